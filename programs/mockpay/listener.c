/*
 * listener — see listener.h.
 *
 * Dropping works by returning MHD_NO from the access handler on the final
 * call for a request: libmicrohttpd then closes the socket without queueing
 * a response, which the client sees as a connection closed (or reset) after
 * its request was sent — the "sent, outcome unknown" case.
 */
#include "listener.h"
#include "base/clock.h"
#include "base/log.h"
#include "base/mem.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DRAIN_MS 30000 /* how long listener_stop waits for requests in flight */

struct listener {
    struct MHD_Daemon *d;
    listener_fn fn;
    listener_conn_fn on_conn;
    void *ctx;
    size_t max_body;
    unsigned port;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int inflight; /* requests begun and not yet completed (answered or dropped) */
    int stopping; /* under mu: requests that begin now are refused (503) */
};

struct reqctx {
    struct buf body;
    int too_big;
    int late; /* begun after listener_stop started: refused, connection closed */
    struct MHD_Connection *conn;
};

static const char *get_header(const struct http_req *r, const char *name)
{
    struct reqctx *c = r->impl;
    return MHD_lookup_connection_value(c->conn, MHD_HEADER_KIND, name);
}

static const char *get_query(const struct http_req *r, const char *name)
{
    struct reqctx *c = r->impl;
    return MHD_lookup_connection_value(c->conn, MHD_GET_ARGUMENT_KIND, name);
}

static enum MHD_Result send_res(struct MHD_Connection *conn, struct http_res *res)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(
        res->body_len, res->body ? res->body : (void *)"", MHD_RESPMEM_MUST_COPY);
    if (!r)
        return MHD_NO;
    if (res->body_len || res->content_type)
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                                res->content_type ? res->content_type : "application/json");
    for (int i = 0; i < res->nheaders; i++)
        MHD_add_response_header(r, res->headers[i].name, res->headers[i].value);
    enum MHD_Result ret = MHD_queue_response(conn, (unsigned)res->status, r);
    MHD_destroy_response(r);
    return ret;
}

/* Answers `status` with the problem document `body` (taken) and closes
 * the connection. */
static enum MHD_Result refuse(struct MHD_Connection *conn, int status, char *body)
{
    struct http_res res = {0};
    http_res_body(&res, status, "application/problem+json", body);
    http_res_header(&res, "Connection", "close");
    enum MHD_Result ret = send_res(conn, &res);
    http_res_clear(&res);
    return ret;
}

static enum MHD_Result toobig(struct listener *l, struct MHD_Connection *conn)
{
    return refuse(conn, 413,
                  xasprintf("{\"type\":\"/problems/payload-too-large\",\"title\":\"Payload "
                            "Too Large\",\"status\":413,\"detail\":\"request body over %zu "
                            "bytes\"}",
                            l->max_body));
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    struct listener *l = cls;
    struct reqctx *c = *con_cls;
    if (!c) {
        c = xcalloc(1, sizeof *c);
        buf_init(&c->body, l->max_body);
        c->conn = conn;
        *con_cls = c;
        pthread_mutex_lock(&l->mu);
        l->inflight++;
        c->late = l->stopping;
        pthread_mutex_unlock(&l->mu);
        const char *cl =
            MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl) {
            char *end = NULL;
            unsigned long long n = strtoull(cl, &end, 10);
            if (end != cl && n > l->max_body) {
                c->too_big = 1;
                if (n / 8 > l->max_body)
                    return toobig(l, conn);
            }
        }
        return MHD_YES;
    }
    if (*upload_data_size) {
        if (!c->too_big && buf_append(&c->body, upload_data, *upload_data_size))
            c->too_big = 1; /* keep reading (and discarding) to answer cleanly */
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (c->too_big)
        return toobig(l, conn);
    if (c->late) /* a keep-alive connection's request after the stop began */
        return refuse(conn, 503,
                      xstrdup("{\"type\":\"/problems/shutting-down\",\"title\":\"Service "
                              "Unavailable\",\"status\":503,\"detail\":\"the provider is "
                              "stopping\"}"));
    struct http_req req = {
        .method = method,
        .path = url,
        .body = c->body.p ? c->body.p : "",
        .body_len = c->body.len,
        .header = get_header,
        .query = get_query,
        .impl = c,
    };
    struct http_res res = {0};
    res.status = 500;
    enum listener_action act = l->fn(l->ctx, &req, &res);
    enum MHD_Result ret = act == LISTENER_DROP ? MHD_NO : send_res(conn, &res);
    http_res_clear(&res);
    return ret;
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct listener *l = cls;
    struct reqctx *c = *con_cls;
    if (!c)
        return;
    buf_free(&c->body);
    free(c);
    *con_cls = NULL;
    pthread_mutex_lock(&l->mu);
    if (--l->inflight == 0)
        pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

static void __attribute__((format(printf, 2, 0))) mhd_log(void *cls, const char *fmt, va_list ap)
{
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = '\0';
    /* A deliberate drop (LISTENER_DROP) is logged by the handler already. */
    if (strncmp(msg, "Application reported internal error", 35) == 0)
        return;
    log_warn("mockpay.mhd", "%s", msg);
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_ctx,
                          enum MHD_ConnectionNotificationCode toe)
{
    (void)c;
    (void)socket_ctx;
    struct listener *l = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED && l->on_conn)
        l->on_conn(l->ctx);
}

