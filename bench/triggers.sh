#!/bin/bash
# bench/triggers.sh — trigger throughput against the machine's HTTP ceiling.
#
# Starts bench/hello (a bare libmicrohttpd server, same threading mode as the
# engine) and `idemflow serve` on a fresh SQLite database, both on 127.0.0.1
# ephemeral ports, then drives each with wrk over the same connections, in
# this order:
#
#   ceiling  POST ~100 B of JSON to hello                      -> all 200
#   dup      POST one of BENCH_DUPS pre-created triggers again -> all 200
#   new      POST a trigger with an order id never seen before -> all 201
#
# Each scenario runs BENCH_RUNS times; the table shows the run with the
# median requests/s, and how much CPU other processes took meanwhile (a
# shared machine makes the ratios meaningless).  Afterwards the server is
# stopped and the executions table is counted: every 201 must be a row.
#
# Environment (all optional):
#   BUILD=build                 where the binaries live
#   IDEMFLOW_BIN=$BUILD/idemflow
#   HELLO_BIN=$BUILD/bench/hello   (compiled into the temp dir if missing)
#   BENCH_CONNECTIONS=64  BENCH_THREADS=2  BENCH_DURATION=10s  BENCH_RUNS=3
#   BENCH_DUPS=100               executions the dup scenario repeats
#   BENCH_KEEP=1                 keep the temp dir (db, logs, wrk output)
#
# Exit status: 0 when every response had the expected status and the row
# count matches; 1 otherwise.  Missing the ratio targets is reported, not an
# error: this is a benchmark, not a timed test.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-build}
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
IDEMFLOW_BIN=${IDEMFLOW_BIN:-$BUILD/idemflow}
HELLO_BIN=${HELLO_BIN:-$BUILD/bench/hello}
CONNS=${BENCH_CONNECTIONS:-64}
THREADS=${BENCH_THREADS:-2}
DURATION=${BENCH_DURATION:-10s}
RUNS=${BENCH_RUNS:-3}
DUPS=${BENCH_DUPS:-100}
case $DURATION in
  *[0-9]s) SECS=${DURATION%s} ;;
  *[0-9]m) SECS=$((${DURATION%m} * 60)) ;;
  *[0-9]) SECS=$DURATION ;;
  *) SECS=x ;;
esac
[[ $SECS =~ ^[0-9]+$ ]] && [ "$SECS" -gt 0 ] || { echo "triggers: BENCH_DURATION must be like 10s or 1m" >&2; exit 2; }
TARGET_NEW=30
TARGET_DUP=60

die() { echo "triggers: $*" >&2; exit 1; }
for tool in wrk curl timeout; do
  command -v $tool >/dev/null || die "$tool is required (apt-get install $tool)"
done
[ -x "$IDEMFLOW_BIN" ] || die "no server binary at $IDEMFLOW_BIN (run make, or set IDEMFLOW_BIN)"

TMP=$(mktemp -d /tmp/idemflow-bench.XXXXXX)
HELLO_PID="" ENGINE_PID=""
cleanup() {
  local pid
  for pid in $HELLO_PID $ENGINE_PID; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in $HELLO_PID $ENGINE_PID; do
    timeout 10 tail --pid="$pid" -f /dev/null 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  done
  if [ "${BENCH_KEEP:-0}" = 1 ]; then echo "kept $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ ! -x "$HELLO_BIN" ]; then
  HELLO_BIN=$TMP/hello
  # shellcheck disable=SC2046
  cc -std=c11 -D_GNU_SOURCE -O2 "$ROOT/bench/hello.c" -o "$HELLO_BIN" \
    $(pkg-config --cflags --libs libmicrohttpd) -lpthread || die "cannot build bench/hello.c"
fi

# Waits (at most 15 s) for "listening on HOST port N" in log $1 written by process $2; prints N.
wait_port() {
  local i port
  for i in $(seq 1 300); do
    port=$(grep -oE 'listening on [^ ]+ port [0-9]+' "$1" 2>/dev/null | head -1 | grep -oE '[0-9]+$' || true)
    if [ -n "$port" ]; then echo "$port"; return 0; fi
    kill -0 "$2" 2>/dev/null || { cat "$1" >&2; return 1; }
    sleep 0.05
  done
  cat "$1" >&2
  return 1
}

"$HELLO_BIN" 0 2>"$TMP/hello.log" &
HELLO_PID=$!
HELLO_PORT=$(wait_port "$TMP/hello.log" "$HELLO_PID") || die "hello did not start"

DB=$TMP/bench.db
"$IDEMFLOW_BIN" serve --listen 127.0.0.1:0 --db "sqlite:$DB" >"$TMP/engine.log" 2>&1 &
ENGINE_PID=$!
ENGINE_PORT=$(wait_port "$TMP/engine.log" "$ENGINE_PID") || die "idemflow did not start"
BASE=http://127.0.0.1:$ENGINE_PORT

# call METHOD PATH BODY EXPECTED-STATUS-PATTERN
call() {
  local code
  code=$(curl -sS --max-time 10 -o "$TMP/last.json" -w '%{http_code}' -X "$1" \
    -H 'Content-Type: application/json' --data-binary "$3" "$BASE$2") || die "$1 $2: curl failed"
  [[ $code =~ ^$4$ ]] || die "$1 $2: got $code, want $4: $(cat "$TMP/last.json")"
}

WS=bench WF=orders
TRIGGER=/v1/workspaces/$WS/workflows/$WF/entry-points/start/trigger
call PUT /v1/workspaces/$WS '{}' '20[01]'
call PUT /v1/workspaces/$WS/workflows/$WF '{"vertices":{
  "start":{"type":"ENTRY_POINT","config":{"idempotencyFields":"order.id"}},
  "t":{"type":"TRANSFORM","config":{"output":"= payload"}}},
  "edges":[{"from":"start","to":"t"}]}' '20[01]'
