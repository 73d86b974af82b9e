"""Retention (spec §4) over real HTTP, in engine time (--test-clock): a
finished execution older than --retention-days is purged, its id still
deduplicates until its entry point's dedupWindow has passed (a tombstone:
same id, same payload check), then it may run again; events go with the
retention; running executions stay."""
import pytest

from test_engine import WS, metric, put_workflow, wait_for
from test_gateway import Mock, charge_flow, mock  # noqa: F401 (fixture)

DAY = 86400 * 1000
FLOW = {"vertices": {
    "keep3d": {"type": "ENTRY_POINT", "config": {"idempotencyFields": "id", "dedupWindow": "3d"}},
    "short": {"type": "ENTRY_POINT", "config": {"idempotencyFields": "id", "dedupWindow": "1h"}},
    "t": {"type": "TRANSFORM", "config": {"output": "= payload.id"}}},
    "edges": [{"from": "keep3d", "to": "t"}, {"from": "short", "to": "t"}]}


def trig(s, entry, payload, query=""):
    return s.post(f"{WS}/workflows/ret/entry-points/{entry}/trigger{query}", payload)


def advance(s, ms):
    r = s.post("/v1/test/clock", {"advanceMs": ms})
    assert r.status == 200, r


def sweep(s, ms):
    """Advances the clock by ms and waits for a whole retention sweep after it."""
    before = metric(s, "idemflow_retention_sweeps_total")
    advance(s, ms)
    wait_for(lambda: metric(s, "idemflow_retention_sweeps_total") >= before + 1)


def purged(s):
    return metric(s, 'idemflow_retention_total{what="purged_executions"}')


def test_purge_keeps_identity_for_the_dedup_window(make_server):
    s = make_server(extra=["--test-clock", "--retention-days", "1"])
    s.start()
    put_workflow(s, "ret", FLOW)
    a = trig(s, "keep3d", {"id": "a", "amount": 1})
    b = trig(s, "short", {"id": "b"})
    assert a.status == 201 and b.status == 201
    xa, xb = a.json["executionId"], b.json["executionId"]
    feed = s.get(f"{WS}/events?limit=1000").json
    b_events = [e for e in feed["items"] if e["executionId"] == xb]
    assert b_events and len(b_events) < len(feed["items"])
    cursor = feed["next"]  # where a feed reader stands
    # a day and a bit later: both purged at the next sweep
    sweep(s, DAY + 120000)
    assert purged(s) == 2
    # a: a tombstone — gone from reads and lists, but its id deduplicates
    r = s.get(f"{WS}/executions/{xa}")
    assert r.status == 410 and r.json["type"] == "/problems/execution-purged", r
    assert s.get(f"{WS}/executions").json["items"] == []
    # the events go too, all but the newest: it stays so that event
    # positions only ever grow (SQLite would hand out its seq again)
    left = s.get(f"{WS}/events?limit=1000").json["items"]
    assert [e["id"] for e in left] == [feed["items"][-1]["id"]]
    again = trig(s, "keep3d", {"id": "a", "amount": 1})
    assert again.status == 200 and again.json == {
        "executionId": xa, "deduplicated": True, "samePayload": True, "status": "purged"}
    other = trig(s, "keep3d", {"id": "a", "amount": 2})
    assert other.status == 200 and other.json["samePayload"] is False
    # operator actions on it are refused: nothing is left to act on
    for path, body in ((f"{WS}/executions/{xa}/retry", None),
                       (f"{WS}/executions/{xa}/steps/t/resolve", {"outcome": "failed"})):
        r = s.post(path, body)
        assert r.status == 410, (path, r)
    r = s.post(f"{WS}/executions/{xa}/start-over", None, headers={"Idempotency-Key": "so-1"})
    assert r.status == 410, r
    # b: its 1 h window had passed at the purge — deleted, so it runs again
    rb = trig(s, "short", {"id": "b"})
    assert rb.status == 201 and rb.json["executionId"] == xb
    # a reader resuming after its old position sees the new events
    after = s.get(f"{WS}/events?limit=1000&after={cursor}").json["items"]
    assert {e["executionId"] for e in after} == {xb} and len(after) == len(b_events), after
    # three days after a was created its tombstone goes, and a runs again
    sweep(s, 2 * DAY)
    assert metric(s, 'idemflow_retention_total{what="expired_tombstones"}') == 1
    ra = trig(s, "keep3d", {"id": "a", "amount": 1})
    assert ra.status == 201 and ra.json["executionId"] == xa
    assert s.get(f"{WS}/executions/{xa}").json["status"] == "completed"


