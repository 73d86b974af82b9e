/*
 * bench/hello — the HTTP ceiling for bench/triggers.sh.
 *
 * A minimal libmicrohttpd server in the engine's threading mode (one thread
 * per connection, internal accept thread): it reads the request body, throws
 * it away and answers 200 with a small constant JSON body.  Whatever rate it
 * sustains under the same client is the most any handler on this machine can
 * reach, so the engine's figures are reported as a fraction of it.
 *
 * Usage: hello PORT   (127.0.0.1 only; PORT 0 picks a free one; SIGTERM or
 * SIGINT stops it).  Prints "hello: listening on 127.0.0.1 port N" on stderr
 * once it accepts connections.
 *
 * Must never: listen beyond loopback, or do work per request that the engine
 * would not also do (that would flatter the ratios).
 */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char body[] = "{\"hello\":\"world\"}";

/* Counts body bytes into *con_cls (so the body is really read), then answers. */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    (void)cls;
    (void)url;
    (void)method;
    (void)version;
    size_t *seen = *con_cls;
    if (!seen) {
        seen = calloc(1, sizeof *seen);
        if (!seen)
            return MHD_NO;
        *con_cls = seen;
        return MHD_YES;
    }
    if (*upload_data_size) {
        /* Touch the bytes the way a parser would, so the read is not elided. */
        for (size_t i = 0; i < *upload_data_size; i++)
            *seen += (unsigned char)upload_data[i] != 0;
        *upload_data_size = 0;
        return MHD_YES;
    }
    struct MHD_Response *r =
        MHD_create_response_from_buffer(sizeof body - 1, (void *)body, MHD_RESPMEM_PERSISTENT);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    enum MHD_Result ret = MHD_queue_response(conn, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ret;
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)conn;
    (void)toe;
    free(*con_cls);
    *con_cls = NULL;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s PORT\n", argv[0]);
        return 2;
    }
    char *end = NULL;
    unsigned long port = strtoul(argv[1], &end, 10);
    if (end == argv[1] || *end || port > 65535) {
        fprintf(stderr, "hello: bad port '%s'\n", argv[1]);
        return 2;
    }

    /* Block the stop signals in every thread (MHD's inherit the mask); main waits for them. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    struct sockaddr_in sin4;
    memset(&sin4, 0, sizeof sin4);
    sin4.sin_family = AF_INET;
    sin4.sin_port = htons((uint16_t)port);
    sin4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_AUTO_INTERNAL_THREAD |
                     MHD_USE_ERROR_LOG | MHD_USE_ITC;
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, (uint16_t)port, NULL, NULL, on_request, NULL, MHD_OPTION_SOCK_ADDR,
        (struct sockaddr *)&sin4, MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL,
        MHD_OPTION_CONNECTION_LIMIT, 1024u, MHD_OPTION_CONNECTION_TIMEOUT, 60u, MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "hello: cannot listen on 127.0.0.1:%lu\n", port);
        return 1;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    fprintf(stderr, "hello: listening on 127.0.0.1 port %u\n",
            info ? (unsigned)info->port : (unsigned)port);
    int sig = 0;
    sigwait(&sigs, &sig);
    MHD_stop_daemon(d);
    return 0;
}
