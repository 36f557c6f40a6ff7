/*
 * tokens.c — token files: llm.c's .bin shards (read and written) and
 * one-dimensional .npy arrays of token ids (read).
 *
 * A .bin shard (llm.c's dev/data layout) is
 *
 *     header   256 little-endian int32: [0] the magic 20240520,
 *              [1] the version (1: uint16 tokens, 2: uint32 tokens),
 *              [2] the token count; the rest zero
 *     then     the tokens, little-endian, nothing after them
 *
 * A .npy file holds a C-order array of one dimension of '<u2', '<u4',
 * '<i4' or '<i8' (NumPy's header: magic, version, a dict literal).
 *
 * The reader checks the header against the file size, then maps the file
 * (mmap) so that shards of any size cost no memory of their own and only
 * the windows read are paged in. A file truncated while it is open would
 * end the process with SIGBUS on the next read of a missing page: token
 * files are written once (the writer renames a finished file into place)
 * and only read afterwards.
 *
 * The writer streams tokens into `path.tmp.<pid>`, writes the header with
 * the final count at close, fsyncs and renames over `path`, so a reader
 * never sees a half-written shard.
 */
#include "core/tensor.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tokens.c assumes a little-endian host (the formats are little-endian)"
#endif

#define TOK_MAGIC 20240520
#define TOK_HEADER_INTS 256
#define TOK_HEADER_BYTES (TOK_HEADER_INTS * 4)
#define NPY_MAX_HEADER 65536

struct dp_token_file {
    char *path;
    void *map;           /* the whole file */
    size_t map_len;
    const unsigned char *data;   /* the first token */
    int64_t count;
    int width;           /* bytes per token: 2, 4 or 8 */
    int is_signed;       /* '<i4', '<i8': negative values are refused when read */
};

/* ---------------------------------------------------------------- headers */

static dp_status bin_header(dp_token_file *f, const unsigned char *p, size_t size)
{
    int32_t h[3];
    int64_t want;
    if (size < TOK_HEADER_BYTES)
        return dp_fail(DP_ERR_IO, "token file '%s' is truncated: %zu bytes, shorter than the %d-byte header of a "
                       ".bin token shard", f->path, size, TOK_HEADER_BYTES);
    memcpy(h, p, sizeof h);
    if (h[0] != TOK_MAGIC)
        return dp_fail(DP_ERR_IO, "token file '%s' has the magic number %d, expected %d (llm.c's .bin token "
                       "shard) or a .npy file", f->path, h[0], TOK_MAGIC);
    if (h[1] != 1 && h[1] != 2)
        return dp_fail(DP_ERR_IO, "token file '%s' has version %d, expected 1 (uint16 tokens) or 2 (uint32 "
                       "tokens)", f->path, h[1]);
    if (h[2] < 0)
        return dp_fail(DP_ERR_IO, "token file '%s' claims %d tokens", f->path, h[2]);
    f->width = h[1] == 1 ? 2 : 4;
    f->count = h[2];
    want = TOK_HEADER_BYTES + f->count * f->width;
    if ((int64_t)size != want)
        return dp_fail(DP_ERR_IO, "token file '%s' is %s: its header promises %lld uint%d tokens (%lld bytes in "
                       "all), the file has %zu bytes", f->path, (int64_t)size < want ? "truncated" : "too long",
                       (long long)f->count, 8 * f->width, (long long)want, size);
    f->data = p + TOK_HEADER_BYTES;
    return DP_OK;
}

/* The text after 'key': in a .npy header, or NULL. */
static const char *npy_field(const char *header, const char *key)
{
    const char *p = strstr(header, key);
    if (!p)
        return NULL;
    p += strlen(key);
    while (*p == ' ' || *p == ':')
        p++;
    return p;
}

