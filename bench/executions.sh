#!/bin/bash
# bench/executions.sh — executions per second of a 3-vertex workflow
# (ENTRY_POINT -> TRANSFORM -> TRANSFORM), from trigger to `completed`, on
# SQLite, beside the HTTP ceiling (bench/hello) measured in the same run.
#
#   ceiling    wrk POSTing ~100 B of JSON to bench/hello            -> req/s
#   pipeline   wrk POSTing new triggers for BENCH_DURATION; then wait until
#              every execution completed.  executions/s = completed /
#              (last completion - first creation), from the database's own
#              timestamps; trigger->completed p50/p99 likewise (ms).
#
# Environment: BUILD, IDEMFLOW_BIN, HELLO_BIN, BENCH_CONNECTIONS (64),
# BENCH_THREADS (2), BENCH_DURATION (10s), BENCH_WORKERS (2), BENCH_KEEP.
# Bounded: wrk runs BENCH_DURATION; the drain waits at most 120 s.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-build}
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
IDEMFLOW_BIN=${IDEMFLOW_BIN:-$BUILD/idemflow}
HELLO_BIN=${HELLO_BIN:-$BUILD/bench/hello}
CONNS=${BENCH_CONNECTIONS:-64}
THREADS=${BENCH_THREADS:-2}
DURATION=${BENCH_DURATION:-10s}
WORKERS=${BENCH_WORKERS:-2}
PY=/usr/bin/python3

tmp=$(mktemp -d /tmp/idemflow-bench-exec.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ "${BENCH_KEEP:-0}" = 1 ] && echo "kept $tmp" || rm -rf "$tmp"
}
trap cleanup EXIT

port() { $PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() { for _ in $(seq 1 200); do curl -fs "$1" >/dev/null 2>&1 && return 0; sleep 0.05; done; return 1; }

HP=$(port); EP=$(port)
"$HELLO_BIN" "$HP" >/dev/null 2>&1 & pids+=($!)
"$IDEMFLOW_BIN" serve --listen 127.0.0.1:$EP --db "sqlite:$tmp/db" --workers "$WORKERS" \
  2>"$tmp/server.log" & pids+=($!)
SERVER=$!
wait_http "http://127.0.0.1:$HP/" || true
wait_http "http://127.0.0.1:$EP/healthz"
H='Content-Type: application/json'
curl -fs -XPUT "http://127.0.0.1:$EP/v1/workspaces/bench" -H "$H" -d '{}' >/dev/null
curl -fs -XPUT "http://127.0.0.1:$EP/v1/workspaces/bench/workflows/three" -H "$H" -d '{
  "vertices": {
    "start": {"type": "ENTRY_POINT", "config": {"idempotencyFields": "order.id"}},
    "price": {"type": "TRANSFORM", "config": {"output": {"id": "= payload.order.id", "total": "= payload.order.amount * 2"}}},
    "label": {"type": "TRANSFORM", "config": {"output": "= '\''order-'\'' & steps.price.id & '\'':'\'' & $string(steps.price.total)"}}},
  "edges": [{"from": "start", "to": "price"}, {"from": "price", "to": "label"}]}' >/dev/null

cat >"$tmp/hello.lua" <<'EOF'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"order":{"id":"hello-0000000000","amount":1250,"currency":"eur","items":[1,2,3]}}'
EOF
cat >"$tmp/new.lua" <<'EOF'
-- tid is the global thread:set() writes (a local here would shadow it and
-- make both threads send the same ids: duplicates, not new triggers)
local n = 0
local counter = 0
function setup(thread) counter = counter + 1; thread:set("tid", counter) end
function request()
  n = n + 1
  return wrk.format("POST", "/v1/workspaces/bench/workflows/three/entry-points/start/trigger",
    {["Content-Type"] = "application/json"},
    string.format('{"order":{"id":"e-%d-%d","amount":%d}}', tid, n, n % 1000))
end
EOF

echo "bench/executions: $(nproc) cores, $CONNS connections, $THREADS wrk threads, $DURATION, $WORKERS workers"
ceiling=$(wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" -s "$tmp/hello.lua" "http://127.0.0.1:$HP/" \
  | awk '/Requests\/sec/ {print $2}')
wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" --latency -s "$tmp/new.lua" "http://127.0.0.1:$EP" >"$tmp/wrk.txt"
trig=$(awk '/Requests\/sec/ {print $2}' "$tmp/wrk.txt")
for _ in $(seq 1 1200); do
  left=$($PY - "$tmp/db" <<'EOF'
import sqlite3, sys
c = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
print(c.execute("select count(*) from executions where status = 'running'").fetchone()[0])
EOF
)
  [ "$left" = 0 ] && break
  sleep 0.1
done
kill -TERM "$SERVER"; wait "$SERVER" 2>/dev/null || true
$PY - "$tmp/db" "$ceiling" "$trig" <<'EOF'
import sqlite3, sys
db, ceiling, trig = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
c = sqlite3.connect(db)
rows = c.execute("select created_at, updated_at, status from executions").fetchall()
done = [r for r in rows if r[2] == "completed"]
lat = sorted(u - s for s, u, _ in done)
span = (max(u for _, u, _ in done) - min(s for s, _, _ in done)) / 1000.0
steps = c.execute("select count(*) from steps where state = 'COMPLETED'").fetchone()[0]
eps = len(done) / span
pct = lambda p: lat[min(len(lat) - 1, int(p / 100 * len(lat)))]
print(f"  HTTP ceiling (hello)           {ceiling:10.0f} req/s")
print(f"  triggers accepted (201)        {trig:10.0f} req/s   ({100 * trig / ceiling:.0f}% of ceiling)")
print(f"  executions completed           {len(done):10d} of {len(rows)} ({steps} steps)")
print(f"  completed executions/s         {eps:10.0f}        ({100 * eps / ceiling:.0f}% of ceiling; target 5000/s)")
print(f"  trigger->completed p50 / p99   {pct(50):7.0f} / {pct(99):.0f} ms")
if len(done) != len(rows):
    print("  FAIL: executions left unfinished")
    sys.exit(1)
EOF