# The dup scenario's executions; the body matches triggers_common.lua's order().
for i in $(seq 0 $((DUPS - 1))); do
  call POST "$TRIGGER" \
    "{\"order\":{\"id\":\"dup-$i\",\"amount\":1250,\"currency\":\"EUR\"},\"customer\":\"c-0042\",\"note\":\"bench\"}" 201
done

# CPU taken by other processes, to flag runs that were not alone on the
# machine.  foreign_snap FILE writes "pid ticks" (utime+stime+cutime+cstime)
# of every user-space process outside this script's process tree, then the
# machine's total ticks as pid 0.  foreign_pct A B prints the % of all CPU time
# between the two snapshots that those processes used (a process that exited
# in between counts once its parent reaps it).
foreign_snap() {
  local total
  total=$(awk '$1 == "cpu" { for (i = 2; i <= NF; i++) t += $i; print t }' /proc/stat)
  { cat /proc/[0-9]*/stat 2>/dev/null || true; } | awk -v me=$$ -v total="$total" '
    { pid = $1; line = $0; sub(/^.*\) /, "", line); split(line, f, " ")
      ppid[pid] = f[2]; t[pid] = f[12] + f[13] + f[14] + f[15] }
    END {
      ours[me] = 1
      do { grew = 0; for (p in ppid) if (!(p in ours) && (ppid[p] in ours)) { ours[p] = 1; grew = 1 } } while (grew)
      for (p in t) if (!(p in ours) && p > 2 && ppid[p] != 2) print p, t[p]
      print 0, total }' >"$1"
}
foreign_pct() {
  awk 'NR == FNR { a[$1] = $2; next } { if ($1 == 0) tot = $2 - a[0]; else d += $2 - (($1 in a) ? a[$1] : 0) }
       END { printf "%d", (tot > 0 ? 100 * d / tot : 0) }' "$1" "$2"
}

# run SCENARIO URL N -> leaves RESULT fields (and foreign=, the % of all CPUs
# that other processes used meanwhile) in $TMP/<scenario>.<N>
run() {
  local out=$TMP/$1.$3
  foreign_snap "$TMP/cpu.0"
  BENCH_DIR=$ROOT/bench BENCH_RUN=$3 BENCH_DUPS=$DUPS \
    timeout $((SECS + 30)) wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" --latency \
    -s "$ROOT/bench/triggers_$1.lua" "$2" >"$out.wrk" 2>&1 || die "wrk $1 failed: $(tail -5 "$out.wrk")"
  foreign_snap "$TMP/cpu.1"
  { grep '^RESULT ' "$out.wrk" | sed 's/^RESULT //' | tr -d '\n' || die "no RESULT from wrk $1"
    echo " foreign=$(foreign_pct "$TMP/cpu.0" "$TMP/cpu.1")"; } >"$out"
  printf '  %-8s run %d: %s\n' "$1" "$3" "$(cat "$out")"
}

# Background load: % of all CPUs busy over 2 s while both servers sit idle.
# Other work on the machine steals from both sides of the ratio unevenly.
cpu_busy() {
  local a b c d e f g h t1 i1
  read -r _ a b c d e f g h _ </proc/stat; t1=$((a + b + c + d + e + f + g + h)); i1=$((d + e))
  sleep 2
  read -r _ a b c d e f g h _ </proc/stat
  echo $((100 - 100 * (d + e - i1) / (a + b + c + d + e + f + g + h - t1)))
}
BUSY=$(cpu_busy)
[ "$BUSY" -le 10 ] || echo "triggers: WARNING: the machine is already ${BUSY}% busy; figures will be low and noisy" >&2

# Order: ceiling, dup, new.  A new execution also dispatches its TRANSFORM
# step to the engine's workers, which keep executing the backlog after wrk
# stops; running dup before new keeps that work out of the dup figures (and in
# the new ones, where it belongs: it is what sustained new triggers cost).
echo "triggers: $RUNS run(s) each of ceiling, dup, new; $CONNS connections, $THREADS wrk threads, $DURATION per run"
for s in hello dup new; do
  for r in $(seq 1 "$RUNS"); do
    if [ $s = hello ]; then run $s "http://127.0.0.1:$HELLO_PORT/" "$r"; else run $s "$BASE$TRIGGER" "$r"; fi
  done
