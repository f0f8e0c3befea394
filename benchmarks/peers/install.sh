#!/usr/bin/env bash
# The peers' venvs for benchmarks/peers/run.py (recipes and pitfalls: ../shared/reference/peers.md).
#   bash benchmarks/peers/install.sh [DIR]   (default /tmp/peers; an existing venv is kept)
set -u
DIR=${1:-/tmp/peers}
mkdir -p "$DIR"
make() {  # make NAME PACKAGE...
  local name=$1; shift
  [ -x "$DIR/$name/bin/python" ] && "$DIR/$name/bin/python" -c 'import sys' && return 0
  python3 -m venv "$DIR/$name" && "$DIR/$name/bin/pip" install -q "$@" || echo "install of $name failed" >&2
}
make fastapi fastapi uvicorn numpy
make litserve torch==2.13.0 litserve numpy   # torch first: the CPU build on local disk
make mlserver mlserver==1.7.1 'uvloop<0.22' numpy
make pytriton nvidia-pytriton==0.7.0 numpy
make ray 'ray[serve]' numpy