static dp_status npy_header(dp_token_file *f, const unsigned char *p, size_t size)
{
    char header[NPY_MAX_HEADER + 1];
    size_t hlen, start;
    const char *descr, *fortran, *shape;
    char *end;
    long long n;
    int64_t want;
    if (size < 10)
        return dp_fail(DP_ERR_IO, "token file '%s' is a truncated .npy file", f->path);
    if (p[6] == 1) {
        hlen = (size_t)p[8] | (size_t)p[9] << 8;
        start = 10;
    } else if ((p[6] == 2 || p[6] == 3) && size >= 12) {
        hlen = (size_t)p[8] | (size_t)p[9] << 8 | (size_t)p[10] << 16 | (size_t)p[11] << 24;
        start = 12;
    } else {
        return dp_fail(DP_ERR_IO, "token file '%s': .npy format version %d is not supported (expected 1, 2 or 3)",
                       f->path, p[6]);
    }
    if (hlen > NPY_MAX_HEADER || start + hlen > size)
        return dp_fail(DP_ERR_IO, "token file '%s' is a truncated .npy file (its header)", f->path);
    memcpy(header, p + start, hlen);
    header[hlen] = '\0';
    descr = npy_field(header, "'descr'");
    fortran = npy_field(header, "'fortran_order'");
    shape = npy_field(header, "'shape'");
    if (!descr || !fortran || !shape || *shape != '(')
        return dp_fail(DP_ERR_IO, "token file '%s': malformed .npy header %s", f->path, header);
    if (strncmp(descr, "'<u2'", 5) == 0 || strncmp(descr, "'<u4'", 5) == 0) {
        f->width = descr[3] - '0';
    } else if (strncmp(descr, "'<i4'", 5) == 0 || strncmp(descr, "'<i8'", 5) == 0) {
        f->width = descr[3] - '0';
        f->is_signed = 1;
    } else {
        return dp_fail(DP_ERR_IO, "token file '%s': .npy dtype %.*s is not a token dtype (expected '<u2', '<u4', "
                       "'<i4' or '<i8')", f->path, (int)strcspn(descr, ","), descr);
    }
    errno = 0;
    n = strtoll(shape + 1, &end, 10);
    while (*end == ' ')
        end++;
    if (errno || n < 0 || end == shape + 1 || strncmp(end, ",)", 2) != 0)
        return dp_fail(DP_ERR_IO, "token file '%s': the .npy array has shape %.*s, expected one dimension (n,)",
                       f->path, (int)strcspn(shape, ")") + (shape[strcspn(shape, ")")] == ')'), shape);
    (void)fortran;   /* one dimension: C and Fortran order are the same */
    f->count = n;
    f->data = p + start + hlen;
    want = (int64_t)(start + hlen) + n * f->width;
    if ((int64_t)size != want)
        return dp_fail(DP_ERR_IO, "token file '%s' is %s: its .npy header promises %lld tokens of %d bytes, the "
                       "file has %zu bytes (expected %lld)", f->path, (int64_t)size < want ? "truncated" : "too long",
                       n, f->width, size, (long long)want);
    return DP_OK;
}

/* ---------------------------------------------------------------- reading */

void dp_token_file_close(dp_token_file *f)
{
    if (!f)
        return;
    if (f->map)
        munmap(f->map, f->map_len);
    free(f->path);
    free(f);
}

