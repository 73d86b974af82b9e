/*
 * fuzz_workflow — workflow definitions: JSON parse, then validation and
 * compilation (graph checks, idempotencyFields, expressions in templates and
 * conditions).  Anything accepted must compile to a DAG whose topological
 * order puts every edge forward.
 */
#include <stdint.h>
#include <stdlib.h>

#include "engine/workflow.h"
#include "json/json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *def = NULL;
    if (json_parse((const char *)data, size, NULL, &def, NULL))
        return 0;
    struct wf *w = NULL;
    struct ifl_err e;
    if (wf_compile(def, &w, &e) == 0) {
        size_t *pos = calloc(w->nv ? w->nv : 1, sizeof *pos);
        for (size_t i = 0; i < w->nv; i++)
            pos[w->topo[i]] = i;
        for (size_t i = 0; i < w->ne; i++)
            if (pos[w->e[i].from] >= pos[w->e[i].to])
                abort();
        free(pos);
        wf_free(w);
    }
    json_decref(def);
    return 0;
}
