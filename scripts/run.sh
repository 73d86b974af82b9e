#!/bin/sh
# `make run`: the engine on embedded SQLite (./idemflow.db) with examples/ loaded.
set -eu
BIN=${1:-build/idemflow}
LISTEN=${IDEMFLOW_LISTEN:-127.0.0.1:8080}
DB=${IDEMFLOW_DB:-sqlite:./idemflow.db}
cat <<MSG
idemflow: starting on http://$LISTEN with $DB and the workflow examples/demo/orders.json.
Trigger it from another terminal (a repeat is deduplicated by order.id):

  curl -si -X POST http://$LISTEN/v1/workspaces/demo/workflows/orders/entry-points/order_received/trigger \\
       -H 'Content-Type: application/json' --data @examples/order.json

  # the id it will get, computed offline:
  $BIN id demo orders order_received --fields order.id < examples/order.json

  curl -s http://$LISTEN/v1/workspaces/demo/executions

Stop with Ctrl-C.
MSG
exec "$BIN" serve --listen "$LISTEN" --db "$DB" --load examples
