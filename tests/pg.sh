#!/bin/bash
# A throwaway PostgreSQL cluster for the tests.
#
#   tests/pg.sh start     initdb + start (idempotent); prints
#                         "export IDEMFLOW_TEST_PG=postgresql://USER@127.0.0.1:PORT/postgres"
#   tests/pg.sh stop      stop it and remove its directory (idempotent)
#   tests/pg.sh restart [fast|immediate]   restart on the same port (crash tests)
#   tests/pg.sh url       print the conninfo of the running cluster
#
# The cluster lives in $IDEMFLOW_PG_DIR (default /tmp/idemflow-pg), listens on
# 127.0.0.1 only, on a free port, with trust authentication on loopback,
# fsync on (durability is what the tests check) and max_connections 200.
# As root, the server runs as the user `idemflowtest` (created when missing):
# initdb refuses to run as root.  Binaries: $PG_BIN or Debian's PostgreSQL 15.
# IDEMFLOW_PG_CONF: extra postgresql.conf lines for `start` (e.g. a bench's
# shared_preload_libraries).
set -euo pipefail
DIR=${IDEMFLOW_PG_DIR:-/tmp/idemflow-pg}
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
RUN_AS=""
USER_NAME=$(id -un)
if [ "$(id -u)" -eq 0 ]; then
  USER_NAME=idemflowtest
  RUN_AS="runuser -u $USER_NAME --"
fi

as_pg() { $RUN_AS "$@"; }

running() {
  [ -f "$DIR/data/postmaster.pid" ] && as_pg "$PG_BIN/pg_ctl" -D "$DIR/data" status >/dev/null 2>&1
}

url() {
  echo "postgresql://$USER_NAME@127.0.0.1:$(cat "$DIR/port")/postgres"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

pg_start() {
  as_pg "$PG_BIN/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w -t 60 \
    -o "-p $(cat "$DIR/port")" start >/dev/null
}

start() {
  if running; then
    echo "export IDEMFLOW_TEST_PG=$(url)"
    return 0
  fi
  if [ "$(id -u)" -eq 0 ] && ! id "$USER_NAME" >/dev/null 2>&1; then
    useradd --system --no-create-home --shell /usr/sbin/nologin "$USER_NAME"
  fi
  rm -rf "$DIR/data"
  mkdir -p "$DIR"
  [ -n "$RUN_AS" ] && chown "$USER_NAME" "$DIR"
  chmod 700 "$DIR"
  as_pg "$PG_BIN/initdb" -D "$DIR/data" -U "$USER_NAME" --auth=trust --no-locale -E UTF8 \
    >"$DIR/initdb.log" 2>&1 || { cat "$DIR/initdb.log" >&2; exit 1; }
  cat >>"$DIR/data/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
unix_socket_directories = '$DIR'
max_connections = 200
fsync = on
synchronous_commit = on
full_page_writes = on
shared_buffers = 128MB
log_min_messages = warning
log_connections = off
${IDEMFLOW_PG_CONF:-}
EOF
  # Loopback only, trust: the cluster is private to this machine's tests.
  cat >"$DIR/data/pg_hba.conf" <<EOF
local all all trust
host all all 127.0.0.1/32 trust
EOF
  for _ in 1 2 3; do
    free_port >"$DIR/port"
    if pg_start; then
      echo "export IDEMFLOW_TEST_PG=$(url)"
      return 0
    fi
  done
  cat "$DIR/server.log" >&2
  exit 1
}

stop() {
  if running; then
    as_pg "$PG_BIN/pg_ctl" -D "$DIR/data" -m fast -w -t 60 stop >/dev/null || true
  fi
  rm -rf "$DIR"
}

restart() {
  running || { echo "pg.sh: no cluster in $DIR" >&2; exit 1; }
  # a loaded machine's shutdown checkpoint can outlast a minute: wait it
  # out rather than leave the cluster down for every later test
  as_pg "$PG_BIN/pg_ctl" -D "$DIR/data" -m "${1:-fast}" -w -t 300 stop >/dev/null
  pg_start
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  restart) restart "${2:-fast}" ;;
  url) running && url ;;
  *) echo "usage: $0 start|stop|restart [fast|immediate]|url" >&2; exit 2 ;;
esac
