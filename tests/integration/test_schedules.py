"""Schedules (spec §9) over real HTTP, in engine time (serve --test-clock):
each tick fires once with a random execution id, missed ticks are skipped
but the latest, and on PostgreSQL two engine processes fire a tick once."""
import json
import re
import time

import pytest

from conftest import BACKEND
from test_engine import wait_for

WS = "/v1/workspaces/cron"
EVERY_MINUTE = {"vertices": {
    "tick": {"type": "ENTRY_POINT", "config": {"schedule": "* * * * *"}},
    "note": {"type": "TRANSFORM", "config": {"output": "= payload.scheduledAt"}}},
    "edges": [{"from": "tick", "to": "note"}]}


def metric(s, name):
    m = re.search(re.escape(name) + r" (\d+)", s.get("/metrics").raw.decode())
    return int(m.group(1))


def fired(s):
    return metric(s, 'idemflow_schedule_ticks_total{outcome="fired"}')


def executions(s):
    return s.get(f"{WS}/executions?limit=1000").json["items"]


def time_ms(rfc3339):
    from datetime import datetime
    return int(datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp() * 1000)


def future_minutes(s, n=21):
    """A schedule of n consecutive minutes that real time cannot reach while
    the test runs (at least five minutes ahead of the engine's clock, within
    one hour), and its first tick: the test moves the engine clock there, so
    no tick fires on the wall clock's own account."""
    start = (clock_now(s) // 60000 + 5) * 60000
    minute = start // 60000 % 60
    if minute + n > 60:
        start += (60 - minute) * 60000
        minute = 0
    return start, f"{minute}-{minute + n - 1} * * * *"


def every(expr):
    d = json.loads(json.dumps(EVERY_MINUTE))
    d["vertices"]["tick"]["config"]["schedule"] = expr
    return d


@pytest.fixture
def clock_server(make_server):
    s = make_server(extra=["--test-clock"])
    s.start()
    return s


def test_each_tick_fires_once_and_missed_ones_are_skipped(clock_server):
    s = clock_server
    s.put(WS, {})
    tick, expr = future_minutes(s)
    assert s.put(f"{WS}/workflows/minutely", every(expr)).status == 201
    advance_to(s, tick + 30000)
    wait_for(lambda: fired(s) >= 1)
    items = executions(s)
    assert len(items) == 1, items
    x = wait_for(lambda: (lambda x: x if x["status"] == "completed" else None)(
        s.get(f"{WS}/executions/{items[0]['id']}").json))
    assert time_ms(x["payload"]["scheduledAt"]) == tick and x["payload"]["schedule"] == expr, x
    assert x["identity"]["mode"] == "random" and x["identity"]["scheduledAt"] == x["payload"]["scheduledAt"]
    assert {st["vertex"]: st for st in x["steps"]}["note"]["output"] == x["payload"]["scheduledAt"]
    # the next minute: one more, for the next tick
    advance_to(s, tick + 90000)
    wait_for(lambda: fired(s) >= 2)
    ticks = sorted(time_ms(s.get(f"{WS}/executions/{i['id']}").json["payload"]["scheduledAt"])
                   for i in executions(s))
    assert ticks == [tick, tick + 60000], ticks
    # ten minutes at once: the latest tick fires, the nine before it are missed
    advance_to(s, tick + 11 * 60000 + 30000)
    wait_for(lambda: fired(s) >= 3)
    # the pass counts the missed ticks after the fired one (scheduler.c
    # due_one): wait for them too before asserting their number
    wait_for(lambda: metric(s, 'idemflow_schedule_ticks_total{outcome="missed"}') >= 9)
    assert metric(s, 'idemflow_schedule_ticks_total{outcome="missed"}') == 9
    ticks = sorted(time_ms(s.get(f"{WS}/executions/{i['id']}").json["payload"]["scheduledAt"])
                   for i in executions(s))
    assert ticks == [tick, tick + 60000, tick + 11 * 60000], ticks
    assert fired(s) == 3 and len(executions(s)) == 3


def test_a_new_version_replaces_the_schedule(clock_server):
    s = clock_server
    s.put(WS, {})
    tick, expr = future_minutes(s)
    assert s.put(f"{WS}/workflows/w", every(expr)).status == 201
    yearly = {"vertices": {"tick": {"type": "ENTRY_POINT", "config": {"schedule": "@yearly"}}}}
    assert s.put(f"{WS}/workflows/w", yearly).status == 201
    assert s.put(f"{WS}/workflows/witness", every(expr)).status == 201
    # two ticks of the witness: the scheduler's pass over the first one has
    # ended by the time the second fires, and version 1 of w had its chance
    advance_to(s, tick + 30000)
    wait_for(lambda: fired(s) >= 1)
    advance_to(s, tick + 90000)
    wait_for(lambda: fired(s) >= 2)
    assert {x["workflow"] for x in executions(s)} == {"witness"}
    assert fired(s) == 2


def clock_now(s):
    return time_ms(s.post("/v1/test/clock", {"advanceMs": 1}).json["now"])


def advance_to(s, target):
    r = s.post("/v1/test/clock", {"advanceMs": target - clock_now(s)})
    assert r.status == 200, r


def scanned(s, after, entries):
    """Waits for a listing after the `after`-th that found `entries`."""
    return wait_for(lambda: metric(s, "idemflow_schedule_scans_total") > after and
                    metric(s, "idemflow_schedules") == entries)


def test_a_tick_due_before_a_new_version_fires_in_the_old_one(clock_server):
    """Found by an audit: the tick fell due under version 1, version 2 was
    put before the scheduler's next pass; the tick still fires, once, in
    version 1 (whose schedule it is)."""
    s = clock_server
    s.put(WS, {})
    scans = metric(s, "idemflow_schedule_scans_total")
    b, expr = future_minutes(s)
    assert s.put(f"{WS}/workflows/w", every(expr)).status == 201
    scanned(s, scans, 1)
    advance_to(s, b + 50)  # tick b is due, under version 1
    assert s.put(f"{WS}/workflows/w", every(expr)).status == 201
    advance_to(s, b + 30000)
    wait_for(lambda: fired(s) >= 1)
    items = executions(s)
    assert len(items) == 1, items
    x = s.get(f"{WS}/executions/{items[0]['id']}").json
    assert time_ms(x["payload"]["scheduledAt"]) == b and x["workflowVersion"] == 1, x


def test_a_tick_due_while_a_listing_ran_fires_in_the_old_version(make_server):
    """Found by stalling the listing (fault point schedule.before_list): a
    listing that starts before tick b is due and lists version 2, put after
    b, dropped version 1's entry with b unfired; b was lost.  It fires, in
    version 1, once."""
    s = make_server(extra=["--test-clock"],
                    env={"IDEMFLOW_FAULT": "schedule.before_list:sleep=2000@*"})
    s.start()
    s.put(WS, {})

    def stalls():
        return s.logs().count("fault point schedule.before_list fired")
    scans = wait_for(lambda: metric(s, "idemflow_schedule_scans_total"))
    b, expr = future_minutes(s)
    assert s.put(f"{WS}/workflows/w", every(expr)).status == 201
    scanned(s, scans, 1)
    # a PUT in this process makes the scheduler list again within a second
    seen = stalls()
    assert s.put(f"{WS}/workflows/other", {"vertices": {"e": {"type": "ENTRY_POINT"}}}).status == 201
    wait_for(lambda: stalls() > seen)
    # that listing, started before b, is stalled: b falls due, then version 2
    advance_to(s, b + 50)
    assert s.put(f"{WS}/workflows/w", every(expr)).status == 201
    wait_for(lambda: fired(s) >= 1)
    advance_to(s, b + 30000)
    wait_for(lambda: metric(s, "idemflow_schedule_scans_total") > scans + 2)
    items = executions(s)
    assert len(items) == 1, items
    x = s.get(f"{WS}/executions/{items[0]['id']}").json
    assert time_ms(x["payload"]["scheduledAt"]) == b and x["workflowVersion"] == 1, x
    assert metric(s, 'idemflow_schedule_ticks_total{outcome="missed"}') == 0


@pytest.mark.skipif(BACKEND != "postgres", reason="two engine processes need PostgreSQL")
def test_a_version_put_before_a_tick_supersedes_the_old_schedule_everywhere(make_server):
    """Found by an audit: process b still lists version 1 when process a puts
    version 2 without a schedule; b's fire of the next tick is superseded,
    not run in version 2."""
    a = make_server(extra=["--test-clock"])
    a.start()
    a.put(WS, {})
    tick, expr = future_minutes(a, 1)
    assert a.put(f"{WS}/workflows/w", every(expr)).status == 201
    b = make_server(db=a.db, extra=["--test-clock"])
    b.start()
    # b's first listing (at start) may still be running: the listing awaited
    # below must be the one after the move, not that one, or it could come
    # after version 2 and drop version 1's entry (a CI failure, 2026-12-03)
    scans = wait_for(lambda: metric(b, "idemflow_schedule_scans_total"))
    advance_to(b, tick - 1500)  # b lists again now, then not for 10 s of its time
    scanned(b, scans, 1)
    unscheduled = {"vertices": {"tick": {"type": "ENTRY_POINT"}}}
    assert a.put(f"{WS}/workflows/w", unscheduled).status == 201
    advance_to(b, tick + 1000)
    wait_for(lambda: metric(b, 'idemflow_schedule_ticks_total{outcome="superseded"}') >= 1)
    assert executions(a) == [] and fired(b) == 0


@pytest.mark.skipif(BACKEND != "postgres", reason="two engine processes need PostgreSQL")
def test_two_processes_fire_a_tick_once(make_server):
    a = make_server(extra=["--test-clock"])
    a.start()
    a.put(WS, {})
    tick, expr = future_minutes(a)
    assert a.put(f"{WS}/workflows/minutely", every(expr)).status == 201
    b = make_server(db=a.db, extra=["--test-clock"])
    b.start()
    advance_to(a, tick + 30000)
    advance_to(b, tick + 30000)

    def both_tried():
        return all(fired(x) + metric(x, 'idemflow_schedule_ticks_total{outcome="taken"}') >= 1
                   for x in (a, b))
    wait_for(both_tried, timeout=30)
    assert fired(a) + fired(b) == 1
    assert len(executions(a)) == 1


@pytest.mark.skipif(BACKEND != "postgres", reason="a second process learns of a version by listing")
def test_a_due_tick_a_listing_finds_fires_in_the_same_pass(make_server):
    """Found by a crash-test audit: a process whose listing finds a schedule
    whose latest tick is already due (it started, or learned of the
    version, after the tick) fires that tick at once.  Before, it waited a
    second; when a minute boundary passed meanwhile, it fired only the next
    tick and counted this one as missed — a tick lost on SQLite, a false
    `missed` and warning on PostgreSQL."""
    a = make_server(extra=["--test-clock"])
    a.start()
    a.put(WS, {})
    b = make_server(db=a.db, extra=["--test-clock"])
    b.start()
    # b's first listing (at start) is over before the version is put, so b
    # first finds it when its clock has moved past `tick`
    scans = wait_for(lambda: metric(b, "idemflow_schedule_scans_total"))
    tick, expr = future_minutes(a)
    assert a.put(f"{WS}/workflows/minutely", every(expr)).status == 201
    # b lists again only on its own clock (a move of it wakes b's scheduler
    # for one pass): half a second before the next boundary, with `tick`
    # due; then past it.  One move each, measured from a's clock (b's still
    # runs with it) and from the last move's answer: a second move (as
    # advance_to's reading makes) would wake b's scheduler for a second
    # pass before the boundary, which fires `tick` even without the fix.
    r = b.post("/v1/test/clock", {"advanceMs": tick + 59500 - clock_now(a)})
    assert r.status == 200, r
    scanned(b, scans, 1)
    r = b.post("/v1/test/clock", {"advanceMs": tick + 60500 - time_ms(r.json["now"])})
    assert r.status == 200, r
    wait_for(lambda: fired(b) >= 2)
    ticks = sorted(time_ms(b.get(f"{WS}/executions/{i['id']}").json["payload"]["scheduledAt"])
                   for i in executions(b))
    assert ticks == [tick, tick + 60000], ticks
    assert metric(b, 'idemflow_schedule_ticks_total{outcome="missed"}') == 0
    assert "schedule.missed" not in b.logs()
