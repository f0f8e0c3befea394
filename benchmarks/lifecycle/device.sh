#!/usr/bin/env bash
# Issue 9's checks on the GPU machine (run through the device tool from the repo root with .whl
# carried): the GPU tests, the routing and swap tests, and the swap benchmark with FRONTENDS
# front-end processes (default 4, what `auto` picks on 16 cores).
#   bash benchmarks/lifecycle/device.sh
# shellcheck source=../device_setup.sh
. "$(dirname "$0")/../device_setup.sh"
timeout 200 python3 -m pytest -p no:cacheprovider -m gpu tests/gpu -q -rs >"$R/gpu-tests.log" 2>&1
timeout 200 python3 -m pytest -p no:cacheprovider -q tests/unit/routing tests/e2e/test_traffic.py \
  tests/e2e/test_swaps.py >"$R/lifecycle-tests.log" 2>&1
timeout 300 python3 benchmarks/lifecycle/swap.py --frontends "${FRONTENDS:-4}" --out "$R/swap" \
  >"$R/swap.log" 2>&1
tar czf "${OUT:-/tmp/out}/res.tgz" -C "$R" .
