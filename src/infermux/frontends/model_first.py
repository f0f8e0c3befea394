"""An inference request names its model before anything else is judged, as in Triton.

A front end decodes a request's body before the data plane looks the model up, so a malformed
body for a model that does not exist would be answered with the body's fault. Clients (and
Triton's own tests) expect "unknown model" first: it tells them the request went to the wrong
place, which no fix to the body would cure. The model is looked up only when decoding failed, so
a well-formed request pays nothing for it.
"""

from __future__ import annotations

from typing import NoReturn

from infermux.dataplane import Operations
from infermux.errors import ErrorCode, InfermuxError


async def unknown_model_first(
    dataplane: Operations, name: str, version: str, error: InfermuxError
) -> NoReturn:
    """Raise the data plane's "unknown model" error for ``name`` (and ``version``) when it has
    one, else ``error``, the fault found in the request's body."""
    try:
        await dataplane.model_config(name, version)
    except InfermuxError as lookup:
        if lookup.code is ErrorCode.NOT_FOUND:
            raise lookup from error
    raise error
