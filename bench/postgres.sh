#!/bin/bash
# bench/postgres.sh — trigger throughput and trigger->completed executions/s
# on PostgreSQL with 1, 2 and 3 engine processes sharing one database, beside
# pgbench running the dedup insert alone on the same cluster in the same run
# (the database's ceiling; issue 5, "Performance").
#
#   ceiling    pgbench -c CONNS: INSERT INTO t (id, payload) VALUES
#              (md5(random()::text), '<~100 B of JSON>') ON CONFLICT (id)
#              DO NOTHING, one statement per transaction          -> tps
#   N procs    N `idemflow serve` on a fresh database; N wrk in parallel, one
#              per process, CONNS/N connections each, POSTing new triggers
#              (bench/triggers_new.lua) of a 3-vertex workflow (ENTRY_POINT ->
#              TRANSFORM -> TRANSFORM, as bench/executions.sh) for
#              BENCH_DURATION; then wait until no execution is running.
#              triggers/s = the wrk instances' req/s summed; executions/s =
#              completed / (max(updated_at) - min(created_at)); p50/p99 of
#              updated_at - created_at (ms), from the executions table; also
#              the database's transactions per execution (pg_stat_database)
#              and the completion rate while triggers arrived vs after.
#
# Environment (all optional): BUILD (build), IDEMFLOW_BIN ($BUILD/idemflow),
# BENCH_CONNECTIONS (64), BENCH_THREADS (2, wrk threads in all), BENCH_DURATION
# (10, seconds), BENCH_PROCESSES ("1 2 3"), BENCH_WORKERS (2 per process),
# BENCH_DRAIN (180, seconds to wait for the backlog), BENCH_KEEP (1: keep the
# temp dir; the cluster is always removed), PG_BIN (tests/pg.sh's default).
#
# Without PostgreSQL (a server in PG_BIN, psql, pgbench) it prints SKIPPED and
# exits 0.  Exit status 1 when a trigger was not answered 201, the rows
# disagree with the 201s (beyond one request in flight per connection), or an
# execution did not complete within BENCH_DRAIN.  The ratios are reported,
# not judged.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-build}
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
IDEMFLOW_BIN=${IDEMFLOW_BIN:-$BUILD/idemflow}
CONNS=${BENCH_CONNECTIONS:-64}
THREADS=${BENCH_THREADS:-2}
SECS=${BENCH_DURATION:-10}
SECS=${SECS%s}
PROCS=${BENCH_PROCESSES:-1 2 3}
WORKERS=${BENCH_WORKERS:-2}
DRAIN=${BENCH_DRAIN:-180}
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}

die() { echo "postgres: $*" >&2; exit 1; }
[[ $SECS =~ ^[0-9]+$ ]] && [ "$SECS" -gt 0 ] || die "BENCH_DURATION must be a number of seconds"
for tool in wrk curl timeout; do
  command -v $tool >/dev/null || die "$tool is required (apt-get install $tool)"
done
# scripts/deps.sh bench does not install PostgreSQL (deps.sh test does): skip, loudly.
if [ ! -x "$PG_BIN/initdb" ] || ! command -v psql >/dev/null || ! command -v pgbench >/dev/null; then
  echo "postgres: SKIPPED: no PostgreSQL server in $PG_BIN or no psql/pgbench (apt-get install postgresql)"
  exit 0
fi
[ -x "$IDEMFLOW_BIN" ] || die "no server binary at $IDEMFLOW_BIN (run make, or set IDEMFLOW_BIN)"

