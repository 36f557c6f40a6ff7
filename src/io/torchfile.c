/*
 * torchfile.c — PyTorch's checkpoint format: the zip archive that
 * torch.save writes since PyTorch 1.6 (zip.c), read and written.
 *
 * The archive holds, under one folder (its name is free; PyTorch takes it
 * from the file name or writes "archive"):
 *
 *     <folder>/data.pkl      the object, pickled (pickle.c); each tensor is
 *                            _rebuild_tensor_v2 of a persistent storage id
 *                            ('storage', torch.FloatStorage, key, location,
 *                            numel) with an offset, sizes and strides
 *     <folder>/data/<key>    each storage's bytes, little-endian
 *     <folder>/version       the format's version ("3")
 *     <folder>/byteorder     "little" or "big" (PyTorch 2.x; absent means little)
 *
 * A tensor is read when asked for: the part of its storage that its view
 * spans, then its elements copied out in order, so that views of one
 * storage (a tensor and its transpose, slices) become tensors of their own.
 * float16, int16 and int8 storages, which dplua lacks, load widened to
 * float32 and int32 (exactly). Every failure names the file and what was
 * wrong; nothing in the file is trusted.
 *
 * The writer gives each distinct tensor a contiguous storage of its own
 * ("cpu" location, whatever device it was on) and writes data.pkl,
 * byteorder, data/<k> and version under "archive/", atomically (atomic.c).
 */
#include "core/tensor.h"
#include "io/atomic.h"
#include "io/pickle.h"
#include "io/zip.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "torchfile.c assumes a little-endian host"
#endif

struct dp_torchfile {
    char *path;
    int fd;
    zip_reader zip;
    char *folder;        /* "archive/": the prefix of every entry */
    py_tree tree;
};

/* ---------------------------------------------------------------- opening */

static dp_status tf_bad(const dp_torchfile *f, const char *why)
{
    return dp_fail(DP_ERR_IO, "torch checkpoint '%s': %s", f->path, why);
}

/* What the first bytes say when they are not a zip archive's. */
static dp_status tf_not_zip(const dp_torchfile *f, const unsigned char *head, int64_t n)
{
    if (n >= 2 && head[0] == 0x80 && head[1] >= 2 && head[1] <= 5)
        return tf_bad(f, "a pickle, not a zip archive: this is PyTorch's legacy checkpoint format (written "
                      "before PyTorch 1.6, or with _use_new_zipfile_serialization=False), which dplua does not "
                      "read; re-save it with a newer PyTorch: torch.save(torch.load(path), path)");
    return tf_bad(f, n < 4 ? "too short for a zip archive (an empty or truncated file)"
                           : "does not start with a zip signature (\"PK\\3\\4\"): not a PyTorch checkpoint");
}

