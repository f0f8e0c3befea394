"""What one HTTP client may hold of a running ``infermux serve``, over raw sockets (issue 23):
request heads are bounded in size and count (431, 414), a head must arrive within
``--http-header-timeout`` and a body may not pause past ``--http-body-timeout`` (408, then the
connection is closed: slowloris), connections beyond ``--http-max-connections`` are answered 503
while the open ones keep being served, with ``--frontends 2`` too; and a client that leaves
mid-request leaves no traceback in the log. After each, the server keeps serving."""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import SLOW_MODEL, ServerProcess, start_server, write_model

TIMEOUT = 2.0  # the header and body timeouts the servers below run with
BOUND = TIMEOUT + 15  # how long a test waits for one: generous, for a loaded CI box
HEALTH = b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with start_server(
        "--http-header-timeout", str(TIMEOUT), "--http-body-timeout", str(TIMEOUT)
    ) as running:
        yield running
        assert running.stop() == 0


def connect(server: ServerProcess) -> socket.socket:
    sock = socket.create_connection((server.host, server.http_port), timeout=BOUND)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (socket.timeout if it never does)."""
    answer = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return answer
        if not chunk:
            return answer
        answer += chunk


def send_until_answered(sock: socket.socket, head: bytes, filler: bytes, total: int) -> bytes:
    """Send ``head`` then ``total`` bytes of ``filler`` in 64 KiB pieces, stopping as soon as the
    server answers; what it answered, up to its close."""
    sock.sendall(head)
    sent = 0
    piece = filler * (65536 // len(filler))
    while sent < total:
        readable, _, _ = select.select([sock], [], [], 0)
        if readable:
            break
        try:
            sock.sendall(piece)
        except (BrokenPipeError, ConnectionResetError):
            break
        sent += len(piece)
    return read_until_closed(sock)


def status(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    return int(answer.split()[1])


def assert_serving(server: ServerProcess) -> None:
    response = httpx.post(
        f"http://{server.url}/v2/models/identity_fp32/infer",
        json={"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == [1, 2]


def server_rss(server: ServerProcess) -> int:
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_ten_megabyte_header_line_is_431_at_once(server: ServerProcess) -> None:
    with connect(server) as sock:
        started = time.monotonic()
        answer = send_until_answered(sock, HEALTH + b"X-Big: ", b"a", 10_000_000)
        assert time.monotonic() - started < BOUND
    assert status(answer) == 431
    assert b"--http-max-header-size" in answer
    assert_serving(server)


def test_unterminated_40_mib_headers_do_not_grow_the_server(server: ServerProcess) -> None:
    before = server_rss(server)
    socks = [connect(server) for _ in range(5)]
    try:
        for sock in socks:
            sock.sendall(HEALTH + b"X-Big: ")
        answers = [send_until_answered(s, b"", b"b", 40 * 2**20) for s in socks]
    finally:
        for sock in socks:
            sock.close()
    assert [status(a) for a in answers] == [431] * 5
    # Before the limit, 5 x 40 MiB were buffered (+190 MiB); now each stops near 64 KiB.
    assert server_rss(server) - before < 64 * 2**20
    assert_serving(server)


def test_too_many_headers_and_over_long_lines_are_refused(server: ServerProcess) -> None:
    many = b"".join(b"X-H%d: 1\r\n" % i for i in range(101))
    with connect(server) as sock:
        sock.sendall(HEALTH + many + b"\r\n")
        answer = read_until_closed(sock)
    assert status(answer) == 431
    assert b"more than 100 header fields" in answer
    with connect(server) as sock:  # one 20 KiB line, the head well within 64 KiB
        sock.sendall(HEALTH + b"X-Long: " + b"l" * 20_000 + b"\r\n\r\n")
        answer = read_until_closed(sock)
    assert status(answer) == 431
    assert b"header 'x-long' is longer than 16384 bytes" in answer.lower()
    with connect(server) as sock:
        sock.sendall(b"GET /v2/" + b"p" * 20_000 + b" HTTP/1.1\r\nHost: t\r\n\r\n")
        answer = read_until_closed(sock)
    assert status(answer) == 414
    with connect(server) as sock:  # 100 header fields are fine
        sock.sendall(HEALTH + many[: many.index(b"X-H98")] + b"Connection: close\r\n\r\n")
        assert status(read_until_closed(sock)) == 200
    assert_serving(server)


def trickle(socks: list[socket.socket], head: bytes) -> list[float]:
    """Send ``head`` one byte a second on every socket; when each was closed (seconds after
    the start; socket.timeout after BOUND)."""
    started = time.monotonic()
    closed: dict[int, float] = {}
    answers: dict[int, bytes] = dict.fromkeys(range(len(socks)), b"")
    position = 0
    while len(closed) < len(socks):
        if time.monotonic() - started > BOUND:
            raise TimeoutError(f"{len(socks) - len(closed)} connections still open")
        for i, sock in enumerate(socks):
            if i in closed:
                continue
            try:
                sock.send(head[position % len(head) : position % len(head) + 1])
            except OSError:
                closed[i] = time.monotonic() - started
        position += 1
        deadline = time.monotonic() + 1
        while time.monotonic() < deadline and len(closed) < len(socks):
            open_ = [s for i, s in enumerate(socks) if i not in closed]
            readable, _, _ = select.select(open_, [], [], max(0, deadline - time.monotonic()))
            for sock in readable:
                i = socks.index(sock)
                try:
                    chunk = sock.recv(65536)
                except OSError:
                    chunk = b""
                answers[i] += chunk
                if not chunk:
                    closed[i] = time.monotonic() - started
    assert all(status(a) == 408 for a in answers.values()), answers
    return [closed[i] for i in range(len(socks))]


def test_slowloris_connections_are_closed_after_the_header_timeout(
    server: ServerProcess,
) -> None:
    socks = [connect(server) for _ in range(20)]
    try:
        times = trickle(socks, HEALTH + b"X-Slow: " + b"s" * 100)
    finally:
        for sock in socks:
            sock.close()
    assert max(times) < BOUND
    assert min(times) >= TIMEOUT * 0.5  # the timeout, not something else, closed them
    with connect(server) as idle:  # a connection that sends nothing is closed too, silently
        assert read_until_closed(idle) == b""
    assert_serving(server)


def test_an_idle_body_is_cut_with_408(server: ServerProcess) -> None:
    with connect(server) as sock:
        started = time.monotonic()
        sock.sendall(
            b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: t\r\n"
            b'Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"inputs": '
        )
        answer = read_until_closed(sock)
        assert time.monotonic() - started < BOUND
    assert status(answer) == 408
    assert b"--http-body-timeout" in answer
    assert_serving(server)


def test_connections_beyond_the_cap_get_503_and_the_open_ones_are_served() -> None:
    with start_server(
        "--http-max-connections", "4", "--http-keep-alive-timeout", "60"
    ) as server:  # fmt: skip
        held = [connect(server) for _ in range(4)]
        try:
            for sock in held:  # each answered, and kept alive
                sock.sendall(HEALTH + b"\r\n")
                assert sock.recv(65536).startswith(b"HTTP/1.1 200")
            with connect(server) as extra:
                answer = read_until_closed(extra)
            assert status(answer) == 503
            assert b"--http-max-connections" in answer
            held[0].sendall(HEALTH + b"\r\n")  # the open ones are still served
            assert held[0].recv(65536).startswith(b"HTTP/1.1 200")
        finally:
            for sock in held:
                sock.close()
        deadline = time.monotonic() + BOUND
        while True:  # their slots come back once the server has seen them close
            try:
                assert_serving(server)
                break
            except (AssertionError, httpx.HTTPError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        assert server.stop() == 0


def test_the_limits_hold_in_every_front_end_process() -> None:
    with start_server(
        "--frontends", "2", "--http-header-timeout", str(TIMEOUT)
    ) as server:  # fmt: skip
        for _ in range(4):  # the kernel spreads these over both processes' accepts
            with connect(server) as sock:
                answer = send_until_answered(sock, HEALTH + b"X-Big: ", b"a", 10_000_000)
            assert status(answer) == 431
        socks = [connect(server) for _ in range(8)]
        try:
            assert max(trickle(socks, HEALTH + b"X-Slow: " + b"s" * 100)) < BOUND
        finally:
            for sock in socks:
                sock.close()
        assert_serving(server)
        assert server.stop() == 0


def test_a_client_leaving_mid_request_leaves_no_traceback(tmp_path: Path) -> None:
    write_model(tmp_path, "slow", datatype="FP32", source=SLOW_MODEL, max_batch_size=0)
    with start_server("--model-repository", str(tmp_path)) as server:
        body = b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1.5]}]}'
        for _ in range(3):
            with connect(server) as sock:
                sock.sendall(
                    b"POST /v2/models/slow/infer HTTP/1.1\r\nHost: t\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
                )
                time.sleep(0.3)  # the request is with the model; the client goes
        time.sleep(1.5 * 3 + 1)  # every slow execution ends
        response = httpx.post(
            f"http://{server.url}/v2/models/slow/infer", content=body.replace(b"1.5", b"0"),
            timeout=30,
        )  # fmt: skip
        assert response.status_code == 200, response.text
        assert server.stop() == 0
    log = "\n".join(server.log)
    assert "Traceback" not in log, log
    assert "InvalidStateError" not in log, log
