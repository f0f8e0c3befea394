"""Moving requests between processes (multi-process front ends, in progress): a shared-memory
arena for tensor bytes, a single-producer single-consumer ring for the headers that describe
them, and a doorbell to wake the reader. Not wired into ``infermux serve`` yet."""

from infermux.ipc.arena import ALIGNMENT, Arena, Block
from infermux.ipc.ring import Doorbell, FrameRing
from infermux.ipc.segment import Segment

__all__ = ["ALIGNMENT", "Arena", "Block", "Doorbell", "FrameRing", "Segment"]
