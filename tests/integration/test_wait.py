"""`Prefer: wait=N` on a trigger (RFC 7240, docs/api.md): the answer waits
until the execution leaves `running` (at most N seconds, at most 60), and
says so with `Preference-Applied`.  Against the mock provider, whose
latency fault holds the charge long enough to tell waiting from not."""
import json
import signal
import socket
import threading
import time

import pytest

from conftest import BACKEND
from test_engine import WS, finished, steps_of
from test_gateway import Mock, setup_pay

TRIGGER = f"{WS}/workflows/pay/entry-points/order/trigger"


@pytest.fixture
def mock(workdir):
    m = Mock(workdir)
    yield m
    m.stop()


def order(i, amount=1250):
    return {"order": {"id": i, "amount": amount}}


def timed_post(s, body, prefer=None):
    t = time.monotonic()
    r = s.post(TRIGGER, body, headers={"Prefer": prefer} if prefer else None)
    return r, time.monotonic() - t


# both HTTP fronts: event loops (answers deferred) and a thread per connection
FRONTS = [["--http-threads", "2"], ["--http-threads", "0"]]


def pay_server(make_server, mock, latency_ms, front=()):
    """A started server with the pay workflow, the provider answering after
    latency_ms (keep it under the flow's 2 s timeoutMs)."""
    s = make_server(extra=list(front))
    s.start()
    setup_pay(s, mock)
    mock.faults(f"latency={latency_ms}")
    return s


@pytest.mark.parametrize("front", FRONTS, ids=["event-loop", "thread-per-connection"])
def test_a_waiting_trigger_is_answered_once_its_execution_finished(make_server, mock, front):
    s = pay_server(make_server, mock, 400, front)
    r, took = timed_post(s, order("w-1"), "wait=10")
    assert r.status == 201, r
    assert r.json["status"] == "completed" and r.json["deduplicated"] is False, r.json
    assert r.headers.get("preference-applied") == "wait=10"
    assert took >= 0.35, took  # it waited for the provider
    x = s.get(f"{WS}/executions/{r.json['executionId']}").json
    assert x["status"] == "completed" and steps_of(x)["paid"]["state"] == "COMPLETED"
    # without the preference the same trigger is answered at once
    r, took = timed_post(s, order("w-2"))
    assert r.status == 201 and r.json["status"] == "running", r.json
    assert "preference-applied" not in r.headers
    assert finished(s, r.json["executionId"])["status"] == "completed"
    assert mock.charges("w-1") == 1 and mock.charges("w-2") == 1


@pytest.mark.parametrize("front", FRONTS, ids=["event-loop", "thread-per-connection"])
def test_a_repeat_waits_for_the_execution_it_deduplicates_to(make_server, mock, front):
    s = pay_server(make_server, mock, 600, front)
    first = s.post(TRIGGER, order("w-3"))
    assert first.status == 201 and first.json["status"] == "running", first.json
    r, took = timed_post(s, order("w-3"), 'respond-async, wait="10"; x=1')
    assert r.status == 200, r
    assert r.json["executionId"] == first.json["executionId"]
    assert r.json["deduplicated"] is True and r.json["status"] == "completed", r.json
    assert r.headers.get("preference-applied") == "wait=10"
    # a repeat of a finished execution is answered at once
    r, took = timed_post(s, order("w-3"), "wait=10")
    assert r.status == 200 and r.json["status"] == "completed" and took < 0.3, (r.json, took)
    assert mock.charges("w-3") == 1


def test_the_wait_ends_at_its_deadline_with_the_execution_still_running(server, mock):
    setup_pay(server, mock)
    mock.faults("latency=1800")  # under the flow's 2 s timeoutMs
    r, took = timed_post(server, order("w-4"), "wait=1")
    assert r.status == 201 and r.json["status"] == "running", r.json
    assert r.headers.get("preference-applied") == "wait=1"
    assert 0.9 <= took < 1.7, took
    assert finished(server, r.json["executionId"])["status"] == "completed"
    assert mock.charges("w-4") == 1


def test_a_failed_execution_ends_the_wait(server, mock):
    setup_pay(server, mock)
    mock.faults("status=402:count=1")  # a 4xx: the step FAILS (clientErrorMode fail)
    r, _ = timed_post(server, order("w-5"), "wait=10")
    assert r.status == 201 and r.json["status"] == "failed", r.json
    x = server.get(f"{WS}/executions/{r.json['executionId']}").json
    assert x["status"] == "failed" and steps_of(x)["charge"]["state"] == "FAILED", x


