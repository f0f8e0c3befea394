#!/usr/bin/env bash
# Issue 14 on the 2×H200 device kind (`nvidia-h200-x2`), carrying .whl (../shared/device.md):
#   bash benchmarks/gpu/two_gpu.sh [tests|bench|both]      (default both)
# tests: the GPU suite and the multi-process suites (executors, front ends) on two GPUs;
# bench: ResNet-50 on one GPU (one executor) against two GPUs (one executor per GPU), same front
# ends, same clients. Results land in $OUT/res.tgz (-> benchmarks/results/gpu/two_gpu/).
# shellcheck source=../device_setup.sh
. "$(dirname "$0")/../device_setup.sh"
WHAT=${1:-both}
nvidia-smi --query-gpu=index,name,memory.total --format=csv >"$R/device.txt" 2>&1
if [ "$WHAT" != bench ]; then
  timeout 330 python3 -m pytest -m gpu tests/gpu -q -p no:cacheprovider -rs >"$R/gpu-tests-x2.log" 2>&1
  timeout 150 python3 -m pytest -q -p no:cacheprovider -rs tests/e2e/test_executors.py \
    tests/unit/dataplane/test_executors.py >"$R/executors-tests-x2.log" 2>&1
fi
if [ "$WHAT" != tests ]; then
  B="python3 benchmarks/gpu/run.py --models resnet50 --servers infermux --protocols ${PROTOCOLS:-grpc_shm,http}
     --concurrency ${CONCURRENCY:-512,1024} --window 4 --queue-delay-us 0 --raw-seconds 1 --deadline 150
     --instances ${INSTANCES:-4} --frontends ${FRONTENDS:-12}"
  timeout 170 $B --out "$R/one" --gpus 0 --executors 1 >"$R/one.log" 2>&1
  timeout 170 $B --out "$R/two" --gpus 0,1 --executors 2 >"$R/two.log" 2>&1
fi
tar czf "${OUT:-/tmp/out}/res.tgz" -C "$R" .
