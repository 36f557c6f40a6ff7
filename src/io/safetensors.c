/*
 * safetensors.c — the safetensors container: a strict reader and an atomic
 * writer.
 *
 * A safetensors file is
 *
 *     bytes 0-7    N, the header length: an unsigned 64-bit little-endian
 *     bytes 8..    the header: N bytes of UTF-8 JSON, an object that maps
 *                  each tensor name to {"dtype": "F32", "shape": [2, 3],
 *                  "data_offsets": [begin, end]}, plus an optional
 *                  "__metadata__" object of string -> string; it starts
 *                  with '{' and may be padded at the end with spaces
 *     then         the data: every tensor's bytes, row-major, little-endian;
 *                  offsets are relative to the start of the data
 *
 * The reader trusts nothing in the file. The header length is checked
 * against the file size before anything is read; the header is parsed by
 * the strict JSON parser of json.c (RFC 8259: no trailing commas, no
 * comments, valid UTF-8, no duplicate keys, a nesting limit); every tensor's dtype,
 * shape and byte count must agree; and, as the reference implementation
 * requires, the tensors must tile the data exactly: in bounds, no overlap,
 * no hole, nothing left over. So every byte a tensor reads lies inside the
 * file, and no allocation is larger than the file. Data is read with
 * pread() into new tensors (not mmap: a file truncated under a mapping
 * would kill the process with SIGBUS instead of failing the read).
 *
 * The writer writes `path.tmp.<pid>`, fsyncs it, renames it over `path`
 * and fsyncs the directory (atomic.c): a reader (or a crash) sees the old
 * file or the new one, never a part of either.
 *
 * Every failure is a dp_fail that names the file and the problem.
 */
#include "core/tensor.h"
#include "io/atomic.h"
#include "io/json.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host (the format is little-endian)"
#endif

/* The reference implementation refuses headers over 100 MB too. */
#define ST_MAX_HEADER (100 * 1000 * 1000)
#define ST_CHUNK (1 << 24)

/* ---------------------------------------------------------------- dtypes */

static const struct {
    const char *name;
    int dtype;           /* -1: a dtype of the format that dplua lacks */
} st_dtypes[] = {
    { "F32", DP_FLOAT32 }, { "F64", DP_FLOAT64 }, { "I64", DP_INT64 }, { "I32", DP_INT32 },
    { "U8", DP_UINT8 }, { "BOOL", DP_BOOL }, { "BF16", DP_BFLOAT16 },
    { "F16", -1 }, { "I8", -1 }, { "I16", -1 }, { "U16", -1 }, { "U32", -1 }, { "U64", -1 },
    { "F8_E4M3", -1 }, { "F8_E5M2", -1 }, { "F8_E8M0", -1 }, { "F4", -1 }, { "F6_E2M3", -1 },
    { "F6_E3M2", -1 }, { "C64", -1 },
};
#define ST_NUM_DTYPES ((int)(sizeof st_dtypes / sizeof st_dtypes[0]))
#define ST_SUPPORTED "F32, F64, I64, I32, U8, BOOL, BF16"

static const char *st_dtype_name(int dtype)
{
    for (int i = 0; i < ST_NUM_DTYPES; i++)
        if (st_dtypes[i].dtype == dtype)
            return st_dtypes[i].name;
    return NULL;
}

/* ---------------------------------------------------------------- the reader */

typedef struct {
    const char *name;
    int dtype;
    int ndim;
    int64_t shape[DP_MAX_DIMS];
    int64_t begin, end;     /* in the data section */
} st_entry;

struct dp_safetensors {
    char *path;
    int fd;
    int64_t data_start;     /* 8 + the header length */
    int64_t data_len;
    int n;
    st_entry *entries;      /* in header order */
    int n_meta;
    const char **meta_keys, **meta_values;
    json_arena *arena;      /* the parsed header, names and metadata */
};

