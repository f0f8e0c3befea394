#!/usr/bin/env bash
# Creates the venv bench.py runs the stacks from (HTTPBENCH_VENV, default /tmp/httpbench-venv) and
# installs wrk. Run once before: benchmarks/http_stack/bench.py --rounds 2 --duration 5
set -euo pipefail
VENV=${HTTPBENCH_VENV:-/tmp/httpbench-venv}
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q uvicorn httptools uvloop h11 granian hypercorn orjson numpy grpcio
command -v wrk >/dev/null || apt-get install -y wrk
