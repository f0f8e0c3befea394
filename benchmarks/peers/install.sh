#!/usr/bin/env bash
# The peers' venvs for benchmarks/peers/run.py (recipes and pitfalls: ../shared/reference/peers.md).
#   bash benchmarks/peers/install.sh [DIR]   (default /tmp/peers; pip skips what is there already)
# torch==2.13.0 is named in every command: that pins the CPU build on this machine's disk, where a
# bare requirement (or a peer's own) would pull a multi-GB CUDA build.
set -u
DIR=${1:-/tmp/peers}
mkdir -p "$DIR"
make() {  # make NAME PACKAGE...
  local name=$1; shift
  [ -x "$DIR/$name/bin/python" ] || python3 -m venv "$DIR/$name"
  "$DIR/$name/bin/pip" install -q "$@" || echo "install of $name failed" >&2
}
make fastapi torch==2.13.0 fastapi uvicorn numpy
make litserve torch==2.13.0 litserve numpy
make mlserver torch==2.13.0 mlserver==1.7.1 'uvloop<0.22' numpy
make pytriton torch==2.13.0 nvidia-pytriton==0.7.0 numpy
make ray torch==2.13.0 'ray[serve]' numpy
# TorchServe 0.12.0 (its last release) needs Java 17 (on this machine) and an undeclared pyyaml.
command -v java > /dev/null || echo "torchserve needs Java 17 (apt-get install -y openjdk-17-jre-headless)" >&2
make torchserve torch==2.13.0 torchserve==0.12.0 torch-model-archiver==0.12.0 pyyaml numpy
command -v hey > /dev/null || echo "the JSON client is Debian's hey (apt-get install -y hey)" >&2
