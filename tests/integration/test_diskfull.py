"""A full disk under the SQLite store, on a real (small) filesystem.

While the disk is full the engine refuses new work with 503 problem+json
and stores none of it; what it had accepted before is not lost: charges
whose outcomes could not be committed are recovered once space returns,
re-sent with their key, and every order is charged exactly once.

The filesystem is a tmpfs of a few MiB mounted under the test's temp dir;
where mounting is not allowed (no root or no CAP_SYS_ADMIN) the test skips.
PostgreSQL is out of scope: there the cluster owns its disk."""
import concurrent.futures
import errno
import os
import subprocess

import pytest

from conftest import BACKEND
from test_engine import WS, finished, metric, put_workflow, run, wait_for
from test_gateway import mock, pay, setup_pay  # noqa: F401  (mock is a fixture)
from test_schedules import WS as CRON, advance_to, clock_now, every, executions, fired, future_minutes, \
    time_ms

pytestmark = pytest.mark.skipif(BACKEND != "sqlite", reason="the SQLite store's own disk")

HOLD_MS = 6000  # how long the provider holds its answers after committing the charges
PAD = "x" * 4000

NOTE = {
    "vertices": {
        "note": {"type": "ENTRY_POINT", "config": {"idempotencyFields": "note.id"}},
        "kept": {"type": "TRANSFORM", "config": {"output": {"id": "= payload.note.id"}}},
    },
    "edges": [{"from": "note", "to": "kept"}],
}


@pytest.fixture
def small_fs(workdir):
    d = os.path.join(workdir, "small")
    os.mkdir(d)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs", d],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip("cannot mount a tmpfs here: " + (r.stderr.strip() or f"exit {r.returncode}"))
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", d], check=False)


def fill(path):
    """Writes `path` until the filesystem has no byte left."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for chunk in (1 << 16, 1 << 12, 1):
            try:
                while True:
                    os.write(fd, b"\0" * chunk)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
    finally:
        os.close(fd)


def ended(s, xid):
    x = s.get(f"{WS}/executions/{xid}").json
    return x if x["status"] != "running" else None


def note(s, i):
    return s.post(f"{WS}/workflows/notes/entry-points/note/trigger",
                  {"note": {"id": f"n-{i}", "pad": PAD}})


def test_a_full_disk_refuses_new_work_and_loses_none_it_accepted(make_server, mock, small_fs):
    s = make_server(db="sqlite:" + os.path.join(small_fs, "idemflow.db"), extra=["--lease-ms", "1000"])
    s.start()
    setup_pay(s, mock, timeoutMs=HOLD_MS * 10)
    put_workflow(s, "notes", NOTE)
    orders = [f"full-{i}" for i in range(12)]
    # The provider commits each charge, then holds its answer back.
    mock.faults(f"latency={HOLD_MS}:after_commit:count={len(orders)}")
    with concurrent.futures.ThreadPoolExecutor(len(orders)) as ex:
        xids = list(ex.map(lambda o: pay(s, o), orders))  # each one 201: accepted
    wait_for(lambda: mock.call("GET", "/stats")["charges"] == len(orders))

    filler = os.path.join(small_fs, "filler")
    fill(filler)
    # New work until the store's slack is gone: then 503, and nothing kept.
    accepted = []

    def refused():
        r = note(s, len(accepted))
        if r.status == 201:
            accepted.append(r.json["executionId"])
            return None
        return r
    r = wait_for(refused, timeout=60, interval=0)
    assert r.status == 503, r
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json["type"] == "/problems/store-unavailable" and "full" in r.json["detail"], r.json
    assert s.get(f"{WS}/executions/{xids[0]}").status == 200  # reads still answer

    # The held-back answers arrive now; their outcomes cannot be committed.
    wait_for(lambda: "gateway.complete_failed" in s.logs(), timeout=HOLD_MS / 1000 + 30)
    assert mock.call("GET", "/stats")["charges"] == len(orders)

    os.unlink(filler)
    for xid in xids:  # recovered once their leases lapse, re-sent with their keys
        x = wait_for(lambda: ended(s, xid), timeout=60)
        assert x["status"] == "completed", x
    for xid in accepted:
        assert finished(s, xid)["status"] == "completed"
    assert metric(s, 'idemflow_steps_total{event="recovered"}') >= 1
    stats = mock.call("GET", "/stats")
    assert {o: stats["charges_per_order"].get(o) for o in orders} == {o: 1 for o in orders}
    assert stats["charges"] == len(orders) and stats["replays"] >= 1, stats

    # The refused trigger stored nothing: sent again, it creates its execution.
    again = note(s, len(accepted))
    assert again.status == 201 and again.json.get("deduplicated") is not True, again
    assert finished(s, again.json["executionId"])["status"] == "completed"
    assert s.stop() == 0


def full_after_a_first_tick(make_server, small_fs):
    """An engine on the small disk (test clock) whose every-minute schedule
    fired its first tick, with the disk then filled until a trigger is
    refused: (server, that tick, the filler file to delete)."""
    s = make_server(db="sqlite:" + os.path.join(small_fs, "idemflow.db"), extra=["--test-clock"])
    s.start()
    put_workflow(s, "notes", NOTE)
    assert s.put(CRON, {}).status in (200, 201)
    tick, expr = future_minutes(s)
    assert s.put(f"{CRON}/workflows/minutely", every(expr)).status == 201
    advance_to(s, tick + 30000)
    wait_for(lambda: fired(s) == 1)
    filler = os.path.join(small_fs, "filler")
    fill(filler)
    n = [0]

    def refused():
        n[0] += 1
        r = note(s, n[0])
        return r if r.status == 503 else None
    wait_for(refused, timeout=60, interval=0)
    return s, tick, filler


def fired_ticks(s):
    """The scheduled times of the schedule's executions, in order."""
    return sorted(time_ms(s.get(f"{CRON}/executions/{i['id']}").json["payload"]["scheduledAt"])
                  for i in executions(s))