static dp_status st_read_full(int fd, void *buf, int64_t n, int64_t off, int64_t *got)
{
    int64_t done = 0;
    while (done < n) {
        size_t want = (size_t)(n - done < ST_CHUNK ? n - done : ST_CHUNK);
        ssize_t r = pread(fd, (char *)buf + done, want, (off_t)(off + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            *got = done;
            return DP_ERR_IO;
        }
        if (r == 0)
            break;
        done += r;
    }
    *got = done;
    return DP_OK;
}

static dp_status st_bad(const dp_safetensors *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static dp_status st_bad(const dp_safetensors *f, const char *fmt, ...)
{
    char what[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return dp_fail(DP_ERR_IO, "safetensors: '%s': %s", f->path, what);
}

static dp_status st_metadata(dp_safetensors *f, const json_value *m)
{
    char nb[96];
    if (m->type != JSON_OBJECT)
        return st_bad(f, "\"__metadata__\" is %s, expected an object of strings", json_type_name(m->type));
    f->n_meta = m->n;
    f->meta_keys = json_arena_alloc(&f->arena, sizeof(char *) * (size_t)(m->n + 1));
    f->meta_values = json_arena_alloc(&f->arena, sizeof(char *) * (size_t)(m->n + 1));
    if (!f->meta_keys || !f->meta_values)
        return dp_fail(DP_ERR_MEMORY, "safetensors: '%s': out of memory", f->path);
    for (int i = 0; i < m->n; i++) {
        const json_value *v = &m->items[i];
        json_printable(nb, sizeof nb, m->keys[i], m->key_lens[i]);
        if (v->type != JSON_STRING)
            return st_bad(f, "\"__metadata__\" entry \"%s\" is %s, expected a string", nb, json_type_name(v->type));
        if (strlen(m->keys[i]) != m->key_lens[i] || strlen(v->str) != v->len)
            return st_bad(f, "\"__metadata__\" entry \"%s\" contains a NUL character", nb);
        f->meta_keys[i] = m->keys[i];
        f->meta_values[i] = v->str;
    }
    return DP_OK;
}

static int st_dtype_lookup(const json_value *v, int *dtype)
{
    for (int i = 0; i < ST_NUM_DTYPES; i++)
        if (strlen(st_dtypes[i].name) == v->len && memcmp(st_dtypes[i].name, v->str, v->len) == 0) {
            *dtype = st_dtypes[i].dtype;
            return 1;
        }
    return 0;
}

static dp_status st_shape(dp_safetensors *f, const char *nb, const json_value *v, st_entry *e)
{
    if (v->type != JSON_ARRAY)
        return st_bad(f, "tensor \"%s\": \"shape\" is %s, expected an array of sizes", nb, json_type_name(v->type));
    if (v->n > DP_MAX_DIMS)
        return st_bad(f, "tensor \"%s\": %d dims, at most %d are supported", nb, v->n, DP_MAX_DIMS);
    e->ndim = v->n;
    for (int d = 0; d < v->n; d++) {
        int r = json_uint(&v->items[d], &e->shape[d]);
        if (r == -2)
            return st_bad(f, "tensor \"%s\": size %d of \"shape\" is too large", nb, d);
        if (r)
            return st_bad(f, "tensor \"%s\": size %d of \"shape\" is not a non-negative integer", nb, d);
    }
    return DP_OK;
}

static dp_status st_offsets(dp_safetensors *f, const char *nb, const json_value *v, st_entry *e)
{
    if (v->type != JSON_ARRAY || v->n != 2)
        return st_bad(f, "tensor \"%s\": \"data_offsets\" must be an array of two integers [begin, end]", nb);
    for (int k = 0; k < 2; k++) {
        int r = json_uint(&v->items[k], k ? &e->end : &e->begin);
        if (r == -2)
            return st_bad(f, "tensor \"%s\": data offset %.*s is too large", nb,
                          (int)(v->items[k].len < 40 ? v->items[k].len : 40), v->items[k].str);
        if (r)
            return st_bad(f, "tensor \"%s\": \"data_offsets\" must be non-negative integers", nb);
    }
    if (e->begin > e->end)
        return st_bad(f, "tensor \"%s\": data_offsets [%lld, %lld] end before they begin", nb,
                      (long long)e->begin, (long long)e->end);
    if (e->end > f->data_len)
        return st_bad(f, "tensor \"%s\": data_offsets [%lld, %lld] run past the end of the data "
                      "(%lld bytes after the header; truncated file?)", nb, (long long)e->begin,
                      (long long)e->end, (long long)f->data_len);
    return DP_OK;
}

/* One tensor's entry: {"dtype":, "shape":, "data_offsets":}, consistent. */
static dp_status st_entry_parse(dp_safetensors *f, const char *name, size_t name_len, const json_value *v,
                                st_entry *e)
{
    char nb[96], sb[160], need[32];
    dp_status st;
    const json_value *dt = NULL, *shape = NULL, *offs = NULL;
    json_printable(nb, sizeof nb, name, name_len);
    if (strlen(name) != name_len)
        return st_bad(f, "tensor name \"%s\" contains a NUL character", nb);
    if (v->type != JSON_OBJECT)
        return st_bad(f, "tensor \"%s\" is %s, expected an object with dtype, shape and data_offsets",
                      nb, json_type_name(v->type));
    for (int i = 0; i < v->n; i++) {
        const char *k = v->keys[i];
        size_t kl = v->key_lens[i];
        if (kl == 5 && memcmp(k, "dtype", 5) == 0) dt = &v->items[i];
        else if (kl == 5 && memcmp(k, "shape", 5) == 0) shape = &v->items[i];
        else if (kl == 12 && memcmp(k, "data_offsets", 12) == 0) offs = &v->items[i];
        else {
            char kb[64];
            return st_bad(f, "tensor \"%s\": unexpected field \"%s\" (expected dtype, shape and data_offsets)",
                          nb, json_printable(kb, sizeof kb, k, v->key_lens[i]));
        }
    }
    if (!dt || !shape || !offs)
        return st_bad(f, "tensor \"%s\": missing \"%s\"", nb, !dt ? "dtype" : !shape ? "shape" : "data_offsets");
    e->name = name;
    if (dt->type != JSON_STRING)
        return st_bad(f, "tensor \"%s\": \"dtype\" is %s, expected a string such as \"F32\"", nb, json_type_name(dt->type));
    if (!st_dtype_lookup(dt, &e->dtype)) {
        char db[48];
        return st_bad(f, "tensor \"%s\": unknown dtype \"%s\" (dplua reads " ST_SUPPORTED ")", nb,
                      json_printable(db, sizeof db, dt->str, dt->len));
    }
    if (e->dtype < 0)
        return st_bad(f, "tensor \"%s\": dtype %s is not supported by dplua (it reads " ST_SUPPORTED ")", nb, dt->str);
    if ((st = st_shape(f, nb, shape, e)) || (st = st_offsets(f, nb, offs, e)))
        return st;
    /* numel * size must equal end - begin, computed without overflow */
    int64_t bytes = (int64_t)dp_dtype_size(e->dtype), avail = e->end - e->begin;
    int zero = 0, over = 0;
    for (int d = 0; d < e->ndim; d++)
        zero |= e->shape[d] == 0;
    for (int d = 0; d < e->ndim && !zero && !over; d++)
        over = __builtin_mul_overflow(bytes, e->shape[d], &bytes);
    if (zero)
        bytes = 0;
    if (over || bytes != avail)
        return st_bad(f, "tensor \"%s\": shape %s of %s needs %s bytes but data_offsets [%lld, %lld] hold %lld",
                      nb, dp_shape_str(sb, sizeof sb, e->ndim, e->shape), dt->str,
                      over ? "more than 2^63" : (snprintf(need, sizeof need, "%lld", (long long)bytes), need),
                      (long long)e->begin, (long long)e->end, (long long)avail);
    return DP_OK;
}

static int entry_cmp(const void *a, const void *b)
{
    const st_entry *x = *(st_entry *const *)a, *y = *(st_entry *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* The tensors must tile the data section: no overlap, no hole, no tail. */
static dp_status st_check_layout(dp_safetensors *f)
{
    char ab[96], bb[96];
    if (f->n == 0) {
        if (f->data_len != 0)
            return st_bad(f, "the header lists no tensor but %lld bytes of data follow it", (long long)f->data_len);
        return DP_OK;
    }
    st_entry **order = malloc(sizeof *order * (size_t)f->n);
    if (!order)
        return dp_fail(DP_ERR_MEMORY, "safetensors: '%s': out of memory", f->path);
    for (int i = 0; i < f->n; i++)
        order[i] = &f->entries[i];
    qsort(order, (size_t)f->n, sizeof *order, entry_cmp);
    dp_status st = DP_OK;
    int64_t pos = 0;
    const st_entry *prev = NULL;
    for (int i = 0; i < f->n && !st; i++) {
        const st_entry *e = order[i];
        if (e->begin < pos)
            st = st_bad(f, "tensors \"%s\" (bytes %lld to %lld) and \"%s\" (bytes %lld to %lld) overlap",
                        json_printable(ab, sizeof ab, prev->name, strlen(prev->name)), (long long)prev->begin,
                        (long long)prev->end, json_printable(bb, sizeof bb, e->name, strlen(e->name)),
                        (long long)e->begin, (long long)e->end);
        else if (e->begin > pos)
            st = st_bad(f, "bytes %lld to %lld of the data belong to no tensor (a hole before \"%s\")",
                        (long long)pos, (long long)e->begin, json_printable(ab, sizeof ab, e->name, strlen(e->name)));
        pos = e->end;
        prev = e;
    }
    if (!st && pos != f->data_len)
        st = st_bad(f, "the tensors end at byte %lld of the data but the file holds %lld bytes of data "
                    "(trailing bytes after the last tensor)", (long long)pos, (long long)f->data_len);
    free(order);
    return st;
}

static dp_status st_bad_json(const dp_safetensors *f, size_t offset, const char *why)
{
    return st_bad(f, "malformed header JSON at byte %lld of the header: %s", (long long)offset, why);
}

static dp_status st_header(dp_safetensors *f, const char *text, int64_t len)
{
    json_value root;
    json_error err;
    size_t end;
    if (len == 0 || text[0] != '{')
        return st_bad(f, "the header does not start with '{' (not a safetensors file?)");
    if (json_parse(text, (size_t)len, &f->arena, &root, &end, &err) != 0) {
        if (err.out_of_memory)
            return dp_fail(DP_ERR_MEMORY, "safetensors: '%s': out of memory parsing the header", f->path);
        return st_bad_json(f, err.offset, err.why);
    }
    if (end != (size_t)len)
        return st_bad_json(f, end, "unexpected data after the header object");
    int ntensors = 0;
    for (int i = 0; i < root.n; i++)
        ntensors += strcmp(root.keys[i], "__metadata__") != 0 || root.key_lens[i] != 12;
    f->entries = json_arena_alloc(&f->arena, sizeof *f->entries * (size_t)(ntensors + 1));
    if (!f->entries)
        return dp_fail(DP_ERR_MEMORY, "safetensors: '%s': out of memory", f->path);
    dp_status st;
    for (int i = 0; i < root.n; i++) {
        if (root.key_lens[i] == 12 && strcmp(root.keys[i], "__metadata__") == 0) {
            if ((st = st_metadata(f, &root.items[i])))
                return st;
            continue;
        }
        st_entry *e = &f->entries[f->n];
        memset(e, 0, sizeof *e);
        if ((st = st_entry_parse(f, root.keys[i], root.key_lens[i], &root.items[i], e)))
            return st;
        f->n++;
    }
    return st_check_layout(f);
}

void dp_safetensors_close(dp_safetensors *f)
{
    if (!f)
        return;
    if (f->fd >= 0)
        close(f->fd);
    json_arena_free(f->arena);
    free(f->path);
    free(f);
}

static dp_status st_open_file(dp_safetensors *f, int64_t *size)
{
    struct stat sb;
    /* O_NONBLOCK: a FIFO must not block the open (it is refused below) */
    f->fd = open(f->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (f->fd < 0)
        return dp_fail(DP_ERR_IO, "safetensors: cannot open '%s': %s", f->path, strerror(errno));
    if (fstat(f->fd, &sb) != 0)
        return dp_fail(DP_ERR_IO, "safetensors: cannot stat '%s': %s", f->path, strerror(errno));
    if (S_ISDIR(sb.st_mode))
        return st_bad(f, "is a directory, not a safetensors file");
    if (!S_ISREG(sb.st_mode))
        return st_bad(f, "is not a regular file");
    *size = (int64_t)sb.st_size;
    return DP_OK;
}

dp_status dp_safetensors_open(dp_safetensors **out, const char *path)
{
    unsigned char lenbuf[8];
    int64_t size = 0, got = 0;
    dp_status st;
    *out = NULL;
    if (!path)
        return dp_fail(DP_ERR_ARG, "safetensors: expected a path, got NULL");
    dp_safetensors *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return dp_fail(DP_ERR_MEMORY, "safetensors: out of memory opening '%s'", path);
    }
    f->fd = -1;
    if ((st = st_open_file(f, &size)))
        goto fail;
    if (size < 8) {
        st = st_bad(f, "the file is %lld bytes, too short for the 8-byte header length (empty or truncated file)",
                    (long long)size);
        goto fail;
    }
    if (st_read_full(f->fd, lenbuf, 8, 0, &got)) {
        st = st_bad(f, "cannot read the header length: %s", strerror(errno));
        goto fail;
    }
    if (got != 8) {
        st = st_bad(f, "cannot read the header length: short read (the file changed?)");
        goto fail;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | lenbuf[i];
    if (hlen > (uint64_t)(size - 8)) {
        st = st_bad(f, "the header length %llu is larger than the %lld bytes that follow it "
                    "(truncated file, or not a safetensors file)", (unsigned long long)hlen, (long long)(size - 8));
        goto fail;
    }
    if (hlen > ST_MAX_HEADER) {
        st = st_bad(f, "the header length %llu is over the limit of %d bytes", (unsigned long long)hlen, ST_MAX_HEADER);
        goto fail;
    }
    if (hlen < 2) {
        st = st_bad(f, "the header length %llu is too small for a JSON object", (unsigned long long)hlen);
        goto fail;
    }
    f->data_start = 8 + (int64_t)hlen;
    f->data_len = size - f->data_start;
    char *text = malloc((size_t)hlen);
    if (!text) {
        st = dp_fail(DP_ERR_MEMORY, "safetensors: '%s': out of memory for a %llu-byte header", path,
                     (unsigned long long)hlen);
        goto fail;
    }
    if (st_read_full(f->fd, text, (int64_t)hlen, 8, &got))
        st = st_bad(f, "cannot read the %llu-byte header: %s", (unsigned long long)hlen, strerror(errno));
    else if (got != (int64_t)hlen)
        st = st_bad(f, "cannot read the %llu-byte header: short read (the file changed?)", (unsigned long long)hlen);
    else
        st = st_header(f, text, (int64_t)hlen);
    free(text);
    if (st)
        goto fail;
    *out = f;
    return DP_OK;
fail:
    dp_safetensors_close(f);
    return st;
}

int dp_safetensors_count(const dp_safetensors *f)
{
    return f ? f->n : 0;
}

const char *dp_safetensors_name(const dp_safetensors *f, int i)
{
    return f && i >= 0 && i < f->n ? f->entries[i].name : NULL;
}

int dp_safetensors_metadata_count(const dp_safetensors *f)
{
    return f ? f->n_meta : 0;
}

const char *dp_safetensors_metadata_key(const dp_safetensors *f, int i)
{
    return f && i >= 0 && i < f->n_meta ? f->meta_keys[i] : NULL;
}

const char *dp_safetensors_metadata_value(const dp_safetensors *f, int i)
{
    return f && i >= 0 && i < f->n_meta ? f->meta_values[i] : NULL;
}

/* A boolean byte other than 0 or 1 is a corrupt file, not a true. */
static dp_status st_check_bools(const dp_safetensors *f, const st_entry *e, const unsigned char *p, int64_t n)
{
    char nb[96];
    for (int64_t i = 0; i < n; i++)
        if (p[i] > 1)
            return st_bad(f, "BOOL tensor \"%s\" holds the byte 0x%02x at element %lld (expected 0 or 1)",
                          json_printable(nb, sizeof nb, e->name, strlen(e->name)), p[i], (long long)i);
    return DP_OK;
}

dp_status dp_safetensors_tensor(dp_tensor **out, const dp_safetensors *f, int i)
{
    dp_status st;
    int64_t got = 0;
    char nb[96];
    *out = NULL;
    if (!f || f->fd < 0)
        return dp_fail(DP_ERR_STATE, "safetensors: the file is closed");
    if (i < 0 || i >= f->n)
        return dp_fail(DP_ERR_INDEX, "safetensors: '%s': tensor index %d out of range (the file holds %d)",
                       f->path, i, f->n);
    const st_entry *e = &f->entries[i];
    dp_tensor *t;
    if ((st = tensor_new(&t, e->ndim, e->shape, e->dtype, DP_CPU)))
        return st;
    int64_t n = e->end - e->begin;
    if (n > 0 && st_read_full(f->fd, tensor_ptr(t), n, f->data_start + e->begin, &got)) {
        st = st_bad(f, "reading tensor \"%s\": %s", json_printable(nb, sizeof nb, e->name, strlen(e->name)), strerror(errno));
    } else if (got != n) {
        st = st_bad(f, "reading tensor \"%s\": the file ended early (it changed after it was opened?)",
                    json_printable(nb, sizeof nb, e->name, strlen(e->name)));
    } else if (e->dtype == DP_BOOL) {
        st = st_check_bools(f, e, (const unsigned char *)tensor_ptr(t), n);
    }
    if (st) {
        dp_tensor_release(t);
        return st;
    }
    *out = t;
    return DP_OK;
}

/* ---------------------------------------------------------------- the writer */

typedef struct {
    char *p;
    size_t len, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->cap - b->len < n + 1) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->len < n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void sb_puts(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_printf(sbuf *b, const char *fmt, long long v)
{
    char tmp[32];
    int n = snprintf(tmp, sizeof tmp, fmt, v);
    sb_put(b, tmp, (size_t)n);
}

/* A JSON string; the caller checked that s is valid UTF-8. */
static void sb_json_string(sbuf *b, const char *s)
{
    sb_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char esc[8];
        if (*p == '"' || *p == '\\') {
            esc[0] = '\\';
            esc[1] = (char)*p;
            sb_put(b, esc, 2);
        } else if (*p == '\n' || *p == '\t' || *p == '\r') {
            esc[0] = '\\';
            esc[1] = *p == '\n' ? 'n' : *p == '\t' ? 't' : 'r';
            sb_put(b, esc, 2);
        } else if (*p < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", *p);
            sb_put(b, esc, 6);
        } else {
            sb_put(b, (const char *)p, 1);
        }
    }
    sb_put(b, "\"", 1);
}

typedef struct { const char *s; int index; } name_ref;

static int name_cmp(const void *a, const void *b)
{
    return strcmp(((const name_ref *)a)->s, ((const name_ref *)b)->s);
}

/* Names must be valid UTF-8 and distinct; what: "tensor name" or "metadata key". */
static dp_status st_check_names(const char *path, int n, const char *const *names, const char *what)
{
    for (int i = 0; i < n; i++) {
        if (!names[i])
            return dp_fail(DP_ERR_ARG, "safetensors: saving '%s': %s %d is NULL", path, what, i);
        if (!json_utf8_valid(names[i]))
            return dp_fail(DP_ERR_ARG, "safetensors: saving '%s': %s %d is not valid UTF-8", path, what, i);
        if (strcmp(what, "tensor name") == 0 && strcmp(names[i], "__metadata__") == 0)
            return dp_fail(DP_ERR_ARG, "safetensors: saving '%s': \"__metadata__\" cannot name a tensor", path);
    }
    if (n < 2)
        return DP_OK;
    name_ref *refs = malloc(sizeof *refs * (size_t)n);
    if (!refs)
        return dp_fail(DP_ERR_MEMORY, "safetensors: saving '%s': out of memory", path);
    for (int i = 0; i < n; i++) {
        refs[i].s = names[i];
        refs[i].index = i;
    }
    qsort(refs, (size_t)n, sizeof *refs, name_cmp);
    dp_status st = DP_OK;
    for (int i = 1; i < n && !st; i++)
        if (strcmp(refs[i - 1].s, refs[i].s) == 0)
            st = dp_fail(DP_ERR_ARG, "safetensors: saving '%s': duplicate %s \"%.200s\"", path, what, refs[i].s);
    free(refs);
    return st;
}

/* The header: metadata first, then the tensors in the given order, their
 * data laid out in that order; padded with spaces so that the data starts
 * 8-byte aligned, as the reference writer does. */
static dp_status st_build_header(sbuf *h, const char *path, int n, const char *const *names,
                                 dp_tensor *const *tensors, int n_meta, const char *const *mkeys,
                                 const char *const *mvalues)
{
    int64_t off = 0;
    sb_puts(h, "{");
    if (n_meta > 0) {
        sb_puts(h, "\"__metadata__\":{");
        for (int i = 0; i < n_meta; i++) {
            if (i) sb_puts(h, ",");
            sb_json_string(h, mkeys[i]);
            sb_puts(h, ":");
            sb_json_string(h, mvalues[i]);
        }
        sb_puts(h, "}");
    }
    for (int i = 0; i < n; i++) {
        const dp_tensor *t = tensors[i];
        const char *dt = st_dtype_name(t->dtype);
        if (!dt)
            return dp_fail(DP_ERR_DTYPE, "safetensors: saving '%s': tensor \"%.200s\" has dtype %s, which the "
                           "format cannot hold", path, names[i], dp_dtype_name(t->dtype));
        int64_t bytes = dp_tensor_numel(t) * (int64_t)dp_dtype_size(t->dtype);
        if (i || n_meta > 0) sb_puts(h, ",");
        sb_json_string(h, names[i]);
        sb_puts(h, ":{\"dtype\":\"");
        sb_puts(h, dt);
        sb_puts(h, "\",\"shape\":[");
        for (int d = 0; d < t->ndim; d++)
            sb_printf(h, d ? ",%lld" : "%lld", (long long)t->shape[d]);
        sb_printf(h, "],\"data_offsets\":[%lld,", (long long)off);
        sb_printf(h, "%lld]}", (long long)(off + bytes));
        off += bytes;
    }
    sb_puts(h, "}");
    while ((8 + h->len) % 8)
        sb_puts(h, " ");
    if (h->oom)
        return dp_fail(DP_ERR_MEMORY, "safetensors: saving '%s': out of memory building the header", path);
    return DP_OK;
}

static dp_status write_full(int fd, const void *buf, size_t n, const char *tmp)
{
    size_t done = 0;
    while (done < n) {
        size_t want = n - done < ST_CHUNK ? n - done : ST_CHUNK;
        ssize_t w = write(fd, (const char *)buf + done, want);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return dp_fail(DP_ERR_IO, "safetensors: writing '%s': %s", tmp, w < 0 ? strerror(errno) : "no progress");
        done += (size_t)w;
    }
    return DP_OK;
}

/* One tensor's bytes: through a contiguous CPU copy when it is not one. */
static dp_status st_write_tensor(int fd, dp_tensor *t, const char *tmp)
{
    dp_tensor *c = NULL, *moved = NULL;
    dp_status st = DP_OK;
    if (dp_tensor_numel(t) == 0)
        return DP_OK;
    int was = dp_set_grad_enabled(0);
    if (t->device != DP_CPU)
        st = dp_to(&moved, t, t->dtype, DP_CPU);
    if (!st)
        st = dp_contiguous(&c, moved ? moved : t);
    dp_set_grad_enabled(was);
    if (!st)
        st = write_full(fd, tensor_ptr(c), (size_t)dp_tensor_numel(c) * dp_dtype_size(c->dtype), tmp);
    if (c) dp_tensor_release(c);
    if (moved) dp_tensor_release(moved);
    return st;
}

static dp_status st_write_file(int fd, const char *tmp, const sbuf *h, int n, dp_tensor *const *tensors)
{
    unsigned char lenbuf[8];
    uint64_t hl = h->len;
    for (int i = 0; i < 8; i++)
        lenbuf[i] = (unsigned char)(hl >> (8 * i));
    dp_status st = write_full(fd, lenbuf, 8, tmp);
    if (!st)
        st = write_full(fd, h->p, h->len, tmp);
    for (int i = 0; i < n && !st; i++)
        st = st_write_tensor(fd, tensors[i], tmp);
    return st;
}

dp_status dp_safetensors_save(const char *path, int n, const char *const *names, dp_tensor *const *tensors,
                              int n_meta, const char *const *meta_keys, const char *const *meta_values)
{
    dp_status st;
    if (!path || !*path)
        return dp_fail(DP_ERR_ARG, "safetensors: save: expected a path");
    if (n < 0 || n_meta < 0 || (n > 0 && (!names || !tensors)) || (n_meta > 0 && (!meta_keys || !meta_values)))
        return dp_fail(DP_ERR_ARG, "safetensors: saving '%s': bad tensor or metadata lists", path);
    for (int i = 0; i < n; i++)
        if (!tensors[i])
            return dp_fail(DP_ERR_ARG, "safetensors: saving '%s': tensor %d is NULL", path, i);
    for (int i = 0; i < n_meta; i++)
        if (!meta_values[i] || !json_utf8_valid(meta_values[i]))
            return dp_fail(DP_ERR_ARG, "safetensors: saving '%s': metadata value %d is %s", path, i,
                           meta_values[i] ? "not valid UTF-8" : "NULL");
    if ((st = st_check_names(path, n, names, "tensor name")) ||
        (st = st_check_names(path, n_meta, meta_keys, "metadata key")))
        return st;
    sbuf h = { 0 };
    if ((st = st_build_header(&h, path, n, names, tensors, n_meta, meta_keys, meta_values))) {
        free(h.p);
        return st;
    }
    char *tmp;
    int fd;
    if (!(st = atomic_create("safetensors", path, &tmp, &fd)))
        st = atomic_finish("safetensors", path, tmp, fd, st_write_file(fd, tmp, &h, n, tensors));
    free(h.p);
    return st;
}
