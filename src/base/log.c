/*
 * log — see log.h.  Each line is assembled in a local buffer and written
 * with one write(2) so concurrent lines never interleave.
 */
#include "base/log.h"
#include "base/clock.h"
#include "base/mem.h"

#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

static enum log_level min_level = LOG_INFO;

void log_set_level(enum log_level lvl)
{
    min_level = lvl;
}

static void escape(struct buf *b, const char *s)
{
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            buf_putc(b, '\\');
            buf_putc(b, (char)c);
        } else if (c < 0x20) {
            buf_printf(b, "\\u%04x", c);
        } else {
            buf_putc(b, (char)c);
        }
    }
}

void log_msg(enum log_level lvl, const char *event, const char *fmt, ...)
{
    static const char *names[] = {"debug", "info", "warn", "error"};
    if (lvl < min_level)
        return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    char ts[32];
    clock_rfc3339(clock_now_ms(), ts);
    struct buf b;
    buf_init(&b, 0);
    buf_printf(&b, "{\"ts\":\"%s\",\"level\":\"%s\",\"event\":\"", ts, names[lvl]);
    escape(&b, event);
    buf_puts(&b, "\",\"msg\":\"");
    escape(&b, msg);
    buf_puts(&b, "\"}\n");
    ssize_t w = write(STDERR_FILENO, b.p, b.len);
    (void)w;
    buf_free(&b);
}
