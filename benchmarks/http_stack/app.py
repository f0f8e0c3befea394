"""Raw ASGI 3 app imitating infermux's KServe V2 hot path (no framework).

Routes:
  GET  /v2/health/ready            -> 200, empty body
  POST /v2/models/simple/infer     -> JSON V2 request/response, INT32 add/sub
  POST /v2/models/identity/infer   -> Triton binary tensor extension, echo FP32 bytes
"""

from __future__ import annotations

import numpy as np
import orjson

_JSON_HDRS = [(b"content-type", b"application/json")]
_EMPTY_HDRS = [(b"content-length", b"0")]
_NOT_FOUND = orjson.dumps({"error": "not found"})
_DTYPES = {"INT32": np.int32, "FP32": np.float32, "INT64": np.int64, "FP64": np.float64}


# ----------------------------------------------------------------- handler logic
def simple_infer(body: bytes) -> bytes:
    """JSON parse + numpy + JSON dump: the pure in-process work of the simple route."""
    req = orjson.loads(body)
    ins = {}
    for t in req["inputs"]:
        ins[t["name"]] = np.asarray(t["data"], dtype=np.int32).reshape(t["shape"])
    a = ins["INPUT0"]
    b = ins["INPUT1"]
    s = a + b
    d = a - b
    shape = list(a.shape)
    resp = {
        "model_name": "simple",
        "model_version": "1",
        "outputs": [
            {"name": "OUTPUT0", "datatype": "INT32", "shape": shape, "data": s.ravel()},
            {"name": "OUTPUT1", "datatype": "INT32", "shape": shape, "data": d.ravel()},
        ],
    }
    return orjson.dumps(resp, option=orjson.OPT_SERIALIZE_NUMPY)


def identity_infer(body: bytes, header_len: int) -> tuple[bytes, int]:
    """Triton binary tensor extension: split JSON header / raw bytes, echo the tensor."""
    mv = memoryview(body)
    req = orjson.loads(mv[:header_len])
    raw = mv[header_len:]
    inp = req["inputs"][0]
    params = inp.get("parameters") or {}
    size = params.get("binary_data_size", len(raw))
    arr = np.frombuffer(raw[:size], dtype=_DTYPES[inp["datatype"]]).reshape(inp["shape"])
    out_bytes = memoryview(np.ascontiguousarray(arr)).cast("B")
    hdr = orjson.dumps(
        {
            "model_name": "identity",
            "model_version": "1",
            "outputs": [
                {
                    "name": "OUTPUT0",
                    "datatype": inp["datatype"],
                    "shape": inp["shape"],
                    "parameters": {"binary_data_size": arr.nbytes},
                }
            ],
        }
    )
    return b"".join((hdr, out_bytes)), len(hdr)


# ----------------------------------------------------------------- ASGI plumbing
async def _read_body(receive) -> bytes:
    msg = await receive()
    body = msg.get("body", b"")
    if not msg.get("more_body", False):
        return body
    chunks = [body]
    while msg.get("more_body", False):
        msg = await receive()
        chunks.append(msg.get("body", b""))
    return b"".join(chunks)


async def _lifespan(receive, send):
    while True:
        msg = await receive()
        t = msg["type"]
        if t == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif t == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _respond(send, status: int, headers, body: bytes = b""):
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def app(scope, receive, send):
    typ = scope["type"]
    if typ == "lifespan":
        await _lifespan(receive, send)
        return
    if typ != "http":
        return
    path = scope["path"]
    method = scope["method"]

    if path == "/v2/health/ready" and method == "GET":
        await _respond(send, 200, _EMPTY_HDRS)
        return

    if path == "/v2/models/simple/infer" and method == "POST":
        body = await _read_body(receive)
        out = simple_infer(body)
        await _respond(
            send,
            200,
            [(b"content-type", b"application/json"), (b"content-length", str(len(out)).encode())],
            out,
        )
        return

    if path == "/v2/models/identity/infer" and method == "POST":
        hlen = None
        for k, v in scope["headers"]:
            if k.lower() == b"inference-header-content-length":
                hlen = int(v)
                break
        body = await _read_body(receive)
        if hlen is None:
            hlen = len(body)
        out, out_hlen = identity_infer(body, hlen)
        await _respond(
            send,
            200,
            [
                (b"content-type", b"application/octet-stream"),
                (b"inference-header-content-length", str(out_hlen).encode()),
                (b"content-length", str(len(out)).encode()),
            ],
            out,
        )
        return

    # drain body for unknown routes so keep-alive stays sane
    if method == "POST":
        await _read_body(receive)
    await _respond(send, 404, _JSON_HDRS, _NOT_FOUND)


# ----------------------------------------------------------------- payload helpers (shared with bench.py)
def make_simple_body() -> bytes:
    return orjson.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))},
                {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
            ],
            "outputs": [{"name": "OUTPUT0"}, {"name": "OUTPUT1"}],
        }
    )


def make_identity_body(nbytes: int = 64 * 1024) -> tuple[bytes, int]:
    n = nbytes // 4
    arr = np.arange(n, dtype=np.float32)
    hdr = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": [1, n],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": arr.nbytes},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    )
    return hdr + arr.tobytes(), len(hdr)