static dp_status tf_open_fd(dp_torchfile *f, int64_t *size)
{
    struct stat sb;
    f->fd = open(f->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (f->fd < 0)
        return dp_fail(DP_ERR_IO, "torch checkpoint '%s': cannot open: %s", f->path, strerror(errno));
    if (fstat(f->fd, &sb) != 0)
        return dp_fail(DP_ERR_IO, "torch checkpoint '%s': cannot stat: %s", f->path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return tf_bad(f, "is not a regular file");
    *size = (int64_t)sb.st_size;
    return DP_OK;
}

/* The folder is what precedes the first '/' of the first entry, as in
 * PyTorch's reader; data.pkl must be in it. */
static dp_status tf_find_pickle(dp_torchfile *f, int *entry)
{
    char name[512];
    if (f->zip.n == 0)
        return tf_bad(f, "an empty zip archive (no data.pkl)");
    const char *first = f->zip.entries[0].name, *slash = strchr(first, '/');
    if (!slash || slash - first > 200)
        return tf_bad(f, "its first entry is not inside a folder, as torch.save writes it");
    if (!(f->folder = strndup(first, (size_t)(slash - first + 1))))
        return dp_fail(DP_ERR_MEMORY, "torch checkpoint '%s': out of memory", f->path);
    snprintf(name, sizeof name, "%sdata.pkl", f->folder);
    *entry = zip_find(&f->zip, name);
    if (*entry >= 0)
        return DP_OK;
    snprintf(name, sizeof name, "%sconstants.pkl", f->folder);
    if (zip_find(&f->zip, name) >= 0)
        return tf_bad(f, "a TorchScript archive (torch.jit.save), not a torch.save checkpoint");
    snprintf(name, sizeof name, "zip archive without %sdata.pkl: not a torch.save checkpoint", f->folder);
    return tf_bad(f, name);
}

static dp_status tf_check_byteorder(dp_torchfile *f)
{
    char name[512], *text;
    int64_t len;
    snprintf(name, sizeof name, "%sbyteorder", f->folder);
    int i = zip_find(&f->zip, name);
    if (i < 0)
        return DP_OK;
    dp_status st = zip_read_all(&f->zip, i, &text, &len);
    if (st)
        return st;
    int little = strcmp(text, "little") == 0;
    free(text);
    return little ? DP_OK : tf_bad(f, "a big-endian checkpoint (its byteorder entry is not \"little\"); dplua reads "
                                   "little-endian ones");
}

/* A zip archive starts with a local header ("PK\3\4"; an empty one with
 * its end record, "PK\5\6"); the legacy format with a pickle's PROTO. */
static int tf_looks_like_torch(const unsigned char *head, ssize_t n)
{
    if (n >= 4 && (memcmp(head, "PK\3\4", 4) == 0 || memcmp(head, "PK\5\6", 4) == 0))
        return 1;
    return n >= 2 && head[0] == 0x80 && head[1] >= 2 && head[1] <= 5;
}

int dp_torchfile_sniff(const char *path)
{
    unsigned char head[4];
    struct stat sb;
    if (!path)
        return 0;
    /* O_NONBLOCK and a regular file only: a FIFO must not block the caller */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return 0;
    ssize_t n = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) ? pread(fd, head, 4, 0) : 0;
    close(fd);
    return tf_looks_like_torch(head, n);
}

dp_status dp_torchfile_open(dp_torchfile **out, const char *path)
{
    unsigned char head[4];
    int64_t size = 0, len;
    char *pkl = NULL, what[600];
    int entry = -1;
    *out = NULL;
    if (!path)
        return dp_fail(DP_ERR_ARG, "torch checkpoint: expected a path, got NULL");
    dp_torchfile *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return dp_fail(DP_ERR_MEMORY, "torch checkpoint: out of memory opening '%s'", path);
    }
    f->fd = -1;
    dp_status st = tf_open_fd(f, &size);
    if (!st) {
        ssize_t n = size >= 4 ? pread(f->fd, head, 4, 0) : 0;
        if (n != 4 || memcmp(head, "PK", 2) != 0)
            st = tf_not_zip(f, head, n < 0 ? 0 : n);
    }
    if (!st)
        st = zip_open(&f->zip, f->fd, size, f->path);
    if (!st)
        st = tf_find_pickle(f, &entry);
    if (!st)
        st = tf_check_byteorder(f);
    if (!st)
        st = zip_read_all(&f->zip, entry, &pkl, &len);
    if (!st) {
        snprintf(what, sizeof what, "torch checkpoint '%.400s': %sdata.pkl", f->path, f->folder);
        st = py_unpickle(&f->tree, pkl, (size_t)len, what);
    }
    free(pkl);
    if (st) {
        dp_torchfile_close(f);
        return st;
    }
    *out = f;
    return DP_OK;
}

void dp_torchfile_close(dp_torchfile *f)
{
    if (!f)
        return;
    if (f->fd >= 0)
        close(f->fd);
    zip_close(&f->zip);
    py_tree_free(&f->tree);
    free(f->folder);
    free(f->path);
    free(f);
}

/* ---------------------------------------------------------------- values */

static const py_value *node(const dp_torchfile *f, int i)
{
    return f && i >= 0 && i < f->tree.n ? &f->tree.v[i] : NULL;
}

int dp_torchfile_root(const dp_torchfile *f) { return f ? f->tree.root : -1; }

int dp_torchfile_kind(const dp_torchfile *f, int i)
{
    const py_value *v = node(f, i);
    return v && v->kind < DP_PY_NUM_KINDS ? v->kind : -1;
}

int64_t dp_torchfile_int(const dp_torchfile *f, int i)
{
    const py_value *v = node(f, i);
    return v ? v->i : 0;
}

