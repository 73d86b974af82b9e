#!/bin/bash
# bench/gateway_ab.sh — an A/B of engine binaries on bench/gateway.sh, for a
# machine whose speed drifts by ±20 % within minutes (docs/bench.md).
#
#   bench/gateway_ab.sh ROUNDS BIN_A BIN_B [BIN_C ...]
#
# Runs bench/gateway.sh on SQLite once per binary per round, the binaries in
# turn (A B A B …), each with one ceiling run of its own, and prints one line
# per run, then the medians per binary: executions/s, % of the ceiling, the
# engine's and the mock's CPU µs per execution, and e/m = engine µs ÷ mock
# µs.  The mock does the same work per call whatever the engine, so e/m
# cancels most of the machine's drift: compare binaries by it first.
#
# Environment: BENCH_EXECUTIONS (20000) and BENCH_CALLS (20000) per run;
# anything else bench/gateway.sh reads passes through.  Exit status 1 when a
# run failed (its output is printed).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
[ $# -ge 3 ] || { echo "usage: $0 ROUNDS BIN_A BIN_B [BIN_C ...]" >&2; exit 2; }
ROUNDS=$1
shift
for b in "$@"; do [ -x "$b" ] || { echo "gateway_ab: no binary at $b" >&2; exit 2; }; done
OUT=$(mktemp /tmp/idemflow-gwab.XXXXXX)
trap 'rm -f "$OUT"' EXIT

for r in $(seq 1 "$ROUNDS"); do
  i=0
  for b in "$@"; do
    i=$((i + 1))
    if ! res=$(IDEMFLOW_BIN=$b BENCH_STORES=sqlite BENCH_CEILING_RUNS=1 \
      BENCH_EXECUTIONS=${BENCH_EXECUTIONS:-20000} BENCH_CALLS=${BENCH_CALLS:-20000} \
      "$ROOT/bench/gateway.sh" 2>&1); then
      echo "$res"
      echo "gateway_ab: run $r of $b failed" >&2
      exit 1
    fi
    # "sqlite  EXEC/S  P50  P99  TRIG/S  INFLIGHT  RATIO%  FOREIGN%  ENG / MOCK / DRV …"
    row=$(echo "$res" | awk -v b="$i" -v r="$r" '$1 == "sqlite" && $3 ~ /^[0-9]+$/ {
      ratio = $7; sub(/%/, "", ratio)
      printf "%s %s %s %s %s %s\n", b, r, $2, ratio, $9, $11 }')
    [ -n "$row" ] || { echo "$res"; echo "gateway_ab: no sqlite result line in run $r of $b" >&2; exit 1; }
    echo "$row" >>"$OUT"
    echo "$row" | awk -v name="$b" '{ printf "round %s %-40s %6d exec/s %5.1f %% engine %3d us mock %3d us e/m %.2f\n", $2, name, $3, $4, $5, $6, $5 / $6 }'
  done
done

# median B EXPR: the median over binary B's runs of an awk expression of the row
median() {
  awk -v b="$1" '$1 == b { print '"$2"' }' "$OUT" | sort -g |
    awk '{ a[NR] = $1 } END { if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}
echo "medians over $ROUNDS rounds:"
i=0
for b in "$@"; do
  i=$((i + 1))
  printf '  %-40s %6.0f exec/s %5.1f %% engine %5.1f us mock %5.1f us e/m %.2f\n' \
    "$b" "$(median $i '$3')" "$(median $i '$4')" "$(median $i '$5')" "$(median $i '$6')" \
    "$(median $i '$5 / $6')"
done
