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
 * w->v[entry].out[k]) and the skips applied.  dec NULL: the entry's edges
 * are not decided yet — the entry is left DISPATCHED, for a worker to
 * complete it (its output the payload) and decide them.  *status receives
 * the execution's status.  rows: heap array (store_steps_free). */
void steps_initial(const struct wf *w, size_t entry, const char *execution_id, const char *ws,
                   const char *payload, const struct decision *dec, int64_t now,
                   struct store_step **rows, size_t *n, const char **status);

/* Completes vertex vi in the rows of an execution not stored yet (a
 * TRANSFORM run at trigger time): COMPLETED with output, epoch and attempts
 * +1, then its decisions (one per outgoing edge) applied by the join rule. */
void steps_complete_initial(const struct wf *w, struct store_step *rows, size_t n, long vi,
                            const char *output, const struct decision *dec);

/* The data of a step event ({vertex, state, epoch, attempts[, error]}). */
json_t *steps_event_data(const struct store_step *st);
/* The same as compact JSON text (caller frees), written directly: events
 * are written on the store's writer thread, a few per execution. */
char *steps_event_data_text(const struct store_step *st);

/* Execution status of spec §5 for a set of rows (static string). */
const char *steps_status(const struct store_step *rows, size_t n);

/* A TRANSFORM successor the worker already evaluated (engine/inline.c). */
struct step_inline {
    long vi;                    /* its workflow vertex */
    const char *output;         /* JSON text */
    const struct decision *dec; /* one per outgoing edge, in w->v[vi].out order */
};

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
    /* The claim taken back as if it never was (a GATEWAY call deferred:
     * nothing was tried): DISPATCHED at run_at, the attempt not counted and
     * its row deleted, the error as it was; to, error, attempt_outcome are
     * not read. */
    int unclaim;
    int64_t now;
    /* Inline completions (optional): applied in order, each only when this
     * outcome has just dispatched it, and only when every row of the
     * execution still has the state and epoch the worker read (seen_*,
     * indexed by the vertex's index in w; n_seen rows were read; a vertex
     * without a row has seen_epoch -1) — so each TRANSFORM was evaluated
     * on exactly the
     * inputs it would see if a worker claimed it now.  Each gets epoch+1,
     * attempts+1, a finished attempt row by `worker`, and its event; its
     * own decisions are applied like a real completion's. */
    const struct step_inline *inl;
    size_t n_inl;
    const enum step_state *seen_state;
    const int64_t *seen_epoch;
    size_t n_seen;
    const char *worker;
    /* results */
    int inlined;        /* how many of inl[] were applied (a prefix) */
    int fenced;         /* the guard failed: nothing was written */
    int over_budget;    /* a completion failed output_budget_exceeded instead */
    int dispatched;     /* some step became DISPATCHED (wake workers) */
    int cancelled;      /* fenced because the execution was cancelled */
    char status[32];    /* the execution's status afterwards */
    int status_changed; /* … and it changed in this transaction */
};

/* A dry run of the join rule over a copy of an execution's rows, so a worker
 * can tell which steps an outcome would dispatch before committing it. */
struct steps_sim;
/* Copies what the join rule needs from rows (borrowed only during the call). */
struct steps_sim *steps_sim_new(const struct wf *w, const struct store_step *rows, size_t n);
/* Completes vertex vi with decisions dec (one per outgoing edge). */
void steps_sim_complete(struct steps_sim *s, long vi, const struct decision *dec);
/* The next vertex the simulated completions dispatched (from PENDING), each
 * returned once, in row order; -1 when none is left. */
long steps_sim_next(struct steps_sim *s);
void steps_sim_free(struct steps_sim *s); /* NULL ok */

/* Whether a step's error (JSON text or NULL) is an object whose code is
 * `code`. */
int steps_error_code_is(const char *error, const char *code);
/* Whether a step's error (JSON text or NULL) asks the next attempt to
 * verify first. */
int steps_error_verify_first(const char *error);
/* A call whose outcome is unknown may still be in its provider's hands:
 * the verify that asks about it waits until verify.afterMs has passed.
 * Its step's error says until when ("verifyNotBefore", RFC 3339), so
 * that every later claim — a retry, a recovery, an operator's retry —
 * waits too (gwstep.c).  The mark's value in ms, 0 when there is none. */
int64_t steps_error_verify_not_before(const char *error);
/* The same, of an error already parsed. */
int64_t steps_error_not_before_of(const json_t *error);
/* Sets the mark on an error object (ms > 0; else nothing). */
void steps_error_set_not_before(json_t *error, int64_t ms);

/* store_tx_fn: applies a step_outcome (arg).  Returns 0 when fenced too
 * (nothing written, o->fenced = 1). */
int steps_apply(struct store_tx *tx, void *arg, struct ifl_err *e);

