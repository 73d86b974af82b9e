#!/bin/bash
# bench/gateway.sh — completed charge executions per second (trigger ->
# GATEWAY POST to the mock provider -> TRANSFORM -> completed) with about 200
# executions in flight, beside the outbound-call ceiling of the same client
# against the same mock in the same run (issue 6, "Performance").
#
#   ceiling   build/bench/gwcalls: BENCH_CALLS POSTs to the mock's
#             /v1/charges through the engine's gateway client (libcurl multi),
#             BENCH_INFLIGHT in flight, a fresh Idempotency-Key each -> calls/s
#             (BENCH_CEILING_RUNS runs; the median counts)
#   engine    `idemflow serve` on each store of BENCH_STORES (a fresh SQLite
#             database; a throwaway tests/pg.sh cluster), workflow
#             ENTRY_POINT (order.id) -> GATEWAY POST /v1/charges
#             (Idempotency-Key 'charge-' & order id) -> TRANSFORM.
#             build/bench/gwdrive (bench/gwdrive.c, one epoll thread) sends
#             BENCH_EXECUTIONS new triggers over BENCH_DRIVER_CONNS
#             keep-alive connections, never more than BENCH_INFLIGHT executions
#             unfinished (BENCH_DRIVE: each trigger waits for its execution
#             with `Prefer: wait`, or the driver reads the engine's /metrics
#             every 10 ms), then waits until all finished.  executions/s = completed /
#             (max(updated_at) - min(created_at)); p50/p99 of updated_at -
#             created_at, from the executions table.  The mock's /stats must
#             show exactly one charge for every order.
#   budget    CPU per bare call (gwcalls' client_us + the mock's) and per charge
#             execution, how busy the CPUs were in each, and what a charge
#             execution may cost for the target at that busy share.
#
# Environment (all optional): BUILD (build), IDEMFLOW_BIN, MOCKPAY_BIN,
# GWCALLS_BIN ($BUILD/bench/gwcalls), GWDRIVE_BIN ($BUILD/bench/gwdrive),
# BENCH_STORES ("sqlite postgres";
# postgres is skipped when PostgreSQL is not installed), BENCH_EXECUTIONS
# (5000), BENCH_INFLIGHT (200), BENCH_CALLS (20000), BENCH_CEILING_RUNS (3),
# BENCH_DRIVE (poll, the default: the driver gates on /metrics, read every
# BENCH_POLL_MS; wait: each trigger asks `Prefer: wait=60` and its connection
# holds the execution to its end, so exactly BENCH_INFLIGHT are unfinished),
# BENCH_DRIVER_CONNS (wait: BENCH_INFLIGHT; poll: 64), BENCH_POLL_MS (10: how often the driver reads
# /metrics), BENCH_SERVE_FLAGS (extra `serve` flags), BENCH_WORKERS (4),
# BENCH_TIMEOUT (300 s per store), BENCH_KEEP (1: keep the temp dir).
#
# Exit status 1 when a call or trigger got an unexpected status, an
# execution did not complete, or an order was not charged exactly once.
# Missing the 50 % target is reported, not an error.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-build}
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
IDEMFLOW_BIN=${IDEMFLOW_BIN:-$BUILD/idemflow}
MOCKPAY_BIN=${MOCKPAY_BIN:-$BUILD/idemflow-mockpay}
GWCALLS_BIN=${GWCALLS_BIN:-$BUILD/bench/gwcalls}
GWDRIVE_BIN=${GWDRIVE_BIN:-$BUILD/bench/gwdrive}
STORES=${BENCH_STORES:-sqlite postgres}
EXECS=${BENCH_EXECUTIONS:-5000}
INFLIGHT=${BENCH_INFLIGHT:-200}
CALLS=${BENCH_CALLS:-20000}
CEIL_RUNS=${BENCH_CEILING_RUNS:-3}
DRIVE=${BENCH_DRIVE:-poll}
case $DRIVE in
  wait) DCONNS=${BENCH_DRIVER_CONNS:-$INFLIGHT} POLL_MS=0 ;;
  poll) DCONNS=${BENCH_DRIVER_CONNS:-64} POLL_MS=${BENCH_POLL_MS:-10} ;;
  *) echo "gateway: BENCH_DRIVE must be wait or poll" >&2; exit 2 ;;