static dp_status map_file(dp_token_file *f)
{
    struct stat sb;
    int fd = open(f->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return dp_fail(DP_ERR_IO, "cannot open token file '%s': %s", f->path, strerror(errno));
    if (fstat(fd, &sb) != 0 || S_ISDIR(sb.st_mode)) {
        int e = errno;
        close(fd);
        return S_ISDIR(sb.st_mode) ? dp_fail(DP_ERR_IO, "token file '%s' is a directory", f->path)
                                   : dp_fail(DP_ERR_IO, "cannot open token file '%s': %s", f->path, strerror(e));
    }
    if (sb.st_size == 0) {
        close(fd);
        return dp_fail(DP_ERR_IO, "token file '%s' is empty", f->path);
    }
    f->map_len = (size_t)sb.st_size;
    f->map = mmap(NULL, f->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        return dp_fail(DP_ERR_IO, "cannot map token file '%s': %s", f->path, strerror(errno));
    }
    return DP_OK;
}

dp_status dp_token_file_open(dp_token_file **out, const char *path)
{
    dp_token_file *f = calloc(1, sizeof *f);
    dp_status st;
    *out = NULL;
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return dp_fail(DP_ERR_MEMORY, "token file '%s': out of memory", path);
    }
    st = map_file(f);
    if (!st) {
        const unsigned char *p = f->map;
        if (f->map_len >= 6 && memcmp(p, "\x93NUMPY", 6) == 0)
            st = npy_header(f, p, f->map_len);
        else
            st = bin_header(f, p, f->map_len);
    }
    if (st) {
        dp_token_file_close(f);
        return st;
    }
    madvise(f->map, f->map_len, MADV_RANDOM);   /* windows are read here and there */
    *out = f;
    return DP_OK;
}

int64_t dp_token_file_count(const dp_token_file *f) { return f->count; }

int dp_token_file_width(const dp_token_file *f) { return f->width; }

/* tokens[start, start + n) as int64 into dst. */
static dp_status read_tokens(const dp_token_file *f, int64_t start, int64_t n, int64_t *dst)
{
    const unsigned char *p = f->data + start * f->width;
    switch (f->width) {
    case 2:
        for (int64_t i = 0; i < n; i++) {
            uint16_t v;
            memcpy(&v, p + 2 * i, 2);
            dst[i] = v;
        }
        return DP_OK;
    case 4:
        for (int64_t i = 0; i < n; i++) {
            uint32_t v;
            memcpy(&v, p + 4 * i, 4);
            dst[i] = f->is_signed ? (int64_t)(int32_t)v : (int64_t)v;
        }
        break;
    default:
        memcpy(dst, p, (size_t)n * 8);
        break;
    }
    if (f->is_signed)
        for (int64_t i = 0; i < n; i++)
            if (dst[i] < 0)
                return dp_fail(DP_ERR_IO, "token file '%s': the token at position %lld is %lld, expected a "
                               "non-negative id", f->path, (long long)(start + i), (long long)dst[i]);
    return DP_OK;
}

dp_status dp_token_file_read(const dp_token_file *f, int64_t start, int64_t n, int64_t *dst)
{
    if (start < 0 || n < 0 || start > f->count || n > f->count - start)
        return dp_fail(DP_ERR_INDEX, "token file '%s': tokens [%lld, %lld) are out of range (the file has %lld)",
                       f->path, (long long)start, (long long)(start + n), (long long)f->count);
    return read_tokens(f, start, n, dst);
}

dp_status dp_token_file_windows(const dp_token_file *f, const int64_t *starts, int64_t nwin, int64_t len,
                                int64_t *x, int64_t *y)
{
    dp_status st;
    for (int64_t i = 0; i < nwin; i++) {
        int64_t s = starts[i];
        if (s < 0 || len < 0 || s > f->count - len - (y ? 1 : 0))
            return dp_fail(DP_ERR_INDEX, "token file '%s': a window of %lld tokens%s at %lld does not fit in its "
                           "%lld tokens", f->path, (long long)len, y ? " and its target" : "", (long long)s,
                           (long long)f->count);
        if ((st = read_tokens(f, s, len, x + i * len)))
            return st;
        if (y) {   /* the same tokens one further on: every y but the last is the next x's */
            memcpy(y + i * len, x + i * len + 1, (size_t)(len > 0 ? len - 1 : 0) * sizeof *y);
            if (len > 0 && (st = read_tokens(f, s + len, 1, y + i * len + len - 1)))
                return st;
        }
    }
    return DP_OK;
}

