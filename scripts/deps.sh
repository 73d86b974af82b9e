#!/bin/sh
# Installs the Debian packages idemflow needs to build, run and test, but only
# the missing ones.  Usage: scripts/deps.sh [build|test|bench]
set -eu
want="build-essential pkg-config curl libmicrohttpd-dev libcurl4-openssl-dev libsqlite3-dev libpq-dev libssl-dev zlib1g-dev libjansson-dev libtcmalloc-minimal4 libcmocka-dev"
testdeps="python3 python3-pytest clang libclang-rt-14-dev postgresql sqlite3 procps openssl"
case "${1:-build}" in
  test)  want="$want $testdeps" ;;
  bench) want="$want $testdeps wrk"
         command -v npm >/dev/null 2>&1 || want="$want nodejs npm" ;;
esac
missing=""
for p in $want; do
  dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "deps: installing$missing" >&2
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
