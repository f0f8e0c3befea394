#!/usr/bin/env bash
# OLD vs NEW system shared memory on the headline GPU path, same machine, same run.
#
# OLD = dbbb5ea (inputs read as zero-copy numpy views of an mmap of the client's region);
# NEW = the hardened tree (each access fstat()s the object and copies the input out with preadv).
# One ResNet-50 fp16 repository (benchmarks/gpu/models.py: 4 KIND_GPU instances, CUDA graphs,
# max_queue_delay 500 µs) is built once; then, alternating OLD, NEW, OLD, NEW, ... while the budget
# allows, each variant gets its own `infermux serve --frontends 4` (127.0.0.1, own process group)
# and perf_analyzer drives it at c=256 over gRPC + system shm, then over HTTP (binary), with
# nvidia-smi sampled beside each run. Results: OUT/ab_shm.json, ab_shm.md, ab_shm.log, ab_shm_raw.tgz
# (perf_analyzer CSVs and logs, nvidia-smi samples, server logs, config.pbtxt).
#
# On the device (carry .whl: the deps + NEW wheel, .whl/old/ the OLD wheel, perf_analyzer.tgz):
#   NEW_COMMIT=<short sha> timeout -k 10 570 bash benchmarks/hardening/ab_shm.sh
# Environment (defaults for the device):
#   OUT ($OUT)  WHL (.whl)  PYTHON (python3)  BUDGET_S (525: no new step starts that would end later)
#   ORDER ("old new old new old new")  CONC (256)  PA_TIMEOUT (80 s per perf_analyzer run)
#   DEVICE (cuda)  TINY (0; 1: ResNet-18 at 64x64, for a CPU dry run)  WORK (/tmp/ab_shm)
#   SKIP_INSTALL (0; 1: /tmp/site, /tmp/old_site, /tmp/new_site are already there)  PA (perf_analyzer
#   command; default: unpacked from WHL/perf_analyzer.tgz)  SITE_ROOT (/tmp)  PROTOS ("grpc_shm http")
#   NAME (ab_shm: the summary's file names)
# Bisecting: any other name in ORDER is a commit whose wheel is WHL/bisect/<name>/infermux-*.whl,
# installed into SITE_ROOT/<name>_site, e.g. ORDER="old 3fbda9c a13e3a9 new" NAME=bisect_shm.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
cd "$ROOT"

OUT=${OUT:?set OUT}
WHL=${WHL:-$ROOT/.whl}
PYTHON=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-525}
ORDER=${ORDER:-old new old new old new}
CONC=${CONC:-256}
PA_TIMEOUT=${PA_TIMEOUT:-80}
DEVICE=${DEVICE:-cuda}
TINY=${TINY:-0}
WORK=${WORK:-/tmp/ab_shm}
SKIP_INSTALL=${SKIP_INSTALL:-0}
SITE_ROOT=${SITE_ROOT:-/tmp}
PROTOS=${PROTOS:-grpc_shm http}
NAME=${NAME:-ab_shm}
OLD_COMMIT=dbbb5ea
PA_FLAGS="--concurrency-range $CONC --measurement-interval 4000 --stability-percentage 25 --max-trials 5"

mkdir -p "$OUT" "$WORK"
LOG=$OUT/$NAME.log
: >"$LOG"
log() { printf '[ab_shm %s +%ss] %s\n' "$(date +%H:%M:%S)" "$SECONDS" "$*" | tee -a "$LOG" >&2; }
left() { echo $((BUDGET_S - SECONDS)); }

SERVER_PGID=""
SMI_PID=""
stop_server() {
  [ -n "$SERVER_PGID" ] || return 0
  kill -TERM -- "-$SERVER_PGID" 2>/dev/null || true
  local i
  for i in $(seq 60); do kill -0 -- "-$SERVER_PGID" 2>/dev/null || break; sleep 0.25; done
  if kill -0 -- "-$SERVER_PGID" 2>/dev/null; then
    log "server group $SERVER_PGID alive 15 s after TERM: KILL"
    kill -KILL -- "-$SERVER_PGID" 2>/dev/null || true
    sleep 1
  fi
  SERVER_PGID=""
}
stop_smi() {
  [ -n "$SMI_PID" ] || return 0
  kill -TERM "$SMI_PID" 2>/dev/null || true
  wait "$SMI_PID" 2>/dev/null || true
  SMI_PID=""
}
finish() {
  stop_smi
  stop_server
  PYTHONPATH=$SITE_ROOT/site "$PYTHON" "$HERE/ab_shm.py" summarize --work "$WORK" --out "$OUT" \
    --name "$NAME" 2>&1 | tee -a "$LOG" >&2
  cp -f "$OUT/$NAME.md" "$WORK/" 2>/dev/null || true
  tar czf "$OUT/${NAME}_raw.tgz" -C "$WORK" --exclude=repo . 2>/dev/null || log "tar failed"
  log "done; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
}
trap finish EXIT
trap 'log "TERM/INT: stopping"; exit 143' TERM INT

