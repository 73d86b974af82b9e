/*
 * crashmark — see crashmark.h.
 */
#include "base/crashmark.h"
#include "base/mem.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char mark_path[4096];         /* written once, before threads */
static __thread const char *current; /* what this thread evaluates */
static __thread void *altstack;      /* this thread's signal stack */
static const int fatal[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};

static void on_fatal(int sig)
{
    const char *m = current;
    if (m && mark_path[0]) {
        int fd = open(mark_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
        if (fd >= 0) {
            size_t n = strlen(m);
            /* one write per line: lines of threads crashing at once stay whole */
            char line[512];
            if (n < sizeof line) {
                memcpy(line, m, n);
                line[n] = '\n';
                if (write(fd, line, n + 1) < 0) {
                    /* nothing to do: the process is dying */
                }
                fsync(fd);
            }
            close(fd);
        }
    }
    /* SA_RESETHAND restored the default action; the signal, blocked while
     * this runs, is delivered again on return (or the faulting instruction
     * faults again) and ends the process. */
    raise(sig);
}

static int mkdirs(char *path)
{
    for (char *p = path + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        int rc = mkdir(path, 0700);
        *p = '/';
        if (rc != 0 && errno != EEXIST)
            return -1;
    }
    return mkdir(path, 0700) == 0 || errno == EEXIST ? 0 : -1;
}

int crashmark_init(const char *dir, struct ifl_err *e)
{
    char d[4096];
    if (strlen(dir) > 3800)
        return err_set(e, IFL_EINVAL, "crash marker directory name too long");
    snprintf(d, sizeof d, "%s", dir);
    if (mkdirs(d) != 0)
        return err_set(e, IFL_EIO, "cannot create the crash marker directory %s: %s", dir,
                       strerror(errno));
    /* Markers decide which steps fail: a directory someone else owns (a
     * shared /tmp) could feed us theirs. */
    struct stat st;
    if (lstat(d, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 022))
        return err_set(e, IFL_EIO,
                       "crash marker directory %s is not a directory of this user's that only "
                       "it can write",
                       dir);
    snprintf(mark_path, sizeof mark_path, "%s/%ld.mark", dir, (long)getpid());
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_fatal;
    sa.sa_flags = SA_RESETHAND | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof fatal / sizeof fatal[0]; i++)
        if (sigaction(fatal[i], &sa, NULL) != 0)
            return err_set(e, IFL_EIO, "sigaction: %s", strerror(errno));
    return 0;
}

void crashmark_thread_init(void)
{
    stack_t old;
    if (altstack || (sigaltstack(NULL, &old) == 0 && !(old.ss_flags & SS_DISABLE)))
        return; /* one is there already (a sanitizer's runtime sets its own) */
    size_t size = 64 * 1024;
    altstack = xmalloc(size);
    stack_t ss = {.ss_sp = altstack, .ss_size = size, .ss_flags = 0};
    if (sigaltstack(&ss, NULL) != 0) {
        free(altstack);
        altstack = NULL;
    }
}

void crashmark_thread_done(void)
{
    if (!altstack)
        return;
    stack_t ss = {.ss_flags = SS_DISABLE};
    sigaltstack(&ss, NULL);
    free(altstack);
    altstack = NULL;
}

void crashmark_enter(const char *what)
{
    current = what;
}

void crashmark_leave(void)
{
    current = NULL;
}

/* Runs at start, before this process can have written a marker: a file
 * named with this process's pid is a predecessor's (a reused pid). */
int crashmark_collect(const char *dir, void (*fn)(void *arg, const char *line), void *arg,
                      struct ifl_err *e)
{
    DIR *d = opendir(dir);
    if (!d)
        return errno == ENOENT ? 0 : err_set(e, IFL_EIO, "%s: %s", dir, strerror(errno));
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t n = strlen(de->d_name);
        if (n < 6 || strcmp(de->d_name + n - 5, ".mark") != 0)
            continue;
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        char line[512];
        while (fgets(line, sizeof line, f)) {
            size_t l = strlen(line);
            if (l && line[l - 1] == '\n')
                line[--l] = '\0';
            if (l)
                fn(arg, line);
        }
        fclose(f);
        unlink(path);
    }
    closedir(d);
    return 0;
}
