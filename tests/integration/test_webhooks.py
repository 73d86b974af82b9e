"""Inbound signed webhooks (spec §8) over real HTTP: Standard Webhooks and
GitHub-style HMAC-SHA256 entry points verify before anything is stored, a
redelivery resolves to the same execution, and a signed entry point is the
one route a caller without the bearer token can reach."""
import base64
import hashlib
import hmac
import json
import os
import time

from jcs_ref import execution_id

WS = "/v1/workspaces/hooks"
KEY = os.urandom(24)
SECRET = "whsec_" + base64.b64encode(KEY).decode()
GH_SECRET = "gh-" + os.urandom(9).hex()


def standard(vertex="start", **extra):
    return {"vertices": {
        vertex: {"type": "ENTRY_POINT", "config": {"signature": dict(
            {"scheme": "standard-webhooks", "secret": "{{ secrets.WH }}"}, **extra)}},
        "seen": {"type": "TRANSFORM", "config": {"output": "= payload.type"}}},
        "edges": [{"from": vertex, "to": "seen"}]}


def github():
    return {"vertices": {
        "push": {"type": "ENTRY_POINT", "config": {"signature": {
            "scheme": "hmac-sha256", "secret": "{{ secrets.GH }}",
            "header": "X-Hub-Signature-256", "prefix": "sha256=", "encoding": "hex"}}},
        "seen": {"type": "TRANSFORM", "config": {"output": "= payload.ref"}}},
        "edges": [{"from": "push", "to": "seen"}]}


def signed(body, msg_id, ts=None, key=KEY):
    ts = str(int(time.time()) if ts is None else ts)
    mac = hmac.new(key, f"{msg_id}.{ts}.".encode() + body, hashlib.sha256).digest()
    return {"webhook-id": msg_id, "webhook-timestamp": ts,
            "webhook-signature": "v1," + base64.b64encode(mac).decode(),
            "Content-Type": "application/json"}


def prepare(s, token=None):
    h = {"Authorization": f"Bearer {token}"} if token else {}
    assert s.put(WS, {}, headers=h).status in (200, 201)
    assert s.put(f"{WS}/secrets/WH", {"value": SECRET}, headers=h).status == 204
    assert s.put(f"{WS}/secrets/GH", {"value": GH_SECRET}, headers=h).status == 204
    assert s.put(f"{WS}/workflows/stripeish", standard(), headers=h).status == 201
    assert s.put(f"{WS}/workflows/gh", github(), headers=h).status == 201


def count(s, h=None):
    return len(s.get(f"{WS}/executions?limit=1000", headers=h or {}).json["items"])


def deliver(s, body, headers, wf="stripeish", vertex="start"):
    return s.request("POST", f"{WS}/workflows/{wf}/entry-points/{vertex}/trigger",
                     raw=body, headers=headers)


def test_standard_webhooks_verify_and_dedupe_by_webhook_id(server):
    prepare(server)
    body = b'{"type": "invoice.paid", "id": 1}'
    a = deliver(server, body, signed(body, "msg_1"))
    assert a.status == 201, a
    xid = a.json["executionId"]
    assert xid == execution_id("hooks", "stripeish", "start", "webhook", "msg_1")
    x = server.get(f"{WS}/executions/{xid}").json
    assert x["identity"] == {"mode": "webhook", "webhookId": "msg_1"}, x["identity"]
    # a redelivery: same id and body, signed again at another time
    b = deliver(server, body, signed(body, "msg_1", ts=int(time.time()) - 200))
    assert b.status == 200 and b.json["executionId"] == xid and b.json["deduplicated"], b
    # refused with 401, and nothing stored
    n = count(server)
    stale = signed(body, "msg_2", ts=int(time.time()) - 400)
    future = signed(body, "msg_3", ts=int(time.time()) + 400)
    forged = signed(body, "msg_4", key=os.urandom(24))
    altered = signed(body, "msg_5")
    for headers, raw in ((stale, body), (future, body), (forged, body),
                         (altered, body.replace(b"1", b"2")),
                         ({k: v for k, v in signed(body, "msg_6").items() if k != "webhook-id"}, body),
                         ({"Content-Type": "application/json"}, body)):
        r = deliver(server, raw, headers)
        assert r.status == 401 and r.json["type"] == "/problems/invalid-signature", (headers, r)
        assert "whsec_" not in r.raw.decode() and SECRET not in r.raw.decode()
    assert count(server) == n
    # the header list may carry other signatures around the right one
    h = signed(body, "msg_7")
    h["webhook-signature"] = "v1,AAAA " + h["webhook-signature"] + " v2,zzz"
    assert deliver(server, body, h).status == 201
    assert SECRET not in server.logs() and GH_SECRET not in server.logs()


def test_hmac_sha256_github_style(server):
    prepare(server)
    body = b'{"ref": "refs/heads/main", "after": "abc"}'
    mac = hmac.new(GH_SECRET.encode(), body, hashlib.sha256).hexdigest()
    h = {"X-Hub-Signature-256": "sha256=" + mac, "Content-Type": "application/json"}
    a = deliver(server, body, h, wf="gh", vertex="push")
    assert a.status == 201, a
    # no signed delivery id: the payload identifies it, so a redelivery dedupes
    assert a.json["executionId"] == execution_id("hooks", "gh", "push", "payload", json.loads(body))
    b = deliver(server, body, dict(h, **{"X-GitHub-Delivery": "another"}), wf="gh", vertex="push")
    assert b.status == 200 and b.json["executionId"] == a.json["executionId"], b
    n = count(server)
    for bad in ("sha1=" + mac, "sha256=" + mac[:-1] + ("0" if mac[-1] != "0" else "1"), None):
        hh = dict(h)
        if bad is None:
            del hh["X-Hub-Signature-256"]
        else:
            hh["X-Hub-Signature-256"] = bad
        r = deliver(server, body, hh, wf="gh", vertex="push")
        assert r.status == 401 and r.json["type"] == "/problems/invalid-signature", (bad, r)
    assert count(server) == n