esac
WORKERS=${BENCH_WORKERS:-4}
LIMIT=${BENCH_TIMEOUT:-300}
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
PY=/usr/bin/python3
TARGET=50

die() { echo "gateway: $*" >&2; exit 1; }
for tool in curl timeout; do command -v $tool >/dev/null || die "$tool is required"; done
[ -x "$PY" ] || die "$PY is required"
for b in "$IDEMFLOW_BIN" "$MOCKPAY_BIN" "$GWCALLS_BIN" "$GWDRIVE_BIN"; do
  [ -x "$b" ] || die "no binary at $b (run make)"
done

TMP=$(mktemp -d /tmp/idemflow-bench-gw.XXXXXX)
PGDIR=""
MOCK_PID="" ENGINE_PID=""
stop_pid() { # stop_pid PID: SIGTERM, wait at most 20 s, then SIGKILL
  [ -n "$1" ] || return 0
  kill -TERM "$1" 2>/dev/null || true
  timeout 20 tail --pid="$1" -f /dev/null 2>/dev/null || kill -KILL "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}
cleanup() {
  stop_pid "$ENGINE_PID"
  stop_pid "$MOCK_PID"
  if [ -n "$PGDIR" ]; then
    IDEMFLOW_PG_DIR=$PGDIR "$ROOT/tests/pg.sh" stop >/dev/null 2>&1 || true
    rm -rf "$PGDIR"
  fi
  if [ "${BENCH_KEEP:-0}" = 1 ]; then echo "kept $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# CPU taken by other processes meanwhile, in % of all CPUs: the machine's
# busy time minus this script's process tree (and the cluster's, $PGROOT)
# minus kernel threads.  foreign_snap FILE; foreign_pct A B.
PGROOT=0
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
# utime + stime of each live thread of a process, summed by thread name with
# its number dropped (worker-0..3 -> worker): "NAME TICKS" lines.
thread_ticks() {
  for t in /proc/"$1"/task/*/stat; do cat "$t" 2>/dev/null || true; done | awk '
    { name = $0; sub(/^[0-9]+ \(/, "", name); sub(/\) .*$/, "", name); sub(/-[0-9]+$/, "", name)
      line = $0; sub(/^.*\) /, "", line); split(line, f, " "); t[name] += f[12] + f[13] }
    END { for (n in t) print n, t[n] }' | sort
}
# utime + stime of a process (all its threads, exited ones too), in clock ticks.
cpu_ticks() { awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$1/stat"; }
# The same for a process and its children (the PostgreSQL cluster: the
# postmaster and its backends, which live as long as the engine's pool).
tree_ticks() {
  { cat /proc/[0-9]*/stat 2>/dev/null || true; } | awk -v root="$1" '
    { pid = $1; sub(/^.*\) /, ""); if (pid == root || $2 == root) t += $12 + $13 } END { print t + 0 }'
}
TCK=$(getconf CLK_TCK)
field() { tr ' ' '\n' <"$1" | sed -n "s/^$2=//p"; }

# ---- the mock provider and the ceiling -----------------------------------------
"$MOCKPAY_BIN" --listen 127.0.0.1:0 --quiet >"$TMP/mock.out" 2>"$TMP/mock.err" &
MOCK_PID=$!
MP=""
for _ in $(seq 1 200); do
  MP=$(grep -o '"port":[0-9]*' "$TMP/mock.out" 2>/dev/null | cut -d: -f2 || true)
  [ -n "$MP" ] && break
  kill -0 "$MOCK_PID" 2>/dev/null || die "mockpay did not start: $(cat "$TMP/mock.err")"
  sleep 0.05
done
[ -n "$MP" ] || die "mockpay did not report its port"
MOCK=http://127.0.0.1:$MP

echo "gateway: $(nproc) CPUs; ceiling $CEIL_RUNS x $CALLS calls, $INFLIGHT in flight;" \
  "engine: $EXECS executions, <= $INFLIGHT in flight ($DRIVE driver), $WORKERS workers; stores: $STORES"
