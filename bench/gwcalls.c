/*
 * bench/gwcalls — the outbound-call ceiling for bench/gateway.sh.
 *
 * Fires TOTAL `POST URL` calls through the engine's own gateway client
 * (src/gateway: gw_request_build, then gw_client_submit on the libcurl-multi
 * thread, GW_MAX_INFLIGHT = 256 transfers at most), keeping INFLIGHT of them
 * in flight, each with its own Idempotency-Key and a JSON body the size of a
 * GATEWAY step's ({"order": ID, "amount": 100}).  Requests are rendered on
 * the main thread and handed to the client, and responses handed back, as
 * the engine's workers do; nothing is stored.  Every answer must be 201.
 *
 * Usage: gwcalls URL TOTAL INFLIGHT [PREFIX]
 * Prints one line:
 *   RESULT calls=N ok=<201s> bad=<others> secs=S cps=<calls/s> p50_ms=.. p99_ms=.. client_us=..
 * (latency: submit to completion of each call, as the client measures it;
 * client_us: this process's CPU time, all threads, per call).
 * Exit status 0 when every call answered 201.
 */
#include "base/clock.h"
#include "base/mem.h"
#include "gateway/gateway.h"

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

struct slot {
    struct gw_request req;
    struct gw_response *resp;
    int64_t started_us;
    struct slot *next; /* done queue */
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static struct slot *done_head;

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* On the client's thread: hand the response to the main thread. */
static void on_done(void *ctx, struct gw_response *resp)
{
    struct slot *s = ctx;
    s->resp = resp;
    pthread_mutex_lock(&mu);
    s->next = done_head;
    done_head = s;
    pthread_cond_signal(&cv);
    pthread_mutex_unlock(&mu);
}

static int render(const char *url, const char *prefix, long i, struct gw_request *out)
{
    char id[128];
    snprintf(id, sizeof id, "%s-%ld", prefix, i);
    char *key = xasprintf("charge-%s", id);
    json_t *r = json_pack("{s:s,s:{s:s},s:{s:s,s:i}}", "url", url, "headers", "Idempotency-Key",
                          key, "body", "order", id, "amount", 100);
    free(key);
    struct ifl_err e = {0};
    int rc = gw_request_build("POST", r, out, &e);
    out->resend_safe = 1; /* keyed, as the engine's charge calls under `retry` */
    json_decref(r);
    if (rc)
        fprintf(stderr, "gwcalls: %s\n", e.msg);
    return rc;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    if (argc < 4 || argc > 5) {
        fprintf(stderr, "usage: %s URL TOTAL INFLIGHT [PREFIX]\n", argv[0]);
        return 2;
    }
    const char *url = argv[1];
    long total = strtol(argv[2], NULL, 10);
    long inflight = strtol(argv[3], NULL, 10);
    const char *prefix = argc == 5 ? argv[4] : "ceiling";
    if (total <= 0 || inflight <= 0 || inflight > 256) {
        fprintf(stderr, "gwcalls: TOTAL > 0 and 0 < INFLIGHT <= 256\n");
        return 2;
    }
    if (inflight > total)
        inflight = total;
    struct gw_client *c = NULL;
    struct ifl_err e = {0};
    if (gw_client_new(256, &c, &e)) {
        fprintf(stderr, "gwcalls: %s\n", e.msg);
        return 1;
    }
    struct slot *slots = xcalloc((size_t)inflight, sizeof *slots);
    int64_t *lat = xcalloc((size_t)total, sizeof *lat);
    long issued = 0, finished = 0, ok = 0, bad = 0;
    int64_t t0 = now_us();
    for (long k = 0; k < inflight; k++) {
        if (render(url, prefix, issued, &slots[k].req))
            return 1;
        slots[k].started_us = now_us();
        gw_client_submit(c, &slots[k].req, 10000, on_done, &slots[k]);
        issued++;
    }
    while (finished < total) {
        pthread_mutex_lock(&mu);
        while (!done_head)
            pthread_cond_wait(&cv, &mu);
        struct slot *list = done_head;
        done_head = NULL;
        pthread_mutex_unlock(&mu);
        while (list) {
            struct slot *s = list;
            list = s->next;
            lat[finished++] = now_us() - s->started_us;
            if (s->resp->transport == GW_T_OK && s->resp->status == 201) {
                ok++;
            } else {
                if (bad < 5)
                    fprintf(stderr, "gwcalls: %s: status %ld %s\n", s->req.idempotency_key,
                            s->resp->status, s->resp->error);
                bad++;
            }
            gw_response_clear(s->resp);
            free(s->resp);
            s->resp = NULL;
            gw_request_clear(&s->req);
            if (issued < total) {
                if (render(url, prefix, issued, &s->req))
                    return 1;
                s->started_us = now_us();
                gw_client_submit(c, &s->req, 10000, on_done, s);
                issued++;
            }
        }
    }
    double secs = (double)(now_us() - t0) / 1e6;
    gw_client_free(c, 0); /* joins the client's thread: its time is in RUSAGE_SELF */
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double cpu_us = (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e6 +
                    (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
    qsort(lat, (size_t)total, sizeof *lat, cmp_i64);
    printf("RESULT calls=%ld ok=%ld bad=%ld secs=%.3f cps=%.1f p50_ms=%.2f p99_ms=%.2f "
           "client_us=%.0f\n",
           total, ok, bad, secs, (double)total / secs, (double)lat[total / 2] / 1000.0,
           (double)lat[(total * 99) / 100] / 1000.0, cpu_us / (double)total);
    free(lat);
    free(slots);
    return bad ? 1 : 0;
}
