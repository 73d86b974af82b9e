/*
 * steps — the step state machine of spec §5 and the join rule of §3, as
 * functions that run inside one store transaction.
 *
 * Everything an outcome implies — the step's terminal state, its attempt
 * record, its successors' dispatch or skip, the execution's status, and the
 * events — is written by ONE call here, inside the caller's transaction, so
 * it commits or vanishes as a whole.  Transitions out of EXECUTING are
 * guarded by state and epoch: a fenced worker's write changes nothing and is
 * reported (`fenced`).
 *
 * Edge conditions are evaluated by the caller before the transaction (they
 * depend only on the finished step's output and the execution's context);
 * this module only applies their decisions.
 */
#ifndef IFL_ENGINE_STEPS_H
#define IFL_ENGINE_STEPS_H

#include <jansson.h>
#include <stdint.h>

#include "base/err.h"
#include "engine/workflow.h"
#include "store/store.h"

enum edge_decision { EDGE_TAKEN, EDGE_NOT_TAKEN, EDGE_ERROR };

struct decision {
    enum edge_decision kind;
    char *error; /* EDGE_ERROR: JSON text {"code","message"}; owned by the caller */
};

/* Builds every step row of a new execution started at vertex `entry`:
 * the entry COMPLETED with output = payload, other entry points SKIPPED,
 * the rest PENDING, then the entry's edge decisions (dec[k] for
 * w->v[entry].out[k]) and the skips applied.  *status receives the
 * execution's status.  rows: heap array (store_steps_free). */
void steps_initial(const struct wf *w, size_t entry, const char *execution_id, const char *ws,
                   const char *payload, const struct decision *dec, int64_t now,
                   struct store_step **rows, size_t *n, const char **status);

/* Execution status of spec §5 for a set of rows (static string). */
const char *steps_status(const struct store_step *rows, size_t n);

/* An outcome to apply inside a transaction. */
struct step_outcome {
    const struct wf *w;
    const char *workspace, *execution_id, *vertex;
    int64_t epoch;               /* the claimed epoch (guard); < 0 = any (operator) */
    enum step_state from;        /* the state the guard expects (EXECUTING for workers) */
    enum step_state to;          /* COMPLETED, FAILED, REQUIRES_RECONCILIATION, DISPATCHED */
    const char *output;          /* JSON text when COMPLETED */
    const char *error;           /* JSON text {"code","message"} for FAILED / reconciliation */
    const char *attempt_outcome; /* recorded in the attempt history, e.g. "completed" */
    const struct decision *dec;  /* COMPLETED: one per outgoing edge, in w->v[i].out order */
    int bump_epoch;              /* new epoch (fences any holder of the old one) */
    int64_t run_at;              /* DISPATCHED: when it may run again (0 = now) */
    int64_t now;
    /* results */
    int fenced;      /* the guard failed: nothing was written */
    int dispatched;  /* some step became DISPATCHED (wake workers) */
    char status[32]; /* the execution's status afterwards */
};

/* store_tx_fn: applies a step_outcome (arg).  Returns 0 when fenced too
 * (nothing written, o->fenced = 1). */
int steps_apply(struct store_tx *tx, void *arg, struct ifl_err *e);

/* store_tx_fn for operator retry: every FAILED and REQUIRES_RECONCILIATION
 * step goes back to DISPATCHED with a new epoch.  arg: struct steps_retry. */
struct steps_retry {
    const char *workspace, *execution_id;
    int64_t now;
    int retried; /* result */
    char status[32];
};
int steps_retry(struct store_tx *tx, void *arg, struct ifl_err *e);

/* Appends an event of execution xid inside tx; takes ownership of data.
 * preset_version > 0: the caller already set the execution's version to it
 * in this transaction (no bump). */
int steps_event(struct store_tx *tx, const char *ws, const char *xid, const char *type,
                json_t *data, int64_t preset_version, struct ifl_err *e);

/* JSON text {"code": code, "message": msg} (caller frees). */
char *steps_error_json(const char *code, const char *msg);

#endif