double dp_torchfile_float(const dp_torchfile *f, int i)
{
    const py_value *v = node(f, i);
    return v ? v->f : 0;
}

const char *dp_torchfile_str(const dp_torchfile *f, int i, size_t *len)
{
    const py_value *v = node(f, i);
    if (len)
        *len = v && v->s ? v->len : 0;
    return v ? v->s : NULL;
}

int dp_torchfile_len(const dp_torchfile *f, int i)
{
    const py_value *v = node(f, i);
    if (!v)
        return 0;
    return v->kind == DP_PY_DICT || v->kind == DP_PY_ODICT ? v->n / 2 : v->n;
}

int dp_torchfile_item(const dp_torchfile *f, int i, int k)
{
    const py_value *v = node(f, i);
    return v && k >= 0 && k < v->n ? v->items[k] : -1;
}

/* ---------------------------------------------------------------- tensors */

static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    float x;
    if (exp == 0) {
        x = ldexpf((float)man, -24);   /* zero or a subnormal */
        return sign ? -x : x;
    }
    if (exp == 31)
        bits = sign | 0x7f800000u | man << 13;
    else
        bits = sign | (exp + 112) << 23 | man << 13;
    memcpy(&x, &bits, 4);
    return x;
}

/* How an element of the file's type becomes one of dplua's. */
enum { CONV_COPY, CONV_HALF, CONV_SHORT, CONV_CHAR };

static int conversion_of(int st)
{
    const char *name = py_storage_types[st].name;
    if (strcmp(name, "HalfStorage") == 0) return CONV_HALF;
    if (strcmp(name, "ShortStorage") == 0) return CONV_SHORT;
    if (strcmp(name, "CharStorage") == 0) return CONV_CHAR;
    return CONV_COPY;
}

static void convert(int conv, const unsigned char *src, char *dst, int esize)
{
    uint16_t h;
    int16_t s;
    switch (conv) {
    case CONV_HALF:
        memcpy(&h, src, 2);
        *(float *)dst = half_to_float(h);
        break;
    case CONV_SHORT:
        memcpy(&s, src, 2);
        *(int32_t *)dst = s;
        break;
    case CONV_CHAR:
        *(int32_t *)dst = (int8_t)src[0];
        break;
    default:
        memcpy(dst, src, (size_t)esize);
    }
}

/* The view's elements, in row-major order, from buf (which starts at
 * the view's lowest element, base). */
static void gather(const py_view *v, int st, const unsigned char *buf, int64_t base, char *out, int out_size)
{
    int64_t idx[DP_MAX_DIMS] = { 0 }, numel = shape_numel(v->ndim, v->size);
    int esize = py_storage_types[st].elsize, conv = conversion_of(st);
    for (int64_t n = 0; n < numel; n++) {
        int64_t off = v->offset - base;
        for (int d = 0; d < v->ndim; d++)
            off += idx[d] * v->stride[d];
        convert(conv, buf + off * esize, out + n * out_size, esize);
        for (int d = v->ndim - 1; d >= 0; d--) {
            if (++idx[d] < v->size[d])
                break;
            idx[d] = 0;
        }
    }
}

static dp_status check_bools(const dp_torchfile *f, const char *key, const unsigned char *p, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (p[i] > 1)
            return dp_fail(DP_ERR_IO, "torch checkpoint '%s': bool storage '%s' holds the byte 0x%02x (expected 0 or 1)",
                           f->path, key, p[i]);
    return DP_OK;
}

static int view_is_contiguous(const py_view *v)
{
    int64_t expect = 1;
    for (int d = v->ndim - 1; d >= 0; d--) {
        if (v->size[d] != 1 && v->stride[d] != expect)
            return 0;
        expect *= v->size[d];
    }
    return 1;
}

static uint32_t crc_of(const unsigned char *p, int64_t n)
{
    uLong crc = crc32(0, Z_NULL, 0);
    for (int64_t done = 0; done < n;) {   /* crc32 takes a 32-bit length */
        uInt part = (uInt)(n - done < (1 << 30) ? n - done : (1 << 30));
        crc = crc32(crc, p + done, part);
        done += part;
    }
    return (uint32_t)crc;
}