/* ---------------------------------------------------------------- writing */

struct dp_token_writer {
    char *path, *tmp;
    FILE *fp;
    int version;
    int64_t count;
};

void dp_token_writer_abort(dp_token_writer *w)
{
    if (!w)
        return;
    if (w->fp) {
        fclose(w->fp);
        unlink(w->tmp);
    }
    free(w->path);
    free(w->tmp);
    free(w);
}

dp_status dp_token_writer_open(dp_token_writer **out, const char *path, int version)
{
    static const int32_t zeros[TOK_HEADER_INTS];
    dp_token_writer *w;
    *out = NULL;
    if (version != 1 && version != 2)
        return dp_fail(DP_ERR_ARG, "token writer: version %d, expected 1 (uint16 tokens) or 2 (uint32 tokens)",
                       version);
    w = calloc(1, sizeof *w);
    if (!w || !(w->path = strdup(path)) || !(w->tmp = malloc(strlen(path) + 32))) {
        dp_token_writer_abort(w);
        return dp_fail(DP_ERR_MEMORY, "token writer: out of memory");
    }
    sprintf(w->tmp, "%s.tmp.%ld", path, (long)getpid());
    w->version = version;
    w->fp = fopen(w->tmp, "wb");
    if (!w->fp || fwrite(zeros, sizeof zeros, 1, w->fp) != 1) {   /* the header is written at close */
        int e = errno;
        dp_token_writer_abort(w);
        return dp_fail(DP_ERR_IO, "cannot write token file '%s': %s", path, strerror(e));
    }
    *out = w;
    return DP_OK;
}

dp_status dp_token_writer_write(dp_token_writer *w, const int32_t *ids, int64_t n)
{
    enum { CHUNK = 4096 };
    uint32_t buf[CHUNK];
    uint16_t *b16 = (uint16_t *)buf;
    int64_t limit = w->version == 1 ? 65535 : 0x7fffffff;
    if (n > 0x7fffffff - w->count)
        return dp_fail(DP_ERR_ARG, "token file '%s': more than 2^31 - 1 tokens, the most a .bin header counts",
                       w->path);
    for (int64_t i = 0; i < n; i += CHUNK) {
        int64_t k = n - i < CHUNK ? n - i : CHUNK;
        for (int64_t j = 0; j < k; j++) {
            int32_t v = ids[i + j];
            if (v < 0 || v > limit)
                return dp_fail(DP_ERR_ARG, "token file '%s': the id %d does not fit %s", w->path, v,
                               w->version == 1 ? "uint16 tokens (version 1); write version 2" : "a token id");
            if (w->version == 1)
                b16[j] = (uint16_t)v;
            else
                buf[j] = (uint32_t)v;
        }
        if (fwrite(buf, w->version == 1 ? 2 : 4, (size_t)k, w->fp) != (size_t)k)
            return dp_fail(DP_ERR_IO, "cannot write token file '%s': %s", w->path, strerror(errno));
    }
    w->count += n;
    return DP_OK;
}

dp_status dp_token_writer_close(dp_token_writer *w)
{
    int32_t head[3] = { TOK_MAGIC, w->version, (int32_t)w->count };
    int ok = fseek(w->fp, 0, SEEK_SET) == 0 && fwrite(head, sizeof head, 1, w->fp) == 1 && fflush(w->fp) == 0 &&
             fsync(fileno(w->fp)) == 0;
    int e = errno;
    ok = fclose(w->fp) == 0 && ok;
    w->fp = NULL;
    if (!ok || rename(w->tmp, w->path) != 0) {
        e = ok ? errno : e;
        unlink(w->tmp);
        dp_status st = dp_fail(DP_ERR_IO, "cannot write token file '%s': %s", w->path, strerror(e));
        dp_token_writer_abort(w);
        return st;
    }
    dp_token_writer_abort(w);
    return DP_OK;
}
