"""Moving requests between processes (multi-process front ends): a shared-memory arena for
tensor bytes, a single-producer single-consumer ring for the headers that describe them, a
doorbell to wake the reader, and the channel that bundles them for one front end."""

from infermux.ipc.arena import ALIGNMENT, Arena, Block
from infermux.ipc.channel import Channel, ChannelSpec, Endpoint
from infermux.ipc.ring import Doorbell, FrameRing
from infermux.ipc.segment import Segment

__all__ = [
    "ALIGNMENT",
    "Arena",
    "Block",
    "Channel",
    "ChannelSpec",
    "Doorbell",
    "Endpoint",
    "FrameRing",
    "Segment",
]
