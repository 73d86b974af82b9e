/*
 * engine_fixture.h — an engine on a fresh SQLite store in a temporary
 * directory, for cmocka setup/teardown (test_wait.c, test_wfcache.c).
 */
#ifndef IFL_TESTS_ENGINE_FIXTURE_H
#define IFL_TESTS_ENGINE_FIXTURE_H

#include <stdio.h>
#include <stdlib.h>

#include "engine/engine.h"
#include "store/store.h"

struct fixture {
    char dir[64];
    struct store *s;
    struct engine *g;
};

/* A fixture under /tmp/ifl-NAME-XXXXXX with an engine of options o. */
static struct fixture *engine_fixture_new(const char *name, const struct engine_opts *o)
{
    struct fixture *f = calloc(1, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "/tmp/ifl-%s-XXXXXX", name);
    assert_non_null(mkdtemp(f->dir));
    char url[128];
    snprintf(url, sizeof url, "%s/db.sqlite", f->dir);
    struct ifl_err e = {0};
    assert_int_equal(store_open(url, &f->s, &e), 0);
    assert_int_equal(engine_new(f->s, o, &f->g, &e), 0);
    return f;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    engine_free(f->g);
    store_close(f->s);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", f->dir);
    if (system(cmd) != 0)
        return -1;
    free(f);
    return 0;
}

#endif
