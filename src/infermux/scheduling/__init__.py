"""Scheduling: the explicit stage between the data plane and model instances."""

from infermux.scheduling.base import Completion, Finisher, Scheduler
from infermux.scheduling.batcher import DynamicBatcher
from infermux.scheduling.queue import RequestQueue

__all__ = ["Completion", "DynamicBatcher", "Finisher", "RequestQueue", "Scheduler"]
