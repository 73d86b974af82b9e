/*
 * fault — see fault.h.
 */
#include "base/fault.h"
#include "base/log.h"
#include "base/mem.h"

#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_POINTS 16

enum action { A_KILL, A_SLEEP, A_EXIT, A_CRASH, A_FAIL };

struct point {
    char name[64];
    enum action action;
    long ms;
    long nth; /* 0: every hit */
    atomic_long hits;
};

int fault_armed;
static struct point points[MAX_POINTS];
static int npoints;

static void parse_one(const char *s, size_t len)
{
    if (npoints == MAX_POINTS || len == 0)
        return;
    char tmp[128];
    if (len >= sizeof tmp)
        return;
    memcpy(tmp, s, len);
    tmp[len] = '\0';
    struct point *p = &points[npoints];
    p->action = A_KILL;
    p->nth = 1;
    char *at = strchr(tmp, '@');
    if (at && strcmp(at + 1, "*") == 0) {
        *at = '\0';
        p->nth = 0; /* every hit */
    } else if (at) {
        *at = '\0';
        char *end = NULL;
        long n = strtol(at + 1, &end, 10);
        if (end == at + 1 || *end || n < 1)
            return;
        p->nth = n;
    }
    char *colon = strchr(tmp, ':');
    if (colon) {
        *colon = '\0';
        const char *act = colon + 1;
        if (strncmp(act, "sleep=", 6) == 0) {
            char *end = NULL;
            long ms = strtol(act + 6, &end, 10);
            if (end == act + 6 || *end || ms < 0)
                return;
            p->action = A_SLEEP;
            p->ms = ms;
        } else if (strcmp(act, "exit") == 0) {
            p->action = A_EXIT;
        } else if (strcmp(act, "crash") == 0) {
            p->action = A_CRASH;
        } else if (strcmp(act, "fail") == 0) {
            p->action = A_FAIL;
        } else if (strcmp(act, "kill") != 0) {
            return;
        }
    }
    if (strlen(tmp) >= sizeof p->name)
        return;
    memcpy(p->name, tmp, strlen(tmp) + 1);
    atomic_init(&p->hits, 0);
    npoints++;
}

void fault_init(void)
{
    const char *env = getenv("IDEMFLOW_FAULT");
    if (!env || !*env)
        return;
    const char *s = env;
    for (;;) {
        const char *comma = strchr(s, ',');
        size_t len = comma ? (size_t)(comma - s) : strlen(s);
        parse_one(s, len);
        if (!comma)
            break;
        s = comma + 1;
    }
    fault_armed = npoints > 0;
    for (int i = 0; i < npoints; i++)
        log_warn("fault.armed", "fault point %s armed (hit %ld)", points[i].name, points[i].nth);
}

/* The point's firing (its action run, or for `fail` only logged): 1 when
 * it fired with `fail`. */
static int hit(const char *name)
{
    int fail = 0;
    for (int i = 0; i < npoints; i++) {
        struct point *p = &points[i];
        if (strcmp(p->name, name) != 0)
            continue;
        long n = atomic_fetch_add(&p->hits, 1) + 1;
        if (p->nth && n != p->nth)
            continue;
        log_warn("fault.fired", "fault point %s fired", name);
        switch (p->action) {
        case A_KILL:
            raise(SIGKILL);
            break;
        case A_EXIT:
            _exit(3);
        case A_CRASH:
            abort(); /* as a crash in the code: SIGABRT, seen by crashmark */
        case A_SLEEP: {
            struct timespec ts = {p->ms / 1000, (p->ms % 1000) * 1000000L};
            while (nanosleep(&ts, &ts) != 0)
                ;
            break;
        }
        case A_FAIL:
            fail = 1;
            break;
        }
    }
    return fail;
}

void fault_hit(const char *name)
{
    (void)hit(name);
}

int fault_fails_hit(const char *name)
{
    return hit(name);
}