/* A GATEWAY step as an operator action's caller saw it before its
 * transaction: at which epoch, and whether its earlier call may have taken
 * effect (steps_effect_unknown over the attempts read then).  The
 * transaction refuses a step it finds at another epoch: it changed since,
 * and the judgment may no longer hold. */
struct steps_seen {
    const char *vertex; /* borrowed */
    int64_t epoch;
    int unknown;
};
/* The entry of `vertex` among v[0..n), or NULL. */
const struct steps_seen *steps_seen_find(const struct steps_seen *v, size_t n, const char *vertex);

/* store_tx_fn for operator retry: every FAILED and REQUIRES_RECONCILIATION
 * step goes back to DISPATCHED with a new epoch.  A GATEWAY step whose
 * call's outcome is unknown — its error says verifyFirst, or `seen` says
 * unknown and the vertex has a `verify` — verifies before it sends again
 * (spec §1: unknown outcomes are verified first when a verify is
 * configured).  A FAILED or REQUIRES_RECONCILIATION GATEWAY step not in
 * `seen` at its epoch is refused (IFL_ECONFLICT): it changed since the
 * caller read it; so is one whose call's effect is unknown and has neither
 * an Idempotency-Key nor a verify, unless send_again.  arg: struct
 * steps_retry. */
struct steps_retry {
    const struct wf *w; /* the execution's workflow version */
    const char *workspace, *execution_id;
    int64_t now;
    /* the FAILED and REQUIRES_RECONCILIATION GATEWAY steps the caller read */
    const struct steps_seen *seen;
    size_t n_seen;
    /* Evaluates the condition of edge `edge` (its source `from` COMPLETED)
     * over the execution as the transaction loaded it; *d as
     * engine_decide fills it.  A step an edge's condition failed is
     * retried by deciding its edges again (NULL: counted as before).
     * decide_ctx is passed on (the caller's: what scrubs d->error). */
    void (*decide_edge)(const void *decide_ctx, const struct wf *w, size_t edge,
                        const struct store_execution *x, const struct store_step *rows, size_t n,
                        const struct store_step *from, struct decision *d);
    const void *decide_ctx;
    /* The operator checked with the provider that a call whose effect is
     * unknown, and which neither a key nor a verify can settle, did not take
     * effect: send it again.  Without it such a step is refused
     * (IFL_ECONFLICT, `step-outcome-unknown`; spec §1: never re-sent
     * blindly). */
    int send_again;
    int retried; /* result */
    int ended;   /* result: the retry ended the execution (all it retried was skipped) */
    char status[32];
};
int steps_retry(struct store_tx *tx, void *arg, struct ifl_err *e);

/* 0, or IFL_ECONFLICT (slug `execution-started-over`) when execution id was
 * started over: an operator acts on the new execution, not the original
 * (a retry or resolve of the original would run its steps a second time
 * beside the new one's).  On PostgreSQL it locks the execution's row. */
int steps_not_started_over(struct store_tx *tx, const char *ws, const char *id, struct ifl_err *e);

/* store_tx_fn for an operator's cancel (an extension of spec §10): in one
 * transaction, every PENDING and DISPATCHED step becomes SKIPPED with error
 * {"code":"cancelled"} and a new epoch, and the execution `cancelled` (a
 * final status: retry and resolve refuse it, its steps are never claimed
 * again) with an `execution.cancelled` event.  Refused, changing nothing,
 * with IFL_ECONFLICT and a slug when:
 *   - a step is EXECUTING, or a DISPATCHED GATEWAY step is not at the epoch
 *     the caller saw it at (`step-executing`): its call may be on the wire,
 *     and what it did must be recorded; cancel again once it ends;
 *   - a step is REQUIRES_RECONCILIATION (`step-needs-reconciliation`), or a
 *     DISPATCHED or FAILED GATEWAY step's earlier call may have taken effect
 *     (`step-outcome-unknown`: the caller judged it from the step's
 *     attempts, steps_effect_unknown): cancelling would not settle it, and
 *     a cancelled execution leaves the dead letters;
 *   - a FAILED GATEWAY step is not in `seen` at its epoch (`conflict`);
 *   - the execution is completed or stale (`execution-finished`).
 * Cancelling a cancelled execution changes nothing (moved = 0). */
struct steps_cancel {
    const char *workspace, *execution_id;
    const char *reason; /* NULL or text (the caller bounds it) */
    int64_t now;
    /* The DISPATCHED and FAILED GATEWAY steps the caller judged. */
    const struct steps_seen *seen;
    size_t n_seen;
    int cancelled; /* result: steps skipped */
    int moved;     /* result: the execution became cancelled here */
    char status[32];
};
int steps_cancel(struct store_tx *tx, void *arg, struct ifl_err *e);
/* Whether a GATEWAY step's attempts (its rows among a, from
 * store_attempts_get) leave a call whose effect is unknown: an ambiguous
 * outcome, an in-progress conflict, a verify that did not settle it, or a
 * worker that died with the call on the wire or its answer in hand — not
 * followed by a verify that found it not done, nor by an operator's
 * resolve (who settled it).  resend: asked for an action that would send
 * the call again (a retry, a start-over).  There a resolve as failed
 * settles nothing: it records that the operator stopped the step, not what
 * its call did, and the step stays among the dead letters, where a script
 * retrying them would otherwise send it again blindly (found by a judge: a
 * keyless charge resolved as failed, then retried, charged the order
 * twice).  An operator who checked that the call did not take effect says
 * so with sendAgain.  For a cancel, which sends nothing, every resolve
 * settles. */
