#!/usr/bin/env bash
# simple over gRPC c=4: base (0ba58a0) vs new (HEAD), alternating, 3 rounds.
cd /work/main
for round in 1 2 3; do
  for tree in base new; do
    SRC=/work/main/src; [ $tree = base ] && SRC=/tmp/base0/src
    PYTHONPATH=$SRC setsid .venv/bin/python -m infermux serve --host 127.0.0.1 --http-port 18000 --grpc-port 18001 --metrics-port 18002 > /tmp/cpu_ab_$tree$round.log 2>&1 &
    PID=$!
    for i in $(seq 400); do curl -sf localhost:18000/v2/health/ready >/dev/null && break; sleep 0.3; done; sleep 1
    echo -n "$tree$round "
    /tmp/perf_analyzer/perf_analyzer -m simple -i grpc -u localhost:18001 --concurrency-range 4 --measurement-interval 3000 --max-trials 8 --stability-percentage 25 > /tmp/pa_$tree$round.txt 2>&1; grep Throughput /tmp/pa_$tree$round.txt | tail -1 || tail -3 /tmp/pa_$tree$round.txt
    kill -TERM -- -$PID 2>/dev/null; wait $PID 2>/dev/null
  done
done
