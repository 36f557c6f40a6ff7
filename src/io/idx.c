/*
 * idx.c — the IDX format of MNIST and Fashion-MNIST: a reader.
 *
 * An IDX file is a big-endian header followed by the elements, row-major:
 *
 *     bytes 0-1   0x00 0x00
 *     byte  2     element type: 0x08 uint8, 0x09 int8, 0x0B int16,
 *                 0x0C int32, 0x0D float32, 0x0E float64
 *     byte  3     number of dims
 *     then        one uint32 per dim, then the data
 *
 * The file may be gzip-compressed or plain: zlib's gzread reads both.
 * Element types map to dtypes as uint8 -> uint8, int8 and int16 -> int32
 * (dplua has no narrower signed type; values are sign-extended), int32 ->
 * int32, float32 -> float32, float64 -> float64.
 *
 * The reader trusts nothing in the file: the dims are checked against what
 * the file can hold before anything is allocated, short data is an error,
 * and so is data left over after the last element.
 */
#include "core/tensor.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

/* Deflate never expands by more than ~1032:1; a larger claim is a lie. */
#define IDX_MAX_GZIP_RATIO 1032
#define IDX_CHUNK (1 << 20)

typedef struct {
    const char *path;
    gzFile gz;
    int64_t file_size;   /* bytes on disk */
} idx_file;

static const struct {
    int code;
    int dtype;           /* the tensor's dtype */
    int fsize;           /* bytes per element in the file */
    const char *name;
} idx_types[] = {
    { 0x08, DP_UINT8, 1, "uint8" },
    { 0x09, DP_INT32, 1, "int8" },
    { 0x0B, DP_INT32, 2, "int16" },
    { 0x0C, DP_INT32, 4, "int32" },
    { 0x0D, DP_FLOAT32, 4, "float32" },
    { 0x0E, DP_FLOAT64, 8, "float64" },
};

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* The message of the last gzip error (without the path zlib puts in
 * front of it), or a short-read description. */
static const char *gz_why(gzFile gz, const char *path)
{
    int err = Z_OK;
    const char *msg = gzerror(gz, &err);
    size_t n = strlen(path);
    if (err == Z_ERRNO)
        return strerror(errno);
    if (err == Z_OK || !msg || !*msg)
        return "unexpected end of file";
    if (strncmp(msg, path, n) == 0 && msg[n] == ':' && msg[n + 1] == ' ')
        msg += n + 2;
    return msg;
}

/* Reads exactly n bytes; returns how many were read (< n at the end of the
 * data or on an error), or -1 when zlib reported an error. */
static int64_t gz_read_full(gzFile gz, void *buf, int64_t n)
{
    int64_t done = 0;
    while (done < n) {
        int64_t want = n - done < IDX_CHUNK ? n - done : IDX_CHUNK;
        int got = gzread(gz, (char *)buf + done, (unsigned)want);
        if (got < 0)
            return -1;
        if (got == 0)
            break;
        done += got;
    }
    return done;
}

/* ---------------------------------------------------------------- header */

static dp_status idx_open(idx_file *f, const char *path)
{
    struct stat sb;
    f->path = path;
    if (stat(path, &sb) != 0)
        return dp_fail(DP_ERR_IO, "load_idx: cannot open '%s': %s", path, strerror(errno));
    if (S_ISDIR(sb.st_mode))
        return dp_fail(DP_ERR_IO, "load_idx: '%s' is a directory, not an IDX file", path);
    f->file_size = (int64_t)sb.st_size;
    f->gz = gzopen(path, "rb");
    if (!f->gz)
        return dp_fail(DP_ERR_IO, "load_idx: cannot open '%s': %s", path,
                       errno ? strerror(errno) : "out of memory");
    gzbuffer(f->gz, 256 * 1024);
    return DP_OK;
}