for r in $(seq 1 "$CEIL_RUNS"); do
  foreign_snap "$TMP/cpu.0"
  m0=$(cpu_ticks "$MOCK_PID")
  timeout $((LIMIT)) "$GWCALLS_BIN" "$MOCK/v1/charges" "$CALLS" "$INFLIGHT" "ceiling-r$r" \
    >"$TMP/ceiling.$r" 2>"$TMP/ceiling.$r.err" || die "gwcalls failed: $(cat "$TMP/ceiling.$r.err")"
  m1=$(cpu_ticks "$MOCK_PID")
  foreign_snap "$TMP/cpu.1"
  mock_us=$(awk -v m=$((m1 - m0)) -v t="$TCK" -v n="$CALLS" 'BEGIN { printf "%.0f", 1e6 * m / t / n }')
  sed -i "s/^RESULT //; s/\$/ mock_us=$mock_us foreign=$(foreign_pct "$TMP/cpu.0" "$TMP/cpu.1")/" "$TMP/ceiling.$r"
  printf '  ceiling run %d: %s\n' "$r" "$(cat "$TMP/ceiling.$r")"
done
CEIL_FILE=$(for r in $(seq 1 "$CEIL_RUNS"); do echo "$(field "$TMP/ceiling.$r" cps) $TMP/ceiling.$r"; done |
  sort -g | awk '{a[NR] = $2} END {print a[int((NR + 1) / 2)]}')
CEIL=$(field "$CEIL_FILE" cps)
curl -fsS --max-time 10 -XPOST "$MOCK/reset" >/dev/null || die "POST /reset failed"

wait_port() { # wait_port LOG PID -> the engine's port (at most 30 s)
  local port
  for _ in $(seq 1 600); do
    port=$(grep -oE 'listening on [^ ]+ port [0-9]+' "$1" 2>/dev/null | head -1 | grep -oE '[0-9]+$' || true)
    if [ -n "$port" ]; then echo "$port"; return 0; fi
    kill -0 "$2" 2>/dev/null || { cat "$1" >&2; return 1; }
    sleep 0.05
  done
  return 1
}
call() { # call BASE METHOD PATH BODY
  local code
  code=$(curl -sS --max-time 20 -o "$TMP/last.json" -w '%{http_code}' -X "$2" \
    -H 'Content-Type: application/json' --data-binary "$4" "$1$3") || die "$2 $3: curl failed"
  [[ $code =~ ^20[01]$ ]] || die "$2 $3: got $code: $(cat "$TMP/last.json")"
}

