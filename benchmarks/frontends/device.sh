#!/usr/bin/env bash
# Issue 7's measurements on the GPU machine (run through the device tool from the repo root with
# .whl carried; see ../shared/device.md). Step "tests": the GPU tests, the multi-process tests and
# the hop benchmark; step "bench": ResNet-50 with 1, 2, 4 and 8 front-end processes.
#   bash benchmarks/frontends/device.sh tests|bench|both
# shellcheck source=../device_setup.sh
. "$(dirname "$0")/../device_setup.sh"
case ${1:-tests} in
tests | both)
  [ -n "${SKIP_GPU_TESTS:-}" ] ||
    timeout 240 python3 -m pytest -p no:cacheprovider -m gpu tests/gpu -q -rs >"$R/gpu-tests.log" 2>&1
  timeout 150 python3 -m pytest -p no:cacheprovider -q tests/e2e/test_frontends.py tests/unit/ipc \
    tests/unit/dataplane/test_remote.py >"$R/frontends-tests.log" 2>&1
  timeout 120 python3 benchmarks/frontends/hop.py --requests 5000 --out "$R" >"$R/hop.log" 2>&1
  ;;&
bench | both)
  timeout 560 python3 benchmarks/gpu/run.py --out "$R/gpu" --models "${MODELS:-resnet50}" \
    --servers infermux --frontends "${FRONTENDS:-1,2,4,8}" --protocols "${PROTOCOLS:-grpc_shm,http}" \
    --concurrency "${CONCURRENCY:-64,256}" --deadline "${DEADLINE:-540}" >"$R/bench.log" 2>&1
  ;;
esac
tar czf "${OUT:-/tmp/out}/res.tgz" -C "$R" .
