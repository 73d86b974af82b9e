#!/bin/bash
# `make run`: the engine on embedded SQLite (./idemflow.db) with examples/
# loaded, and the mock payment provider on 127.0.0.1:9090 for the GATEWAY
# examples.  Ctrl-C stops both.
set -eu
BIN=${1:-build/idemflow}
MOCK=${2:-build/idemflow-mockpay}
LISTEN=${IDEMFLOW_LISTEN:-127.0.0.1:8080}
DB=${IDEMFLOW_DB:-sqlite:./idemflow.db}
U=http://$LISTEN/v1/workspaces/demo/workflows
READY=$(mktemp /tmp/idemflow-mockpay.XXXXXX)
"$MOCK" --listen 127.0.0.1:9090 --quiet >"$READY" &
MOCK_PID=$!
trap 'kill $MOCK_PID 2>/dev/null || true; rm -f "$READY"' EXIT INT TERM
# The examples' URLs name port 9090: without the mock there, stop now rather
# than serve charges that would all fail.
for _ in $(seq 100); do
  grep -q mockpay.ready "$READY" && break
  if ! kill -0 $MOCK_PID 2>/dev/null; then
    echo "make run: the mock payment provider could not start on 127.0.0.1:9090 (in use?)" >&2
    exit 1
  fi
  sleep 0.1
done
grep -q mockpay.ready "$READY" || { echo "make run: the mock payment provider did not start" >&2; exit 1; }
cat <<MSG
idemflow: engine on http://$LISTEN ($DB), mock payment provider on http://127.0.0.1:9090.
Workflows loaded from examples/demo: orders, charge, charge_verified, refund_lookup,
invoice_webhook (signed webhooks; README shows how to sign a delivery).
From another terminal:

  # a charge; send it twice: one execution, one charge (the key is 'charge-' & order.id)
  curl -s -X POST $U/charge/entry-points/order_received/trigger \\
       -H 'Content-Type: application/json' --data @examples/order.json
  # the execution id, computed offline
  $BIN id demo charge order_received --fields order.id < examples/order.json
  curl -s http://$LISTEN/v1/workspaces/demo/executions/\$($BIN id demo charge order_received --fields order.id < examples/order.json)
  curl -s http://127.0.0.1:9090/stats          # charges_per_order

  # make the provider drop its response after charging, then charge another order:
  curl -s -X POST http://127.0.0.1:9090/faults -d 'drop_after_commit:count=1'
  curl -s -X POST $U/charge/entry-points/order_received/trigger \\
       -H 'Content-Type: application/json' -d '{"order":{"id":"ord-2","items":[{"price":10,"qty":1}]}}'

  # watch a run: its events stream as they commit (text/event-stream), until it ends
  curl -sN -X POST $U/charge/entry-points/order_received/run \\
       -H 'Content-Type: application/json' -d '{"order":{"id":"ord-3","items":[{"price":5,"qty":2}]}}'

  # 4xx as data: route on the lookup's 404
  curl -s -X POST $U/refund_lookup/entry-points/refund_requested/trigger \\
       -H 'Content-Type: application/json' --data @examples/refund.json

Stop with Ctrl-C.
MSG
"$BIN" serve --listen "$LISTEN" --db "$DB" --load examples