# --- install ---------------------------------------------------------------------------------------
wheel_of() {  # the infermux wheel of a variant
  case $1 in
    new) ls "$WHL"/infermux-*.whl 2>/dev/null | head -1 ;;
    old) ls "$WHL"/old/infermux-*.whl 2>/dev/null | head -1 ;;
    *) ls "$WHL/bisect/$1"/infermux-*.whl 2>/dev/null | head -1 ;;
  esac
}
VARIANTS=$(printf '%s\n' $ORDER | awk '!seen[$0]++' | tr '\n' ' ')
declare -A WHEEL
for v in $VARIANTS; do
  WHEEL[$v]=$(wheel_of "$v")
  [ -n "${WHEEL[$v]}" ] || { log "no wheel for variant '$v'"; exit 1; }
done
if [ "$SKIP_INSTALL" != 1 ]; then
  mapfile -t DEPS < <(ls "$WHL"/*.whl | grep -v '/infermux-')
  pipi() { "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target "$@"; }
  rm -rf "$SITE_ROOT/site"
  { [ ${#DEPS[@]} -eq 0 ] || pipi "$SITE_ROOT/site" "${DEPS[@]}"; } || { log "pip install failed"; exit 1; }
  for v in $VARIANTS; do
    rm -rf "$SITE_ROOT/${v}_site"
    pipi "$SITE_ROOT/${v}_site" "${WHEEL[$v]}" || { log "pip install of $v failed"; exit 1; }
  done
  log "installed ${#DEPS[@]} deps into $SITE_ROOT/site; variants: $VARIANTS"
fi
declare -A WHICH
for v in $VARIANTS; do
  WHICH[$v]=$(PYTHONPATH=$SITE_ROOT/${v}_site:$SITE_ROOT/site "$PYTHON" "$HERE/ab_shm.py" which 2>&1)
  log "$v: ${WHEEL[$v]} -> ${WHICH[$v]}"
done
if [[ " $VARIANTS " == *" old "* && ${WHICH[old]} != *'"shm_maps_regions": true, "shm_uses_preadv": false'* ]] \
    || [[ " $VARIANTS " == *" new "* && ${WHICH[new]} != *'"shm_maps_regions": false, "shm_uses_preadv": true'* ]]; then
  log "OLD must map its regions and NEW must preadv; refusing to measure"; exit 1
fi

# --- perf_analyzer ---------------------------------------------------------------------------------
if [ -z "${PA:-}" ]; then
  mkdir -p /tmp/pa && tar xzf "$WHL/perf_analyzer.tgz" -C /tmp/pa || { log "no perf_analyzer bundle"; exit 1; }
  PA=/tmp/pa/wheel/perf_analyzer/bin/perf_analyzer
  if ! "$PA" --version >/dev/null 2>&1; then
    L=/tmp/pa/root/usr/lib/x86_64-linux-gnu
    PA="$L/ld-linux-x86-64.so.2 --library-path $L /tmp/pa/wheel/perf_analyzer/bin/perf_analyzer"
  fi
fi
read -r -a PA_CMD <<<"$PA"
log "perf_analyzer: ${PA_CMD[*]} ($("${PA_CMD[@]}" --version 2>&1 | head -1))"

# --- repository ------------------------------------------------------------------------------------
REPO_DIR=$WORK/repo
rm -rf "$REPO_DIR"
tiny=(); [ "$TINY" = 1 ] && tiny=(--tiny)
if ! PYTHONPATH=$SITE_ROOT/site timeout 180 "$PYTHON" "$HERE/ab_shm.py" export --repo "$REPO_DIR" \
    --device "$DEVICE" "${tiny[@]}" >"$WORK/export.json" 2>"$WORK/export.err"; then
  log "export failed: $(tail -5 "$WORK/export.err")"; exit 1
fi
cp "$REPO_DIR/resnet50/config.pbtxt" "$WORK/config.pbtxt"
log "repository built: $(head -c 300 "$WORK/export.json" | tr '\n' ' ')"

export VARIANTS PROTOS ORDER
HAVE_SMI=0; command -v nvidia-smi >/dev/null 2>&1 && HAVE_SMI=1
"$PYTHON" - "$WORK/meta.json" "$OLD_COMMIT" "${WHICH[old]:-}" "${WHICH[new]:-}" "$PA_FLAGS" "$HAVE_SMI" <<'PY'
import json, os, platform, subprocess, sys
path, old_commit, old_which, new_which, flags, smi = sys.argv[1:]
def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception as exc:
        return f"? ({exc})"
new_commit = os.environ.get("NEW_COMMIT") or sh("git rev-parse --short HEAD 2>/dev/null") or "HEAD (wheel from .whl)"
device = sh("nvidia-smi --query-gpu=name,driver_version --format=csv,noheader") if smi == "1" else "cpu (dry run)"
json.dump({"old_commit": old_commit, "new_commit": new_commit, "old_which": old_which,
           "new_which": new_which, "pa_flags": flags, "device": device, "cores": os.cpu_count(),
           "python": platform.python_version(), "order_planned": os.environ.get("ORDER", ""),
           "variants": os.environ.get("VARIANTS", "").split(), "protos": os.environ.get("PROTOS", "").split()},
          open(path, "w"), indent=1)
PY

# --- one round: one server, grpc_shm then http -------------------------------------------------------
ITER_EST=70   # first guess of one round's wall time; replaced by the longest round measured
DONE_ORDER=()
run_round() {
  local index=$1 variant=$2 site=$SITE_ROOT/${2}_site
  local hp gp mp
  read -r hp gp mp < <("$PYTHON" "$HERE/ab_shm.py" ports)
  local slog=$WORK/server_${index}_${variant}.log
  log "round $index $variant: starting infermux (http $hp, grpc $gp) from $site"
  PYTHONPATH=$site:$SITE_ROOT/site PYTHONUNBUFFERED=1 setsid "$PYTHON" -m infermux serve \
    --model-repository "$REPO_DIR" --host 127.0.0.1 --http-port "$hp" --grpc-port "$gp" \
    --metrics-port "$mp" --allow-client-shm true --frontends 4 >"$slog" 2>&1 </dev/null &
  local spid=$!
  SERVER_PGID=$(ps -o pgid= -p "$spid" 2>/dev/null | tr -d ' ')
  SERVER_PGID=${SERVER_PGID:-$spid}
  local ready
  if ! ready=$("$PYTHON" "$HERE/ab_shm.py" wait-ready --url "http://127.0.0.1:$hp" --model resnet50 \
      --pid "$spid" --timeout 120 2>>"$LOG"); then
    log "round $index $variant: server not ready; log tail: $(tail -5 "$slog" | tr '\n' ' ')"
    stop_server; return 1
  fi
  log "round $index $variant: ready in ${ready}s"
  local proto args t rc shm_before f
  for proto in $PROTOS; do
    case $proto in
      grpc_shm) args=(-i grpc -u "127.0.0.1:$gp" --shared-memory system) ;;
      http) args=(-i http -u "127.0.0.1:$hp") ;;
    esac
    t=$PA_TIMEOUT
    if [ $(( $(left) - 10 )) -lt "$t" ]; then t=$(( $(left) - 10 )); fi
    if [ "$t" -lt 25 ]; then log "round $index $variant $proto: skipped (budget)"; continue; fi
    local stem=${index}_${variant}_${proto}
    # shellcheck disable=SC2086  # PA_FLAGS is deliberately word-split
    local cmd=("${PA_CMD[@]}" -m resnet50 "${args[@]}" $PA_FLAGS -f "$WORK/pa_$stem.csv")
    printf '%q ' timeout -k 5 "$t" "${cmd[@]}" >"$WORK/pa_$stem.cmd"; echo >>"$WORK/pa_$stem.cmd"
    if [ "$HAVE_SMI" = 1 ]; then
      nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader,nounits \
        -lms 250 >"$WORK/smi_$stem.csv" 2>/dev/null </dev/null &
      SMI_PID=$!
    fi
    shm_before=$(ls -A /dev/shm 2>/dev/null | sort)
    rc=0
    timeout -k 5 "$t" "${cmd[@]}" >"$WORK/pa_$stem.log" 2>&1 </dev/null || rc=$?
    stop_smi
    echo "$rc" >"$WORK/pa_$stem.rc"
    if [ "$proto" = grpc_shm ]; then  # perf_analyzer's shm objects left behind by a failed run
      for f in $(comm -13 <(printf '%s\n' "$shm_before") <(ls -A /dev/shm 2>/dev/null | sort)); do
        rm -f -- "/dev/shm/$f"
      done
    fi
    log "round $index $variant $proto: rc=$rc $(grep -a -m1 'Throughput:' "$WORK/pa_$stem.log" | sed 's/^ *//')"
    if ! kill -0 "$spid" 2>/dev/null; then
      log "round $index $variant: server died; log tail: $(tail -5 "$slog" | tr '\n' ' ')"; break
    fi
  done
  stop_server
  log "round $index $variant: server stopped"
}

index=0
for variant in $ORDER; do
  if [ $((SECONDS + ITER_EST)) -gt "$BUDGET_S" ]; then
    log "stopping before round $index ($variant): ${ITER_EST}s per round would pass the ${BUDGET_S}s budget"
    break
  fi
  started=$SECONDS
  run_round "$index" "$variant" || true
  DONE_ORDER+=("$variant")
  took=$((SECONDS - started))
  [ "$took" -gt "$ITER_EST" ] && ITER_EST=$took
  "$PYTHON" - "$WORK/meta.json" "${DONE_ORDER[*]}" <<'PY'
import json, sys
m = json.load(open(sys.argv[1])); m["order_done"] = sys.argv[2]; json.dump(m, open(sys.argv[1], "w"), indent=1)
PY
  PYTHONPATH=$SITE_ROOT/site "$PYTHON" "$HERE/ab_shm.py" summarize --work "$WORK" --out "$OUT" \
    --name "$NAME" >/dev/null 2>&1 || true
  index=$((index + 1))
done