done

metric() { awk -v k="$1" 'index($0, k " ") == 1 {print $2}' "$TMP/metrics"; }
curl -sS --max-time 10 "$BASE/metrics" >"$TMP/metrics" || die "GET /metrics failed"
created_metric=$(metric 'idemflow_triggers_total{outcome="created"}')
finished_metric=$(metric 'idemflow_executions_finished_total{status="completed"}')
finished_metric=${finished_metric:-0}

# Stop the engine cleanly, then count what is on disk.
kill -TERM "$ENGINE_PID"
timeout 30 tail --pid="$ENGINE_PID" -f /dev/null || die "engine did not stop"
wait "$ENGINE_PID" 2>/dev/null || true
ENGINE_PID=""
if command -v sqlite3 >/dev/null; then
  rows=$(sqlite3 "$DB" 'SELECT count(*) FROM executions')
elif command -v python3 >/dev/null; then
  rows=$(python3 -c 'import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute("SELECT count(*) FROM executions").fetchone()[0])' "$DB")
else
  die "need sqlite3 or python3 to count the executions"
fi
db_bytes=0
for f in "$DB" "$DB-wal"; do
  [ -f "$f" ] && db_bytes=$((db_bytes + $(stat -c %s "$f")))
done

# field FILE KEY
field() { tr ' ' '\n' <"$1" | sed -n "s/^$2=//p"; }
# median SCENARIO -> file of the run with the median requests/s
median() {
  local r
  for r in $(seq 1 "$RUNS"); do echo "$(field "$TMP/$1.$r" rps) $TMP/$1.$r"; done |
    sort -g | awk '{a[NR]=$2} END{print a[int((NR+1)/2)]}'
}
sum() {
  local r t=0
  for r in $(seq 1 "$RUNS"); do t=$((t + $(field "$TMP/$1.$r" "$2"))); done
  echo $t
}

echo
echo "machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), $(uname -sr)," \
  "db on $(df -T "$TMP" | awk 'NR==2 {print $2}'), background load ${BUSY}%"
printf '%-10s %12s %9s %9s %11s %8s %8s\n' scenario "requests/s" "p50 ms" "p99 ms" unexpected sockerr foreign
foreign_max=0
for s in hello new dup; do
  m=$(median $s)
  name=$s; [ $s = hello ] && name=ceiling
  fm=$(for r in $(seq 1 "$RUNS"); do field "$TMP/$s.$r" foreign; done | sort -n | tail -1)
  [ "$fm" -gt "$foreign_max" ] && foreign_max=$fm
  printf '%-10s %12.0f %9.2f %9.2f %11d %8d %7d%%\n' "$name" "$(field "$m" rps)" "$(field "$m" p50_ms)" \
    "$(field "$m" p99_ms)" "$(sum $s unexpected)" "$(sum $s sockerr)" "$fm"
done
ceil=$(field "$(median hello)" rps)
ratio() { awk -v a="$1" -v b="$ceil" -v t="$2" -v n="$3" 'BEGIN{
  r = 100 * a / b; printf "%s/ceiling = %.1f%% (target %d%%: %s)\n", n, r, t, (r >= t ? "met" : "NOT met")}'; }
echo
ratio "$(field "$(median new)" rps)" $TARGET_NEW new
ratio "$(field "$(median dup)" rps)" $TARGET_DUP dup
echo "(requests/s, p50, p99: the median-throughput run of $RUNS; unexpected, sockerr: summed over"
echo " all runs; foreign: the most CPU other processes took during any run, in % of all CPUs)"
[ "$foreign_max" -le 10 ] || echo "WARNING: other processes took up to ${foreign_max}% of the CPUs; these figures are not representative"

new201=$(sum new expected)
inflight=$((created_metric - DUPS - new201))
echo
echo "executions: $rows rows on disk after shutdown; server counted $created_metric created" \
  "($DUPS dup seeds + $new201 201s seen by wrk + $inflight answered after wrk hung up)"
echo "background: the workers had completed $finished_metric of those executions by the end of the last run"
echo "database: $db_bytes bytes (db + wal)"

fail=0
for s in hello new dup; do
  n=$(sum $s non2xx)
  if [ "$n" -ne 0 ]; then echo "FAIL: $s got $n non-2xx responses" >&2; fail=1; fi
  n=$(sum $s unexpected)
  if [ "$n" -ne 0 ]; then echo "FAIL: $s got $n responses with an unexpected status" >&2; fail=1; fi
done
if [ "$rows" != "$created_metric" ]; then
  echo "FAIL: $rows rows on disk but the server answered $created_metric 201s" >&2; fail=1
fi
# wrk drops the requests in flight when its clock runs out; the server still
# answers (and commits) them, so up to CONNS per new run may be unseen by wrk.
if [ "$inflight" -lt 0 ] || [ "$inflight" -gt $((CONNS * RUNS)) ]; then
  echo "FAIL: wrk saw $new201 201s, the server created $((created_metric - DUPS))" >&2; fail=1
fi
exit $fail
