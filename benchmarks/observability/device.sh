#!/usr/bin/env bash
# Issue 8's checks on the GPU machine (run through the device tool from the repo root, carrying
# .whl and, for the perf_analyzer step, build/pa.tgz: a perf_analyzer install made here by
# ../shared/tools/install-perf-analyzer.sh into /tmp/pa, packed without its apt cache).
#   bash benchmarks/observability/device.sh tests|overhead|both
# tests: the GPU tests (incl. GPU metrics), the observability and multi-process tests, and
# perf_analyzer --collect-metrics against infermux (does it parse infermux's GPU gauges?);
# overhead: benchmarks/observability/overhead.py on this machine's cores.
# shellcheck source=../device_setup.sh
. "$(dirname "$0")/../device_setup.sh"
if [ -f build/pa.tgz ]; then rm -rf /tmp/pa && mkdir -p /tmp/pa && tar xzf build/pa.tgz -C /tmp/pa; fi
case ${1:-tests} in
tests | both)
  timeout 300 python3 -m pytest -p no:cacheprovider -m gpu tests/gpu -q -rs >"$R/gpu-tests.log" 2>&1
  timeout 200 python3 -m pytest -p no:cacheprovider -q tests/unit/observability \
    tests/e2e/test_observability.py tests/e2e/test_frontends.py >"$R/observability-tests.log" 2>&1
  OUT="$R/pa-metrics" MODES="grpc" PA_METRICS=1 PA_PREFIX=/tmp/pa PYTHON=python3 \
    SERVER_ARGS="--frontends 2 --model-repository $PWD/src/infermux/examples/model_repository" \
    timeout 120 bash benchmarks/perf_analyzer/run.sh >"$R/pa-metrics.log" 2>&1
  ;;&
overhead | both)
  timeout 420 python3 benchmarks/observability/overhead.py --rounds "${ROUNDS:-3}" \
    --out "$R/overhead" --work /tmp/ovh >"$R/overhead.log" 2>&1
  ;;
esac
tar czf "${OUT:-/tmp/out}/res.tgz" -C "$R" .