/* The storage's zip entry, checked against its type and length. */
static dp_status storage_entry(const dp_torchfile *f, const py_value *s, int *entry)
{
    char name[600];
    const py_storage_type *type = &py_storage_types[s->sub];
    if (type->dtype < 0)
        return dp_fail(DP_ERR_DTYPE, "torch checkpoint '%s': storage '%s' is a torch.%s, which dplua cannot load",
                       f->path, s->s, type->name);
    snprintf(name, sizeof name, "%sdata/%s", f->folder, s->s);
    *entry = zip_find(&f->zip, name);
    if (*entry < 0)
        return dp_fail(DP_ERR_IO, "torch checkpoint '%s': the pickle refers to storage '%s' but the archive has no "
                       "entry '%s'", f->path, s->s, name);
    int64_t bytes;
    if (__builtin_mul_overflow(s->i, (int64_t)type->elsize, &bytes) || bytes != f->zip.entries[*entry].size)
        return dp_fail(DP_ERR_IO, "torch checkpoint '%s': storage '%s' is %lld elements of %d bytes, but its entry "
                       "holds %lld bytes", f->path, s->s, (long long)s->i, type->elsize,
                       (long long)f->zip.entries[*entry].size);
    return DP_OK;
}

dp_status dp_torchfile_tensor(dp_tensor **out, const dp_torchfile *f, int i)
{
    const py_value *v = node(f, i);
    int entry = -1;
    *out = NULL;
    if (!v || v->kind != DP_PY_TENSOR)
        return dp_fail(DP_ERR_ARG, "torch checkpoint: node %d is not a tensor", i);
    const py_view *view = v->view;
    const py_value *s = &f->tree.v[view->storage];
    dp_status st = storage_entry(f, s, &entry);
    if (st)
        return st;
    const py_storage_type *type = &py_storage_types[s->sub];
    dp_tensor *t;
    if ((st = tensor_new(&t, view->ndim, view->size, type->dtype, DP_CPU)))
        return st;
    int64_t numel = dp_tensor_numel(t), last = view->offset;   /* bounds were checked by the unpickler */
    for (int d = 0; d < view->ndim; d++)
        last += (view->size[d] - 1) * view->stride[d];
    if (numel == 0) {
        *out = t;
        return DP_OK;
    }
    int64_t span = last - view->offset + 1, esize = type->elsize;
    int direct = span == numel && view_is_contiguous(view) && esize == (int64_t)dp_dtype_size(type->dtype);
    unsigned char *buf = direct ? (unsigned char *)tensor_ptr(t) : malloc((size_t)(span * esize));
    if (!buf)
        st = dp_fail(DP_ERR_MEMORY, "torch checkpoint '%s': out of memory reading storage '%s'", f->path, s->s);
    if (!st)
        st = zip_read(&f->zip, entry, buf, view->offset * esize, span * esize);
    if (!st && view->offset == 0 && span == s->i && crc_of(buf, span * esize) != f->zip.entries[entry].crc)
        st = dp_fail(DP_ERR_IO, "torch checkpoint '%s': storage '%s' fails its CRC check (a damaged file)", f->path, s->s);
    if (!st && type->dtype == DP_BOOL)
        st = check_bools(f, s->s, buf, span);
    if (!st && !direct)
        gather(view, s->sub, buf, view->offset, tensor_ptr(t), (int)dp_dtype_size(type->dtype));
    if (!direct)
        free(buf);
    if (st) {
        dp_tensor_release(t);
        return st;
    }
    *out = t;
    return DP_OK;
}

/* ---------------------------------------------------------------- the writer */

struct dp_torchwriter {
    py_pickler p;
};

dp_status dp_torchwriter_new(dp_torchwriter **out)
{
    *out = calloc(1, sizeof **out);
    if (!*out)
        return dp_fail(DP_ERR_MEMORY, "torch.save: out of memory");
    py_pickler_init(&(*out)->p);
    return DP_OK;
}

void dp_torchwriter_free(dp_torchwriter *w)
{
    if (!w)
        return;
    py_pickler_free(&w->p);
    free(w);
}

