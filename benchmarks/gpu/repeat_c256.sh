# Issue 24: is perf_analyzer's first-pass ramp at c=256 the server warming up, or each perf_analyzer
# run's own start (connections, shm regions)? One server, each protocol's c=256 point run twice
# back to back (the second perf_analyzer run finds the server warm): gRPC + system shm, gRPC + CUDA
# shm, HTTP binary (or the protocols given), at 10% stability. From the repo root on the device,
# .whl carried: bash benchmarks/gpu/repeat_c256.sh [DEADLINE [PROTOCOLS]]
. benchmarks/device_setup.sh
DEADLINE=${1:-400}
PROTOCOLS=${2:-pa_grpc_shm,pa_grpc_cuda_shm,pa_http}
timeout $((DEADLINE + 20)) python3 benchmarks/gpu/run.py --out "$R/repeat" --models resnet50 \
    --servers infermux --frontends 12 --batch-curve 16,24,32,40,48,64 --concurrency 256,256 \
    --queue-delay-us 500 --raw-seconds 1 --protocols "$PROTOCOLS" \
    --pa-stability 10 --pa-max-trials 8 --deadline "$DEADLINE" >"$R/repeat.log" 2>&1
git rev-parse HEAD >"$R/checkout-head.txt" 2>/dev/null
(cd src && find . -name '*.py' | LC_ALL=C sort | xargs cat | sha1sum) >"$R/src-sha1.txt"
tar czf "$OUT/res.tgz" -C "$R" .
