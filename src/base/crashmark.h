/*
 * crashmark — evidence that the process crashed, rather than was killed,
 * while one of its threads evaluated something.
 *
 * A thread names what it is evaluating (crashmark_enter) and stops naming it
 * (crashmark_leave).  A fatal signal raised by the process itself — SIGSEGV,
 * SIGBUS, SIGFPE, SIGILL, SIGABRT — on a thread that names something appends
 * that name as one line to a marker file; the signal then takes its default
 * action (the process dies, with a core dump where enabled).  A SIGKILL (an
 * operator, the OOM killer, a test) leaves nothing: a kill is not a crash.
 * The next process collects the markers (crashmark_collect).
 *
 * The engine uses it so that a step whose evaluation crashes the process is
 * failed after a few crashes instead of crashing every start, while a step
 * that is merely killed again and again is always tried again (runner.c).
 *
 * Must never: allocate, lock or log in the signal handler (it only opens,
 * writes and closes one file).
 */
#ifndef IFL_BASE_CRASHMARK_H
#define IFL_BASE_CRASHMARK_H

#include "base/err.h"

/* Creates dir (mode 0700, parents too) and installs the handlers; markers
 * of this process go to dir/<pid>.mark.  Call once, before threads start.
 * dir is copied; at most 3800 bytes. */
int crashmark_init(const char *dir, struct ifl_err *e);
/* Gives the calling thread an alternate signal stack, so that a stack
 * overflow can still be recorded.  Cheap; once per thread that evaluates. */
void crashmark_thread_init(void);
/* Before such a thread ends: removes and frees the stack it was given. */
void crashmark_thread_done(void);
/* Names what the calling thread evaluates: one line of text without a
 * newline, borrowed until crashmark_leave (or the next enter). */
void crashmark_enter(const char *what);
void crashmark_leave(void);
/* Calls fn(arg, line) for every line of every marker file in dir, then
 * removes the files.  A missing dir is no markers (0). */
int crashmark_collect(const char *dir, void (*fn)(void *arg, const char *line), void *arg,
                      struct ifl_err *e);

#endif