def raw_answer(sock):
    """Reads one HTTP answer (head and Content-Length body) from sock."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        assert chunk, f"connection closed without an answer: {data!r}"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = next(int(v) for k, _, v in (h.partition(b":") for h in head.split(b"\r\n")[1:])
                  if k.strip().lower() == b"content-length")
    while len(body) < length:
        chunk = sock.recv(4096)
        assert chunk, "connection closed in the body"
        body += chunk
    return int(head.split(b" ")[1]), json.loads(body)


def test_a_waiting_trigger_that_loses_its_key_is_answered_at_once(make_server, mock):
    """Two waiting triggers with one Idempotency-Key and different orders, the
    first held before its commit: the second creates the execution and waits
    for it; the first's commit finds the key taken by another payload, and its
    answer (422) comes at once, not after the wait it asked for."""
    s = make_server(extra=["--http-threads", "2"],
                    env={"IDEMFLOW_FAULT": "trigger.before_commit:sleep=1000@1"})
    s.start()
    setup_pay(s, mock)
    mock.faults("latency=300")
    body = json.dumps(order("k-1")).encode()
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=20)
    t0 = time.monotonic()
    sock.sendall(f"POST {TRIGGER} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                 f"Idempotency-Key: k\r\nPrefer: wait=10\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    from test_engine import wait_for
    wait_for(lambda: "fault.fired" in s.logs())  # the first is held before its commit
    got = {}

    def second():
        got["r"] = s.post(TRIGGER, order("k-2"), headers={"Idempotency-Key": "k",
                                                         "Prefer": "wait=10"})
    t = threading.Thread(target=second)
    t.start()
    status, problem = raw_answer(sock)
    took = time.monotonic() - t0
    sock.close()
    t.join(timeout=20)
    assert status == 422 and "idempotency-key-reused" in problem["type"], (status, problem)
    assert took < 5, took  # its 1 s hold, not the 10 s wait it asked for
    r = got["r"]
    assert r.status == 201 and r.json["status"] == "completed", r.json
    assert mock.charges("k-2") == 1 and mock.charges("k-1") == 0


@pytest.mark.parametrize("prefer", ["wait=soon", "wait", "wait=-1", "wait=0", "respond-async",
                                    "wait=3x", 'wait="3', "handling=strict"])
def test_a_prefer_without_a_usable_wait_is_ignored(server, mock, prefer):
    setup_pay(server, mock)
    mock.faults("latency=1500")
    r, took = timed_post(server, order("w-6"), prefer)
    assert r.status == 201 and r.json["status"] == "running", (prefer, r.json)
    assert "preference-applied" not in r.headers, prefer
    assert took < 1.2, (prefer, took)
    assert finished(server, r.json["executionId"])["status"] == "completed"


def test_a_stopping_engine_answers_its_waiters_at_once(make_server, mock):
    s = pay_server(make_server, mock, 1800)
    got = {}

    def send():
        got["r"], got["took"] = timed_post(s, order("w-7"), "wait=30")
    t = threading.Thread(target=send)
    t.start()

    def calling():  # the charge is on the wire: the trigger committed
        r = s.get(f"{WS}/executions?limit=10").json
        return r["items"] or None
    from test_engine import wait_for
    wait_for(calling)
    s.proc.send_signal(signal.SIGTERM)
    t.join(timeout=20)
    assert got["r"].status == 201 and got["r"].json["status"] == "running", got["r"].json
    assert got["took"] < 1.7, got["took"]  # not the provider's 1.8 s, nor the 30 s asked
    assert s.proc.wait(timeout=20) == 0
    # the call in flight finishes during the drain, or after the next start
    s.start()
    assert finished(s, got["r"].json["executionId"])["status"] == "completed"
    assert mock.charges("w-7") == 1


@pytest.mark.skipif(BACKEND != "postgres", reason="two engine processes need PostgreSQL")
def test_a_wait_on_another_process_sees_the_finish_within_a_second(make_server, mock, workdir):
    """The execution runs on A; B, asked to wait by a repeat of its trigger,
    learns of the finish by reading the status (once a second)."""
    from conftest import new_db
    db = new_db(workdir)
    a = make_server(db=db)
    b = make_server(db=db)
    a.start()
    b.start()
    setup_pay(a, mock)
    mock.faults("latency=1500")
    first = a.post(TRIGGER, order("w-8"))
    assert first.status == 201 and first.json["status"] == "running", first.json
    r, took = timed_post(b, order("w-8"), "wait=10")
    assert r.status == 200 and r.json["status"] == "completed", r.json
    assert took < 4, took  # the provider's 1.5 s and one or two polls, not the 10 s asked
    assert mock.charges("w-8") == 1
