/*
 * log — structured JSON lines on stderr: {"ts":…,"level":…,"event":…,"msg":…}.
 *
 * Thread safe (one write(2) per line).  Callers must never pass secret
 * values; messages are escaped, not filtered.
 */
#ifndef IFL_BASE_LOG_H
#define IFL_BASE_LOG_H

enum log_level { LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR };

/* Lines below this level are dropped; set once at start (frozen config). */
void log_set_level(enum log_level lvl);
void log_msg(enum log_level lvl, const char *event, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define log_info(ev, ...) log_msg(LOG_INFO, ev, __VA_ARGS__)
#define log_warn(ev, ...) log_msg(LOG_WARN, ev, __VA_ARGS__)
#define log_error(ev, ...) log_msg(LOG_ERROR, ev, __VA_ARGS__)
#define log_debug(ev, ...) log_msg(LOG_DEBUG, ev, __VA_ARGS__)

#endif
