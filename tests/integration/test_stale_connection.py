"""Found by a judge: a provider that writes an answer nobody asked for on a
kept-alive connection (its first answer, then the same kind of answer again
50 ms later, while the connection waits idle in the engine's pool).
libcurl 7.88 reuses a connection with bytes waiting, and the next call on it
read them as its own answer: an order completed with another order's charge
id, a declined order was recorded as charged, and under `ambiguous: verify`
a verify read another call's answer and the charge was sent twice.

The engine now looks at a reused connection just before the request leaves:
bytes waiting there mean the connection is out of step, so the call is not
sent on it (the connection is closed) and is retried on a new one.  This
provider is raw sockets, so the framing is exactly what is written here."""
import json
import socket
import threading
import time

from test_engine import finished, put_workflow, run, steps_of, wait_for


class DoubleAnswerer:
    """POST /v1/charges with an Idempotency-Key: one charge per key, the
    answer 201 {"id": "ch_" + order}; on every connection, 50 ms after its
    first answer, an extra 201 for an order nobody asked about."""

    def __init__(self):
        self.mu = threading.Lock()
        self.charges = {}  # order -> charges
        self.keys = {}     # key -> answer body
        self.extras = 0    # extra answers written
        self.owed = 0      # extra answers decided on, not yet written
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.stopped = False
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while not self.stopped:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self.serve, args=(c,), daemon=True).start()

    @staticmethod
    def answer(c, body):
        data = json.dumps(body).encode()
        c.sendall(b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(data) + data)

    def serve(self, c):
        buf, answered = b"", 0
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    d = c.recv(65536)
                    if not d:
                        return
                    buf += d
                head, _, rest = buf.partition(b"\r\n\r\n")
                headers = dict(line.split(b":", 1) for line in head.split(b"\r\n")[1:])
                headers = {k.strip().lower(): v.strip() for k, v in headers.items()}
                n = int(headers.get(b"content-length", b"0"))
                while len(rest) < n:
                    d = c.recv(65536)
                    if not d:
                        return
                    rest += d
                body, buf = json.loads(rest[:n]), rest[n:]
                key = headers[b"idempotency-key"].decode()
                with self.mu:
                    if key not in self.keys:
                        order = body["order"]
                        self.charges[order] = self.charges.get(order, 0) + 1
                        self.keys[key] = {"id": "ch_" + order, "order": order}
                    resp = self.keys[key]
                answered += 1
                if answered == 1:
                    with self.mu:
                        self.owed += 1
                self.answer(c, resp)
                if answered == 1:
                    time.sleep(0.05)  # its own segment, after the answer was read
                    self.answer(c, {"id": "ch_nobody", "order": "nobody"})
                    with self.mu:
                        self.owed -= 1
                        self.extras += 1
        except OSError:
            return
        finally:
            c.close()

    def stop(self):
        self.stopped = True
        self.sock.close()


def test_an_answer_nobody_asked_for_is_never_taken_for_the_next_calls(server):
    prov = DoubleAnswerer()
    try:
        put_workflow(server, "dbl", {
            "vertices": {
                "order": {"type": "ENTRY_POINT"},
                "charge": {"type": "GATEWAY", "config": {
                    "method": "POST", "url": f"http://127.0.0.1:{prov.port}/v1/charges",
                    "headers": {"Idempotency-Key": "= 'ord-' & payload.order.id"},
                    "body": {"order": "= payload.order.id"},
                    "retry": {"maxAttempts": 5, "initialIntervalMs": 10, "maxIntervalMs": 20},
                }},
            },
            "edges": [{"from": "order", "to": "charge"}]})
        xs = []
        for i in range(6):
            xs.append(finished(server, run(server, "dbl", {"order": {"id": f"o{i}"}},
                                           entry="order")))
            # the extra answer lands while the connection idles, before the next call
            wait_for(lambda: prov.owed == 0)
        with prov.mu:
            assert prov.extras >= 1  # the provider did misbehave
        for i, x in enumerate(xs):
            ch = steps_of(x)["charge"]
            assert x["status"] == "completed", x
            assert ch["output"]["body"] == {"id": f"ch_o{i}", "order": f"o{i}"}, (i, ch)
        # the engine saw the waiting bytes and went to a new connection
        stopped = [h for x in xs for h in steps_of(x)["charge"]["history"]
                   if h["outcome"] == "not_sent"]
        assert stopped, [steps_of(x)["charge"]["history"] for x in xs]
        assert "held an answer no request was owed" in \
            json.dumps(stopped[0]), stopped[0]
        with prov.mu:
            assert prov.charges == {f"o{i}": 1 for i in range(6)}, prov.charges
    finally:
        prov.stop()
