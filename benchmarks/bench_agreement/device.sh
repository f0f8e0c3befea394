#!/usr/bin/env bash
# infermux bench vs perf_analyzer on the 16-core device host (carry .whl and build/pa.tgz, see
# benchmarks/observability/device.sh for how pa.tgz is made).
#   [MODELS=simple,mlp] bash benchmarks/bench_agreement/device.sh
# shellcheck source=../device_setup.sh
. "$(dirname "$0")/../device_setup.sh"
rm -rf /tmp/pa && mkdir -p /tmp/pa && tar xzf build/pa.tgz -C /tmp/pa
MODELS=${MODELS:-simple}
for model in ${MODELS//,/ }; do
  timeout "${SECONDS_EACH:-560}" python3 benchmarks/bench_agreement/agreement.py --rounds "${ROUNDS:-2}" \
    --concurrency "${CONCURRENCY:-1,4,16}" --server-args "${SERVER_ARGS:---frontends 4}" \
    --model "$model" --protocols "${PROTOCOLS:-http,grpc}" --out "$R/agreement" >"$R/agreement-$model.log" 2>&1
done
tar czf "${OUT:-/tmp/out}/res.tgz" -C "$R" .