int listener_start(const char *listen, size_t max_body, listener_fn fn, listener_conn_fn on_conn,
                   void *ctx, struct listener **out, struct ifl_err *e)
{
    char host[128];
    unsigned port;
    if (http_parse_listen(listen, host, sizeof host, &port))
        return err_set(e, IFL_EINVAL, "--listen must be HOST:PORT, got '%s'", listen);
    if (strcmp(host, "localhost") == 0)
        snprintf(host, sizeof host, "127.0.0.1");
    struct sockaddr_in sin4 = {0};
    struct sockaddr_in6 sin6 = {0};
    struct sockaddr *sa;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_AUTO_INTERNAL_THREAD |
                     MHD_USE_ERROR_LOG | MHD_USE_ITC;
    if (inet_pton(AF_INET, host, &sin4.sin_addr) == 1) {
        sin4.sin_family = AF_INET;
        sin4.sin_port = htons((uint16_t)port);
        sa = (struct sockaddr *)&sin4;
    } else if (inet_pton(AF_INET6, host, &sin6.sin6_addr) == 1) {
        sin6.sin6_family = AF_INET6;
        sin6.sin6_port = htons((uint16_t)port);
        sa = (struct sockaddr *)&sin6;
        flags |= MHD_USE_IPv6;
    } else {
        return err_set(e, IFL_EINVAL, "--listen host must be an IP address, got '%s'", host);
    }
    struct listener *l = xcalloc(1, sizeof *l);
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    l->fn = fn;
    l->on_conn = on_conn;
    l->ctx = ctx;
    l->max_body = max_body ? max_body : 1u << 16;
    l->d = MHD_start_daemon(
        flags, (uint16_t)port, NULL, NULL, on_request, l, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
        MHD_OPTION_SOCK_ADDR, sa, MHD_OPTION_NOTIFY_COMPLETED, on_completed, l,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, l, MHD_OPTION_CONNECTION_LIMIT, 1024u,
        MHD_OPTION_CONNECTION_TIMEOUT, 60u, MHD_OPTION_END);
    if (!l->d) {
        pthread_mutex_destroy(&l->mu);
        pthread_cond_destroy(&l->cv);
        free(l);
        return err_set(e, IFL_EIO, "cannot listen on %s (in use or not permitted)", listen);
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(l->d, MHD_DAEMON_INFO_BIND_PORT);
    l->port = info ? info->port : port;
    *out = l;
    return 0;
}

unsigned listener_port(const struct listener *l)
{
    return l->port;
}

void listener_stop(struct listener *l)
{
    if (!l)
        return;
    /* Stop accepting; let every request already begun be answered (or
     * dropped, as its faults say) before the connections are closed —
     * for at most DRAIN_MS. */
    MHD_socket fd = MHD_quiesce_daemon(l->d);
    if (fd != MHD_INVALID_SOCKET)
        close(fd);
    struct timespec ts;
    clock_abstime(clock_now_ms() + DRAIN_MS, &ts);
    pthread_mutex_lock(&l->mu);
    l->stopping = 1;
    while (l->inflight > 0)
        if (pthread_cond_timedwait(&l->cv, &l->mu, &ts) != 0)
            break;
    pthread_mutex_unlock(&l->mu);
    MHD_stop_daemon(l->d);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
    free(l);
}
