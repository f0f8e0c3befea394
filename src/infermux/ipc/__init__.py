"""Moving requests between processes: a shared-memory arena for tensor bytes (and, next, the
channel that carries request headers between front-end processes and the executor)."""

from infermux.ipc.arena import ALIGNMENT, Arena, Block

__all__ = ["ALIGNMENT", "Arena", "Block"]
