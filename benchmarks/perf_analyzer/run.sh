#!/usr/bin/env bash
# Drive Triton's perf_analyzer against infermux's built-in `simple` model (INT32 add/sub, 2x[16]).
#
# Modes: http, grpc, http_shm (--shared-memory system), grpc_shm. Each writes OUT/<mode>.csv (-f),
# OUT/<mode>.log (perf_analyzer stdout+stderr), OUT/<mode>.rc and OUT/<mode>.cmd; a failing mode does not
# stop the others. At the end a summary line per mode is printed and summarize.py writes OUT.json / OUT.md.
#
# Environment:
#   PYTHON      interpreter with infermux installed (default: python), e.g. PYTHON=.venv/bin/python
#   PA_PREFIX   where perf_analyzer is / gets installed (default: /tmp/pa)
#   PA_INSTALLER path of install-perf-analyzer.sh (default: the shared one next to the checkout)
#   OUT         output directory (default: benchmarks/results/perf_analyzer, relative to the repo root)
#   MODES       space-separated subset of "http grpc http_shm grpc_shm" (default: all four)
#   MODEL       model to drive (default: simple)
#   CONCURRENCY --concurrency-range value (default: 4)
#   PA_WINDOW   stabilisation flags (default: "-p 2000 --max-trials 10"; stability -s stays at 10%)
#   PA_RETRIES  extra attempts when perf_analyzer exits 2 (no stable measurement) (default: 1)
#   PA_EXTRA    extra perf_analyzer flags (default: none)
#   PA_TIMEOUT  per-mode wall-clock limit in seconds (default: 180)
#   READY_TIMEOUT seconds to wait for /v2/health/ready (default: 60)
#   SERVER_ARGS extra `infermux serve` flags (default: none), e.g. "--frontends 2"
#   PA_METRICS  1: perf_analyzer also scrapes the server's /metrics every second (--collect-metrics),
#               as Prometheus would, and reports what it found (default: 0)
#
# Do not run two copies at once: perf_analyzer names its system shared-memory keys after the tensors
# ("/OUTPUT0", "/INPUT0_0_0", ...), so concurrent runs on one host collide in /dev/shm.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
cd "$REPO"

PYTHON=${PYTHON:-python}
PA_PREFIX=${PA_PREFIX:-/tmp/pa}
OUT=${OUT:-benchmarks/results/perf_analyzer}
MODES=${MODES:-http grpc http_shm grpc_shm}
MODEL=${MODEL:-simple}
CONCURRENCY=${CONCURRENCY:-4}
PA_WINDOW=${PA_WINDOW:--p 2000 --max-trials 10}
PA_EXTRA=${PA_EXTRA:-}
PA_RETRIES=${PA_RETRIES:-1}
PA_TIMEOUT=${PA_TIMEOUT:-180}
READY_TIMEOUT=${READY_TIMEOUT:-60}
SERVER_ARGS=${SERVER_ARGS:-}
PA_METRICS=${PA_METRICS:-0}

