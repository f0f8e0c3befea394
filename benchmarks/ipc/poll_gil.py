"""Does the event loop's polling of a GPU batch hold other threads off the GIL?

``runtime/completions.py`` has the loop poll a batch launched on an idle GPU once per iteration
(a ``call_soon`` chain) for up to ``--gpu-completion-spin-us``. The loop holds the GIL except
where uvloop releases it around its poll of the sockets. Another Python thread of the process
(a CPU model's instance thread, an eager GPU batch's, grpc.aio's poller with ``--frontends 1``)
may then find the GIL taken whenever it wants it back. This measures that: a second thread sleeps
0.3 ms (the GIL released) and records how late it runs again, while the loop alternates 2 ms
windows of either polling (``poll``) or sleeping in ``asyncio.sleep`` (``sleep``: the loop in
epoll, the GIL free). No GPU is needed: the cost is the loop's, not the event query's.

    .venv/bin/python benchmarks/ipc/poll_gil.py [--seconds 5] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import threading
import time

import uvloop

NAP_S = 0.0003
WINDOW_S = 0.002


def _napper(lates: list[float], stop: threading.Event) -> None:
    while not stop.is_set():
        start = time.perf_counter()
        time.sleep(NAP_S)  # releases the GIL; wants it back NAP_S later
        lates.append((time.perf_counter() - start - NAP_S) * 1e6)


async def _windows(mode: str, seconds: float) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    lates: list[float] = []
    stop = threading.Event()
    thread = threading.Thread(target=_napper, args=(lates, stop))
    thread.start()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        if mode == "sleep":
            await asyncio.sleep(WINDOW_S)
            continue
        done: asyncio.Future[None] = loop.create_future()
        give_up = time.perf_counter() + WINDOW_S

        def poll(done: asyncio.Future[None] = done, give_up: float = give_up) -> None:
            if time.perf_counter() >= give_up:
                done.set_result(None)
            else:
                loop.call_soon(poll)

        loop.call_soon(poll)
        await done
    stop.set()
    thread.join()
    lates.sort()
    return {
        "naps": len(lates),
        "late_p50_us": round(statistics.median(lates), 1),
        "late_p90_us": round(lates[int(len(lates) * 0.9)], 1),
        "late_p99_us": round(lates[int(len(lates) * 0.99)], 1),
        "late_max_us": round(lates[-1], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for _ in range(args.rounds):
        for mode in ("sleep", "poll"):
            reading = uvloop.run(_windows(mode, args.seconds))
            print(json.dumps({"mode": mode, **reading}), flush=True)


if __name__ == "__main__":
    main()
