#!/usr/bin/env bash
# The precision benchmark (ResNet-50: PyTorch fp32/fp16/bf16 on one GPU with CUDA graphs, ONNX
# Runtime fp32/int8 on the CPU, raw torch) on the 1×H200 device kind, run through the device tool
# from the repo root carrying .whl (../shared/device.md):
#   bash benchmarks/precision/device.sh [resnet50.py options, e.g. --variants ... or --tiny]
# The timeout keeps the whole command (install and packing included) inside ~420 s; resnet50.json
# and .md are rewritten after every variant, so a run cut short still brings back what it
# measured. Results land in $OUT/res.tgz (-> benchmarks/results/precision/).
# shellcheck source=../device_setup.sh
. "$(dirname "$0")/../device_setup.sh"
nvidia-smi --query-gpu=index,name,memory.total --format=csv >"$R/device.txt" 2>&1
timeout "${TIMEOUT_S:-380}" python3 benchmarks/precision/resnet50.py --out "$R/precision" "$@" \
  >"$R/precision.log" 2>&1
echo "exit status $?" >>"$R/precision.log"
tar czf "${OUT:-/tmp/out}/res.tgz" -C "$R" .