dp_status dp_torchwriter_none(dp_torchwriter *w) { return py_put_none(&w->p); }
dp_status dp_torchwriter_bool(dp_torchwriter *w, int v) { return py_put_bool(&w->p, v); }
dp_status dp_torchwriter_int(dp_torchwriter *w, int64_t v) { return py_put_int(&w->p, v); }
dp_status dp_torchwriter_float(dp_torchwriter *w, double v) { return py_put_float(&w->p, v); }
dp_status dp_torchwriter_str(dp_torchwriter *w, const char *s, size_t len) { return py_put_str(&w->p, s, len); }
dp_status dp_torchwriter_dtype(dp_torchwriter *w, dp_dtype dtype) { return py_put_dtype(&w->p, (int)dtype); }
dp_status dp_torchwriter_begin(dp_torchwriter *w, dp_pykind kind) { return py_begin(&w->p, (int)kind); }
dp_status dp_torchwriter_end(dp_torchwriter *w) { return py_end(&w->p); }

dp_status dp_torchwriter_device(dp_torchwriter *w, const char *type, int index)
{
    if (!type || strlen(type) > 32)
        return dp_fail(DP_ERR_ARG, "torch.save: a device type must be a short string");
    return py_put_device(&w->p, type, index);
}

dp_status dp_torchwriter_tensor(dp_torchwriter *w, dp_tensor *t)
{
    if (!t)
        return dp_fail(DP_ERR_ARG, "torch.save: tensor is NULL");
    return py_put_tensor(&w->p, t);
}

/* Storage k: the tensor's elements, contiguous, from a CPU copy when it
 * is elsewhere or strided. */
static dp_status write_storage(zip_writer *z, int k, dp_tensor *t)
{
    char name[48];
    dp_tensor *c = NULL, *moved = NULL;
    dp_status st = DP_OK;
    snprintf(name, sizeof name, "archive/data/%d", k);
    int was = dp_set_grad_enabled(0);
    if (t->device != DP_CPU)
        st = dp_to(&moved, t, t->dtype, DP_CPU);
    if (!st)
        st = dp_contiguous(&c, moved ? moved : t);
    dp_set_grad_enabled(was);
    if (!st)
        st = zip_write_entry(z, name, dp_tensor_numel(c) ? tensor_ptr(c) : "",
                             dp_tensor_numel(c) * (int64_t)dp_dtype_size(c->dtype));
    if (c) dp_tensor_release(c);
    if (moved) dp_tensor_release(moved);
    return st;
}

static dp_status write_archive(dp_torchwriter *w, zip_writer *z)
{
    dp_status st;
    if ((st = zip_write_entry(z, "archive/data.pkl", w->p.p, (int64_t)w->p.len)) ||
        (st = zip_write_entry(z, "archive/byteorder", "little", 6)))
        return st;
    for (int k = 0; k < w->p.ntensors; k++)
        if ((st = write_storage(z, k, w->p.tensors[k])))
            return st;
    if ((st = zip_write_entry(z, "archive/version", "3\n", 2)) || (st = zip_write_end(z)))
        return st;
    if (fflush(z->fp) != 0)
        return dp_fail(DP_ERR_IO, "torch.save: writing '%s': %s", z->path, strerror(errno));
    return DP_OK;
}

dp_status dp_torchwriter_save(dp_torchwriter *w, const char *path)
{
    char *tmp;
    int fd;
    if (!w || !path || !*path)
        return dp_fail(DP_ERR_ARG, "torch.save: expected a writer and a path");
    dp_status st = py_finish(&w->p);
    if (st || (st = atomic_create("torch.save", path, &tmp, &fd)))
        return st;
    zip_writer z = { 0 };
    z.path = tmp;
    int fd2 = dup(fd);
    z.fp = fd2 < 0 ? NULL : fdopen(fd2, "wb");
    if (!z.fp) {
        if (fd2 >= 0)
            close(fd2);
        st = dp_fail(DP_ERR_IO, "torch.save: writing '%s': %s", tmp, strerror(errno));
    } else {
        st = write_archive(w, &z);
        if (fclose(z.fp) != 0 && !st)
            st = dp_fail(DP_ERR_IO, "torch.save: writing '%s': %s", tmp, strerror(errno));
    }
    zip_writer_free(&z);
    return atomic_finish("torch.save", path, tmp, fd, st);
}