def test_running_executions_and_recent_ones_stay(make_server, mock):
    s = make_server(extra=["--test-clock", "--retention-days", "1"])
    s.start()
    put_workflow(s, "ret", FLOW)
    # a GATEWAY that parks its execution (the provider keeps refusing)
    put_workflow(s, "pay", charge_flow(mock, retry={"maxAttempts": 1}, ambiguous="reconcile"))
    assert s.put(f"{WS}/secrets/PAY_KEY", {"value": "sk_test_x"}).status == 204
    mock.faults("status=500:after_commit")
    r = s.post(f"{WS}/workflows/pay/entry-points/order/trigger",
               {"order": {"id": "o-r1", "amount": 5}})
    xp = r.json["executionId"]
    wait_for(lambda: s.get(f"{WS}/executions/{xp}").json["status"] == "requires_reconciliation")
    old = trig(s, "keep3d", {"id": "old"}).json["executionId"]
    sweep(s, DAY + 120000)
    assert purged(s) == 1
    young = trig(s, "keep3d", {"id": "young"}).json["executionId"]
    sweep(s, 120000)  # young is minutes old
    assert purged(s) == 1
    assert s.get(f"{WS}/executions/{old}").status == 410
    assert s.get(f"{WS}/executions/{young}").json["status"] == "completed"
    x = s.get(f"{WS}/executions/{xp}").json
    assert x["status"] == "requires_reconciliation" and x["steps"], x
    ids = [i["id"] for i in s.get(f"{WS}/executions").json["items"]]
    assert set(ids) == {young, xp}


def test_dedup_window_is_validated(server):
    for bad in ("7", "0d", "3651d", "1w", 5, "d"):
        flow = {"vertices": {"e": {"type": "ENTRY_POINT", "config": {"dedupWindow": bad}}},
                "edges": []}
        server.put(WS, {})
        r = server.put(f"{WS}/workflows/dw", flow)
        assert r.status == 422 and r.json["pointer"] == "/vertices/e/config/dedupWindow", (bad, r)


def test_retention_days_is_validated(make_server):
    s = make_server(extra=["--retention-days", "-1"])
    assert s.start(expect_fail=True) == 2


def test_repeated_actions_replay_after_the_purge(make_server):
    """An operator action repeated with its Idempotency-Key after the purge
    gets its first answer again (the client may have lost it), as long as the
    key is kept (here 48 h, longer than the retention); a new key gets the
    410."""
    s = make_server(extra=["--test-clock", "--retention-days", "1", "--key-retention-hours", "48"])
    s.start()
    bad = {"vertices": {"start": {"type": "ENTRY_POINT"},
                        "t": {"type": "TRANSFORM", "config": {"output": "= $error('boom')"}}},
           "edges": [{"from": "start", "to": "t"}]}
    put_workflow(s, "bad", bad)
    x = s.post(f"{WS}/workflows/bad/entry-points/start/trigger", {"n": 1}).json["executionId"]
    wait_for(lambda: s.get(f"{WS}/executions/{x}").json["status"] == "failed")
    r1 = s.post(f"{WS}/executions/{x}/retry", None, headers={"Idempotency-Key": "rt-1"})
    assert r1.status == 200, r1
    wait_for(lambda: s.get(f"{WS}/executions/{x}").json["status"] == "failed")
    so = s.post(f"{WS}/executions/{x}/start-over", None, headers={"Idempotency-Key": "so-1"})
    assert so.status == 201, so
    wait_for(lambda: s.get(f"{WS}/executions/{so.json['executionId']}").json["status"] == "failed")
    sweep(s, DAY + 120000)
    assert purged(s) == 2
    r2 = s.post(f"{WS}/executions/{x}/retry", None, headers={"Idempotency-Key": "rt-1"})
    assert r2.status == 200 and r2.headers.get("idempotent-replayed") == "true", r2
    assert r2.json == r1.json
    so2 = s.post(f"{WS}/executions/{x}/start-over", None, headers={"Idempotency-Key": "so-1"})
    assert so2.status == 201 and so2.json["executionId"] == so.json["executionId"], so2
    for path, key in ((f"{WS}/executions/{x}/retry", "rt-2"),
                      (f"{WS}/executions/{x}/start-over", "so-2")):
        r = s.post(path, None, headers={"Idempotency-Key": key})
        assert r.status == 410 and r.json["type"] == "/problems/execution-purged", (path, r)
    # the refused keys were not kept: nothing to replay, still 410
    r = s.post(f"{WS}/executions/{x}/retry", None, headers={"Idempotency-Key": "rt-2"})
    assert r.status == 410, r


def test_a_lengthened_dedup_window_holds_for_older_executions(make_server):
    s = make_server(extra=["--test-clock", "--retention-days", "1"])
    s.start()
    put_workflow(s, "ret", FLOW)
    a = trig(s, "short", {"id": "w1"}).json["executionId"]
    # a new version gives the entry point a longer window
    longer = {**FLOW, "vertices": {**FLOW["vertices"], "short": {
        "type": "ENTRY_POINT", "config": {"idempotencyFields": "id", "dedupWindow": "5d"}}}}
    put_workflow(s, "ret", longer)
    sweep(s, DAY + 120000)
    assert purged(s) == 1
    r = trig(s, "short", {"id": "w1"})
    assert r.status == 200 and r.json["executionId"] == a and r.json["status"] == "purged", r
