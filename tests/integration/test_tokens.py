"""Workspace tokens (spec §10) over real HTTP: with IDEMFLOW_ADMIN_TOKEN set,
a token from POST /v1/workspaces/{ws}/tokens reaches that workspace only,
cannot manage tokens, stops working when revoked, and is never stored."""
import glob
import os

ADMIN = "admin-" + os.urandom(6).hex()
A = {"Authorization": f"Bearer {ADMIN}"}
WF = {"vertices": {"start": {"type": "ENTRY_POINT"},
                   "t": {"type": "TRANSFORM", "config": {"output": "= payload.n"}}},
      "edges": [{"from": "start", "to": "t"}]}


def bearer(token):
    return {"Authorization": f"Bearer {token}"}


def admin_server(make_server):
    s = make_server(env={"IDEMFLOW_ADMIN_TOKEN": ADMIN})
    s.start()
    for ws in ("a", "b"):
        assert s.put(f"/v1/workspaces/{ws}", {}, headers=A).status in (200, 201)
    return s


def test_a_workspace_token_reaches_its_workspace_only(make_server):
    s = admin_server(make_server)
    r = s.post("/v1/workspaces/a/tokens", {"name": "ci"}, headers=A)
    assert r.status == 201, r
    assert r.headers.get("cache-control") == "no-store"
    tok, tid = r.json["token"], r.json["id"]
    assert r.json["name"] == "ci" and r.json["workspace"] == "a"
    t = bearer(tok)
    # its own workspace: every route
    assert s.get("/v1/workspaces/a", headers=t).status == 200
    assert s.put("/v1/workspaces/a/workflows/f", WF, headers=t).status == 201
    r = s.post("/v1/workspaces/a/workflows/f/entry-points/start/trigger", {"n": 1}, headers=t)
    assert r.status == 201, r
    assert s.get(f"/v1/workspaces/a/executions/{r.json['executionId']}", headers=t).status == 200
    # another workspace, the token routes, a tampered token, no token: refused
    assert s.get("/v1/workspaces/b", headers=t).status == 401
    assert s.put("/v1/workspaces/b/workflows/f", WF, headers=t).status == 401
    assert s.post("/v1/workspaces/a/tokens", {}, headers=t).status == 403
    assert s.get("/v1/workspaces/a/tokens", headers=t).status == 403
    assert s.request("DELETE", f"/v1/workspaces/a/tokens/{tid}", headers=t).status == 403
    bad = tok[:-1] + ("0" if tok[-1] != "0" else "1")
    assert s.get("/v1/workspaces/a", headers=bearer(bad)).status == 401
    assert s.get("/v1/workspaces/a").status == 401
    # the list shows ids and names, never the token
    r = s.get("/v1/workspaces/a/tokens", headers=A)
    assert r.status == 200 and [i["id"] for i in r.json["items"]] == [tid]
    assert tok not in r.raw.decode()
    # revoked: refused at once
    assert s.request("DELETE", f"/v1/workspaces/a/tokens/{tid}", headers=A).status == 204
    assert s.get("/v1/workspaces/a", headers=t).status == 401
    assert s.request("DELETE", f"/v1/workspaces/a/tokens/{tid}", headers=A).status == 404
    s.stop()
    # the token is in no database file and no log line
    files = glob.glob(s.db[len("sqlite:"):] + "*") if s.db.startswith("sqlite:") else []
    for f in files + [s.log_path]:
        if os.path.isfile(f):
            with open(f, "rb") as fh:
                assert tok.encode() not in fh.read(), f


def test_create_with_an_idempotency_key_replays_the_same_token(make_server):
    s = admin_server(make_server)
    h = dict(A, **{"Idempotency-Key": '"tok-1"'})
    r1 = s.post("/v1/workspaces/a/tokens", {"name": "deploy"}, headers=h)
    assert r1.status == 201, r1
    r2 = s.post("/v1/workspaces/a/tokens", {"name": "deploy"}, headers=h)
    assert r2.status == 201 and r2.headers.get("idempotent-replayed") == "true"
    assert r2.json == r1.json
    assert s.get("/v1/workspaces/a", headers=bearer(r2.json["token"])).status == 200
    # another body under the key: 422, and no second token
    r3 = s.post("/v1/workspaces/a/tokens", {"name": "other"}, headers=h)
    assert r3.status == 422, r3
    assert len(s.get("/v1/workspaces/a/tokens", headers=A).json["items"]) == 1
    # no body and {} are one request: a key sent with both replays
    h0 = dict(A, **{"Idempotency-Key": "tok-0"})
    e1 = s.post("/v1/workspaces/a/tokens", None, headers=h0)
    e2 = s.post("/v1/workspaces/a/tokens", raw=b" { } ", headers=h0)
    assert e1.status == 201 and e2.status == 201 and e2.json == e1.json, (e1, e2)
    assert e2.headers.get("idempotent-replayed") == "true"
    assert s.request("DELETE", f"/v1/workspaces/a/tokens/{e1.json['id']}", headers=A).status == 204
    # without a key, each create is a new token
    r4 = s.post("/v1/workspaces/a/tokens", None, headers=A)
    assert r4.status == 201 and r4.json["token"] != r1.json["token"] and r4.json["name"] == ""
    # a token of workspace a presented on b's path is refused, even by id
    assert s.get("/v1/workspaces/b", headers=bearer(r4.json["token"])).status == 401
    # once revoked, a replay does not hand the dead token out again
    tid = r1.json["id"]
    assert s.request("DELETE", f"/v1/workspaces/a/tokens/{tid}", headers=A).status == 204
    r5 = s.post("/v1/workspaces/a/tokens", {"name": "deploy"}, headers=h)
    assert r5.status == 410 and r5.json["type"] == "/problems/token-revoked", r5
    assert r1.json["token"] not in r5.raw.decode()