def test_a_missing_signing_secret_is_503_until_it_exists(server):
    server.put(WS, {})
    assert server.put(f"{WS}/workflows/stripeish", standard()).status == 201
    body = b'{"type": "x"}'
    r = deliver(server, body, signed(body, "msg_s"))
    assert r.status == 503, r
    assert count(server) == 0
    assert "secrets.WH" not in r.raw.decode() and "'WH'" in server.logs()
    # a secret that is not a Standard Webhooks key
    assert server.put(f"{WS}/secrets/WH", {"value": "not base64 !"}).status == 204
    assert deliver(server, body, signed(body, "msg_s")).status == 503
    assert server.put(f"{WS}/secrets/WH", {"value": SECRET}).status == 204
    assert deliver(server, body, signed(body, "msg_s")).status == 201


def test_signature_config_is_validated(server):
    server.put(WS, {})
    bad = [
        ({"scheme": "standard-webhooks", "secret": SECRET}, "/secret"),
        ({"scheme": "standard-webhooks", "secret": "x {{ secrets.WH }}"}, "/secret"),
        ({"scheme": "rot13", "secret": "{{ secrets.WH }}"}, "/scheme"),
        ({"scheme": "standard-webhooks", "secret": "{{ secrets.WH }}", "toleranceSeconds": 0},
         "/toleranceSeconds"),
        ({"scheme": "standard-webhooks", "secret": "{{ secrets.WH }}", "header": "X"}, "/header"),
        ({"scheme": "hmac-sha256", "secret": "{{ secrets.WH }}"}, "/header"),
        ({"scheme": "hmac-sha256", "secret": "{{ secrets.WH }}", "header": "X Sig"}, "/header"),
        ({"scheme": "hmac-sha256", "secret": "{{ secrets.WH }}", "header": "X-Sig",
          "encoding": "base32"}, "/encoding"),
        ("standard-webhooks", ""),
    ]
    for sig, ptr in bad:
        d = standard()
        d["vertices"]["start"]["config"]["signature"] = sig
        r = server.put(f"{WS}/workflows/v", d)
        assert r.status == 422 and r.json["pointer"] == "/vertices/start/config/signature" + ptr, (sig, r)
        assert SECRET not in r.raw.decode()
    assert server.get(f"{WS}/workflows/v").status == 404


def test_only_signed_entry_points_answer_without_the_bearer_token(make_server):
    token = "t0ken-" + os.urandom(6).hex()
    s = make_server(env={"IDEMFLOW_ADMIN_TOKEN": token})
    s.start()
    auth = {"Authorization": f"Bearer {token}"}
    prepare(s, token)
    unsigned = {"vertices": {"start": {"type": "ENTRY_POINT"}}}
    assert s.put(f"{WS}/workflows/plain", unsigned, headers=auth).status == 201
    body = b'{"type": "a"}'
    # the signature stands in for the token on a signed entry point
    assert deliver(s, body, signed(body, "msg_t")).status == 201
    assert deliver(s, body, dict(signed(body, "msg_u"), **{"webhook-signature": "v1,AAAA"})).status == 401
    # everything else needs the token, and an unauthenticated caller learns
    # nothing about what exists
    for wf, vx in (("plain", "start"), ("nope", "start"), ("stripeish", "nope")):
        r = deliver(s, body, {"Content-Type": "application/json"}, wf=wf, vertex=vx)
        assert r.status == 401 and r.json["type"] == "/problems/unauthorized", (wf, vx, r)
        assert r.headers.get("www-authenticate") == "Bearer"
    r = s.request("POST", "/v1/workspaces/nope/workflows/x/entry-points/y/trigger", raw=body,
                  headers={"Content-Type": "application/json"})
    assert r.status == 401, r
    assert s.get(f"{WS}/executions").status == 401
    assert s.request("POST", f"{WS}/workflows/stripeish/entry-points/start/test-runs", raw=body,
                     headers=signed(body, "msg_v")).status == 401
    assert count(s, auth) == 1
    assert deliver(s, body, dict(signed(body, "msg_w"), **auth), wf="plain").status == 201


def test_the_cli_signs_deliveries_and_computes_their_ids(server):
    import subprocess
    from conftest import BIN
    prepare(server)
    body = b'{"type": "invoice.paid"}'
    env = dict(os.environ, IDEMFLOW_WEBHOOK_SECRET=SECRET)
    p = subprocess.run([BIN, "sign-webhook", "msg_cli"], input=body, env=env, capture_output=True)
    assert p.returncode == 0, p.stderr
    headers = dict(line.split(": ", 1) for line in p.stdout.decode().splitlines())
    assert set(headers) == {"webhook-id", "webhook-timestamp", "webhook-signature"}
    assert SECRET not in p.stdout.decode()
    a = deliver(server, body, dict(headers, **{"Content-Type": "application/json"}))
    assert a.status == 201, a
    i = subprocess.run([BIN, "id", "hooks", "stripeish", "start", "--webhook-id", "msg_cli"],
                       capture_output=True, text=True)
    assert i.returncode == 0 and i.stdout.strip() == a.json["executionId"], i
    for bad_env, args in ((dict(env, IDEMFLOW_WEBHOOK_SECRET="nope!"), ["msg"]),
                          (env, ["msg", "--timestamp", "12\nx"]), (env, [])):
        q = subprocess.run([BIN, "sign-webhook", *args], input=body, env=bad_env, capture_output=True)
        assert q.returncode == 2, (args, q)
