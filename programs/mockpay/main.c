/*
 * idemflow-mockpay — the mock payment provider: a real HTTP server that
 * charges orders with Stripe-style idempotency keys and injects faults
 * (docs/mockpay.md).  This file is the thin program: options, signals, the
 * ready line; the provider lives in mockpay.c, the HTTP front in listener.c.
 *
 * Prints {"event":"mockpay.ready","port":N} on stdout once listening, then
 * serves until SIGTERM or SIGINT, when it stops accepting, lets in-flight
 * requests finish (injected latency is cut short) and exits 0.
 */
#include "base/err.h"
#include "base/log.h"
#include "listener.h"
#include "mockpay.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fputs("usage: idemflow-mockpay --listen HOST:PORT [--seed N] [--faults SPEC]\n"
          "                        [--max-charges N] [--quiet]\n"
          "  --listen HOST:PORT   address to serve on (port 0 = any free port; the ready\n"
          "                       line on stdout reports the real one)\n"
          "  --seed N             seed for probabilistic faults and charge ids (default 1)\n"
          "  --faults SPEC        start-up faults, compact or JSON, e.g.\n"
          "                       'drop_after_commit:count=1;status=429:retry_after=1:count=2'\n"
          "  --max-charges N      charges kept before answering 507 (default 1000000)\n"
          "  --quiet              no per-request log lines on stderr\n"
          "See docs/mockpay.md.\n",
          f);
}

/* A whole decimal number in [0, max]; 0 or -1. */
static int parse_u64(const char *s, unsigned long long max, unsigned long long *out)
{
    if (!s || *s < '0' || *s > '9')
        return -1;
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v > max)
        return -1;
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    const char *listen = NULL;
    struct mockpay_opts o = {.seed = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        unsigned long long n;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--quiet") == 0) {
            o.quiet = 1;
            continue;
        } else if (!v) {
            fprintf(stderr, "idemflow-mockpay: %s needs a value (or is unknown)\n", a);
            usage(stderr);
            return 2;
        } else if (strcmp(a, "--listen") == 0) {
            listen = v;
        } else if (strcmp(a, "--seed") == 0) {
            if (parse_u64(v, 1ull << 53, &n)) {
                fputs("idemflow-mockpay: --seed must be an integer from 0 to 2^53\n", stderr);
                return 2;
            }
            o.seed = n;
        } else if (strcmp(a, "--faults") == 0) {
            o.faults = v;
        } else if (strcmp(a, "--max-charges") == 0) {
            if (parse_u64(v, 100000000ull, &n) || n == 0) {
                fputs("idemflow-mockpay: --max-charges must be from 1 to 100000000\n", stderr);
                return 2;
            }
            o.max_charges = (size_t)n;
        } else {
            fprintf(stderr, "idemflow-mockpay: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
        i++;
    }
    if (!listen) {
        fputs("idemflow-mockpay: --listen is required\n", stderr);
        usage(stderr);
        return 2;
    }

    /* Signals are taken synchronously by sigwait below; every thread
     * (libmicrohttpd's included) inherits this mask. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    struct ifl_err e = {0};
    struct mockpay *m = NULL;
    struct listener *l = NULL;
    if (mockpay_new(&o, &m, &e)) {
        fprintf(stderr, "idemflow-mockpay: --faults: %s\n", e.msg);
        return 2;
    }
    if (listener_start(listen, MOCKPAY_MAX_BODY, mockpay_handle, mockpay_connected, m, &l, &e)) {
        fprintf(stderr, "idemflow-mockpay: %s\n", e.msg);
        mockpay_free(m);
        return e.code == IFL_EINVAL ? 2 : 1;
    }
    printf("{\"event\":\"mockpay.ready\",\"port\":%u}\n", listener_port(l));
    fflush(stdout);
    log_info("mockpay.ready", "listening on %s port %u, seed %llu", listen, listener_port(l),
             (unsigned long long)o.seed);

    int sig = 0;
    while (sigwait(&set, &sig) != 0)
        ;
    log_info("mockpay.stop", "signal %d: draining", sig);
    mockpay_shutdown(m);
    listener_stop(l);
    mockpay_free(m);
    return 0;
}
