#!/usr/bin/env bash
# Issue 24's device steps on one H200 (`nvidia-h200`), carrying .whl with perf_analyzer.tgz
# (../shared/device.md; device-wheels.sh first, then perf-analyzer-bundle.sh: the first empties
# .whl). One step or several per call, each within the 10-minute command limit:
#   bash benchmarks/gpu/issue24_steps.sh tests c1            (~5 min)
#   bash benchmarks/gpu/issue24_steps.sh resnet50            (~8 min: the full sweep + LitServe)
#   bash benchmarks/gpu/issue24_steps.sh bert                (~7 min)
#   bash benchmarks/gpu/issue24_steps.sh buckets bert-cuda   (~8 min)
#   bash benchmarks/gpu/issue24_steps.sh cprofile            (~3 min: ResNet-50 gRPC + shm at c=1,
#       delay 0, and at c=256, delay 500, each with a cProfile of the executor's loop thread:
#       py-spy --native crashed there; benchmarks/gpu/cprofiling.py)
#   bash benchmarks/gpu/issue24_steps.sh cprofile-cuda       (~2.5 min: BERT gRPC + CUDA shm at
#       c=256, delay 500, with the executors' cProfile: where the CUDA-shm path's CPU goes)
#   bash benchmarks/gpu/issue24_steps.sh c1-f1               (~2 min: c=1, delay 0, one process:
#       --frontends 1 has no front end <-> executor hop, the latency target's best case)
#   bash benchmarks/gpu/issue24_steps.sh ab                  (~2.5 min: ResNet-50 c=256, gRPC +
#       system / CUDA shm, the tree in ab_base/src (e.g. `git archive OLD src | tar -x -C
#       ab_base`, untracked so that it travels) then this tree, one after the other;
#       AB_MODEL (bert) and AB_PROTOCOLS narrow it, AB_CONCURRENCY (e.g. 1,16,256) and
#       AB_DEADLINE (seconds per tree, 125) widen it)
#   bash benchmarks/gpu/issue24_steps.sh share1              (~1.5 min: ResNet-50 gRPC + shm c=256
#       with TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT=1: a connection per perf_analyzer thread,
#       so SO_REUSEPORT spreads 256 connections over the front ends, not ~43)
#   bash benchmarks/gpu/issue24_steps.sh shm-check           (~20 s: benchmarks/gpu/cuda_shm_check.py)
#   bash benchmarks/gpu/issue24_steps.sh tests-runtime       (~1 min: the GPU runtime and launched-
#       path tests: graphs, streams, memory, the event-driven completions)
#   bash benchmarks/gpu/issue24_steps.sh tests-hooked        (~1 min: tests-runtime's tests with the
#       tuning hook's variables in $HOOK_SETS ("VAR=VALUE,VAR=VALUE"): a variant's correctness)
#   bash benchmarks/gpu/issue24_steps.sh tests-cuda          (~1 min: the CUDA-shm GPU tests only)
#   bash benchmarks/gpu/issue24_steps.sh copy-check          (~30 s: benchmarks/gpu/copy_check.py,
#       a batch's per-request copies queued one driver call each or in one cuMemcpyBatchAsync)
#   bash benchmarks/gpu/issue24_steps.sh c1-floor            (~4 min: benchmarks/gpu/c1_floor.py, the
#       c=1 latency of perf_analyzer against bare gRPC and HTTP servers that only wait 0 or 900
#       µs, and infermux beside them; C1_PROTOCOLS=pa_grpc narrows it, ~2 min)
#   bash benchmarks/gpu/issue24_steps.sh ab-c1               (~5 min: c=1, delay 0, ResNet-50 over
#       gRPC + shm and HTTP, --frontends 12 then 1, the tree in ab_base/src then this tree;
#       AB_FRONTENDS and AB_PROTOCOLS narrow it)
#   bash benchmarks/gpu/issue24_steps.sh limits              (~8 min: what limits ResNet-50 gRPC +
#       shm at c=256, delay 500: the same server at c=256 and 512 beside LitServe (GPU memory at
#       equal concurrency), then 8 instances instead of 4, then 16 front ends instead of 12, at
#       c=256 (docs/benchmarks.md, *What limits c=256*)
#   bash benchmarks/gpu/issue24_steps.sh c1-d0               (~1.5 min: c=1, delay 0, ResNet-50 over
#       gRPC + shm and HTTP, 12 front ends, no profile: the latency target's own setting)
#   bash benchmarks/gpu/issue24_steps.sh ab-load             (~4 min: c=16 and 64, delay 500,
#       ResNet-50 over gRPC + shm and HTTP, the tree in ab_base/src then this tree)
#   bash benchmarks/gpu/issue24_steps.sh probe               (~8.5 min: ResNet-50 gRPC + shm at
#       c=256, delay 500, four runs on one machine: as configured; 2 instances instead of 4;
#       perf_analyzer --async instead of its 256 synchronous threads; and the tree in ab_base/src
#       (made from this one with a change to try, e.g. front ends that never hold a micro-batch)
#   bash benchmarks/gpu/issue24_steps.sh i2 i4               (~1 min each: ResNet-50 gRPC + shm at
#       c=256, delay 500, with 2 or 4 instances; each step's results come back on their own)
#   bash benchmarks/gpu/issue24_steps.sh gputrace            (~2.5 min: ResNet-50 gRPC + shm at
#       c=256, delay 500, with py-spy and a trace of each executor's GPU streams, gputrace.py:
#       per stream busy share and idle gaps, streams busy at once, copies by direction)
#   bash benchmarks/gpu/issue24_steps.sh variants            (~7 min: ResNet-50 (VAR_MODEL) gRPC + shm
#       at c=256, delay 500, once per entry of $VARIANTS, "NAME:VAR=VALUE,VAR=VALUE" with the
#       variables benchmarks/gpu/tuning_hook reads, or "NAME:@base" for the tree in ab_base/src;
#       default $DEFAULT_VARIANTS below: the tree twice; give each candidate twice, ABCD ABCD, ~65 s a run)
#   bash benchmarks/gpu/issue24_steps.sh repeat              (~6 min: ResNet-50 at c=256, delay 500,
#       each protocol's point twice back to back on one server, at 10% stability: is perf_analyzer's
#       ramping first pass the server warming up or each perf_analyzer run's start? REPEAT_PROTOCOLS
#       (default gRPC + system shm, gRPC + CUDA shm, HTTP) and REPEAT_DEADLINE (400 s) narrow it)
# Results land in $OUT/res.tgz (-> benchmarks/results/gpu/issue24/<step>-<commit>/).
# shellcheck source=../device_setup.sh
. "$(dirname "$0")/../device_setup.sh"
# run.py unpacks .whl/perf_analyzer.tgz itself (benchmarks/gpu/perfanalyzer.py).
# --batch-curve: the raw model's throughput at the batch sizes a server forms at c=256 (~28-36),
# so that each point is also set beside the GPU at the batch it served (gpu_bench.md).
RUN="python3 benchmarks/gpu/run.py --frontends 12 --batch-curve 16,24,32,40,48,64"
SWEEP="--protocols pa_grpc_shm,pa_grpc_cuda_shm,pa_grpc,pa_http --concurrency 1,16,64,256
       --queue-delay-us 500 --pa-http-interval-ms 2000 --profile"
