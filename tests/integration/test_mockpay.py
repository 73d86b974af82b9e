"""The mock payment provider (idemflow-mockpay) over real HTTP: charges with
Idempotency-Key semantics, the verify endpoint, statistics, every fault kind,
determinism under a seed, /reset, logs and a graceful exit.

IDEMFLOW_MOCKPAY names the binary (default build/idemflow-mockpay)."""
import email.utils
import http.client
import json
import os
import signal
import subprocess
import tempfile
import threading
import time

import pytest
from test_engine import wait_for

MOCKPAY = os.environ.get(
    "IDEMFLOW_MOCKPAY",
    os.path.join(os.path.dirname(__file__), "../../build/idemflow-mockpay"))

SANITIZER_MARKERS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:",
                     "WARNING: ThreadSanitizer")


class Dropped(Exception):
    """The server closed the connection without a response."""


class Res:
    def __init__(self, status, headers, raw):
        self.status = status
        self.headers = headers
        self.raw = raw
        try:
            self.json = json.loads(raw) if raw else None
        except ValueError:
            self.json = None

    def __repr__(self):
        return f"<{self.status} {self.raw[:300]!r}>"


class Mock:
    def __init__(self, args=(), env=None):
        self.args = list(args)
        self.env = env
        self.proc = None
        self.port = None
        self.errf = tempfile.NamedTemporaryFile(prefix="mockpay-", suffix=".log", delete=False)

    def start(self, timeout=10):
        self.proc = subprocess.Popen([MOCKPAY, "--listen", "127.0.0.1:0"] + self.args,
                                     stdout=subprocess.PIPE, stderr=self.errf,
                                     env=self.env)
        line = self.proc.stdout.readline()  # blocks until ready (or exit)
        if not line:
            self.proc.wait(timeout)
            raise RuntimeError(f"mockpay exited {self.proc.returncode}: {self.logs()[-2000:]}")
        ready = json.loads(line)
        assert ready["event"] == "mockpay.ready"
        self.port = ready["port"]
        assert self.port > 0
        return self

    def logs(self):
        with open(self.errf.name, "rb") as f:
            return f.read().decode(errors="replace")

    def stop(self, sig=signal.SIGTERM, timeout=15):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc and self.proc.stdout:
            self.proc.stdout.close()
        return self.proc.returncode if self.proc else None

    def request(self, method, path, body=None, headers=None, raw=None, timeout=30):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            h = dict(headers or {})
            data = raw
            if body is not None and raw is None:
                data = json.dumps(body).encode()
            if data is not None:
                h.setdefault("Content-Type", "application/json")
            conn.request(method, path, body=data, headers=h)
            try:
                r = conn.getresponse()
            except (http.client.RemoteDisconnected, ConnectionError) as exc:
                raise Dropped() from exc
            return Res(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
        finally:
            conn.close()

    def charge(self, order, amount=100, key=None, extra=None, **kw):
        body = {"order": order, "amount": amount}
        body.update(extra or {})
        h = {"Idempotency-Key": key} if key else {}
        return self.request("POST", "/v1/charges", body, headers=h, **kw)

    def stats(self):
        r = self.request("GET", "/stats")
        assert r.status == 200, r
        return r.json

    def set_faults(self, spec):
        if isinstance(spec, str):
            r = self.request("POST", "/faults", raw=spec.encode(),
                             headers={"Content-Type": "text/plain"})
        else:
            r = self.request("POST", "/faults", spec)
        assert r.status == 200, r
        return r.json


@pytest.fixture
def make_mock():
    mocks = []

    def make(*args, start=True):
        m = Mock(args)
        mocks.append(m)
        return m.start() if start else m

    yield make
    problems = []
    for m in mocks:
        rc = m.stop()
        logs = m.logs()
        os.unlink(m.errf.name)
        if rc not in (0, None):
            problems.append(f"mockpay exited {rc}")
        problems += [f"{k} in mockpay stderr" for k in SANITIZER_MARKERS if k in logs]
    assert not problems, problems


@pytest.fixture
def mock(make_mock):
    return make_mock()


# ---- charges and idempotency ----------------------------------------------

def test_ready_line_reports_real_port_and_charge_shape(mock):
    r = mock.charge("o-1", 1250)
    assert r.status == 201, r
    c = r.json
    assert c["id"].startswith("ch_") and c["order"] == "o-1" and c["amount"] == 1250
    assert c["status"] == "succeeded" and isinstance(c["created"], int)
    assert "idempotent-replayed" not in r.headers
    # numeric order ids are kept as numbers
    r = mock.charge(42, 5)
    assert r.status == 201 and r.json["order"] == 42


def test_without_key_every_post_charges(mock):
    a, b = mock.charge("o-1"), mock.charge("o-1")
    assert a.status == b.status == 201
    assert a.json["id"] != b.json["id"]
    st = mock.stats()
    assert st["charges_per_order"] == {"o-1": 2}
    assert st["requests"]["POST /v1/charges"] == 2 and st["replays"] == 0


def test_same_key_same_body_replays(mock):
    a = mock.charge("o-1", 100, key="k-1")
    # the same body with other member order and spacing is the same request
    b = mock.request("POST", "/v1/charges", raw=b'{ "amount": 100.0,  "order": "o-1" }',
                     headers={"Idempotency-Key": "k-1"})
    assert a.status == b.status == 201
    assert b.raw == a.raw
    assert b.headers.get("idempotent-replayed") == "true"
    assert "idempotent-replayed" not in a.headers
    st = mock.stats()
    assert st["charges_per_order"] == {"o-1": 1}
    assert st["replays"] == 1 and st["idempotency_keys"] == 1


def test_same_key_other_body_is_422(mock):
    assert mock.charge("o-1", 100, key="k-1").status == 201
    r = mock.charge("o-1", 200, key="k-1")
    assert r.status == 422, r
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json["type"] == "/problems/idempotency-key-reused"
    r = mock.charge("o-2", 100, key="k-1")
    assert r.status == 422
    st = mock.stats()
    assert st["charges_per_order"] == {"o-1": 1} and st["key_mismatches"] == 2


def test_same_key_in_flight_is_409(mock):
    mock.set_faults("latency=1500:count=1")
    first = {}

    def slow():
        first["res"] = mock.charge("o-1", 100, key="k-1")

    t = threading.Thread(target=slow)
    t.start()
    try:
        # the key is held in flight from the moment it is stored (the same
        # critical section), for the whole latency
        wait_for(lambda: mock.stats()["idempotency_keys"] == 1, timeout=5)
        r = mock.charge("o-1", 100, key="k-1")
        assert r.status == 409, r
        assert r.json["type"] == "/problems/idempotency-key-in-use"
    finally:
        t.join()
    assert first["res"].status == 201
    again = mock.charge("o-1", 100, key="k-1")
    assert again.status == 201 and again.json["id"] == first["res"].json["id"]
    assert again.headers.get("idempotent-replayed") == "true"
    st = mock.stats()
    assert st["charges_per_order"] == {"o-1": 1} and st["in_flight_conflicts"] == 1


def test_invalid_requests_are_400_and_store_nothing(mock):
    cases = [
        dict(raw=b"{not json"),
        dict(body=[1, 2]),
        dict(body={"amount": 5}),
        dict(body={"order": "o", "amount": 0}),
        dict(body={"order": "o", "amount": 1.5}),
        dict(body={"order": {"id": 1}, "amount": 5}),
        dict(body={"order": "", "amount": 5}),
        dict(body={"order": "o", "amount": 5, "currency": 7}),
        dict(body={"order": "o", "amount": 5}, headers={"Idempotency-Key": "x" * 256}),
    ]
    for c in cases:
        r = mock.request("POST", "/v1/charges", **c)
        assert r.status == 400, (c, r)
        assert r.headers["content-type"] == "application/problem+json"
    assert mock.stats()["charges"] == 0
    assert mock.charge("o", 5, key="x" * 255).status == 201


def test_body_over_cap_is_413(mock):
    r = mock.request("POST", "/v1/charges",
                     raw=b'{"order":"o","amount":1,"pad":"' + b"x" * 70000 + b'"}')
    assert r.status == 413
    assert mock.stats()["charges"] == 0


def test_unknown_routes(mock):
    assert mock.request("GET", "/nope").status == 404
    assert mock.request("DELETE", "/v1/charges").status == 405
    assert mock.request("PUT", "/stats").status == 405


# ---- verify endpoints -----------------------------------------------------

def test_verify_endpoints(mock):
    r = mock.request("GET", "/v1/charges?order=o-1")
    assert r.status == 200 and r.json["data"] == []
    a = mock.charge("o-1", 100).json
    b = mock.charge("o-1", 300).json
    mock.charge("o-2", 100)
    r = mock.request("GET", "/v1/charges?order=o-1")
    assert r.status == 200
    assert [c["id"] for c in r.json["data"]] == [a["id"], b["id"]]
    r = mock.request("GET", "/v1/charges/" + a["id"])
    assert r.status == 200 and r.json == a
    assert mock.request("GET", "/v1/charges/ch_nope").status == 404
    assert mock.request("GET", "/v1/charges").status == 400
    # percent-encoded order ids
    mock.charge("a b/c", 1)
    r = mock.request("GET", "/v1/charges?order=a%20b%2Fc")
    assert len(r.json["data"]) == 1
    st = mock.stats()
    assert st["requests"]["GET /v1/charges"] == 4
    assert st["requests"]["GET /v1/charges/{id}"] == 2


def test_verify_faults_apply_only_with_on_verify(mock):
    mock.set_faults("status=503:on=verify:count=1")
    assert mock.charge("o-1").status == 201
    assert mock.request("GET", "/v1/charges?order=o-1").status == 503
    assert mock.request("GET", "/v1/charges?order=o-1").status == 200


# ---- faults ---------------------------------------------------------------

def test_drop_after_commit(mock):
    mock.set_faults([{"kind": "drop_after_commit", "count": 1}])
    with pytest.raises(Dropped):
        mock.charge("o-1", 100, key="k-1")
    st = mock.stats()
    assert st["charges_per_order"] == {"o-1": 1}
    assert st["dropped"] == 1 and st["faults_injected"]["drop_after_commit"] == 1
    # the charge is visible to a verify read, and a retry with the key replays it
    listed = mock.request("GET", "/v1/charges?order=o-1").json["data"]
    assert len(listed) == 1
    r = mock.charge("o-1", 100, key="k-1")
    assert r.status == 201 and r.headers.get("idempotent-replayed") == "true"
    assert r.json["id"] == listed[0]["id"]
    # without a key the retry charges again: the danger the engine must avoid
    mock.set_faults("drop_after_commit:count=1")
    with pytest.raises(Dropped):
        mock.charge("o-2", 100)
    assert mock.charge("o-2", 100).status == 201
    assert mock.stats()["charges_per_order"]["o-2"] == 2


def test_status_429_with_retry_after_seconds(mock):
    mock.set_faults("status=429:retry_after=1:count=2")
    for _ in range(2):
        r = mock.charge("o-1", key="k-1")
        assert r.status == 429, r
        assert r.headers["retry-after"] == "1"
        assert r.json["status"] == 429
    r = mock.charge("o-1", key="k-1")
    assert r.status == 201 and "idempotent-replayed" not in r.headers
    st = mock.stats()
    assert st["charges_per_order"] == {"o-1": 1}
    assert st["faults_injected"]["status"] == 2
    assert st["responses"]["429"] == 2 and st["responses"]["201"] == 1


def test_status_429_with_retry_after_http_date(mock):
    mock.set_faults([{"kind": "status", "code": 429, "retry_after_date": 3}])
    before = time.time()
    r = mock.charge("o-1")
    after = time.time()
    assert r.status == 429
    when = email.utils.parsedate_to_datetime(r.headers["retry-after"]).timestamp()
    assert r.headers["retry-after"].endswith(" GMT")
    # rounded up to whole seconds: never sooner than N seconds from now
    assert before + 3 - 0.01 <= when <= after + 3 + 1


def test_status_503_refuses_before_commit_and_frees_the_key(mock):
    mock.set_faults("status=503:count=1")
    r = mock.charge("o-1", key="k-1")
    assert r.status == 503 and "retry-after" not in r.headers
    assert mock.stats()["charges"] == 0
    r = mock.charge("o-1", key="k-1")
    assert r.status == 201 and "idempotent-replayed" not in r.headers


def test_status_500_after_commit(mock):
    mock.set_faults("status=500:after_commit:count=1")
    r = mock.charge("o-1", key="k-1")
    assert r.status == 500, r
    assert mock.stats()["charges_per_order"] == {"o-1": 1}
    r = mock.charge("o-1", key="k-1")
    assert r.status == 201 and r.headers.get("idempotent-replayed") == "true"
    assert mock.stats()["charges_per_order"] == {"o-1": 1}


def test_latency_before_and_after_commit(mock):
    mock.set_faults("latency=400:count=1")
    t0 = time.monotonic()
    assert mock.charge("o-1").status == 201
    assert time.monotonic() - t0 >= 0.38
    t0 = time.monotonic()
    assert mock.charge("o-1").status == 201
    assert time.monotonic() - t0 < 0.3
    # latency after commit: the client times out, the charge exists
    mock.set_faults("latency=1000:after_commit:count=1")
    with pytest.raises(TimeoutError):
        mock.charge("o-2", key="k-2", timeout=0.3)
    assert mock.stats()["charges_per_order"]["o-2"] == 1
    # the key is done at the commit: a retry replays while the first
    # answer is still held back (what an engine's retry after a timeout meets)
    r = mock.charge("o-2", key="k-2")
    assert r.status == 201 and r.headers.get("idempotent-replayed") == "true"


def test_ignore_idempotency(mock):
    mock.set_faults("ignore_idempotency")
    a = mock.charge("o-1", key="k-1")
    b = mock.charge("o-1", key="k-1")
    assert a.status == b.status == 201 and a.json["id"] != b.json["id"]
    assert "idempotent-replayed" not in b.headers
    st = mock.stats()
    assert st["charges_per_order"] == {"o-1": 2}
    assert st["replays"] == 0 and st["faults_injected"]["ignore_idempotency"] == 2


def test_match_by_order_every_and_count(mock):
    mock.set_faults("status=503:order=o-bad;status=502:every=3:count=2")
    assert mock.charge("o-bad").status == 503
    seq = [mock.charge("o-%d" % i).status for i in range(9)]
    # every 3rd request that reaches the second fault, twice
    assert seq == [201, 201, 502, 201, 201, 502, 201, 201, 201]
    f = mock.request("GET", "/faults").json["faults"]
    assert f[0]["fired"] == 1 and f[1]["fired"] == 2 and f[1]["seen"] == 6
    # order ids given as numbers match their text form
    mock.set_faults([{"kind": "status", "code": 503, "order": 7}])
    assert mock.charge(7).status == 503 and mock.charge(8).status == 201


def test_determinism_under_seed(make_mock):
    spec = "status=503:probability=0.5;latency=1:probability=0.3"

    def run(m):
        return [mock_status(m, i) for i in range(40)]

    def mock_status(m, i):
        return m.charge("o-%d" % i).status

    a = make_mock("--seed", "7", "--faults", spec)
    b = make_mock("--seed", "7", "--faults", spec)
    c = make_mock("--seed", "8", "--faults", spec)
    sa, sb, sc = run(a), run(b), run(c)
    assert sa == sb
    assert sa != sc
    assert 5 <= sa.count(503) <= 35
    # /reset restores the start-up faults with fresh counters and streams
    assert a.request("POST", "/reset").status == 200
    assert run(a) == sa
    # a seed given at run time re-seeds the set the same way
    b.set_faults({"seed": 8, "faults": [{"kind": "status", "code": 503, "probability": 0.5},
                                        {"kind": "latency", "ms": 1, "probability": 0.3}]})
    assert run(b) == sc


def test_reset_clears_state(mock):
    mock.set_faults("status=503:order=never")
    mock.charge("o-1", key="k-1")
    r = mock.request("POST", "/reset")
    assert r.status == 200
    st = mock.stats()
    assert st["charges"] == 0 and st["charges_per_order"] == {} and st["idempotency_keys"] == 0
    assert st["requests"]["POST /v1/charges"] == 0
    assert mock.request("GET", "/faults").json["faults"] == []  # start-up set: none
    r = mock.charge("o-1", key="k-1")
    assert r.status == 201 and "idempotent-replayed" not in r.headers


def test_faults_endpoint(mock):
    assert mock.request("GET", "/faults").json == {"seed": 1, "faults": []}
    got = mock.set_faults("drop:order=o-1:count=1; status=429:retry_after_date=2:probability=0.25")
    assert [f["kind"] for f in got["faults"]] == ["drop_after_commit", "status"]
    assert got["faults"][1]["retry_after_date"] == 2 and got["faults"][1]["probability"] == 0.25
    bad = [
        "bogus", "status", "status=201", "status=199", "latency", "status=503:after_commit:retry_after=x",
        "drop_after_commit:after_commit", "status=429:retry_after=1:retry_after_date=1",
        "status=503:probability=2", "status=503:on=elsewhere", "status=503:nope=1",
        '[{"kind":"status","code":503,"extra":1}]', '{"seed":-1}', '{"faults":{}}', "[1]",
    ]
    for spec in bad:
        r = mock.request("POST", "/faults", raw=spec.encode())
        assert r.status == 400, (spec, r)
        assert r.json["type"] == "/problems/invalid-faults"
    # a rejected set leaves the current one in place
    assert len(mock.request("GET", "/faults").json["faults"]) == 2
    assert mock.set_faults([])["faults"] == []


def test_cli_faults_and_bad_options(make_mock):
    m = make_mock("--faults", '[{"kind":"status","code":503,"count":1}]')
    assert m.charge("o").status == 503 and m.charge("o").status == 201
    m = make_mock("--faults", "drop_after_commit:every=2", "--seed", "3")
    assert m.charge("o").status == 201
    with pytest.raises(Dropped):
        m.charge("o")
    for args in (["--faults", "status=999"], ["--seed", "x"], ["--bogus", "1"],
                 ["--max-charges", "0"]):
        p = subprocess.run([MOCKPAY, "--listen", "127.0.0.1:0"] + args,
                           capture_output=True, timeout=10)
        assert p.returncode == 2, (args, p)
    p = subprocess.run([MOCKPAY], capture_output=True, timeout=10)
    assert p.returncode == 2


def test_charge_cap_is_507(make_mock):
    m = make_mock("--max-charges", "2")
    assert m.charge("a").status == 201 and m.charge("b", key="k").status == 201
    r = m.charge("c", key="k2")
    assert r.status == 507
    # a replay still works at the cap; the refused key is not recorded
    assert m.charge("b", key="k").headers.get("idempotent-replayed") == "true"
    assert m.stats()["idempotency_keys"] == 1


# ---- operations -----------------------------------------------------------

def test_logs_are_json_and_never_hold_authorization(mock):
    secret = "sk_live_do_not_log_4242"
    r = mock.request("POST", "/v1/charges", {"order": "o-log", "amount": 1},
                     headers={"Authorization": "Bearer " + secret, "Idempotency-Key": "k"})
    assert r.status == 201
    mock.request("GET", "/v1/charges?order=o-log", headers={"Authorization": "Bearer " + secret})

    def request_lines():
        return [x for x in (json.loads(line) for line in mock.logs().splitlines()
                            if line.startswith("{")) if x.get("event") == "mockpay.request"]
    wait_for(lambda: len(request_lines()) >= 2, timeout=5)  # both request lines
    logs = mock.logs()
    assert secret not in logs
    lines = [json.loads(line) for line in logs.splitlines() if line.startswith("{")]
    reqs = [x for x in lines if x.get("event") == "mockpay.request"]
    assert {"method": "POST", "path": "/v1/charges", "status": 201, "order": "o-log"}.items() \
        <= reqs[0].items()
    assert reqs[1]["method"] == "GET" and reqs[1]["order"] == "o-log"


def test_concurrent_charges_with_keys(mock):
    errors = []

    def worker(n):
        try:
            for i in range(20):
                r = mock.charge("o-%d-%d" % (n, i % 5), 100, key="k-%d-%d" % (n, i % 5))
                assert r.status in (201, 409), r
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    ts = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    st = mock.stats()
    assert len(st["charges_per_order"]) == 40
    assert set(st["charges_per_order"].values()) == {1}


def test_sigterm_is_graceful_during_latency(make_mock):
    m = make_mock("--faults", "latency=20000")
    out = {}

    def slow():
        try:
            out["res"] = m.charge("o-1", timeout=30)
        except Exception as exc:  # noqa: BLE001
            out["exc"] = exc

    t = threading.Thread(target=slow)
    t.start()
    wait_for(lambda: m.stats()["requests"]["POST /v1/charges"] == 1, timeout=5)  # arrived
    t0 = time.monotonic()
    assert m.stop() == 0
    assert time.monotonic() - t0 < 5
    t.join(10)
    assert "mockpay.stop" in m.logs()
    # the request in flight was answered, not cut off with its connection
    assert "exc" not in out and out["res"].status == 201, out


def test_sigterm_answers_a_request_held_after_commit(make_mock):
    """SIGTERM while an answer is held back after its charge committed: the
    answer still goes out (a lost one would be a drop nobody injected)."""
    m = make_mock("--faults", "latency=20000:after_commit")
    out = {}

    def slow():
        try:
            out["res"] = m.charge("o-2", key="k-held", timeout=30)
        except Exception as exc:  # noqa: BLE001
            out["exc"] = exc

    t = threading.Thread(target=slow)
    t.start()
    wait_for(lambda: m.stats()["charges"] == 1, timeout=5)  # committed, answer held
    assert m.stop() == 0
    t.join(10)
    assert "exc" not in out and out["res"].status == 201, out
    assert out["res"].json["order"] == "o-2"


def test_outcome_faults_apply_only_to_charges(mock):
    """A drop or an after-commit status stands in for the answer to a charge
    (made, or replayed); a 422 charged nothing, so it is answered as such and
    the fault stays for the next charge."""
    assert mock.charge("o-3", key="k-3").status == 201
    mock.set_faults("drop_after_commit:count=1")
    r = mock.charge("o-3", amount=999, key="k-3")  # same key, other body
    assert r.status == 422, r
    f = mock.request("GET", "/faults").json["faults"][0]
    assert f["fired"] == 0 and f["seen"] == 1, f
    assert mock.stats()["faults_injected"]["drop_after_commit"] == 0
    try:
        mock.charge("o-4", key="k-4")
        raise AssertionError("the drop should have fired on this charge")
    except Dropped:
        pass
    assert mock.stats()["charges_per_order"] == {"o-3": 1, "o-4": 1}


def test_compact_faults_skip_empty_items(mock):
    spec = ";;".join(["latency=1"] * 40) + ";;"
    assert len(mock.set_faults(spec)["faults"]) == 40
    assert len(mock.set_faults(";".join(["latency=1"] * 64) + ";;;")["faults"]) == 64
    r = mock.request("POST", "/faults", raw=";".join(["latency=1"] * 65).encode(),
                     headers={"Content-Type": "text/plain"})
    assert r.status == 400, r


def test_key_with_trailing_whitespace_is_the_same_key(mock):
    a = mock.charge("o-5", key="k-5")
    b = mock.request("POST", "/v1/charges", {"order": "o-5", "amount": 100},
                     headers={"Idempotency-Key": "k-5  "})
    assert a.status == 201 and b.status == 201, (a, b)
    assert b.headers.get("idempotent-replayed") == "true" and b.json["id"] == a.json["id"]
    assert mock.stats()["charges_per_order"] == {"o-5": 1}