TMP=$(mktemp -d /tmp/idemflow-bench-pg.XXXXXX)
# The cluster's own dir: tests/pg.sh hands it to the server's user.
export IDEMFLOW_PG_DIR
IDEMFLOW_PG_DIR=$(mktemp -d /tmp/idemflow-bench-pgdata.XXXXXX)
ENGINES=() WRKS=()
stop_engines() {
  local p
  for p in "${ENGINES[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${ENGINES[@]}"; do
    timeout 20 tail --pid="$p" -f /dev/null 2>/dev/null || kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  ENGINES=()
}
cleanup() {
  local p
  for p in "${WRKS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  stop_engines
  "$ROOT/tests/pg.sh" stop >/dev/null 2>&1 || true
  rm -rf "$IDEMFLOW_PG_DIR"
  if [ "${BENCH_KEEP:-0}" = 1 ]; then echo "kept $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$ROOT/tests/pg.sh" start >/dev/null || die "cannot start a PostgreSQL cluster"
ADMIN=$("$ROOT/tests/pg.sh" url)
PGROOT=$(head -1 "$IDEMFLOW_PG_DIR/data/postmaster.pid")
dburl() { echo "${ADMIN%/*}/$1"; }
q() { psql -X -q -At -v ON_ERROR_STOP=1 "$1" -c "$2"; }

# CPU taken by other processes meanwhile, in % of all CPUs: the machine's busy
# time (/proc/stat) minus this script's process tree and the cluster's
# (utime + stime + the reaped children's) minus kernel threads (loopback TCP
# work lands partly in softirq threads).  foreign_snap FILE; foreign_pct A B.
foreign_snap() {
  { awk '$1 == "cpu" { for (i = 2; i <= NF; i++) t += $i; print "T", t, t - $5 - $6 }' /proc/stat
    { cat /proc/[0-9]*/stat 2>/dev/null || true; } | awk -v me=$$ -v pg="$PGROOT" '
      { pid = $1; line = $0; sub(/^.*\) /, "", line); split(line, f, " ")
        ppid[pid] = f[2]; t[pid] = f[12] + f[13] + f[14] + f[15] }
      END {
        ours[me] = 1; ours[pg] = 1
        do { grew = 0; for (p in ppid) if (!(p in ours) && (ppid[p] in ours)) { ours[p] = 1; grew = 1 } } while (grew)
        for (p in t) if (p in ours) print "O", p, t[p]; else if (p == 2 || ppid[p] == 2) print "K", p, t[p] }'
  } >"$1"
}
foreign_pct() {
  awk 'NR == FNR { if ($1 == "T") { t0 = $2; b0 = $3 } else a[$1 " " $2] = $3; next }
       $1 == "T" { tot = $2 - t0; busy = $3 - b0; next }
       { mine += $3 - (($1 " " $2) in a ? a[$1 " " $2] : 0) }
       END { f = tot > 0 ? 100 * (busy - mine) / tot : 0; printf "%d", (f < 0 ? 0 : f) }' "$1" "$2"
}

# ---- the ceiling: pgbench, the dedup insert alone ------------------------------
PAYLOAD='{"order":{"id":"new-r1-t1-1","amount":1250,"currency":"EUR"},"customer":"c-0042","note":"bench"}'
q "$ADMIN" "CREATE DATABASE ceiling"
q "$(dburl ceiling)" 'CREATE TABLE t (id text COLLATE "C" PRIMARY KEY, payload json NOT NULL)'
echo "INSERT INTO t (id, payload) VALUES (md5(random()::text), '$PAYLOAD') ON CONFLICT (id) DO NOTHING;" \
  >"$TMP/insert.sql"
PGB_THREADS=$THREADS; [ "$PGB_THREADS" -gt "$CONNS" ] && PGB_THREADS=$CONNS
echo "postgres: $(nproc) CPUs, $CONNS connections, ${SECS}s per run, processes: $PROCS, $WORKERS workers each"
foreign_snap "$TMP/cpu.0"
timeout $((SECS + 60)) pgbench -n -M prepared -c "$CONNS" -j "$PGB_THREADS" -T "$SECS" \
  -f "$TMP/insert.sql" "$(dburl ceiling)" >"$TMP/pgbench.txt" 2>&1 || die "pgbench failed: $(tail -5 "$TMP/pgbench.txt")"
