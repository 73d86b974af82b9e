/*
 * tokens — workspace tokens (spec §10).
 *
 * A token is "ifw_" + its id (32 hex digits) + "_" + the hex HMAC-SHA256,
 * under a key derived from the engine's secrets key (HMAC of a label), of
 * "idemflow-token/v1/" + workspace + "/" + id.  The store keeps only ids: the token is checked by
 * computing its MAC again (constant-time compare) and finding its id still recorded, so a database
 * dump holds no usable token, a revoked id stops working at once, and a repeated create (same
 * Idempotency-Key) can hand back the same token without it ever being stored.  Changing the secrets
 * key voids every token, as it voids every sealed secret.
 */
#include "base/clock.h"
#include "base/mem.h"
#include "crypto/crypto.h"
#include "engine/engine_int.h"
#include "json/json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ID_HEX 32
#define TOKEN_LEN (4 + ID_HEX + 1 + 64)
#define NAME_MAX_LEN 128

static void token_of(const struct engine *g, const char *ws, const char *id,
                     char out[TOKEN_LEN + 1])
{
    /* a key of its own, derived from the secrets key (which also seals) */
    static const char label[] = "idemflow-token-key/v1";
    uint8_t key[CRYPTO_SHA256_LEN];
    crypto_hmac_sha256(g->key, CRYPTO_KEY_LEN, label, sizeof label - 1, key);
    char *msg = xasprintf("idemflow-token/v1/%s/%s", ws, id);
    uint8_t mac[CRYPTO_SHA256_LEN];
    crypto_hmac_sha256(key, sizeof key, msg, strlen(msg), mac);
    crypto_wipe(key, sizeof key);
    free(msg);
    char hex[2 * CRYPTO_SHA256_LEN + 1];
    crypto_hex(mac, sizeof mac, hex);
    snprintf(out, TOKEN_LEN + 1, "ifw_%s_%s", id, hex);
    crypto_wipe(mac, sizeof mac);
    crypto_wipe(hex, sizeof hex);
}

int engine_token_check(struct engine *g, const char *ws, const char *token)
{
    size_t n = strlen(token);
    if (n != TOKEN_LEN || strncmp(token, "ifw_", 4) != 0 || token[4 + ID_HEX] != '_')
        return -1;
    char id[ID_HEX + 1];
    memcpy(id, token + 4, ID_HEX);
    id[ID_HEX] = '\0';
    if (strspn(id, "0123456789abcdef") != ID_HEX)
        return -1;
    char want[TOKEN_LEN + 1];
    token_of(g, ws, id, want);
    int ok = crypto_equal(want, TOKEN_LEN, token, n);
    crypto_wipe(want, sizeof want);
    if (!ok)
        return -1;
    struct ifl_err e = {0};
    return store_token_exists(g->store, ws, id, &e) == 0 ? 0 : -1;
}

static json_t *token_json(const char *ws, const char *id, const char *name, int64_t created_at)
{
    char ts[32];
    clock_rfc3339(created_at, ts);
    return json_pack("{s:s, s:s, s:s, s:s}", "id", id, "workspace", ws, "name", name, "createdAt",
                     ts);
}

struct create_args {
    struct engine *g;
    const char *ws, *name;
    char id[ID_HEX + 1];
    struct engine_op_key *k;
    char *replay;
    json_t *answer;
};

static int tx_create(struct store_tx *tx, void *arg, struct ifl_err *e)
{
    struct create_args *a = arg;
    json_decref(a->answer);
    a->answer = NULL;
    int rc = engine_op_key_claim(a->g, tx, a->ws, "token", a->k, &a->replay, e);
    if (rc || a->k->replayed)
        return rc;
    int64_t now = clock_now_ms();
    if ((rc = store_tx_token_insert(tx, a->ws, a->id, a->name, now, e)))
        return rc;
    a->answer = token_json(a->ws, a->id, a->name, now);
    /* the stored answer has no token: a replay derives it again */
    char *text = json_to_string(a->answer);
    rc = engine_op_key_answer(tx, a->ws, "token", a->k, 201, text, e);
    free(text);
    return rc;
}

static int token_create_keyed(struct engine *g, const char *ws, const char *name,
                              struct engine_op_key *k, json_t **answer, struct ifl_err *e)
{
    struct engine_op_key none = {0};
    if (!k)
        k = &none;
    int rc = store_workspace_exists(g->store, ws, e);
    if (rc)
        return rc;
    if (!name)
        name = "";
    if (strlen(name) > NAME_MAX_LEN)
        return err_setp(e, IFL_EVALIDATION, "/name", "name must be at most %d characters",
                        NAME_MAX_LEN);
    for (const char *p = name; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            return err_setp(e, IFL_EVALIDATION, "/name", "name must be printable text");
    uint8_t raw[ID_HEX / 2];
    if (crypto_random(raw, sizeof raw))
        return err_set(e, IFL_EIO, "random generator failed");
    struct create_args a = {.g = g, .ws = ws, .name = name, .k = k};
    crypto_hex(raw, sizeof raw, a.id);
    rc = store_tx_run(g->store, tx_create, &a, e);
    json_t *out = NULL;
    if (!rc && k->replayed)
        rc = engine_replay_answer(a.replay, &out, e);
    else if (!rc) {
        out = a.answer;
        a.answer = NULL;
        k->status = 201;
    }
    json_decref(a.answer);
    free(a.replay);
    if (rc)
        return rc;
    const char *id = json_string_value(json_object_get(out, "id"));
    /* a replay hands the token out again only while it is live */
    if (k->replayed && (!id || store_token_exists(g->store, ws, id, e) != 0)) {
        json_decref(out);
        rc = err_set(e, IFL_EGONE, "the token made under this Idempotency-Key was revoked");
        err_slug(e, "token-revoked");
        return rc;
    }
    if (id && strlen(id) == ID_HEX) {
        char token[TOKEN_LEN + 1];
        token_of(g, ws, id, token);
        json_object_set_new(out, "token", json_string(token));
        crypto_wipe(token, sizeof token);
    }
    *answer = out;
    return 0;
}

int engine_token_create(struct engine *g, const char *ws, const char *name, struct engine_op_key *k,
                        json_t **answer, struct ifl_err *e)
{
    *answer = NULL;
    struct engine_key_inflight n;
    int rc = engine_op_key_enter(g, &n, ws, "token", k ? k->key : NULL, e);
    if (!rc) {
        rc = token_create_keyed(g, ws, name, k, answer, e);
        engine_op_key_leave(g, &n);
    }
    return rc;
}

int engine_token_list(struct engine *g, const char *ws, json_t **out, struct ifl_err *e)
{
    *out = NULL;
    struct store_token *v = NULL;
    size_t n = 0;
    int rc = store_workspace_exists(g->store, ws, e);
    if (rc || (rc = store_token_list(g->store, ws, &v, &n, e)))
        return rc;
    json_t *items = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(items, token_json(ws, v[i].id, v[i].name, v[i].created_at));
    store_tokens_free(v, n);
    *out = json_pack("{s:o, s:n}", "items", items, "next"); /* one page: every one */
    return 0;
}

int engine_token_delete(struct engine *g, const char *ws, const char *id, struct ifl_err *e)
{
    return store_token_delete(g->store, ws, id, e);
}
