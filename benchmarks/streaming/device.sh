#!/usr/bin/env bash
# Issue 28's streaming benchmark on the GPU machine (16 cores; no tritonserver there): infermux
# alone, for the "overhead <= 0.2 ms per response at c=64" figure. Run through the device tool
# from the repo root carrying .whl with tritonclient in it (../shared/device.md):
#   bash benchmarks/streaming/device.sh [bench.py options, e.g. --rounds 2]
# The timeout keeps the whole command inside ~7 minutes. Results land in $OUT/res.tgz
# (-> benchmarks/results/streaming/streaming_device.{json,md}, logs/).
# shellcheck source=../device_setup.sh
. "$(dirname "$0")/../device_setup.sh"
timeout "${TIMEOUT_S:-400}" python3 benchmarks/streaming/bench.py --servers infermux \
  --name streaming_device --out "$R" "$@" >"$R/streaming.log" 2>&1
echo "exit status $?" >>"$R/streaming.log"
tar czf "${OUT:-/tmp/out}/res.tgz" -C "$R" .
