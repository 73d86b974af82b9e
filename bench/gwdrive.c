/*
 * bench/gwdrive — the trigger driver of bench/gateway.sh.
 *
 * Sends TOTAL new triggers `POST PATH` (order ids "gw-RUN-<i>") to the engine
 * on 127.0.0.1:PORT over CONNS keep-alive connections, never more than
 * INFLIGHT executions unfinished, in one of two modes:
 *   POLL_MS > 0  "unfinished" is triggers sent minus the engine's
 *                idemflow_executions_finished_total (completed + failed),
 *                which it reads from GET /metrics on a connection of its own
 *                every POLL_MS (default 10) ms.  The count it reads is up to
 *                POLL_MS old, so fewer than INFLIGHT are really unfinished.
 *   POLL_MS = 0  every trigger asks `Prefer: wait=60` and is answered when
 *                its execution finished: a connection holds one execution
 *                from trigger to end, so INFLIGHT (<= CONNS) are exactly
 *                that many unfinished.  An answer still `running` (the wait
 *                ran out) is counted from /metrics at the end.
 * Then it waits until TOTAL executions finished or LIMIT seconds passed.
 *
 * One thread, epoll, plain sockets: the driver shares the machine's cores
 * with the engine and the mock provider, so it should cost as little CPU as
 * it can (the Python driver it replaces took about 100 us per trigger, a
 * fifth of the engine's own cost).
 *
 * Usage: gwdrive PORT PATH TOTAL INFLIGHT CONNS RUN LIMIT_S
 * Prints one line:
 *   RESULT sent=N ok=<201s> other=N finished=N send_secs=S secs=S trig_rps=R
 *          inflight_avg=A inflight_max=M statuses=CODE:N,… cpu_us=<own CPU>
 * Exit status 0 when it ran to the end (statuses are judged by the script).
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BUFCAP (256 * 1024)

struct conn {
    int fd;
    int busy;   /* a request is out, its response not read */
    size_t len; /* bytes in buf */
    char *buf;  /* the response being read */
    int is_metrics;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int dial(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int send_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* A complete response in c->buf?  1 with *status, *body, *blen and the bytes
 * it took in *used; 0 when more is needed; -1 when it cannot be parsed. */
static int parse(struct conn *c, int *status, const char **body, size_t *blen, size_t *used)
{
    c->buf[c->len] = '\0';
    const char *end = strstr(c->buf, "\r\n\r\n");
    if (!end)
        return c->len >= BUFCAP - 1 ? -1 : 0;
    if (c->len < 12 || strncmp(c->buf, "HTTP/1.", 7) != 0)
        return -1;
    *status = atoi(c->buf + 9);
    size_t cl = 0;
    for (const char *p = c->buf; p && p < end; p = strstr(p, "\r\n")) {
        p += 2;
        if (strncasecmp(p, "content-length:", 15) == 0) {
            cl = strtoul(p + 15, NULL, 10);
            break;
        }
    }
    size_t head = (size_t)(end - c->buf) + 4;
    if (head + cl >= BUFCAP)
        return -1;
    if (c->len < head + cl)
        return 0;
    *body = c->buf + head;
    *blen = cl;
    *used = head + cl;
    return 1;
}

/* Sum of idemflow_executions_finished_total{status="completed"|"failed"}. */
static long finished_from(const char *body, size_t n)
{
    static const char *keys[] = {
        "idemflow_executions_finished_total{status=\"completed\"} ",
        "idemflow_executions_finished_total{status=\"failed\"} ",
    };
    long sum = 0;
    for (size_t k = 0; k < 2; k++) {
        const char *p = memmem(body, n, keys[k], strlen(keys[k]));
        if (p)
            sum += strtol(p + strlen(keys[k]), NULL, 10);
    }
    return sum;
}

int main(int argc, char **argv)
{
    if (argc != 8 && argc != 9) {
        fprintf(stderr, "usage: gwdrive PORT PATH TOTAL INFLIGHT CONNS RUN LIMIT_S [POLL_MS]\n");
        return 2;
    }
    int port = atoi(argv[1]);
    const char *path = argv[2];
    long total = atol(argv[3]), target = atol(argv[4]);
    int nconns = atoi(argv[5]);
    const char *run = argv[6];
    double limit = atof(argv[7]);
    double poll_s = argc == 9 ? atof(argv[8]) / 1000 : 0.01;
    int wait_mode = poll_s == 0;
    if (port <= 0 || total <= 0 || target <= 0 || nconns <= 0 || limit <= 0 || poll_s < 0 ||
        (wait_mode && target > nconns)) {
        fprintf(stderr, "gwdrive: bad arguments\n");
        return 2;
    }
    int ep = epoll_create1(0);
    struct conn *cs = calloc((size_t)nconns + 1, sizeof *cs);
    long *statuses = calloc(600, sizeof *statuses);
    if (ep < 0 || !cs || !statuses)
        return 2;
    for (int i = 0; i <= nconns; i++) {
        cs[i].fd = dial(port);
        cs[i].buf = malloc(BUFCAP);
        if (cs[i].fd < 0 || !cs[i].buf) {
            fprintf(stderr, "gwdrive: cannot connect to 127.0.0.1:%d: %s\n", port, strerror(errno));
            return 1;
        }
        cs[i].is_metrics = i == nconns;
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &cs[i]};
        epoll_ctl(ep, EPOLL_CTL_ADD, cs[i].fd, &ev);
    }
    struct conn *mc = &cs[nconns];
    static const char metrics_req[] = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";

    long next = 0, finished = 0, other = 0, nsamples = 0, inflight_max = 0;
    long answered = 0, ended = 0, running = 0; /* wait mode: answers, finished or not */
    double inflight_sum = 0, t0 = now_s(), sent_at = 0, next_poll = t0;
    char req[1024];
    for (;;) {
        double t = now_s();
        if (next >= total && sent_at == 0)
            sent_at = t;
        if (wait_mode && !running)
            finished = ended; /* every answer so far was a finished execution */
        if (next >= total && finished >= total)
            break;
        if (t - t0 > limit)
            break;
        /* Send on every idle connection while the gate allows. */
        long unfinished = wait_mode ? next - answered : next - finished;
        for (int i = 0; i < nconns && next < total && unfinished < target; i++) {
            struct conn *c = &cs[i];
            if (c->busy)
                continue;
            char body[256];
            int bl = snprintf(body, sizeof body,
                              "{\"order\":{\"id\":\"gw-%s-%ld\",\"amount\":1250,\"currency\":"
                              "\"EUR\"},\"customer\":\"c-0042\",\"note\":\"bench\"}",
                              run, next);
            int rl = snprintf(req, sizeof req,
                              "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                              "application/json\r\n%sContent-Length: %d\r\n\r\n%s",
                              path, wait_mode ? "Prefer: wait=60\r\n" : "", bl, body);
            if (send_all(c->fd, req, (size_t)rl) != 0) {
                fprintf(stderr, "gwdrive: send: %s\n", strerror(errno));
                return 1;
            }
            c->busy = 1;
            next++;
            unfinished++;
        }
        /* wait mode reads /metrics only for answers that were still running */
        int poll_now = !wait_mode || (running && next >= total && answered >= total);
        if (poll_now && !mc->busy && t >= next_poll) {
            if (send_all(mc->fd, metrics_req, sizeof metrics_req - 1) != 0) {
                fprintf(stderr, "gwdrive: send /metrics: %s\n", strerror(errno));
                return 1;
            }
            mc->busy = 1;
        }
        int wait_ms = mc->busy || !poll_now ? 100 : (int)((next_poll - t) * 1000) + 1;
        struct epoll_event evs[64];
        int n = epoll_wait(ep, evs, 64, wait_ms < 0 ? 0 : wait_ms);
        if (n < 0 && errno != EINTR) {
            perror("gwdrive: epoll_wait");
            return 1;
        }
        for (int k = 0; k < n; k++) {
            struct conn *c = evs[k].data.ptr;
            ssize_t r = recv(c->fd, c->buf + c->len, BUFCAP - 1 - c->len, 0);
            if (r <= 0) {
                fprintf(stderr, "gwdrive: connection closed by the engine\n");
                return 1;
            }
            c->len += (size_t)r;
            int status;
            const char *body;
            size_t blen, used;
            int p = parse(c, &status, &body, &blen, &used);
            if (p < 0) {
                fprintf(stderr, "gwdrive: unparsable response\n");
                return 1;
            }
            if (p == 0)
                continue;
            if (c->is_metrics) {
                finished = finished_from(body, blen);
                if (next < total) { /* the sending phase only */
                    long in = next - finished;
                    inflight_sum += (double)in;
                    nsamples++;
                    if (in > inflight_max)
                        inflight_max = in;
                }
                next_poll = now_s() + poll_s;
            } else if (status >= 100 && status < 600) {
                statuses[status]++;
                if (wait_mode) {
                    long in = next - answered;
                    inflight_sum += (double)in;
                    nsamples++;
                    if (in > inflight_max)
                        inflight_max = in;
                    answered++;
                    if (memmem(body, blen, "\"status\":\"running\"", 18))
                        running++;
                    else
                        ended++;
                }
            } else {
                other++;
            }
            memmove(c->buf, c->buf + used, c->len - used);
            c->len -= used;
            c->busy = 0;
        }
    }
    double end = now_s();
    if (sent_at == 0)
        sent_at = end;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    long cpu_us = ru.ru_utime.tv_sec * 1000000L + ru.ru_utime.tv_usec +
                  ru.ru_stime.tv_sec * 1000000L + ru.ru_stime.tv_usec;
    printf("RESULT sent=%ld ok=%ld other=%ld finished=%ld send_secs=%.2f secs=%.2f trig_rps=%.1f "
           "inflight_avg=%.0f inflight_max=%ld statuses=",
           next, statuses[201], next - statuses[201], finished, sent_at - t0, end - t0,
           (double)next / (sent_at - t0), nsamples ? inflight_sum / (double)nsamples : 0.0,
           inflight_max);
    const char *sep = "";
    for (int s = 0; s < 600; s++)
        if (statuses[s]) {
            printf("%s%d:%ld", sep, s, statuses[s]);
            sep = ",";
        }
    if (other)
        printf("%sbad:%ld", sep, other);
    printf(" cpu_us=%ld\n", cpu_us);
    return 0;
}