foreign_snap "$TMP/cpu.1"
PGB_FOREIGN=$(foreign_pct "$TMP/cpu.0" "$TMP/cpu.1")
TPS=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time)/\1/p' "$TMP/pgbench.txt")
PGB_LAT=$(sed -n 's/^latency average = \([0-9.]*\) ms/\1/p' "$TMP/pgbench.txt")
PGB_FAILED=$(sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p' "$TMP/pgbench.txt")
[ -n "$TPS" ] || die "no tps from pgbench: $(cat "$TMP/pgbench.txt")"
PGB_ROWS=$(q "$(dburl ceiling)" 'SELECT count(*) FROM t')
printf '  ceiling  pgbench: %.0f tps, latency avg %s ms, %s rows, %s failed, foreign %s%%\n' \
  "$TPS" "$PGB_LAT" "$PGB_ROWS" "${PGB_FAILED:-0}" "$PGB_FOREIGN"

# ---- the engine: N processes, one database -----------------------------------
KEY=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
# Waits (at most 30 s) for "listening on HOST port N" in log $1 of process $2; prints N.
wait_port() {
  local i port
  for i in $(seq 1 600); do
    port=$(grep -oE 'listening on [^ ]+ port [0-9]+' "$1" 2>/dev/null | head -1 | grep -oE '[0-9]+$' || true)
    if [ -n "$port" ]; then echo "$port"; return 0; fi
    kill -0 "$2" 2>/dev/null || { cat "$1" >&2; return 1; }
    sleep 0.05
  done
  cat "$1" >&2
  return 1
}
# call BASE METHOD PATH BODY
call() {
  local code
  code=$(curl -sS --max-time 20 -o "$TMP/last.json" -w '%{http_code}' -X "$2" \
    -H 'Content-Type: application/json' --data-binary "$4" "$1$3") || die "$2 $3: curl failed"
  [[ $code =~ ^20[01]$ ]] || die "$2 $3: got $code: $(cat "$TMP/last.json")"
}
field() { tr ' ' '\n' <"$1" | sed -n "s/^$2=//p"; }

FAIL=0
TRIGGER=/v1/workspaces/bench/workflows/three/entry-points/start/trigger
for n in $PROCS; do
  db=bench_n$n
  q "$ADMIN" "CREATE DATABASE $db"
  url=$(dburl "$db")
  ports=()
  for i in $(seq 1 "$n"); do
    IDEMFLOW_SECRETS_KEY=$KEY "$IDEMFLOW_BIN" serve --listen 127.0.0.1:0 --db "$url" \
      --workers "$WORKERS" >"$TMP/engine.$n.$i.log" 2>&1 &
    ENGINES+=($!)
  done
  for i in $(seq 1 "$n"); do
    ports+=("$(wait_port "$TMP/engine.$n.$i.log" "${ENGINES[$((i - 1))]}")") || die "engine $i of $n did not start"
  done
  base=http://127.0.0.1:${ports[0]}
  call "$base" PUT /v1/workspaces/bench '{}'
  call "$base" PUT /v1/workspaces/bench/workflows/three '{
    "vertices": {
      "start": {"type": "ENTRY_POINT", "config": {"idempotencyFields": "order.id"}},
      "price": {"type": "TRANSFORM", "config": {"output": {"id": "= payload.order.id", "total": "= payload.order.amount * 2"}}},
      "label": {"type": "TRANSFORM", "config": {"output": "= '\''order-'\'' & steps.price.id & '\'':'\'' & $string(steps.price.total)"}}},
    "edges": [{"from": "start", "to": "price"}, {"from": "price", "to": "label"}]}'

  # One wrk per process, CONNS/N connections each (the remainder to the first
  # ones), THREADS/N threads each (at least 1), all at once.
  foreign_snap "$TMP/cpu.0"
  WRKS=()
  for i in $(seq 1 "$n"); do
    c=$((CONNS / n + (i <= CONNS % n ? 1 : 0)))
    t=$((THREADS / n)); [ "$t" -lt 1 ] && t=1; [ "$t" -gt "$c" ] && t=$c
    BENCH_DIR=$ROOT/bench BENCH_RUN="n${n}p$i" \
      timeout $((SECS + 30)) wrk -t"$t" -c"$c" -d"${SECS}s" --latency \
      -s "$ROOT/bench/triggers_new.lua" "http://127.0.0.1:${ports[$((i - 1))]}$TRIGGER" \
      >"$TMP/wrk.$n.$i" 2>&1 &
    WRKS+=($!)
  done
  for i in $(seq 1 "$n"); do
    wait "${WRKS[$((i - 1))]}" || die "wrk $i of $n failed: $(tail -5 "$TMP/wrk.$n.$i")"
  done
  WRKS=()
  foreign_snap "$TMP/cpu.1"
  foreign=$(foreign_pct "$TMP/cpu.0" "$TMP/cpu.1")
  rps=0 ok=0 bad=0 non2xx=0 sockerr=0
  for i in $(seq 1 "$n"); do
    grep '^RESULT ' "$TMP/wrk.$n.$i" | sed 's/^RESULT //' >"$TMP/res.$n.$i" || die "no RESULT from wrk $i of $n"
    rps=$(awk -v a="$rps" -v b="$(field "$TMP/res.$n.$i" rps)" 'BEGIN{print a + b}')
    ok=$((ok + $(field "$TMP/res.$n.$i" expected)))
    bad=$((bad + $(field "$TMP/res.$n.$i" unexpected)))
    non2xx=$((non2xx + $(field "$TMP/res.$n.$i" non2xx)))
    sockerr=$((sockerr + $(field "$TMP/res.$n.$i" sockerr)))
  done

  # Drain: every execution completed (or the bound ran out).
  running=-1
  for _ in $(seq 1 $((DRAIN * 5))); do
    running=$(q "$url" "SELECT count(*) FROM executions WHERE status = 'running'")
    [ "$running" = 0 ] && break
    sleep 0.2
  done
  stop_engines
  q "$url" "SELECT count(*),
      count(*) FILTER (WHERE status = 'completed'),
      count(*) FILTER (WHERE status NOT IN ('completed', 'running')),
      coalesce(max(updated_at) FILTER (WHERE status = 'completed') - min(created_at), 0),
      coalesce(percentile_disc(0.5) WITHIN GROUP (ORDER BY updated_at - created_at)
               FILTER (WHERE status = 'completed'), 0),
      coalesce(percentile_disc(0.99) WITHIN GROUP (ORDER BY updated_at - created_at)
               FILTER (WHERE status = 'completed'), 0),
      (SELECT count(*) FROM steps WHERE state = 'COMPLETED'),
      (SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()),
      (SELECT count(*) FROM executions WHERE status = 'completed'
         AND updated_at <= (SELECT max(created_at) FROM executions)),
      coalesce(max(created_at) - min(created_at), 0)
    FROM executions" | tr '|' ' ' >"$TMP/db.$n"
  read -r rows completed other span p50 p99 steps xacts during tspan <"$TMP/db.$n"
  eps=$(awk -v d="$completed" -v s="$span" 'BEGIN{printf "%.1f", (s > 0 ? 1000 * d / s : 0)}')
  txe=$(awk -v x="$xacts" -v r="$rows" 'BEGIN{printf "%.1f", (r > 0 ? x / r : 0)}')
  # Completions while triggers still arrived, and afterwards (the backlog alone).
  while_trig=$(awk -v d="$during" -v s="$tspan" 'BEGIN{printf "%.0f", (s > 0 ? 1000 * d / s : 0)}')
  after=$(awk -v d="$((completed - during))" -v s="$((span - tspan))" 'BEGIN{printf "%.0f", (s > 0 ? 1000 * d / s : 0)}')
  echo "$n $rps $eps $p50 $p99 $foreign $txe $while_trig $after" >>"$TMP/table"
  printf '  %d process(es): %.0f triggers/s (%d 201, %d other, %d sockerr), %d rows, %d completed (%d steps), %.0f executions/s, p50 %d ms, p99 %d ms, %s transactions/execution, %s/s completed while triggers arrived and %s/s after, foreign %d%%\n' \
    "$n" "$rps" "$ok" "$bad" "$sockerr" "$rows" "$completed" "$steps" "$eps" "$p50" "$p99" "$txe" "$while_trig" "$after" "$foreign"
  if [ "$bad" -ne 0 ] || [ "$non2xx" -ne 0 ]; then
    echo "FAIL: $n process(es): $bad triggers not answered 201 ($non2xx non-2xx)" >&2; FAIL=1
  fi
  # wrk hangs up on the requests in flight when its clock runs out; the
  # engine still commits them: at most one unseen 201 per connection.
  if [ "$rows" -lt "$ok" ] || [ "$rows" -gt $((ok + CONNS)) ]; then
    echo "FAIL: $n process(es): $rows rows for $ok 201s (at most $CONNS more allowed)" >&2; FAIL=1
  fi
  if [ "$completed" -ne "$rows" ] || [ "$steps" -ne $((3 * rows)) ]; then
    echo "FAIL: $n process(es): $completed of $rows executions completed ($running running, $other other, $steps steps) after ${DRAIN}s" >&2
    FAIL=1
  fi
