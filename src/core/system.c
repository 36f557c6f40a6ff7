/*
 * system.c — what the launcher and the Lua library (progress bars,
 * metrics, the sweep driver) ask of the operating system: clocks, sleep,
 * the number of CPUs, directories, terminals. In C, so that no Lua code
 * declares libc's structures or constants through the FFI.
 */
#define _GNU_SOURCE
#include "core/tensor.h"

#include <errno.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double seconds_of(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double dp_clock_monotonic(void)
{
    return seconds_of(CLOCK_MONOTONIC);
}

double dp_clock_wall(void)
{
    return seconds_of(CLOCK_REALTIME);
}

int dp_sleep(double seconds)
{
    if (!(seconds > 0))   /* also NaN */
        return 0;
    if (seconds > 1e9)
        seconds = 1e9;
    struct timespec ts = { (time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9) };
    return nanosleep(&ts, NULL) == 0 ? 0 : 1;
}

int dp_cpu_count(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

int dp_is_terminal(int fd)
{
    return isatty(fd) == 1;
}

dp_status dp_make_dirs(const char *path)
{
    char buf[PATH_MAX];
    if (path == NULL || path[0] == '\0')
        return dp_fail(DP_ERR_ARG, "make_dirs: expected a directory path, got an empty one");
    size_t n = strlen(path);
    if (n >= sizeof buf)
        return dp_fail(DP_ERR_ARG, "make_dirs: the path is %zu bytes long (at most %d)", n, PATH_MAX - 1);
    memcpy(buf, path, n + 1);
    /* each prefix that ends before a '/', then the whole path */
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0')
            continue;
        char c = buf[i];
        buf[i] = '\0';
        struct stat sb;
        if (mkdir(buf, 0777) != 0 && (errno != EEXIST || stat(buf, &sb) != 0 || !S_ISDIR(sb.st_mode)))
            return dp_fail(DP_ERR_IO, "make_dirs: cannot create the directory %s: %s", buf,
                           errno == EEXIST ? "a file of that name is in the way" : strerror(errno));
        buf[i] = c;
    }
    return DP_OK;
}
