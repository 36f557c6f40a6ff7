/*
 * atomic.h — files written whole or not at all (src/io/atomic.c), for the
 * checkpoint writers: a temporary file beside the target, fsync'd and
 * renamed over it, then the directory fsync'd.
 */
#ifndef DP_IO_ATOMIC_H
#define DP_IO_ATOMIC_H

#include "dplua.h"

/* Creates `path.tmp.<pid>`: *tmp (to free) and its descriptor *fd.
 * who starts every message ("safetensors", "torch.save"). */
dp_status atomic_create(const char *who, const char *path, char **tmp, int *fd);
/* Ends the write: with st == DP_OK fsyncs and closes fd, renames tmp over
 * path and fsyncs the directory; otherwise (or when one of these fails)
 * closes fd and removes tmp. Frees tmp. Returns the first failure. */
dp_status atomic_finish(const char *who, const char *path, char *tmp, int fd, dp_status st);

#endif /* DP_IO_ATOMIC_H */
