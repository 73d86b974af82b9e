"""Fixtures for integration tests: a real `idemflow serve` on a free loopback
port, over a throwaway database, spoken to over real HTTP.

IDEMFLOW_TEST_BACKEND selects the store: "sqlite" (a file under a tmp dir) or
"postgres" (IDEMFLOW_TEST_PG is a conninfo of a cluster; each server gets a
fresh database)."""
import http.client
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import uuid

import pytest

BIN = os.environ.get("IDEMFLOW_BIN", os.path.join(os.path.dirname(__file__), "../../build/idemflow"))
BACKEND = os.environ.get("IDEMFLOW_TEST_BACKEND", "sqlite")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Response:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers
        self.raw = body
        try:
            self.json = json.loads(body) if body else None
        except ValueError:
            self.json = None

    def __repr__(self):
        return f"<{self.status} {self.raw[:300]!r}>"


class Server:
    """One engine process.  start() waits for /healthz by polling."""

    def __init__(self, db, workdir, env=None, extra=()):
        self.db = db
        self.workdir = workdir
        self.env = dict(os.environ, **(env or {}))
        if not db.startswith("sqlite:"):
            # processes sharing a database share the secrets key
            self.env.setdefault("IDEMFLOW_SECRETS_KEY", "7" * 64)
        self.extra = list(extra)
        self.proc = None
        self.port = None
        self.log_path = os.path.join(workdir, f"server-{uuid.uuid4().hex[:6]}.log")

    def start(self, expect_fail=False, timeout=15):
        self.port = free_port()
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [BIN, "serve", "--listen", f"127.0.0.1:{self.port}", "--db", self.db] + self.extra,
            stdout=self.log, stderr=self.log, env=self.env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if expect_fail:
                    return self.proc.returncode
                raise RuntimeError(f"server exited {self.proc.returncode}: {self.logs(4000)}")
            try:
                if self.request("GET", "/healthz").status == 200:
                    return 0
            except OSError:
                pass
            time.sleep(0.02)
        raise RuntimeError("server did not become healthy: " + self.logs(4000))

    def logs(self, tail=None):
        with open(self.log_path, "rb") as f:
            text = f.read().decode(errors="replace")
        return text[-tail:] if tail else text

    def stop(self, sig=signal.SIGTERM):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "log", None):
            self.log.close()
        return self.proc.returncode if self.proc else None

    def request(self, method, path, body=None, headers=None, raw=None, timeout=30):
        """headers: a dict, or a list of (name, value) pairs, sent as given
        (a name may repeat)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            pairs = list(headers.items() if isinstance(headers, dict) else headers or [])
            data = raw
            if body is not None and raw is None:
                data = json.dumps(body).encode()
            if data is not None and not any(k.lower() == "content-type" for k, _ in pairs):
                pairs.append(("Content-Type", "application/json"))
            conn.putrequest(method, path)
            for k, v in pairs:
                conn.putheader(k, v)
            if data is not None or method in ("POST", "PUT", "PATCH"):
                conn.putheader("Content-Length", str(len(data or b"")))
            conn.endheaders(data)
            r = conn.getresponse()
            return Response(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
        finally:
            conn.close()

    # conveniences
    def put(self, path, body=None, **kw):
        return self.request("PUT", path, body, **kw)

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, body=None, **kw):
        return self.request("POST", path, body, **kw)


def all_pages(server, path):
    """Every item of a list (`{"items", "next"}`), page by page: path holds
    its query (with its limit) but not `after`."""
    seen, after = [], None
    while True:
        r = server.get(path + (f"&after={after}" if after else ""))
        assert r.status == 200, r
        seen += r.json["items"]
        after = r.json["next"]
        if not after:
            return seen


CREATED_DBS = []  # PostgreSQL databases of the current test, dropped at its end


def new_db(tmp):
    if BACKEND == "postgres":
        base = os.environ["IDEMFLOW_TEST_PG"]
        name = "t_" + uuid.uuid4().hex[:12]
        subprocess.run(["psql", base, "-qc", f"CREATE DATABASE {name}"], check=True,
                       stdout=subprocess.DEVNULL)
        CREATED_DBS.append(name)
        if base.startswith(("postgres://", "postgresql://")):
            # postgresql://user@host:port/dbname[?params] -> another dbname
            head, _, query = base.partition("?")
            url = head.rsplit("/", 1)[0] + "/" + name
            return url + ("?" + query if query else "")
        return f"{base} dbname={name}"
    return "sqlite:" + os.path.join(tmp, "idemflow.db")


@pytest.fixture
def workdir():
    if os.environ.get("IDEMFLOW_TEST_KEEP"):  # keep databases and logs for a post-mortem
        yield tempfile.mkdtemp(prefix="idemflow-it-")
        return
    with tempfile.TemporaryDirectory(prefix="idemflow-it-") as d:
        yield d


@pytest.fixture
def make_server(workdir):
    servers = []

    def make(db=None, **kw):
        s = Server(db or new_db(workdir), workdir, **kw)
        servers.append(s)
        return s

    yield make
    problems = []
    for s in servers:
        s.stop()
        logs = s.logs()
        # sanitizer builds: any report from the server process fails the test
        for marker in ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:",
                       "WARNING: ThreadSanitizer"):
            if marker in logs:
                problems.append(f"{marker} in {s.log_path}")
    # a cluster that keeps every test's database grows to tens of thousands
    # of files, and its checkpoints (and a restart's) take minutes
    while CREATED_DBS and not os.environ.get("IDEMFLOW_TEST_KEEP"):
        subprocess.run(["psql", os.environ["IDEMFLOW_TEST_PG"], "-qc",
                        f"DROP DATABASE IF EXISTS {CREATED_DBS.pop()} WITH (FORCE)"],
                       stdout=subprocess.DEVNULL)
    assert not problems, problems


@pytest.fixture
def server(make_server):
    s = make_server()
    s.start()
    return s


ORDERS = {
    "vertices": {
        "order_received": {"type": "ENTRY_POINT", "config": {"idempotencyFields": "order.id"}},
        "by_payload": {"type": "ENTRY_POINT"},
        "summary": {"type": "TRANSFORM",
                    "config": {"output": {"order": "= payload.order.id", "note": "literal"}}},
    },
    "edges": [
        {"from": "order_received", "to": "summary"},
        {"from": "by_payload", "to": "summary", "condition": "= payload.order.amount > 0"},
    ],
}


@pytest.fixture
def orders(server):
    """A workspace "acme" with the ORDERS workflow; returns (server, base path)."""
    assert server.put("/v1/workspaces/acme", {}).status in (200, 201)
    r = server.put("/v1/workspaces/acme/workflows/orders", ORDERS)
    assert r.status == 201, r
    return server, "/v1/workspaces/acme/workflows/orders/entry-points"
