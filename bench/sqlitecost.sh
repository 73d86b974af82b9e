#!/bin/bash
# bench/sqlitecost.sh — runs build/bench/sqlitecost (bench/sqlitecost.c):
# the SQLite costs behind the store's settings, each as an A/B in one
# process.  About 20 s.
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BIN="$BUILD/bench/sqlitecost"
[ -x "$BIN" ] || { echo "sqlitecost: $BIN not built (make $BIN)"; exit 1; }
exec "$BIN"
