/*
 * http/client — see client.h.
 */
#include "http/client.h"
#include "base/mem.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;

static void global_init(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

static size_t on_data(char *ptr, size_t size, size_t nmemb, void *ud)
{
    struct buf *b = ud;
    size_t n = size * nmemb;
    return buf_append(b, ptr, n) ? 0 : n; /* 0 aborts the transfer past the cap */
}

/* url as an error shows it: the password of its userinfo masked (or the
 * user name, when it has no password: a token), by libcurl's URL parser,
 * as the gateway's views mask theirs.  Caller frees. */
static char *url_shown(const char *url)
{
    CURLU *u = curl_url();
    char *pw = NULL, *user = NULL, *out = NULL;
    if (u && curl_url_set(u, CURLUPART_URL, url, CURLU_NON_SUPPORT_SCHEME) == CURLUE_OK) {
        if (curl_url_get(u, CURLUPART_PASSWORD, &pw, 0) == CURLUE_OK)
            curl_url_set(u, CURLUPART_PASSWORD, "****", 0);
        else if (curl_url_get(u, CURLUPART_USER, &user, 0) == CURLUE_OK)
            curl_url_set(u, CURLUPART_USER, "****", 0);
        char *shown = NULL;
        if (curl_url_get(u, CURLUPART_URL, &shown, 0) == CURLUE_OK) {
            out = xstrdup(shown);
            curl_free(shown);
        }
    }
    curl_free(pw);
    curl_free(user);
    curl_url_cleanup(u);
    return out ? out : xstrdup("(the server url)"); /* unparsable: not shown at all */
}

int http_client_do(const struct http_call *c, struct http_reply *reply, struct ifl_err *e)
{
    pthread_once(&once, global_init);
    memset(reply, 0, sizeof *reply);
    CURL *h = curl_easy_init();
    if (!h)
        return err_set(e, IFL_EIO, "cannot initialise libcurl");
    struct buf b;
    buf_init(&b, c->max_response ? c->max_response : (16u << 20));
    struct curl_slist *hdrs = NULL;
    if (c->body)
        hdrs = curl_slist_append(hdrs, "Content-Type: application/json");
    for (const char *const *p = c->headers; p && *p; p++)
        hdrs = curl_slist_append(hdrs, *p);
    hdrs = curl_slist_append(hdrs, "Expect:");
    curl_easy_setopt(h, CURLOPT_URL, c->url);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, c->method);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, c->timeout_ms ? c->timeout_ms : 30000L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    if (c->body) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, c->body);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)strlen(c->body));
    } else if (strcmp(c->method, "GET") != 0) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, "");
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, 0L);
    }
    CURLcode cc = curl_easy_perform(h);
    int rc = 0;
    if (cc != CURLE_OK) {
        char *shown = url_shown(c->url); /* never the url's password */
        rc = err_set(e, cc == CURLE_WRITE_ERROR ? IFL_ETOOBIG : IFL_EIO, "%s %s: %s", c->method,
                     shown, curl_easy_strerror(cc));
        free(shown);
        buf_free(&b);
    } else {
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &reply->status);
        reply->len = b.len;
        reply->body = buf_steal(&b);
    }
    curl_slist_free_all(hdrs);
    curl_easy_cleanup(h);
    return rc;
}

void http_reply_clear(struct http_reply *r)
{
    if (!r)
        return;
    free(r->body);
    memset(r, 0, sizeof *r);
}