log() { printf '[run.sh %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# --- perf_analyzer ---------------------------------------------------------------------------------
PA="$PA_PREFIX/perf_analyzer"
if ! { [ -x "$PA" ] && "$PA" --version >/dev/null 2>&1; }; then
  installer=${PA_INSTALLER:-}
  if [ -z "$installer" ]; then
    for c in "$REPO/shared/tools/install-perf-analyzer.sh" "$REPO/../shared/tools/install-perf-analyzer.sh" \
             /work/shared/tools/install-perf-analyzer.sh; do
      [ -f "$c" ] && { installer=$c; break; }
    done
  fi
  [ -n "$installer" ] || { log "perf_analyzer not in $PA_PREFIX and install-perf-analyzer.sh not found (set PA_INSTALLER)"; exit 1; }
  log "installing perf_analyzer into $PA_PREFIX with $installer"
  PA=$(bash "$installer" "$PA_PREFIX" | tail -1)
fi
log "perf_analyzer: $PA ($("$PA" --version 2>&1 | head -1))"

# --- server ----------------------------------------------------------------------------------------
"$PYTHON" -c 'import infermux' 2>/dev/null || {
  log "'$PYTHON' cannot import infermux; set PYTHON, e.g. PYTHON=$REPO/.venv/bin/python"; exit 1; }

mkdir -p "$OUT"
# Three distinct free ports, all held open until chosen so they cannot coincide.
read -r HTTP_PORT GRPC_PORT METRICS_PORT < <("$PYTHON" - <<'PY'
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
for s in socks:
    s.close()
PY
)

SERVER_PGID=""
PA_PID=""
cleanup() {
  local rc=$?
  if [ -n "$PA_PID" ]; then kill -TERM "$PA_PID" 2>/dev/null || true; wait "$PA_PID" 2>/dev/null || true; PA_PID=""; fi
  if [ -n "$SERVER_PGID" ]; then
    kill -TERM -- "-$SERVER_PGID" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 -- "-$SERVER_PGID" 2>/dev/null || break; sleep 0.2; done
    if kill -0 -- "-$SERVER_PGID" 2>/dev/null; then
      log "server group $SERVER_PGID still alive after 10 s; sending SIGKILL"
      kill -KILL -- "-$SERVER_PGID" 2>/dev/null || true
    fi
    SERVER_PGID=""
  fi
  return $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

log "starting infermux: http=$HTTP_PORT grpc=$GRPC_PORT metrics=$METRICS_PORT (log: $OUT/server.log)"
# setsid: the server (and anything it spawns) gets its own process group, killed as a whole in cleanup.
# shellcheck disable=SC2086  # SERVER_ARGS is deliberately word-split
setsid "$PYTHON" -m infermux serve --allow-client-shm \
  --http-port "$HTTP_PORT" --grpc-port "$GRPC_PORT" --metrics-port "$METRICS_PORT" $SERVER_ARGS \
  >"$OUT/server.log" 2>&1 </dev/null &
SERVER_PID=$!
SERVER_PGID=$(ps -o pgid= -p "$SERVER_PID" 2>/dev/null | tr -d ' ' || true)
SERVER_PGID=${SERVER_PGID:-$SERVER_PID}

http_get() { curl -fsS --max-time 2 "http://127.0.0.1:$HTTP_PORT$1"; }
deadline=$((SECONDS + READY_TIMEOUT))
until http_get /v2/health/ready >/dev/null 2>&1; do
  if ! kill -0 "$SERVER_PID" 2>/dev/null; then
    log "server exited before becoming ready; last log lines:"; tail -20 "$OUT/server.log" >&2; exit 1
  fi
  if [ $SECONDS -ge $deadline ]; then
    log "server not ready after ${READY_TIMEOUT}s; last log lines:"; tail -20 "$OUT/server.log" >&2; exit 1
  fi
  sleep 0.25
done
log "server ready"
http_get /v2 >"$OUT/server_metadata.json" 2>/dev/null || true
log "server extensions: $(cat "$OUT/server_metadata.json" 2>/dev/null || echo '?')"

# --- perf_analyzer runs ----------------------------------------------------------------------------
run_mode() {
  local mode=$1; local -a args
  case $mode in
    http)     args=(-i http -u "127.0.0.1:$HTTP_PORT") ;;
    grpc)     args=(-i grpc -u "127.0.0.1:$GRPC_PORT") ;;
    http_shm) args=(-i http -u "127.0.0.1:$HTTP_PORT" --shared-memory system) ;;
    grpc_shm) args=(-i grpc -u "127.0.0.1:$GRPC_PORT" --shared-memory system) ;;
    *) log "unknown mode '$mode'"; echo 2 >"$OUT/$mode.rc"; return 0 ;;
  esac
  # shellcheck disable=SC2206  # PA_WINDOW / PA_EXTRA are deliberately word-split
  args=(-m "$MODEL" "${args[@]}" --concurrency-range "$CONCURRENCY" $PA_WINDOW $PA_EXTRA -f "$OUT/$mode.csv")
  if [ "$PA_METRICS" = 1 ]; then
    args+=(--collect-metrics --metrics-url "127.0.0.1:$METRICS_PORT/metrics" --metrics-interval 1000)
  fi
  rm -f "$OUT/$mode.csv" "$OUT/$mode.log" "$OUT/$mode.rc" "$OUT/$mode".unstable*.log
  printf '%q ' "$PA" "${args[@]}" >"$OUT/$mode.cmd"; echo >>"$OUT/$mode.cmd"
  log "mode $mode: $(cat "$OUT/$mode.cmd")"
  local rc attempt=0 shm_before
  shm_before=$(ls -A /dev/shm 2>/dev/null || true)
  while :; do
    rc=0
    # Background + wait (not a plain foreground command) so INT/TERM traps fire at once and clean up.
    timeout "$PA_TIMEOUT" "$PA" "${args[@]}" >"$OUT/$mode.log" 2>&1 </dev/null &
    PA_PID=$!
    wait "$PA_PID" || rc=$?
    PA_PID=""
    # Exit 2 = "Failed to obtain stable measurement" (noisy shared machine): try again, keep the old log.
    [ "$rc" -eq 2 ] && [ "$attempt" -lt "$PA_RETRIES" ] || break
    attempt=$((attempt + 1))
    mv "$OUT/$mode.log" "$OUT/$mode.unstable$attempt.log"
    log "mode $mode: no stable measurement; retry $attempt/$PA_RETRIES"
  done
  echo "$rc" >"$OUT/$mode.rc"
  # perf_analyzer leaves its shm objects (e.g. /dev/shm/OUTPUT0) behind when a registration fails:
  # remove the ones that appeared during this mode (nothing else may use /dev/shm concurrently, see top).
  if [[ $mode == *shm ]]; then
    local f
    for f in $(comm -13 <(printf '%s\n' "$shm_before" | sort) <(ls -A /dev/shm 2>/dev/null | sort)); do
      log "mode $mode: removing leftover /dev/shm/$f"; rm -f -- "/dev/shm/$f"
    done
  fi
  log "mode $mode: exit $rc"
  if ! kill -0 "$SERVER_PID" 2>/dev/null; then
    log "server died during mode $mode; last log lines:"; tail -20 "$OUT/server.log" >&2; return 1
  fi
}

