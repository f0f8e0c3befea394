"""infermux as several processes (``infermux serve --frontends N``): N front ends, one executor,
and the supervisor that runs them (:mod:`.supervisor`), over the shared-memory channels of
:mod:`infermux.ipc`."""

from infermux.processes.supervisor import Supervisor

__all__ = ["Supervisor"]