# At 10% stability perf_analyzer's first, ramping pass at c=256 is not among the three it reports
# (docs/benchmarks.md, *perf_analyzer's first pass at c=256*).
PA_STEADY="--pa-stability 10 --pa-max-trials 8"
# ResNet-50's saturated point as the probes run it (gRPC + system shm, c=256, delay 500).
C256="--servers infermux --protocols pa_grpc_shm --concurrency 256 --queue-delay-us 500
      --raw-seconds 1 $PA_STEADY"
# The variants step's default: the tree as it is, twice (the host's repeatability within a call).
# Candidates come in $VARIANTS. Decided so far: graph buckets every 2 rows (adopted), a hold with 4
# in flight, the executor at nice -10, the front ends at nice +5, a Wanted frame for held
# micro-batches (variants-14666b2/, gputrace-variants-de8ea6d/, wanted-variants-23e6145/;
# docs/decisions.md).
DEFAULT_VARIANTS="head: head-r:"
# What is done so far, packed where it comes back even if a later run outlives the call.
pack() { tar czf "${OUT:-/tmp/out}/res.tgz" -C "$R" .; }
# Run a command on one tree of an A/B: "base" (ab_base/src) or "head" (src/).
on_tree() {
  local src=$PWD/src
  [ "$1" = base ] && src=$PWD/ab_base/src
  PYTHONPATH=$src:/tmp/site:$PWD "${@:2}"
}
for STEP in "$@"; do
  case $STEP in
    tests) timeout 200 python3 -m pytest -m gpu tests/gpu -q -p no:cacheprovider -rs \
             >"$R/gpu-tests.log" 2>&1 ;;
    c1) timeout 280 $RUN --out "$R/c1" --models resnet50 --servers infermux \
          --protocols pa_grpc_shm,pa_http --concurrency 1 --queue-delay-us 0 \
          --profile --profile-concurrency 1 --profile-native --deadline 240 >"$R/c1.log" 2>&1 ;;
    resnet50) timeout 520 $RUN --out "$R/resnet50" --models resnet50 --servers infermux,litserve \
                $SWEEP --deadline 470 >"$R/resnet50.log" 2>&1 ;;
    bert) timeout 430 $RUN --out "$R/bert" --models bert --servers infermux,litserve \
            $SWEEP --deadline 385 >"$R/bert.log" 2>&1 ;;
    buckets) timeout 340 $RUN --out "$R/buckets" --models resnet50 --servers infermux \
               --protocols pa_grpc_shm,pa_http --concurrency 256 --queue-delay-us 500 \
               --pa-http-interval-ms 2000 --deadline 300 \
               --graph-variants "default/1,2,4,8,$(seq -s, 12 4 128)" >"$R/buckets.log" 2>&1 ;;
    bert-cuda) timeout 280 $RUN --out "$R/bert-cuda" --models bert --servers infermux \
                 --protocols pa_grpc_cuda_shm --concurrency 1,256 --queue-delay-us 500 --profile \
                 --profile-protocol pa_grpc_cuda_shm --profile-native --deadline 240 \
                 >"$R/bert-cuda.log" 2>&1 ;;
    c1-f1) timeout 150 python3 benchmarks/gpu/run.py --frontends 1 --out "$R/c1-f1" \
             --models resnet50 --servers infermux --protocols pa_grpc_shm,pa_http --concurrency 1 \
             --queue-delay-us 0 --profile --profile-cprofile --profile-concurrency 1 \
             --deadline 130 >"$R/c1-f1.log" 2>&1 ;;
    cprofile) timeout 150 $RUN --out "$R/cprofile-c1" --models resnet50 --servers infermux \
                --protocols pa_grpc_shm --concurrency 1 --queue-delay-us 0 --profile \
                --profile-cprofile --profile-concurrency 1 --deadline 130 >"$R/cprofile-c1.log" 2>&1
              timeout 150 $RUN --out "$R/cprofile-c256" --models resnet50 --servers infermux \
                --protocols pa_grpc_shm --concurrency 256 --queue-delay-us 500 --profile \
                --profile-cprofile --deadline 130 >"$R/cprofile-c256.log" 2>&1 ;;
    cprofile-cuda) timeout 170 $RUN --out "$R/cprofile-cuda" --models bert --servers infermux \
                     --protocols pa_grpc_cuda_shm --concurrency 256 --queue-delay-us 500 --profile \
                     --profile-protocol pa_grpc_cuda_shm --profile-cprofile --deadline 150 \
                     >"$R/cprofile-cuda.log" 2>&1 ;;
    ab) for TREE in base head; do
          on_tree $TREE timeout $(( ${AB_DEADLINE:-125} + 15 )) $RUN --out "$R/ab-$TREE" --models ${AB_MODEL:-resnet50} \
            --servers infermux --protocols ${AB_PROTOCOLS:-pa_grpc_shm,pa_grpc_cuda_shm} \
            --concurrency ${AB_CONCURRENCY:-256} --queue-delay-us 500 --raw-seconds 1 \
            --deadline ${AB_DEADLINE:-125} >"$R/ab-$TREE.log" 2>&1
        done ;;
    share1) timeout 140 $RUN --out "$R/share1" --models resnet50 --servers infermux \
              --protocols pa_grpc_shm --concurrency 256 --queue-delay-us 500 --raw-seconds 1 \
              --pa-grpc-channel-share 1 --deadline 125 >"$R/share1.log" 2>&1 ;;
    shm-check) timeout 100 python3 benchmarks/gpu/cuda_shm_check.py \
                 --out "$R/cuda_shm_check.json" >"$R/shm-check.log" 2>&1 ;;
    c1-floor) timeout 320 python3 benchmarks/gpu/c1_floor.py --work-us 0,900 \
                --protocols ${C1_PROTOCOLS:-pa_grpc,pa_http} \
                --out "$R/c1_floor.json" >"$R/c1-floor.log" 2>&1 ;;
    copy-check) timeout 100 python3 benchmarks/gpu/copy_check.py \
                  --out "$R/copy_check.json" >"$R/copy-check.log" 2>&1 ;;
    tests-runtime) timeout 150 python3 -m pytest -m gpu tests/gpu/test_runtime_gpu.py \
                     tests/gpu/test_launched_gpu.py -q \
                     -p no:cacheprovider -rs >"$R/gpu-tests-runtime.log" 2>&1 ;;
    tests-hooked) env ${HOOK_SETS//,/ } PYTHONPATH=$PWD/benchmarks/gpu/tuning_hook:$PYTHONPATH \
                    timeout 150 python3 -m pytest -m gpu tests/gpu/test_runtime_gpu.py \
                    tests/gpu/test_launched_gpu.py -q -p no:cacheprovider -rs \
                    >"$R/gpu-tests-hooked.log" 2>&1 ;;
    tests-cuda) timeout 200 python3 -m pytest -m gpu tests/gpu/test_cuda_shm_gpu.py \
                  tests/gpu/test_cuda_micro_batch_gpu.py -q -p no:cacheprovider -rs \
                  >"$R/gpu-tests-cuda.log" 2>&1 ;;
    ab-c1) for F in ${AB_FRONTENDS:-12 1}; do
             for TREE in base head; do
               on_tree $TREE timeout 120 python3 benchmarks/gpu/run.py \
                 --frontends $F --out "$R/ab-c1-f$F-$TREE" --models resnet50 --servers infermux \
                 --protocols ${AB_PROTOCOLS:-pa_grpc_shm,pa_http} --concurrency 1 \
                 --queue-delay-us 0 --raw-seconds 1 --deadline 105 >"$R/ab-c1-f$F-$TREE.log" 2>&1
             done
           done ;;
    limits) timeout 260 $RUN --out "$R/limits-c" --models resnet50 --servers infermux,litserve \
              --protocols pa_grpc_shm --concurrency 256,512 --queue-delay-us 500 --raw-seconds 1 \
              --deadline 240 >"$R/limits-c.log" 2>&1
            timeout 130 $RUN --out "$R/limits-i8" --models resnet50 --servers infermux \
              --protocols pa_grpc_shm --concurrency 256 --queue-delay-us 500 --raw-seconds 1 \
              --instances 8 --deadline 115 >"$R/limits-i8.log" 2>&1
            timeout 130 $RUN --out "$R/limits-f16" --models resnet50 --servers infermux \
              --protocols pa_grpc_shm --concurrency 256 --queue-delay-us 500 --raw-seconds 1 \
              --frontends 16 --deadline 115 >"$R/limits-f16.log" 2>&1 ;;
    c1-d0) timeout 120 $RUN --out "$R/c1-d0" --models resnet50 --servers infermux \
             --protocols pa_grpc_shm,pa_http --concurrency 1 --queue-delay-us 0 --raw-seconds 1 \
             --deadline 105 >"$R/c1-d0.log" 2>&1 ;;
    ab-load) for TREE in base head; do
               on_tree $TREE timeout 140 $RUN --out "$R/ab-load-$TREE" \
                 --models resnet50 --servers infermux --protocols pa_grpc_shm,pa_http \
                 --concurrency 16,64 --queue-delay-us 500 --pa-http-interval-ms 2000 \
                 --raw-seconds 1 --deadline 125 >"$R/ab-load-$TREE.log" 2>&1
             done ;;
    gputrace) timeout 200 $RUN --out "$R/gputrace" --models resnet50 $C256 --profile \
                --profile-gpu-trace --deadline 180 >"$R/gputrace.log" 2>&1 ;;
    i2|i4) timeout 110 $RUN --out "$R/$STEP" --models resnet50 $C256 --instances ${STEP#i} \
             --deadline 95 >"$R/$STEP.log" 2>&1 ;;
    probe) P="--models resnet50 $C256 --deadline 110"
           timeout 125 $RUN --out "$R/probe-i4" $P >"$R/probe-i4.log" 2>&1
           timeout 125 $RUN --out "$R/probe-i2" $P --instances 2 >"$R/probe-i2.log" 2>&1
           timeout 125 $RUN --out "$R/probe-async" $P --pa-async >"$R/probe-async.log" 2>&1
           on_tree base timeout 125 $RUN --out "$R/probe-base" $P >"$R/probe-base.log" 2>&1 ;;
    variants) P="--models ${VAR_MODEL:-resnet50} $C256 --deadline 110"
              python3 -c "import grpc; print(grpc.__version__)" >"$R/grpcio.txt" 2>&1
              for V in ${VARIANTS:-$DEFAULT_VARIANTS}; do
                NAME=${V%%:*} SETS=${V#*:}
                if [ "$SETS" = @base ]; then
                  on_tree base timeout 125 $RUN --out "$R/var-$NAME" $P >"$R/var-$NAME.log" 2>&1
                else
                  env ${SETS//,/ } PYTHONPATH=$PWD/benchmarks/gpu/tuning_hook:$PYTHONPATH \
                    timeout 125 $RUN --out "$R/var-$NAME" $P >"$R/var-$NAME.log" 2>&1
                fi
                # INFERMUX_BENCH_FE_TIMING=/tmp/fe-timing: the front ends' timings of this run.
                [ -d /tmp/fe-timing ] && mv /tmp/fe-timing "$R/var-$NAME/fe-timing"
                pack  # each variant's results, in case a later one outlives the call
              done ;;
    repeat) timeout $(( ${REPEAT_DEADLINE:-400} + 20 )) $RUN --out "$R/repeat" --models resnet50 \
              --servers infermux --concurrency 256,256 --queue-delay-us 500 --raw-seconds 1 \
              --protocols ${REPEAT_PROTOCOLS:-pa_grpc_shm,pa_grpc_cuda_shm,pa_http} \
              $PA_STEADY --deadline ${REPEAT_DEADLINE:-400} \
              >"$R/repeat.log" 2>&1 ;;
    *) echo "unknown step $STEP" >&2 ;;
  esac
  # After every step: what is done comes back even if a later step outlives the call. The
  # device copy's .git can be stale (its HEAD named an older commit than the tree sent), so the
  # tree is named by a digest of src/'s Python files: the same command here finds the commit.
  git rev-parse HEAD >"$R/checkout-head.txt" 2>/dev/null
  (cd src && find . -name '*.py' | LC_ALL=C sort | xargs cat | sha1sum) >"$R/src-sha1.txt"
  pack
done
