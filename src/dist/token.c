/*
 * token.c — the job token of a store opened without one (no launcher, no
 * DPLUA_JOB_TOKEN): rank 0 makes a random token and leaves it in a file
 * only this user can read; the other ranks of the job, the same user's
 * processes, read it there. The file is keyed by the store's host and
 * port, as every rank names them (MASTER_ADDR, MASTER_PORT), and lives
 * under $XDG_CACHE_HOME/dplua or ~/.cache/dplua (a home shared by the
 * nodes of a cluster serves every node). A loopback host is keyed with
 * this machine's name too, so that one-node jobs of two machines that
 * share the home do not meet.
 */
#define _GNU_SOURCE
#include "dist/store.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

int token_random(char *out, size_t size)
{
    unsigned char r[16];
    if (size < 2 * sizeof r + 1 || getrandom(r, sizeof r, 0) != (ssize_t)sizeof r)
        return errno ? errno : EINVAL;
    for (size_t i = 0; i < sizeof r; i++)
        snprintf(out + 2 * i, 3, "%02x", r[i]);
    return 0;
}

void token_derived(const char *host, int port, char *out, size_t size)
{
    char key[600];
    uint64_t h = 1469598103934665603ull;
    snprintf(key, sizeof key, "dplua-job:%s:%d", host, port);
    for (const char *p = key; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ull;
    snprintf(out, size, "derived-%016llx", (unsigned long long)h);
}

/* The folder, made private when it is new, and checked to be private. */
static int token_dir(char *dir, size_t size, char *why, size_t why_size)
{
    const char *cache = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    struct stat st;
    char parent[4096];
    if (cache && *cache == '/') {
        snprintf(parent, sizeof parent, "%s", cache);
        mkdir(parent, 0700);
    } else {
        struct passwd *pw = home && *home == '/' ? NULL : getpwuid(getuid());
        if ((home == NULL || *home != '/') && (pw == NULL || (home = pw->pw_dir) == NULL)) {
            snprintf(why, why_size, "no home folder to keep the job token in (set HOME or DPLUA_JOB_TOKEN)");
            return ENOENT;
        }
        snprintf(parent, sizeof parent, "%s/.cache", home);
        mkdir(parent, 0700);
    }
    snprintf(dir, size, "%s/dplua", parent);
    if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
        snprintf(why, why_size, "cannot make %s for the job token: %s", dir, strerror(errno));
        return errno;
    }
    if (lstat(dir, &st) < 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid() || (st.st_mode & 077) != 0) {
        snprintf(why, why_size, "%s must be a folder of this user that only this user can open (chmod 700 it)",
                 dir);
        return EPERM;
    }
    return 0;
}

/* The file's path for host:port. */
static int token_path(const char *host, int port, char *path, size_t size, char *why, size_t why_size)
{
    char dir[4200], name[300], machine[128] = "";
    size_t k = 0;
    int e = token_dir(dir, sizeof dir, why, why_size);
    if (e != 0)
        return e;
    if (strcmp(host, "localhost") == 0 || strncmp(host, "127.", 4) == 0 || strcmp(host, "::1") == 0) {
        gethostname(machine, sizeof machine - 1);
        machine[sizeof machine - 1] = '\0';
    }
    if (machine[0])
        k = (size_t)snprintf(name, 130, "%.120s-", machine);
    snprintf(name + k, sizeof name - k, "%.250s", host);   /* a host name, an IPv4 or IPv6 address */
    for (k = 0; name[k]; k++)   /* a file name of the folder, whatever the names hold */
        if (name[k] == '/' || (k == 0 && name[k] == '.'))
            name[k] = '_';
    snprintf(path, size, "%s/store-%s-%d.token", dir, name, port);
    return 0;
}

int token_file_write(const char *host, int port, const char *token, char *why, size_t why_size)
{
    char path[4600], tmp[4700];
    size_t n = strlen(token);
    int fd, e = token_path(host, port, path, sizeof path, why, why_size);
    if (e != 0)
        return e;
    snprintf(tmp, sizeof tmp, "%s.%d", path, (int)getpid());
    unlink(tmp);
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 || write(fd, token, n) != (ssize_t)n || close(fd) < 0 || rename(tmp, path) < 0) {
        e = errno;
        snprintf(why, why_size, "cannot write the job token to %s: %s", path, strerror(e));
        if (fd >= 0)
            unlink(tmp);
        return e ? e : EIO;
    }
    return 0;
}

int token_file_read(const char *host, int port, char *out, size_t size, char *why, size_t why_size)
{
    char path[4600];
    struct stat st;
    ssize_t n;
    int fd, e = token_path(host, port, path, sizeof path, why, why_size);
    if (e != 0)
        return e;
    fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        e = errno;
        snprintf(why, why_size, "no job token in %s (%s): rank 0 writes it when it serves the store", path,
                 strerror(e));
        return e;
    }
    if (fstat(fd, &st) < 0 || st.st_uid != getuid() || (st.st_mode & 077) != 0) {
        close(fd);
        snprintf(why, why_size, "%s is readable by others or not this user's; remove it", path);
        return EPERM;
    }
    n = read(fd, out, size - 1);
    close(fd);
    if (n <= 0) {   /* (rename makes it whole at once: an empty file is no token) */
        snprintf(why, why_size, "the job token file %s is empty", path);
        return ENOENT;
    }
    out[n] = '\0';
    return 0;
}

void token_file_remove(const char *host, int port, const char *token)
{
    char path[4600], why[4800], now[TOKEN_MAX + 1];
    /* only our own: a later job on the same port may have replaced it */
    if (token_file_read(host, port, now, sizeof now, why, sizeof why) == 0 && strcmp(now, token) == 0 &&
        token_path(host, port, path, sizeof path, why, sizeof why) == 0)
        unlink(path);
}
