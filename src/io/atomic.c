/*
 * atomic.c — a file replaced whole: written to `path.tmp.<pid>`, fsync'd,
 * renamed over path, and the directory fsync'd, so that a reader (or a
 * crash) sees the old file or the new one, never a part of either.
 */
#include "io/atomic.h"
#include "core/tensor.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

dp_status atomic_create(const char *who, const char *path, char **tmp, int *fd)
{
    *fd = -1;
    *tmp = malloc(strlen(path) + 32);
    if (!*tmp)
        return dp_fail(DP_ERR_MEMORY, "%s: saving '%s': out of memory", who, path);
    sprintf(*tmp, "%s.tmp.%ld", path, (long)getpid());
    *fd = open(*tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (*fd < 0) {
        dp_status st = dp_fail(DP_ERR_IO, "%s: cannot create '%s': %s", who, *tmp, strerror(errno));
        free(*tmp);
        *tmp = NULL;
        return st;
    }
    return DP_OK;
}

/* fsyncs the directory that holds path, so that the rename is durable.
 * Filesystems that cannot sync a directory (EINVAL) are let be. */
static dp_status sync_dir(const char *who, const char *path)
{
    char *dir = strdup(path);
    if (!dir)
        return dp_fail(DP_ERR_MEMORY, "%s: saving '%s': out of memory", who, path);
    char *slash = strrchr(dir, '/');
    if (!slash)
        strcpy(dir, ".");
    else if (slash == dir)
        dir[1] = 0;
    else
        *slash = 0;
    dp_status st = DP_OK;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        if (fsync(fd) != 0 && errno != EINVAL && errno != EROFS && errno != ENOTSUP)
            st = dp_fail(DP_ERR_IO, "%s: saving '%s': fsync of the directory '%s' failed: %s",
                         who, path, dir, strerror(errno));
        close(fd);
    }
    free(dir);
    return st;
}

dp_status atomic_finish(const char *who, const char *path, char *tmp, int fd, dp_status st)
{
    if (!st && fsync(fd) != 0)
        st = dp_fail(DP_ERR_IO, "%s: fsync of '%s' failed: %s", who, tmp, strerror(errno));
    if (close(fd) != 0 && !st)
        st = dp_fail(DP_ERR_IO, "%s: closing '%s' failed: %s", who, tmp, strerror(errno));
    if (!st && rename(tmp, path) != 0)
        st = dp_fail(DP_ERR_IO, "%s: cannot rename '%s' to '%s': %s", who, tmp, path, strerror(errno));
    if (st)
        unlink(tmp);
    else
        st = sync_dir(who, path);
    free(tmp);
    return st;
}