int steps_effect_unknown(const struct store_attempt *a, size_t n, const char *vertex, int resend);

/* Appends an event of execution xid inside tx; takes ownership of data.
 * preset_version > 0: the caller already set the execution's version to it
 * in this transaction (no bump). */
int steps_event(struct store_tx *tx, const char *ws, const char *xid, const char *type,
                json_t *data, int64_t preset_version, struct ifl_err *e);
/* The same with data as JSON text (taken, freed). */
int steps_event_text(struct store_tx *tx, const char *ws, const char *xid, const char *type,
                     char *data, int64_t preset_version, struct ifl_err *e);
/* {"status": status} as JSON text (caller frees). */
char *steps_status_data_text(const char *status);

/* JSON text {"code": code, "message": msg} (caller frees). */
char *steps_error_json(const char *code, const char *msg);

/* What a lease expiry leaves behind (runner.c recover, gwstep.c): the
 * notes a GATEWAY claimed again leaves on its running attempt while its
 * request is rendered (RENDERING) and, re-sent after a lease expiry, when
 * its response arrives (RESPONDED); the error code of a GATEWAY
 * re-dispatched after its worker died mid-call, while rendering, or with
 * the response in hand (the last two also end that attempt); the code of a
 * step failed because its worker kept dying while evaluating it. */
/* How much output an execution may keep (docs/api.md, "Limits"): every
 * step's context carries every completed output, so without a bound one
 * workflow's executions could make each claim load and parse gigabytes.
 * A TRANSFORM output over STEPS_OUTPUT_MAX fails its step (invalid_output);
 * a completion that would take the execution's stored outputs past
 * STEPS_EXECUTION_OUTPUT_MAX fails instead (output_budget_exceeded). */
#define STEPS_OUTPUT_MAX ((size_t)4 << 20)
#define STEPS_EXECUTION_OUTPUT_MAX ((size_t)16 << 20)

#define STEPS_RENDERING "rendering"
#define STEPS_RESPONDED "responded"
#define STEPS_LEASE_EXPIRED_MID_CALL "lease_expired_mid_call"
#define STEPS_LEASE_EXPIRED_WHILE_RENDERING "lease_expired_while_rendering"
#define STEPS_LEASE_EXPIRED_AFTER_RESPONSE "lease_expired_after_response"
#define STEPS_LEASE_EXPIRED_REPEATEDLY "lease_expired_repeatedly"
/* A crash (not a kill) while evaluating, from the markers the crashed
 * process left (base/crashmark.h): the note engine_start puts on the
 * running attempt ("crashed:" + the phase: rendering, responded, running),
 * and the outcomes a recovery then ends the attempt with. */
#define STEPS_CRASH_NOTE_PREFIX "crashed:"
#define STEPS_RUNNING "running" /* the phase of a TRANSFORM's evaluation */
#define STEPS_CRASHED "crashed"
#define STEPS_CRASHED_WHILE_RENDERING "crashed_while_rendering"
#define STEPS_CRASHED_AFTER_RESPONSE "crashed_after_response"
/* The history row an operator's retry leaves (worker "operator", at the
 * epoch the retry gave the step): a GATEWAY's retry budget — maxAttempts,
 * deadlineMs, the backoff's growth — counts from the attempts after it. */
#define STEPS_OPERATOR_RETRY "operator_retry"
/* … of a retry with sendAgain that sends again a call nothing else could
 * settle: the operator checked that it had not taken effect, so this row
 * settles it (steps_effect_unknown), and a new budget starts from it too. */
#define STEPS_OPERATOR_SEND_AGAIN "operator_send_again"
/* Whether an attempt outcome is one of the two rows an operator's retry leaves. */
int steps_operator_retry(const char *outcome);
/* The history row an operator's resolve leaves (worker "operator", at the
 * epoch the resolve gave the step, with the resolved step's error): the
 * operator settled what the call did — as completed; as failed, only for a
 * cancel (steps_effect_unknown). */
#define STEPS_RESOLVED "resolved"
/* The attempt outcome of a GATEWAY call that was answered — it took effect
 * as its answer says — but whose answer would take the execution's stored
 * outputs past STEPS_EXECUTION_OUTPUT_MAX: the step FAILS, and its effect
 * counts as unknown (steps_effect_unknown), so that an operator's retry
 * verifies before it sends again and a cancel is refused. */
#define STEPS_ANSWER_OVER_BUDGET "answer_over_budget"

#endif
