"""Which data-plane operations a front end may ask of the executor by name (a ``Call`` frame).

Derived from the one :class:`~infermux.dataplane.operations.Operations` definition, so that a new
operation cannot be forgotten here (before, a hand-kept list in the wire module; a missing entry
failed only at run time, with several front-end processes): every coroutine of ``Operations``
except ``infer``, which travels as its own ``Infer`` frame. ``live`` and ``server_metadata`` are
answered by the front end itself.
"""

from __future__ import annotations

import inspect

from infermux.dataplane.operations import Operations

CALLS = frozenset(
    name
    for name, member in vars(Operations).items()
    if inspect.iscoroutinefunction(member) and name != "infer"
)
"""The data-plane methods a ``Call`` frame may name; anything else is refused."""
