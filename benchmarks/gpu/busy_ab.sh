# Issue 24, the busy-GPU rule (scheduling/batcher.py) A/B on one warm machine: ResNet-50 at c=256
# over gRPC + system shm, perf_analyzer at 10% stability (up to 8 passes, so the first pass's ramp
# is left out more often), one export and ceiling, servers alternating busy_gpu_batches values.
# Run from the repo root on the device with .whl carried: bash benchmarks/gpu/busy_ab.sh [VALUES [DEADLINE]]
. benchmarks/device_setup.sh
VALUES=${1:-0,1,2,0,1,2}
DEADLINE=${2:-550}  # seconds for run.py; the call's limit is 20 s more
timeout $((DEADLINE + 20)) python3 benchmarks/gpu/run.py --out "$R/busy-ab" --models resnet50 \
    --servers infermux \
    --frontends 12 --batch-curve 16,24,32,40,48,64 --concurrency 256 --queue-delay-us 500 \
    --raw-seconds 1 --protocols pa_grpc_shm --pa-stability 10 --pa-max-trials 8 \
    --busy-gpu-batches "$VALUES" --deadline "$DEADLINE" >"$R/busy-ab.log" 2>&1
git rev-parse HEAD >"$R/checkout-head.txt" 2>/dev/null
(cd src && find . -name '*.py' | LC_ALL=C sort | xargs cat | sha1sum) >"$R/src-sha1.txt"
tar czf "$OUT/res.tgz" -C "$R" .