/* Reads the magic and the dims; sets *type (an index into idx_types). */
static dp_status idx_header(idx_file *f, int *type, int *ndim, int64_t *shape)
{
    unsigned char head[4], dims[4 * 255];
    int64_t got = gz_read_full(f->gz, head, 4);
    if (got < 0)
        return dp_fail(DP_ERR_IO, "load_idx: '%s': read error: %s", f->path, gz_why(f->gz, f->path));
    if (got == 0)
        return dp_fail(DP_ERR_IO, "load_idx: '%s' is empty: not an IDX file", f->path);
    if (got < 4)
        return dp_fail(DP_ERR_IO, "load_idx: '%s': truncated header (%lld of 4 magic bytes)", f->path,
                       (long long)got);
    if (head[0] != 0 || head[1] != 0)
        return dp_fail(DP_ERR_IO, "load_idx: '%s': bad magic 0x%02x%02x%02x%02x: not an IDX file "
                       "(expected 0x0000 then a type byte and a dim count)",
                       f->path, head[0], head[1], head[2], head[3]);
    *type = -1;
    for (int i = 0; i < (int)(sizeof idx_types / sizeof idx_types[0]); i++)
        if (idx_types[i].code == head[2])
            *type = i;
    if (*type < 0)
        return dp_fail(DP_ERR_IO, "load_idx: '%s': unknown element type 0x%02x in the magic "
                       "(expected 0x08, 0x09, 0x0B, 0x0C, 0x0D or 0x0E)", f->path, head[2]);
    *ndim = head[3];
    if (*ndim > DP_MAX_DIMS)
        return dp_fail(DP_ERR_IO, "load_idx: '%s': %d dims in the header, at most %d are supported",
                       f->path, *ndim, DP_MAX_DIMS);
    got = gz_read_full(f->gz, dims, 4 * *ndim);
    if (got < 0)
        return dp_fail(DP_ERR_IO, "load_idx: '%s': read error: %s", f->path, gz_why(f->gz, f->path));
    if (got < 4 * *ndim)
        return dp_fail(DP_ERR_IO, "load_idx: '%s': truncated header (%lld of %d bytes of dims)",
                       f->path, (long long)got, 4 * *ndim);
    for (int i = 0; i < *ndim; i++)
        shape[i] = be32(dims + 4 * i);
    return DP_OK;
}

/* The number of data bytes the dims claim, checked against what the file
 * on disk can hold (exactly for a plain file, by deflate's best ratio for
 * a gzip file), so that absurd dims never reach the allocator. */
static dp_status idx_data_bytes(idx_file *f, int type, int ndim, const int64_t *shape, int64_t *nbytes)
{
    char buf[160], need[32];
    int64_t header = 4 + 4 * (int64_t)ndim;
    int direct = gzdirect(f->gz);
    int64_t cap = direct ? f->file_size - header : f->file_size * IDX_MAX_GZIP_RATIO;
    int64_t n = idx_types[type].fsize;
    for (int i = 0; i < ndim; i++)
        if (shape[i] == 0)
            n = 0;
    /* the product may overflow: divide instead of multiplying */
    for (int i = 0; i < ndim && n > 0; i++) {
        if (n > INT64_MAX / shape[i]) {
            n = -1;
            break;
        }
        n *= shape[i];
    }
    if (n >= 0 && n <= cap) {
        *nbytes = n;
        return DP_OK;
    }
    if (n < 0)
        snprintf(need, sizeof need, "more than 2^63");
    else
        snprintf(need, sizeof need, "%lld", (long long)n);
    return dp_fail(DP_ERR_IO, "load_idx: '%s': dims %s of %s need %s bytes of data, more than the "
                   "file can hold (%lld bytes on disk%s): truncated, or not an IDX file",
                   f->path, dp_shape_str(buf, sizeof buf, ndim, shape), idx_types[type].name, need,
                   (long long)f->file_size, direct ? "" : ", gzip-compressed");
}

/* ---------------------------------------------------------------- data */

static void swap_in_place(unsigned char *p, int64_t n, int size)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    (void)p; (void)n; (void)size;
#else
    for (int64_t i = 0; i < n; i++, p += size)
        for (int a = 0, b = size - 1; a < b; a++, b--) {
            unsigned char c = p[a];
            p[a] = p[b];
            p[b] = c;
        }
