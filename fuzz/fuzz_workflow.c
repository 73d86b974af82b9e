/*
 * fuzz_workflow — workflow definitions: JSON parse, then validation and
 * compilation (graph checks, idempotencyFields, expressions in templates and
 * conditions), new (wf_compile) and stored (wf_compile_stored).  Anything
 * accepted must compile to a DAG whose topological order puts every edge
 * forward, and the stored form must accept whatever the new one does.
 */
#include <stdint.h>
#include <stdlib.h>

#include "engine/workflow.h"
#include "json/json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Every edge forward in the topological order. */
static void check_dag(const struct wf *w)
{
    size_t *pos = calloc(w->nv ? w->nv : 1, sizeof *pos);
    for (size_t i = 0; i < w->nv; i++)
        pos[w->topo[i]] = i;
    for (size_t i = 0; i < w->ne; i++)
        if (pos[w->e[i].from] >= pos[w->e[i].to])
            abort();
    free(pos);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *def = NULL;
    if (json_parse((const char *)data, size, NULL, &def, NULL))
        return 0;
    struct wf *w = NULL, *ws = NULL;
    struct ifl_err e;
    int strict_ok = wf_compile(def, &w, &e) == 0;
    if (strict_ok) {
        check_dag(w);
        wf_free(w);
    }
    /* stored: lenient, never stricter; what a new version may hold compiles
     * stored with no vertex broken */
    if (wf_compile_stored(def, &ws, &e) == 0) {
        check_dag(ws);
        for (size_t i = 0; i < ws->nv; i++)
            if (strict_ok && ws->v[i].broken)
                abort();
        wf_free(ws);
    } else if (strict_ok) {
        abort();
    }
    json_decref(def);
    return 0;
}
