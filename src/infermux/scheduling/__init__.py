"""Scheduling: the explicit stage between the data plane and model instances."""

from infermux.scheduling.base import Completion, Finisher, Scheduler
from infermux.scheduling.batcher import GreedyBatcher

__all__ = ["Completion", "Finisher", "GreedyBatcher", "Scheduler"]
