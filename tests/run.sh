#!/bin/bash
# Runs every test layer and prints one closing line "total: N passed, N failed, N skipped".
#   unit:        build/tests/test_* (cmocka), each a binary
#   integration: tests/integration/test_*.py (pytest, real server over loopback),
#                on SQLite and, when IDEMFLOW_TEST_PG is set or a throwaway
#                cluster can be started, on PostgreSQL
#   fuzz:        with SANITIZER containing "address", a short libFuzzer run of each target
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export IDEMFLOW_BIN="$PWD/$BUILD/idemflow"
export IDEMFLOW_MOCKPAY="$PWD/$BUILD/idemflow-mockpay"
export IDEMFLOW_CONFORMANCE_DIR=${IDEMFLOW_CONFORMANCE_DIR:-$PWD/../shared/conformance}
export TSAN_OPTIONS="suppressions=$PWD/tests/tsan.supp ${TSAN_OPTIONS:-}"
export ASAN_OPTIONS="detect_leaks=1 ${ASAN_OPTIONS:-}"
pass=0 fail=0 skip=0
failed_names=""
log=$(mktemp -d /tmp/idemflow-test.XXXXXX)

count() { # cmocka output file -> "passed failed skipped"
  local f=$1 p fl s
  p=$(grep -oE '^\[  PASSED  \] [0-9]+' "$f" | awk '{s+=$NF} END{print s+0}')
  fl=$(grep -oE '^\[  FAILED  \] [0-9]+' "$f" | awk '{s+=$NF} END{print s+0}')
  s=$(grep -oE '^\[  SKIPPED \] [0-9]+' "$f" | awk '{s+=$NF} END{print s+0}')
  echo "$p $fl $s"
}

# PostgreSQL: without IDEMFLOW_TEST_PG, a throwaway cluster (tests/pg.sh) for
# this run, removed on exit; the PostgreSQL unit test and the integration
# tests run on it.
if [ -z "${IDEMFLOW_TEST_PG:-}" ] && [ -x /usr/lib/postgresql/15/bin/initdb ]; then
  IDEMFLOW_PG_DIR=$(mktemp -d /tmp/idemflow-pg.XXXXXX)
  export IDEMFLOW_PG_DIR
  trap 'tests/pg.sh stop >/dev/null 2>&1' EXIT
  echo "== PostgreSQL (tests/pg.sh, $IDEMFLOW_PG_DIR)"
  if pgenv=$(tests/pg.sh start 2>"$log/pg-start.err"); then
    eval "$pgenv"
  else
    fail=$((fail + 1)); failed_names="$failed_names pg-start"
    echo "FAIL cannot start a PostgreSQL cluster"; tail -20 "$log/pg-start.err"
  fi
fi

echo "== unit tests ($BUILD)"
if [ -d "$IDEMFLOW_CONFORMANCE_DIR" ]; then
  echo "third-party vectors (JSONata, RFC 8785, Standard Webhooks): $IDEMFLOW_CONFORMANCE_DIR"
else
  echo "third-party vectors: $IDEMFLOW_CONFORMANCE_DIR is absent, so the tests that read them skip" \
       "(set IDEMFLOW_CONFORMANCE_DIR)"
fi
for t in "$BUILD"/tests/test_*; do
  [ -x "$t" ] || continue
  n=$(basename "$t")
  "$t" >"$log/$n.out" 2>&1
  rc=$?
  read -r p fl s < <(count "$log/$n.out")
  pass=$((pass + p)); fail=$((fail + fl)); skip=$((skip + s))
  if [ $rc -ne 0 ] && [ "$fl" = 0 ]; then
    fail=$((fail + 1)); fl=1   # crashed or aborted outside a test case
  fi
  if [ "$fl" != 0 ]; then
    failed_names="$failed_names $n"
    echo "FAIL $n"; tail -40 "$log/$n.out"
  else
    if [ "$s" != 0 ]; then echo "ok   $n ($p passed, $s skipped)"; else echo "ok   $n ($p passed)"; fi
  fi
done

# Integration tests: pytest over the real server, on each backend.
backends="sqlite"
[ -n "${IDEMFLOW_TEST_PG:-}" ] && backends="$backends postgres"
if ls tests/integration/test_*.py >/dev/null 2>&1; then
  for be in $backends; do
    echo "== integration tests ($be)"
    IDEMFLOW_TEST_BACKEND=$be /usr/bin/python3 -m pytest -q -rfEs -p no:cacheprovider tests/integration \
      >"$log/pytest-$be.out" 2>&1
    rc=$?
    tail -3 "$log/pytest-$be.out"
    line=$(grep -E '(passed|failed|skipped|error)' "$log/pytest-$be.out" | tail -1)
    p=$(echo "$line" | grep -oE '[0-9]+ passed' | grep -oE '[0-9]+'); p=${p:-0}
    fl=$(echo "$line" | grep -oE '[0-9]+ (failed|errors?)' | grep -oE '[0-9]+' | awk '{s+=$1} END{print s+0}')
    s=$(echo "$line" | grep -oE '[0-9]+ skipped' | grep -oE '[0-9]+'); s=${s:-0}
    if [ $rc -ne 0 ] && [ "$fl" = 0 ]; then fl=1; fi
    pass=$((pass + p)); fail=$((fail + fl)); skip=$((skip + s))
    if [ "$fl" != 0 ]; then
      failed_names="$failed_names pytest-$be"
      grep -E '^(FAILED|ERROR)' "$log/pytest-$be.out" | head -40
    fi
  done
fi

# Style: every C file is as clang-format leaves it (.clang-format).
if command -v clang-format >/dev/null 2>&1; then
  bad=""
  for f in src/*/*.[ch] programs/*/*.[ch] tests/unit/*.c bench/*.c fuzz/*.c; do
    [ -f "$f" ] || continue
    clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || bad="$bad $f"
  done
  if [ -z "$bad" ]; then
    pass=$((pass + 1)); echo "ok   clang-format"
  else
    fail=$((fail + 1)); failed_names="$failed_names clang-format"; echo "FAIL clang-format:$bad"
  fi
fi

case "${SANITIZER:-}" in
  *address*)
    if ls fuzz/fuzz_*.c >/dev/null 2>&1; then
      echo "== short fuzz runs"
      if make --no-print-directory fuzz >"$log/fuzz-build.out" 2>&1; then
        for f in build-fuzz/fuzz/fuzz_*; do
          n=$(basename "$f"); corpus="fuzz/corpus/${n#fuzz_}"; dict="fuzz/${n#fuzz_}.dict"
          mkdir -p "$log/corpus-$n"
          dictarg=(); [ -f "$dict" ] && dictarg=(-dict="$dict")
          if "$f" "${dictarg[@]}" -max_total_time="${FUZZ_SECONDS:-20}" -timeout=10 -rss_limit_mb=2048 \
               "$log/corpus-$n" "$corpus" >"$log/$n.out" 2>&1; then
            pass=$((pass + 1)); echo "ok   $n"
          else
            fail=$((fail + 1)); failed_names="$failed_names $n"; echo "FAIL $n"; tail -30 "$log/$n.out"
          fi
        done
      else
        fail=$((fail + 1)); failed_names="$failed_names fuzz-build"; tail -20 "$log/fuzz-build.out"
      fi
    fi ;;
esac

[ -n "$failed_names" ] && echo "failed:$failed_names"
echo "logs in $log"
echo "total: $pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
