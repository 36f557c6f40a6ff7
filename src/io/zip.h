/*
 * zip.h — the zip container of PyTorch's checkpoints (src/io/zip.c): a
 * reader of archives whose entries are stored (not compressed), zip64
 * included, and a writer of such archives with 64-byte aligned data.
 */
#ifndef DP_IO_ZIP_H
#define DP_IO_ZIP_H

#include "dplua.h"
#include <stdint.h>
#include <stdio.h>

typedef struct {
    char *name;
    int64_t data;        /* file offset of the entry's bytes */
    int64_t size;
    uint32_t crc;
} zip_entry;

typedef struct {
    const char *path;    /* for messages; not owned */
    int fd;              /* not owned */
    int n;
    zip_entry *entries;  /* in central-directory order */
} zip_reader;

/* Reads and checks the central directory of the file fd (size bytes):
 * every entry stored, unencrypted, with its bytes inside the file. */
dp_status zip_open(zip_reader *z, int fd, int64_t size, const char *path);
void zip_close(zip_reader *z);
int zip_find(const zip_reader *z, const char *name);   /* -1 when absent */
/* len bytes of entry i from byte off of it, which must lie inside it. */
dp_status zip_read(const zip_reader *z, int i, void *buf, int64_t off, int64_t len);
/* The whole entry i into a new buffer (NUL-terminated), its CRC checked. */
dp_status zip_read_all(const zip_reader *z, int i, char **buf, int64_t *len);

/* The writer appends entries to an open FILE and ends with the central
 * directory; offsets past 4 GiB are refused (zip64 is not written). */
typedef struct {
    FILE *fp;
    const char *path;    /* for messages; not owned */
    int64_t pos;
    int n, cap;
    struct zip_out_entry { char *name; int64_t header; int64_t size; uint32_t crc; } *entries;
} zip_writer;

dp_status zip_write_entry(zip_writer *w, const char *name, const void *data, int64_t len);
dp_status zip_write_end(zip_writer *w);
void zip_writer_free(zip_writer *w);

#endif /* DP_IO_ZIP_H */
