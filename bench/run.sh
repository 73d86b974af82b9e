#!/bin/bash
# bench/run.sh — runs every bench/*.sh but itself and the A/B tools
# (*_ab.sh, which take binaries as arguments), in name order, and prints
# one closing line naming the benchmarks that failed.  `make bench` calls it
# with BUILD set; each benchmark reads BUILD (default: build) to find binaries.
set -u
cd "$(dirname "$0")/.." || exit 1
export BUILD=${BUILD:-build}
failed=""
for b in bench/*.sh; do
  case $(basename "$b") in run.sh | *_ab.sh) continue ;; esac
  echo "== $(basename "$b" .sh)"
  if ! bash "$b"; then
    failed="$failed $(basename "$b" .sh)"
  fi
  echo
done
if [ -n "$failed" ]; then
  echo "bench: failed:$failed"
  exit 1
fi
echo "bench: all passed"
