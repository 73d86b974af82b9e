"""The streaming run (spec §4, `…/run`): a text/event-stream of an
execution's events as they commit, until it ends — over real HTTP, on both
HTTP fronts (event loops and a thread per connection)."""
import http.client
import json
import signal
import time

import pytest

from test_gateway import MOCKPAY, Mock, charge_flow, mock  # noqa: F401 (fixture)
from test_engine import WS, put_workflow

FLOW = {"vertices": {"start": {"type": "ENTRY_POINT"},
                     "t": {"type": "TRANSFORM", "config": {"output": "= payload.n"}}},
        "edges": [{"from": "start", "to": "t"}]}


class Stream:
    """Reads an SSE answer event by event, recording when each arrived."""

    def __init__(self, server, path, body, timeout=30, query=""):
        self.conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
        self.conn.request("POST", path + query, body=json.dumps(body),
                          headers={"Content-Type": "application/json"})
        self.resp = self.conn.getresponse()
        self.status = self.resp.status
        self.headers = {k.lower(): v for k, v in self.resp.getheaders()}

    def events(self):
        ev = {}
        while True:
            line = self.resp.readline()
            if not line:
                return
            line = line.decode().rstrip("\n")
            if line == "":
                if ev:
                    ev["at"] = time.monotonic()
                    yield ev
                    ev = {}
                continue
            if line.startswith(":"):
                continue
            k, _, v = line.partition(": ")
            ev[k] = json.loads(v) if k == "data" else v

    def all(self):
        out = list(self.events())
        self.conn.close()
        return out


def run_path(wf="flow", vertex="start"):
    return f"{WS}/workflows/{wf}/entry-points/{vertex}/run"


def check_run(s):
    put_workflow(s, "flow", FLOW)
    st = Stream(s, run_path(), {"n": 1})
    assert st.status == 200 and st.headers["content-type"] == "text/event-stream"
    evs = st.all()
    first, last = evs[0], evs[-1]
    assert first["event"] == "execution" and first["data"]["deduplicated"] is False
    assert first["data"]["status"] == "running", first
    xid = first["data"]["executionId"]
    assert st.headers["location"].endswith(xid)
    assert last == {**last, "event": "end", "data": {"executionId": xid, "status": "completed"}}
    body = evs[1:-1]
    assert [e["event"] for e in body] == ["execution.created", "step.completed",
                                          "execution.completed"]
    # each is the feed's item, with its id as the SSE id, in version order
    feed = {e["id"]: e for e in s.get(f"{WS}/events?limit=1000").json["items"]}
    for e in body:
        assert e["id"] == e["data"]["id"] and feed[e["id"]]["type"] == e["event"]
        assert e["data"]["executionId"] == xid
    assert [e["data"]["aggregateVersion"] for e in body] == [1, 2, 3]
    x = s.get(f"{WS}/executions/{xid}").json
    assert x["status"] == "completed" and x["test"] is False
    assert x["identity"]["mode"] == "random"
    return xid


def test_run_streams_the_execution_until_it_ends(server):
    a = check_run(server)
    # a new execution each time by default
    b = check_run(server)
    assert a != b


def test_run_on_a_thread_per_connection(make_server):
    s = make_server(extra=["--http-threads", "0"])
    s.start()
    assert s.put(WS, {}).status in (200, 201)
    check_run(s)


def test_run_without_forcing_dedupes(server):
    put_workflow(server, "flow", FLOW)
    q = "?forceNewExecution=false"
    one = Stream(server, run_path(), {"n": 7}, query=q).all()
    two = Stream(server, run_path(), {"n": 7}, query=q).all()
    xid = one[0]["data"]["executionId"]
    # the repeat: the same execution, already ended — its events are not replayed
    assert two[0]["data"] == {"executionId": xid, "deduplicated": True, "status": "completed"}
    assert [e["event"] for e in two] == ["execution", "end"]
    assert two[1]["data"]["status"] == "completed"
    assert one[-1]["event"] == "end"


def test_bad_runs_are_problems_not_streams(server):
    put_workflow(server, "flow", FLOW)
    r = server.post(run_path("nope"), {"n": 1})
    assert r.status == 404 and r.headers["content-type"] == "application/problem+json"
    r = server.post(run_path() + "?forceNewExecution=true&clientIdempotencyId=k", {"n": 1})
    assert r.status == 400 and r.json["pointer"] == "/forceNewExecution"
    r = server.request("POST", run_path(), raw=b"{", headers={"Content-Type": "application/json"})
    assert r.status == 400
    assert server.get(f"{WS}/executions").json["items"] == []


def test_events_arrive_while_the_execution_runs(server, mock):
    """A GATEWAY call held 1.5 s by the provider: execution.created arrives
    at once, the rest after the call — the stream is not buffered to the end."""
    put_workflow(server, "pay", charge_flow(mock, timeoutMs=10000))
    assert server.put(f"{WS}/secrets/PAY_KEY", {"value": "sk_test_x"}).status == 204
    mock.faults("latency=1500:count=1")
    t0 = time.monotonic()
    st = Stream(server, run_path("pay", "order"), {"order": {"id": "o-s1", "amount": 100}})
    evs = st.all()
    names = [e["event"] for e in evs]
    assert names[0] == "execution" and names[-1] == "end", names
    created = next(e for e in evs if e["event"] == "execution.created")
    done = next(e for e in evs if e["event"] == "execution.completed")
    assert created["at"] - t0 < 1.0, created["at"] - t0
    assert done["at"] - created["at"] >= 1.0
    assert mock.charges("o-s1") == 1


def test_a_stopping_server_ends_its_streams(make_server, mock):
    s = make_server()
    s.start()
    assert s.put(WS, {}).status in (200, 201)
    # the provider answers 503 with a long Retry-After: the execution waits
    # for its next attempt with nothing in flight
    # (a deadline past the Retry-After: with the default 300 s the 503 would
    # fail the step at once, deadline_exceeded, and end the stream with `end`
    # whenever the answer came before the stop)
    put_workflow(s, "pay", charge_flow(mock, retry={"maxAttempts": 3, "initialIntervalMs": 10},
                                       deadlineMs=3600000))
    assert s.put(f"{WS}/secrets/PAY_KEY", {"value": "sk_test_x"}).status == 204
    mock.faults("status=503:retry_after=600")
    st = Stream(s, run_path("pay", "order"), {"order": {"id": "o-s2", "amount": 100}})
    it = st.events()
    first = next(it)
    assert first["event"] == "execution"
    assert next(it)["event"] == "execution.created"
    # the 503 has been answered and its retry, 10 minutes out, committed
    xid = first["data"]["executionId"]
    deadline = time.monotonic() + 10
    while True:
        x = s.get(f"{WS}/executions/{xid}").json
        charge = next(st_ for st_ in x["steps"] if st_["vertex"] == "charge")
        if charge["state"] == "DISPATCHED" and charge["attempts"] == 1:
            break
        assert x["status"] == "running" and time.monotonic() < deadline, x
        time.sleep(0.01)
    t0 = time.monotonic()
    s.proc.send_signal(signal.SIGTERM)
    rest = list(it)  # the stream ends (no `end` event: the execution still runs)
    assert s.proc.wait(timeout=20) == 0
    assert time.monotonic() - t0 < 15
    assert all(e["event"] != "end" for e in rest), rest
