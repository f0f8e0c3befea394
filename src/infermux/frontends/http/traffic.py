"""The traffic admin API (infermux's own, beside the V2 routes):

- ``GET /v2/models/{name}/traffic``: the policy in force, its source, served versions, shadow
  figures.
- ``POST /v2/models/{name}/traffic`` with a policy (``docs/lifecycle.md``): put it in force.
- ``DELETE /v2/models/{name}/traffic``: back to the policy in the model's config.
- ``POST /v2/models/{name}/traffic/promote`` with ``{"version": N}``: all traffic to ``N``.
- ``POST /v2/models/{name}/traffic/rollback``: undo the last change.

Every change takes effect for the next request; each answers the resulting report.
"""

from __future__ import annotations

import re

import msgspec

from infermux.dataplane import Operations
from infermux.errors import InvalidArgumentError
from infermux.frontends.http.transport import Reply, Request

PATTERN = re.compile(r"^/v2/models/([^/]+)/traffic(?:/(promote|rollback))?$")


async def handle(operations: Operations, request: Request, match: re.Match[str]) -> Reply:
    name, action = match.groups()
    if action is None and request.method == "POST":
        await operations.set_traffic(name, (await request.body()).decode("utf-8", "replace"))
    elif action is None and request.method == "DELETE":
        await operations.set_traffic(name, None)
    elif action is None:
        request.allow("GET")
    elif action == "promote":
        request.allow("POST")
        await operations.promote(name, _version((await request.json_object()).get("version")))
    else:
        request.allow("POST")
        await operations.rollback(name)
    return Reply.json(msgspec.to_builtins(await operations.traffic(name)))


def _version(value: object) -> int:
    if isinstance(value, str) and value.isascii() and value.isdigit():  # not "¹"
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidArgumentError("field 'version' must be a version number (e.g. 2)")
    return value