done

echo
echo "machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), $(uname -sr);" \
  "pgbench ceiling $(printf '%.0f' "$TPS") tps (-c $CONNS -j $PGB_THREADS -T $SECS, foreign ${PGB_FOREIGN}%)"
printf '%-9s %10s %12s %8s %8s %12s %12s %7s %8s %8s %7s\n' processes triggers/s executions/s "p50 ms" \
  "p99 ms" "trig/ceiling" "exec/ceiling" tx/exec "exec/s" "exec/s" foreign
printf '%-9s %10s %12s %8s %8s %12s %12s %7s %8s %8s %7s\n' "" "" "" "" "" "" "" "" during after ""
awk -v tps="$TPS" '{ printf "%-9d %10.0f %12.0f %8d %8d %11.1f%% %11.1f%% %7.1f %8d %8d %6d%%\n",
  $1, $2, $3, $4, $5, 100 * $2 / tps, 100 * $3 / tps, $7, $8, $9, $6 }' "$TMP/table"
echo "(triggers/s: wrk req/s summed over the processes; executions/s and p50/p99 (trigger ->"
echo " completed) from executions.created_at/updated_at; tx/exec: the database's committed and rolled"
echo " back transactions per execution (pg_stat_database); exec/s during/after: completions while"
echo " triggers still arrived / after the last one; foreign: CPU other processes took, % of all CPUs)"
fmax=$(awk -v m="$PGB_FOREIGN" '$6 > m { m = $6 } END { print m }' "$TMP/table")
[ "$fmax" -le 10 ] || echo "WARNING: other processes took up to ${fmax}% of the CPUs; these figures are not representative"
exit $FAIL