def test_a_tick_that_falls_due_while_the_disk_is_full_fires_once_space_returns(make_server, small_fs):
    """A tick whose fire the store refused (here a full disk; on PostgreSQL an
    outage longer than the store's own retries) is tried again each pass,
    not skipped: it fires, once, as soon as the store takes writes again."""
    s, tick, filler = full_after_a_first_tick(make_server, small_fs)
    advance_to(s, tick + 90000)
    wait_for(lambda: "schedule.fire_failed" in s.logs(), timeout=30)
    assert fired(s) == 1
    os.unlink(filler)
    wait_for(lambda: fired(s) == 2, timeout=30)
    ticks = fired_ticks(s)
    assert ticks == [tick, tick + 60000], ticks
    assert metric(s, 'idemflow_schedule_ticks_total{outcome="missed"}') == 0
    assert s.logs().count("schedule.fire_failed") == 1  # once per tick, however many tries
    assert s.stop() == 0


def test_a_failed_tick_is_tried_again_before_the_next_one_is_due(make_server, small_fs):
    """The retries of a refused fire back off (1 s, 2 s, … 10 s), but never
    past two seconds before the next tick: space that returns at 58.5 s of
    the minute still fires the tick (without the cap, its retry came after
    the next tick and it counted as missed)."""
    s, tick, filler = full_after_a_first_tick(make_server, small_fs)
    due = tick + 60000
    failures = lambda: s.logs().count("store.commit_failed")  # noqa: E731
    # each move passes the retry's time: 1, 2, 4, 8 and 10 s of backoff
    for at in (30000, 31500, 34000, 38500, 47000, 57500):
        before = failures()
        advance_to(s, due + at)
        wait_for(lambda: failures() > before, timeout=30)
    os.unlink(filler)
    # the engine's clock kept running with real time while the test waited
    # for the failure above: move to 58.5 s, or a little on if it is past it
    # already (still well before the next tick, or the test means nothing)
    now = clock_now(s)
    assert now < due + 59000, now - due
    advance_to(s, max(due + 58500, now + 1))
    wait_for(lambda: fired(s) == 2, timeout=30)
    ticks = fired_ticks(s)
    assert ticks == [tick, due], ticks
    assert metric(s, 'idemflow_schedule_ticks_total{outcome="missed"}') == 0
    assert s.stop() == 0