def test_bad_create_bodies_change_nothing(make_server):
    s = admin_server(make_server)
    for body, ptr in (({"name": 5}, "/name"), ({"nom": "x"}, "/nom"),
                      ({"name": "x" * 129}, "/name"), ({"name": "a\nb"}, "/name"), (["x"], ""),
                      ({"name": "a\u0000b"}, "/name"), ({"a/b": "x"}, "/a~1b")):
        r = s.post("/v1/workspaces/a/tokens", body, headers=A)
        assert r.status == 422 and r.json["pointer"] == ptr, (body, r)
    assert s.post("/v1/workspaces/nope/tokens", {}, headers=A).status == 404
    assert s.get("/v1/workspaces/a/tokens", headers=A).json["items"] == []


def test_the_cli_creates_lists_and_revokes_tokens(make_server):
    """`idemflow token-create|tokens|token-revoke` (the admin token from
    $IDEMFLOW_ADMIN_TOKEN): a created token works, a keyed repeat replays
    it, and a revoked one is refused at once."""
    import json
    import subprocess
    from conftest import BIN
    s = admin_server(make_server)
    url = f"http://127.0.0.1:{s.port}"

    def cli(*args, admin=ADMIN):
        env = dict(os.environ, IDEMFLOW_ADMIN_TOKEN=admin)
        return subprocess.run([BIN, *args, "--url", url], capture_output=True, text=True, env=env)

    made = cli("token-create", "a", "--name", "deploy", "--key", "tok-1")
    assert made.returncode == 0, made.stderr
    tok = json.loads(made.stdout)
    assert tok["name"] == "deploy" and tok["workspace"] == "a" and tok["token"].startswith("ifw_")
    again = cli("token-create", "a", "--name", "deploy", "--key", "tok-1")
    assert again.returncode == 0 and json.loads(again.stdout) == tok, again
    assert s.get("/v1/workspaces/a", headers=bearer(tok["token"])).status == 200
    listed = cli("tokens", "a")
    assert listed.returncode == 0 and [i["id"] for i in json.loads(listed.stdout)["items"]] == [tok["id"]]
    assert tok["token"] not in listed.stdout
    # without the admin token: refused, and nothing printed on stdout
    no = cli("tokens", "a", admin="")
    assert no.returncode == 1 and no.stdout == "" and "401" in no.stderr, no
    gone = cli("token-revoke", "a", tok["id"])
    assert gone.returncode == 0 and gone.stdout == "", gone
    assert s.get("/v1/workspaces/a", headers=bearer(tok["token"])).status == 401
    assert cli("token-revoke", "a", tok["id"]).returncode == 1
    # usage errors never reach the server
    for bad in (("token-revoke", "a"), ("token-create", "a", "--state", "dead"),
                ("tokens", "a/b"), ("token-revoke", "a", "x y")):
        r = cli(*bad)
        assert r.returncode == 2, (bad, r)
    s.stop()


def test_the_cli_never_prints_the_password_of_its_url():
    """A transport error names the url with its userinfo masked, as the
    server shows a subscription's: `user:****@`, `****@` for a lone token."""
    import subprocess
    from conftest import BIN
    for url, shown in (("http://admin:S3cr3tPw@127.0.0.1:1", "http://admin:****@127.0.0.1:1/"),
                       ("http://S3cr3tPw@127.0.0.1:1", "http://****@127.0.0.1:1/")):
        for args, env in ((["get", "ws", "x", "--url", url], {}),
                          (["get", "ws", "x"], {"IDEMFLOW_URL": url})):
            r = subprocess.run([BIN, *args], capture_output=True, text=True,
                               env=dict(os.environ, IDEMFLOW_ADMIN_TOKEN="", **env))
            assert r.returncode == 1, r
            assert "S3cr3tPw" not in r.stdout + r.stderr, r
            assert shown in r.stderr, r