#endif
}

/* Widens n elements of int8 or int16 (big-endian) from src to int32. */
static void widen(int32_t *dst, const unsigned char *src, int64_t n, int fsize)
{
    if (fsize == 1)
        for (int64_t i = 0; i < n; i++)
            dst[i] = (int8_t)src[i];
    else
        for (int64_t i = 0; i < n; i++)
            dst[i] = (int16_t)(uint16_t)(src[2 * i] << 8 | src[2 * i + 1]);
}

static dp_status short_data(idx_file *f, int64_t got, int64_t want)
{
    if (got < 0)
        return dp_fail(DP_ERR_IO, "load_idx: '%s': read error in the data: %s", f->path, gz_why(f->gz, f->path));
    return dp_fail(DP_ERR_IO, "load_idx: '%s': truncated: %lld of %lld data bytes (%s)", f->path,
                   (long long)got, (long long)want, gz_why(f->gz, f->path));
}

/* Reads the data into t (contiguous, numel elements). */
static dp_status idx_data(idx_file *f, int type, dp_tensor *t, int64_t nbytes)
{
    int fsize = idx_types[type].fsize;
    unsigned char *dst = (unsigned char *)tensor_ptr(t);
    if (idx_types[type].dtype == DP_UINT8 || fsize == 4 || fsize == 8) {
        int64_t got = gz_read_full(f->gz, dst, nbytes);
        if (got != nbytes)
            return short_data(f, got, nbytes);
        if (fsize > 1)
            swap_in_place(dst, nbytes / fsize, fsize);
        return DP_OK;
    }
    /* int8, int16: through a staging buffer */
    unsigned char *stage = malloc(IDX_CHUNK);
    if (!stage)
        return dp_fail(DP_ERR_MEMORY, "load_idx: out of memory for a read buffer");
    int64_t done = 0;
    while (done < nbytes) {
        int64_t want = nbytes - done < IDX_CHUNK ? nbytes - done : IDX_CHUNK;
        int64_t got = gz_read_full(f->gz, stage, want);
        if (got != want) {
            free(stage);
            return short_data(f, got < 0 ? got : done + got, nbytes);
        }
        widen((int32_t *)dst + done / fsize, stage, want / fsize, fsize);
        done += want;
    }
    free(stage);
    return DP_OK;
}

/* Data after the last element means the dims do not describe the file. */
static dp_status idx_check_end(idx_file *f, int64_t nbytes)
{
    unsigned char extra[1];
    int got = gzread(f->gz, extra, 1);
    if (got < 0)
        return dp_fail(DP_ERR_IO, "load_idx: '%s': read error after the data: %s", f->path, gz_why(f->gz, f->path));
    if (got > 0)
        return dp_fail(DP_ERR_IO, "load_idx: '%s': more data than the dims describe (%lld data bytes "
                       "expected): not an IDX file, or wrong dims", f->path, (long long)nbytes);
    return DP_OK;
}

dp_status dp_load_idx(dp_tensor **out, const char *path)
{
    idx_file f = { 0 };
    int type = 0, ndim = 0;
    int64_t shape[DP_MAX_DIMS], nbytes;
    dp_tensor *t = NULL;
    dp_status st;
    if (!out || !path)
        return dp_fail(DP_ERR_ARG, "load_idx: expected an output pointer and a path");
    *out = NULL;
    if ((st = idx_open(&f, path)))
        return st;
    if (!(st = idx_header(&f, &type, &ndim, shape)) &&
        !(st = idx_data_bytes(&f, type, ndim, shape, &nbytes)) &&
        !(st = tensor_new(&t, ndim, shape, idx_types[type].dtype, DP_CPU)) &&
        !(st = idx_data(&f, type, t, nbytes)))
        st = idx_check_end(&f, nbytes);
    gzclose(f.gz);
    if (st) {
        if (t)
            dp_tensor_release(t);
        return st;
    }
    *out = t;
    return DP_OK;
}
