/*
 * fault — named fault points for crash tests.
 *
 * IDEMFLOW_FAULT="name[:action][@N][,…]" arms points at start (fault_init):
 *   action  kill      (default) SIGKILL this process: no cleanup, as kill -9
 *           sleep=MS  stall the calling thread MS milliseconds
 *           exit      _exit(3)
 *           crash     abort(): a crash (SIGABRT), which crashmark records,
 *                     where a kill leaves no trace
 *           fail      the code at a FAULT_FAILS point fails as its operation
 *                     would (a store read that errs), and goes on
 *   @N      fire on the N-th hit of that point only (default: the first)
 *   @*      fire on every hit (for sleep: a point that is always slow)
 * Each firing writes a "fault.fired" log line first, so a test can see it.
 *
 * When IDEMFLOW_FAULT is unset, FAULT(name) costs one load and a branch.
 * The armed table is frozen after fault_init; hit counters are atomic.
 * Points in the code: docs/faults.md.
 */
#ifndef IFL_BASE_FAULT_H
#define IFL_BASE_FAULT_H

extern int fault_armed; /* frozen after fault_init() */

/* Reads IDEMFLOW_FAULT once; call before starting threads. */
void fault_init(void);
void fault_hit(const char *name);
/* fault_hit, and 1 when the point fired with `fail`. */
int fault_fails_hit(const char *name);

/* 1 when the point `name` fired with `fail`: the caller fails there. */
#define FAULT_FAILS(name) (fault_armed && fault_fails_hit(name))

#define FAULT(name)                                                                                \
    do {                                                                                           \
        if (fault_armed)                                                                           \
            fault_hit(name);                                                                       \
    } while (0)

#endif