KEY=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
TRIGGER=/v1/workspaces/bench/workflows/charge/entry-points/start/trigger
FAIL=0
for store in $STORES; do
  case $store in
    sqlite) DBURL="sqlite:$TMP/gw.db" ;;
    postgres)
      if [ ! -x "$PG_BIN/initdb" ] || ! command -v psql >/dev/null; then
        echo "  postgres: skipped (no PostgreSQL in $PG_BIN)"; continue
      fi
      PGDIR=$(mktemp -d /tmp/idemflow-bench-gwpg.XXXXXX)
      pgconf=""
      [ "${BENCH_PG_STATEMENTS:-0}" = 1 ] && pgconf="shared_preload_libraries = 'pg_stat_statements'"
      IDEMFLOW_PG_CONF=$pgconf IDEMFLOW_PG_DIR=$PGDIR "$ROOT/tests/pg.sh" start >/dev/null || die "cannot start a PostgreSQL cluster"
      PGROOT=$(head -1 "$PGDIR/data/postmaster.pid")
      admin=$(IDEMFLOW_PG_DIR=$PGDIR "$ROOT/tests/pg.sh" url)
      psql -X -q -v ON_ERROR_STOP=1 "$admin" -c 'CREATE DATABASE gw' || die "CREATE DATABASE failed"
      DBURL=${admin%/*}/gw
      if [ "${BENCH_PG_STATEMENTS:-0}" = 1 ]; then
        psql -X -q -v ON_ERROR_STOP=1 "$DBURL" -c 'CREATE EXTENSION pg_stat_statements' ||
          die "CREATE EXTENSION pg_stat_statements failed"
      fi ;;
    *) die "unknown store '$store' (sqlite, postgres)" ;;
  esac
  IDEMFLOW_SECRETS_KEY=$KEY "$IDEMFLOW_BIN" serve --listen 127.0.0.1:0 --db "$DBURL" \
    --workers "$WORKERS" ${BENCH_SERVE_FLAGS:-} >"$TMP/engine.$store.log" 2>&1 &
  ENGINE_PID=$!
  EP=$(wait_port "$TMP/engine.$store.log" "$ENGINE_PID") || die "idemflow did not start on $store"
  base=http://127.0.0.1:$EP
  call "$base" PUT /v1/workspaces/bench '{}'
  call "$base" PUT /v1/workspaces/bench/workflows/charge '{
    "vertices": {
      "start": {"type": "ENTRY_POINT", "config": {"idempotencyFields": "order.id"}},
      "charge": {"type": "GATEWAY", "config": {"method": "POST", "url": "'"$MOCK"'/v1/charges",
        "headers": {"Idempotency-Key": "= '\''charge-'\'' & payload.order.id"},
        "body": {"order": "= payload.order.id", "amount": 100}}},
      "receipt": {"type": "TRANSFORM", "config": {"output": {"order": "= payload.order.id", "charge": "= steps.charge.body.id"}}}},
    "edges": [{"from": "start", "to": "charge"}, {"from": "charge", "to": "receipt"}]}'

  foreign_snap "$TMP/cpu.0"
  e0=$(cpu_ticks "$ENGINE_PID") m0=$(cpu_ticks "$MOCK_PID") p0=$(tree_ticks "$PGROOT")
  thread_ticks "$ENGINE_PID" >"$TMP/threads0.$store"
  timeout $((LIMIT + 30)) "$GWDRIVE_BIN" "$EP" "$TRIGGER" "$EXECS" "$INFLIGHT" "$DCONNS" "$store" "$LIMIT" "$POLL_MS" \
    >"$TMP/driver.$store" 2>"$TMP/driver.$store.err" || die "driver failed on $store: $(tail -5 "$TMP/driver.$store.err")"
  e1=$(cpu_ticks "$ENGINE_PID") m1=$(cpu_ticks "$MOCK_PID") p1=$(tree_ticks "$PGROOT")
  thread_ticks "$ENGINE_PID" >"$TMP/threads1.$store"
  foreign_snap "$TMP/cpu.1"
  foreign=$(foreign_pct "$TMP/cpu.0" "$TMP/cpu.1")
  sed -i 's/^RESULT //' "$TMP/driver.$store"
  stop_pid "$ENGINE_PID"
  ENGINE_PID=""

  # From the store: rows, completed, span, p50/p99 (ms), completed steps.
  if [ "$store" = sqlite ]; then
    $PY - "$TMP/gw.db" >"$TMP/db.$store" <<'EOF'
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
rows = c.execute("select status, created_at, updated_at from executions").fetchall()
done = sorted(u - s for st, s, u in rows if st == "completed")
span = (max(u for st, s, u in rows if st == "completed") - min(s for _, s, _ in rows)) if done else 0
pct = lambda p: done[min(len(done) - 1, int(p / 100 * len(done)))] if done else 0
steps = c.execute("select count(*) from steps where state = 'COMPLETED'").fetchone()[0]
deferred = c.execute("select count(*) from step_attempts where outcome = 'deferred'").fetchone()[0]
print(len(rows), len(done), span, pct(50), pct(99), steps, deferred)
EOF
  else
    psql -X -q -At -F ' ' -v ON_ERROR_STOP=1 "$DBURL" -c "SELECT count(*),
        count(*) FILTER (WHERE status = 'completed'),
        coalesce(max(updated_at) FILTER (WHERE status = 'completed') - min(created_at), 0),
        coalesce(percentile_disc(0.5) WITHIN GROUP (ORDER BY updated_at - created_at) FILTER (WHERE status = 'completed'), 0),
        coalesce(percentile_disc(0.99) WITHIN GROUP (ORDER BY updated_at - created_at) FILTER (WHERE status = 'completed'), 0),
        (SELECT count(*) FROM steps WHERE state = 'COMPLETED'),
        (SELECT count(*) FROM step_attempts WHERE outcome = 'deferred')
      FROM executions" >"$TMP/db.$store"
  fi
  # deferred: calls put off because their destination had its share of
  # the calls in flight (--max-calls-per-destination; docs/gateway.md)
  read -r rows completed span p50 p99 steps deferred <"$TMP/db.$store"

  # The provider's count: exactly one charge per order, one order per execution.
  curl -fsS --max-time 30 "$MOCK/stats" >"$TMP/stats.$store" || die "GET /stats failed"
  curl -fsS --max-time 10 -XPOST "$MOCK/reset" >/dev/null || die "POST /reset failed"
  read -r charges orders once replays conns < <($PY - "$TMP/stats.$store" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
per = s["charges_per_order"]
print(s["charges"], len(per), sum(1 for v in per.values() if v == 1), s.get("replays", 0),
      s.get("connections", -1))
EOF
)
  eps=$(awk -v d="$completed" -v s="$span" 'BEGIN{printf "%.1f", (s > 0 ? 1000 * d / s : 0)}')
  # CPU per execution (us): the engine's (plus PostgreSQL's) and the mock's
  # over the driver's run, the driver's own.
  cpu=$(awk -v e=$((e1 - e0)) -v m=$((m1 - m0)) -v d="$(field "$TMP/driver.$store" cpu_us)" -v t="$TCK" -v n="$EXECS" \
    -v pg=$((p1 - p0)) 'BEGIN { printf "%.0f %.0f %.0f %.0f", 1e6 * e / t / n, 1e6 * m / t / n, d / n, 1e6 * pg / t / n }')
  echo "$store $eps $p50 $p99 $(field "$TMP/driver.$store" trig_rps) $(field "$TMP/driver.$store" inflight_avg) $foreign $cpu" >>"$TMP/table"
  printf '  %s: %s\n  %s: %d rows, %d completed (%d steps), %.0f executions/s, p50 %d ms, p99 %d ms, %d calls deferred;' \
    "$store" "$(cat "$TMP/driver.$store")" "$store" "$rows" "$completed" "$steps" "$eps" "$p50" "$p99" "$deferred"
  printf ' mock: %d charges, %d orders, %d charged once, %d replays, %d connections; foreign %d%%\n' \
    "$charges" "$orders" "$once" "$replays" "$conns" "$foreign"
  # Where the engine's CPU went, per thread kind (threads that exited during
  # the run, e.g. PostgreSQL's per-connection ones, are missing here).
  printf '  %s: engine CPU us per execution by thread:%s\n' "$store" "$(join -a 2 -e 0 -o 0,1.2,2.2 \
    "$TMP/threads0.$store" "$TMP/threads1.$store" | awk -v t="$TCK" -v n="$EXECS" '
      { us = 1e6 * ($3 - $2) / t / n; if (us >= 0.5) printf " %s %.0f", $1, us }')"
  if [ "$store" = postgres ] && [ "${BENCH_PG_STATEMENTS:-0}" = 1 ]; then
    echo "  postgres: statements per execution (pg_stat_statements, the whole run; calls/exec, us/call, % of the time)"
    psql -X -q -At -F ' | ' "$DBURL" -c "SELECT round(calls::numeric / $EXECS, 2),
        round((total_exec_time * 1000 / calls)::numeric, 1),
        round((100 * total_exec_time / sum(total_exec_time) OVER ())::numeric, 1),
        (SELECT CASE WHEN length(q) > 120 THEN left(q, 50) || ' … ' || right(q, 65) ELSE q END
         FROM (SELECT regexp_replace(query, '\s+', ' ', 'g') AS q) z)
      FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
      ORDER BY total_exec_time DESC LIMIT 25" | sed 's/^/    /'
  fi
  ok=$(field "$TMP/driver.$store" ok)
  if [ "$ok" -ne "$EXECS" ]; then echo "FAIL: $store: $ok of $EXECS triggers answered 201" >&2; FAIL=1; fi
  if [ "$rows" -ne "$EXECS" ] || [ "$completed" -ne "$EXECS" ] || [ "$steps" -ne $((3 * EXECS)) ]; then
    echo "FAIL: $store: $completed of $rows executions completed ($steps steps), $EXECS triggered" >&2; FAIL=1
  fi
  if [ "$charges" -ne "$EXECS" ] || [ "$orders" -ne "$EXECS" ] || [ "$once" -ne "$EXECS" ]; then
    echo "FAIL: $store: $charges charges for $orders orders, $once charged exactly once; want $EXECS" >&2; FAIL=1
  fi
done

echo
echo "machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), $(uname -sr)"
printf 'ceiling (gwcalls, same client): %.0f calls/s, p50 %s ms, p99 %s ms (median of %d; foreign %s%%)\n' \
  "$CEIL" "$(field "$CEIL_FILE" p50_ms)" "$(field "$CEIL_FILE" p99_ms)" "$CEIL_RUNS" "$(field "$CEIL_FILE" foreign)"
printf '%-9s %13s %9s %9s %11s %10s %15s %8s %24s\n' store executions/s "p50 ms" "p99 ms" triggers/s "in flight" \
  "exec/ceiling" foreign "CPU us engine/mock/drv"
[ -f "$TMP/table" ] && awk -v c="$CEIL" -v t=$TARGET '{ r = 100 * $2 / c
  printf "%-9s %13.0f %9d %9d %11.0f %10.0f %14.1f%% %7d%% %14d / %3d / %3d   (target %d%%: %s)%s\n", $1, $2, $3, $4, $5, $6, r, $7,
    $8, $9, $10, t, (r >= t ? "met" : "NOT met"), ($11 > 0 ? sprintf("; PostgreSQL %d us", $11) : "") }' "$TMP/table"
echo "(executions/s and p50/p99 (trigger -> completed) from executions.created_at/updated_at;"
echo " triggers/s: the driver's rate; in flight: mean unfinished executions it saw; foreign: CPU of"
echo " other processes, % of all CPUs; CPU us: per execution, of the engine, the mock and the driver"
echo " (and of the PostgreSQL cluster);"
echo " the ceiling's mock_us is the mock's CPU per call, client_us gwcalls' own)"
# The CPU budget behind the ratio: what one bare call costs, what one charge
# execution costs, how busy the CPUs were in each, and so what a charge
# execution may cost at that busy share for the target to be met.
awk -v c="$CEIL" -v cu="$(field "$CEIL_FILE" client_us)" -v mu="$(field "$CEIL_FILE" mock_us)" \
  -v ncpu="$(nproc)" -v t=$TARGET '
  BEGIN { call = cu + mu; cb = 100 * c * call / (ncpu * 1e6)
    printf "budget: a bare call %d us of CPU (client %d + mock %d), CPUs %.0f%% busy in the ceiling run\n", call, cu, mu, cb }
  { tot = $8 + $9 + $10 + $11; b = 100 * $2 * tot / (ncpu * 1e6); need = (t / 100) * c
    allow = need > 0 ? b / 100 * ncpu * 1e6 / need : 0
    printf "  %s: a charge execution %d us (%.1f bare calls), CPUs %.0f%% busy; %d%% at that share needs <= %d us (engine <= %d)\n",
      $1, tot, (call > 0 ? tot / call : 0), b, t, allow, allow - $9 - $10 - $11 }' "$([ -f "$TMP/table" ] && echo "$TMP/table" || echo /dev/null)"
fmax=$({ for r in $(seq 1 "$CEIL_RUNS"); do field "$TMP/ceiling.$r" foreign; done
  [ -f "$TMP/table" ] && awk '{print $7}' "$TMP/table"; } | sort -n | tail -1)
[ "${fmax:-0}" -le 10 ] || echo "WARNING: other processes took up to ${fmax}% of the CPUs; these figures are not representative"
exit $FAIL
