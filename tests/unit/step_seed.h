/*
 * step_seed.h — one running execution and n steps of it, written in one
 * transaction through the store's interface: the claim tests' fixture
 * (test_claims.c, test_store_pg.c, store_checks.h).
 */
#ifndef IFL_TESTS_STEP_SEED_H
#define IFL_TESTS_STEP_SEED_H

#include <stdio.h>

#include "store/store.h"

struct step_seed {
    const char *ws;
    const char *id; /* the execution's (64 hex digits) */
    int n;
    enum step_state state;
    char prefix;  /* step i is named prefix + i in four digits ("v0007") */
    int64_t due0; /* step i is due at due0 + i */
};

static int step_seed_tx(struct store_tx *tx, void *arg, struct ifl_err *e)
{
    const struct step_seed *sd = arg;
    struct store_execution x = {0};
    snprintf(x.id, sizeof x.id, "%s", sd->id);
    x.workspace = (char *)sd->ws;
    x.workflow = "wf";
    x.workflow_version = 1;
    x.entry_point = "start";
    x.identity = "{}";
    x.payload = "null";
    x.status = "running";
    int created;
    int rc = store_tx_execution_insert(tx, &x, &created, e);
    for (int i = 0; !rc && i < sd->n; i++) {
        struct store_step st = {0};
        snprintf(st.execution_id, sizeof st.execution_id, "%s", sd->id);
        char name[16];
        snprintf(name, sizeof name, "%c%04d", sd->prefix, i);
        st.vertex = name;
        st.workspace = (char *)sd->ws;
        st.kind = "TRANSFORM";
        st.state = sd->state;
        st.next_run_at = sd->due0 + i;
        rc = store_tx_step_insert(tx, &st, e);
    }
    return rc;
}

#endif
