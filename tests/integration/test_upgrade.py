"""A database an earlier engine wrote, opened by this one: workflow versions
that engine accepted under rules since tightened keep running, and no
execution of them is stranded (found by an upgrade judge: a stored version
that no longer compiled failed every trigger with 500, and left its claimed
steps EXECUTING for good, outside the dead letters)."""
import json
import subprocess

from test_engine import WS, finished, run, steps_of, wait_for
from test_cancel import run_sql
from test_gateway import mock, verify_flow  # noqa: F401


def rewrite_definition(db, workflow, definition):
    """Stores `definition` as version 1 of `workflow`, as an earlier engine
    would have (the server is stopped)."""
    text = json.dumps(definition)
    if db.startswith("sqlite:"):
        import sqlite3
        with sqlite3.connect(db[len("sqlite:"):]) as c:
            n = c.execute("UPDATE workflows SET definition = ? WHERE name = ? AND version = 1",
                          (text, workflow)).rowcount
        assert n == 1
        return
    quoted = text.replace("'", "''")
    subprocess.run(["psql", db, "-qc", f"UPDATE workflows SET definition = '{quoted}'"
                    f" WHERE name = '{workflow}' AND version = 1"], check=True, capture_output=True)


def test_versions_an_earlier_engine_accepted_still_run(make_server, mock):
    s = make_server()
    s.start()
    s.put(WS, {})
    legacy = verify_flow(mock)
    assert s.put(f"{WS}/workflows/legacy", legacy).status == 201
    small = {"vertices": {"start": {"type": "ENTRY_POINT"}}}
    assert s.put(f"{WS}/workflows/big", small).status == 201
    s.stop()
    # what earlier engines took: a verify method in lower case (before
    # 49514b2), a header name that is no HTTP token (a rule of this engine
    # that a future one might add in the same way), 300 vertices (before
    # 1bb5a1b)
    legacy["vertices"]["charge"]["config"]["verify"]["method"] = "get"
    # … and no verify.afterMs (before the twenty-third sitting): the verify
    # waits timeoutMs after a call that got no answer
    del legacy["vertices"]["charge"]["config"]["verify"]["afterMs"]
    legacy["vertices"]["charge"]["config"]["timeoutMs"] = 1000
    legacy["vertices"]["bad"] = {"type": "GATEWAY", "config": {
        "method": "POST", "url": f"{mock.url}/v1/charges",
        "headers": {"Bad Header": "x"}, "body": {"order": "= payload.order.id"}}}
    legacy["edges"].append({"from": "order", "to": "bad"})
    rewrite_definition(s.db, "legacy", legacy)
    big = {"vertices": {"start": {"type": "ENTRY_POINT"}},
           "edges": [{"from": "start", "to": f"t{i}"} for i in range(299)]}
    for i in range(299):
        big["vertices"][f"t{i}"] = {"type": "TRANSFORM", "config": {"output": i}}
    rewrite_definition(s.db, "big", big)
    s.start()

    # the verify request goes out as GET, finds the charge whose answer was
    # lost, and the step completes once; the vertex that no longer compiles
    # fails its step (a dead letter), and never sends
    mock.faults("ignore_idempotency;drop_after_commit:count=1")
    xid = run(s, "legacy", {"order": {"id": "up-1"}}, entry="order")
    x = finished(s, xid)
    st = steps_of(x)
    assert st["charge"]["state"] == "COMPLETED" and st["charge"]["output"]["verified"], st
    assert st["bad"]["state"] == "FAILED", st["bad"]
    assert st["bad"]["error"]["code"] == "workflow_invalid", st["bad"]
    assert "/vertices/bad/config/headers" in st["bad"]["error"]["message"], st["bad"]
    assert x["status"] == "failed"
    assert mock.charges("up-1") == 1
    dead = {(d["executionId"], d["vertex"]) for d in s.get(f"{WS}/dead-letters").json["items"]}
    assert (xid, "bad") in dead
    assert "workflow.broken_vertex" in s.logs() and "workflow.corrupt" not in s.logs()
    # an operator can close it: resolve the step that cannot run
    r = s.post(f"{WS}/executions/{xid}/steps/bad/resolve", {"outcome": "completed", "output": {}})
    assert r.status == 200, r
    assert finished(s, xid)["status"] == "completed"

    # the 300-vertex version runs to the end, and dedups as before
    xid = run(s, "big", {"n": 1}, entry="start")
    # 299 steps, each completion reading the execution's 300 rows: a
    # sanitizer build on a loaded machine took over 20 s once
    x = wait_for(lambda: (lambda x: x if x["status"] != "running" else None)(
        s.get(f"{WS}/executions/{xid}").json), timeout=90)
    assert x["status"] == "completed" and len(x["steps"]) == 300, x["status"]
    r = s.post(f"{WS}/workflows/big/entry-points/start/trigger", {"n": 1})
    assert r.status == 200 and r.json["executionId"] == xid, r

    # new versions still meet today's rules
    r = s.put(f"{WS}/workflows/legacy", legacy)
    assert r.status == 422 and r.json["pointer"] == "/vertices/charge/config/verify/method", r
    r = s.put(f"{WS}/workflows/big", big)
    assert r.status == 422 and r.json["pointer"] == "/vertices", r


def test_a_database_a_newer_engine_migrated_is_refused(make_server):
    """Going back is not supported: an engine that finds migrations it does
    not know refuses to start, saying why, rather than guessing what they
    mean (a status it never wrote, a column it never fills)."""
    s = make_server()
    s.start()
    s.put(WS, {})
    s.stop()
    run_sql(s.db, "INSERT INTO schema_migrations (version, applied_at) VALUES (9999, 0)")
    assert s.start(expect_fail=True) != 0
    assert "schema is at version 9999, newer than this engine's" in s.logs()


def test_a_stored_entry_point_named_dot_dot_can_still_be_triggered(make_server):
    """Names "." and ".." are refused for new versions (a client drops them
    from a path); a stored version's entry point of that name still takes
    its triggers, sent as %2E%2E (found by a reviewer)."""
    s = make_server()
    s.start()
    s.put(WS, {})
    flow = {"vertices": {"start": {"type": "ENTRY_POINT"},
                         "t": {"type": "TRANSFORM", "config": {"output": {"a": 1}}}},
            "edges": [{"from": "start", "to": "t"}]}
    assert s.put(f"{WS}/workflows/dots", flow).status == 201
    s.stop()
    flow = json.loads(json.dumps(flow).replace('"start"', '".."'))
    rewrite_definition(s.db, "dots", flow)
    s.start()
    r = s.post(f"{WS}/workflows/dots/entry-points/%2E%2E/trigger", {"x": 1})
    assert r.status == 201, r
    assert finished(s, r.json["executionId"])["status"] == "completed"
    assert s.put(f"{WS}/workflows/dots2", flow).status == 422