for mode in $MODES; do
  run_mode "$mode" || break
done

cleanup
trap - EXIT

# --- summary ---------------------------------------------------------------------------------------
echo
echo "=== perf_analyzer vs infermux: model=$MODEL concurrency=$CONCURRENCY ($PA_WINDOW) ==="
for mode in $MODES; do
  rc=$(cat "$OUT/$mode.rc" 2>/dev/null || echo "not-run")
  tp=$(grep -a -m1 'Throughput:' "$OUT/$mode.log" 2>/dev/null | sed 's/^ *//' || true)
  printf '%-9s exit=%-3s %s\n' "$mode" "$rc" "${tp:-Throughput: n/a}"
  if [ -f "$OUT/$mode.log" ]; then
    # Server-side block (printed only when the server lists `statistics` in /v2 extensions).
    awk '/^  Server: *$/{s=1; next} s && /^    /{sub(/^ +/, ""); print "          server: " $0; next} {s=0}' "$OUT/$mode.log"
    if [ "$rc" != 0 ]; then
      grep -a -iE -m3 'error|failed|unable|unstable' "$OUT/$mode.log" | sed 's/^ */          /' || true
    fi
  fi
done
echo

"$PYTHON" "$HERE/summarize.py" "$OUT" || log "summarize.py failed"
