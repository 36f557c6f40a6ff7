/*
 * pickle.c — the pickles inside PyTorch checkpoints, read by a restricted
 * unpickler and written by a protocol-2 pickler.
 *
 * Python's pickle format is a program for a stack machine; its GLOBAL and
 * REDUCE opcodes import and call any Python function, which is why
 * loading an untrusted pickle in Python can run anything. This unpickler
 * calls nothing: it builds a tree of values (py_tree) and knows by name
 * the few globals that torch.save writes: collections.OrderedDict,
 * torch._utils._rebuild_tensor_v2 and _rebuild_parameter, torch's storage
 * classes, dtypes, torch.device and torch.Size. "Calling" one of them
 * (REDUCE) makes the value it stands for: a tensor node holds its storage
 * reference and view (offset, sizes, strides), checked against the
 * storage's length. Any other global is refused by its name. The binary
 * opcodes (protocols 1 to 5) that build plain values (None, booleans,
 * integers up to 64 bits, floats, str, bytes, tuples, lists, dicts) are
 * understood; protocol 0's text opcodes and those that make objects
 * (NEWOBJ, INST, OBJ, sets, out-of-band buffers) are refused. Every read is bounds-checked, the memo only grows by one, and
 * pops never go below the current mark: a malformed pickle is an error
 * that names the byte where it went wrong.
 *
 * The pickler writes what torch.save (protocol 2) writes for the same
 * values: dicts, OrderedDicts, lists, tuples and scalars, and each tensor
 * as _rebuild_tensor_v2(persistent storage ('storage', torch.FloatStorage,
 * key, 'cpu', numel), 0, size, stride, False, OrderedDict()) over a
 * contiguous storage of its own.
 */
#include "io/pickle.h"
#include "core/tensor.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const py_storage_type py_storage_types[] = {
    { "FloatStorage", 4, DP_FLOAT32 }, { "DoubleStorage", 8, DP_FLOAT64 },
    { "HalfStorage", 2, DP_FLOAT32 }, { "BFloat16Storage", 2, DP_BFLOAT16 },
    { "LongStorage", 8, DP_INT64 }, { "IntStorage", 4, DP_INT32 },
    { "ShortStorage", 2, DP_INT32 }, { "CharStorage", 1, DP_INT32 },
    { "ByteStorage", 1, DP_UINT8 }, { "BoolStorage", 1, DP_BOOL },
    { "ComplexFloatStorage", 8, -1 }, { "ComplexDoubleStorage", 16, -1 },
    { NULL, 0, 0 },
};

enum { G_ODICT, G_REBUILD_TENSOR, G_REBUILD_PARAM, G_DEVICE, G_SIZE, G_ENCODE, G_BYTES, G_STORAGE };

static const struct {
    const char *module, *name;
    int which;
} py_globals[] = {
    { "collections", "OrderedDict", G_ODICT },
    { "torch._utils", "_rebuild_tensor_v2", G_REBUILD_TENSOR },
    { "torch._utils", "_rebuild_parameter", G_REBUILD_PARAM },
    { "torch", "device", G_DEVICE },
    { "torch", "Size", G_SIZE },
    /* protocol 2 pickles bytes as _codecs.encode(str, 'latin1'), b'' as bytes() */
    { "_codecs", "encode", G_ENCODE },
    { "__builtin__", "bytes", G_BYTES },
    { "builtins", "bytes", G_BYTES },
};

static const char *const py_dtype_names[] = {
    "float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool", NULL,
};

/* ---------------------------------------------------------------- the unpickler */

typedef struct {
    py_tree *t;
    const unsigned char *p;
    size_t len, pos, op_pos;
    const char *what;
    int *stack, sn, scap;
    int *marks, mn, mcap;
    int *memo, memon, memocap;
} unpickler;

static dp_status up_bad(const unpickler *u, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static dp_status up_bad(const unpickler *u, const char *fmt, ...)
{
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return dp_fail(DP_ERR_IO, "%s: %s (at byte %zu of the pickle)", u->what, why, u->op_pos);
}

static dp_status up_oom(const unpickler *u)
{
    return dp_fail(DP_ERR_MEMORY, "%s: out of memory unpickling", u->what);
}

/* Grows *arr (of *cap ints) to hold need. */
static int grow(int **arr, int *cap, int need)
{
    if (need <= *cap)
        return 0;
    int c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    int *p = realloc(*arr, sizeof *p * (size_t)c);
    if (!p)
        return -1;
    *arr = p;
    *cap = c;
    return 0;
}

static int new_value(unpickler *u, int kind)
{
    py_tree *t = u->t;
    if (t->n == t->cap) {
        int c = t->cap ? 2 * t->cap : 64;
        py_value *v = realloc(t->v, sizeof *v * (size_t)c);
        if (!v)
            return -1;
        t->v = v;
        t->cap = c;
    }
    memset(&t->v[t->n], 0, sizeof t->v[t->n]);
    t->v[t->n].kind = kind;
    return t->n++;
}

static dp_status push(unpickler *u, int v)
{
    if (v < 0 || grow(&u->stack, &u->scap, u->sn + 1))
        return up_oom(u);
    u->stack[u->sn++] = v;
    return DP_OK;
}

static int floor_of_stack(const unpickler *u) { return u->mn ? u->marks[u->mn - 1] : 0; }

static dp_status pop(unpickler *u, int *v)
{
    *v = -1;
    if (u->sn <= floor_of_stack(u))
        return up_bad(u, "the stack is empty where an opcode needs a value (a malformed pickle)");
    *v = u->stack[--u->sn];
    return DP_OK;
}

static dp_status top(unpickler *u, int *v)
{
    *v = -1;
    if (u->sn <= floor_of_stack(u))
        return up_bad(u, "the stack is empty where an opcode needs a value (a malformed pickle)");
    *v = u->stack[u->sn - 1];
    return DP_OK;
}

static dp_status pop_mark(unpickler *u, int *first)
{
    *first = 0;
    if (!u->mn)
        return up_bad(u, "an opcode needs a MARK that is not there (a malformed pickle)");
    *first = u->marks[--u->mn];
    return DP_OK;
}

static dp_status take(unpickler *u, size_t n, const unsigned char **out)
{
    *out = NULL;
    if (n > u->len - u->pos)
        return up_bad(u, "the pickle ends inside an opcode's argument (a truncated file?)");
    *out = u->p + u->pos;
    u->pos += n;
    return DP_OK;
}

static uint64_t le(const unsigned char *b, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | b[i];
    return v;
}

/* A length-prefixed argument: n bytes of little-endian length, then it. */
static dp_status take_counted(unpickler *u, int n, const unsigned char **s, size_t *len)
{
    *s = NULL;
    *len = 0;
    const unsigned char *b;
    dp_status st = take(u, (size_t)n, &b);
    if (st)
        return st;
    uint64_t l = le(b, n);
    if (l > u->len - u->pos)
        return up_bad(u, "a string of %llu bytes runs past the end of the pickle", (unsigned long long)l);
    *len = (size_t)l;
    return take(u, (size_t)l, s);
}

static dp_status push_string(unpickler *u, int kind, const unsigned char *s, size_t len)
{
    int v = new_value(u, kind);
    char *copy = v < 0 ? NULL : malloc(len + 1);
    if (!copy)
        return up_oom(u);
    memcpy(copy, s, len);
    copy[len] = 0;
    u->t->v[v].s = copy;
    u->t->v[v].len = len;
    return push(u, v);
}

static dp_status push_int(unpickler *u, int64_t x)
{
    int v = new_value(u, DP_PY_INT);
    if (v >= 0)
        u->t->v[v].i = x;
    return push(u, v);
}

/* LONG1/LONG4: a little-endian two's complement integer of n bytes. */
static dp_status push_long(unpickler *u, int nbytes)
{
    const unsigned char *b;
    dp_status st = take(u, (size_t)nbytes, &b);
    if (st)
        return st;
    uint64_t n = le(b, nbytes);
    if (n > 8)
        return up_bad(u, "an integer of %llu bytes; only integers up to 64 bits are read", (unsigned long long)n);
    if ((st = take(u, (size_t)n, &b)))
        return st;
    uint64_t x = le(b, (int)n);
    if (n > 0 && n < 8 && (b[n - 1] & 0x80))
        x |= ~(uint64_t)0 << (8 * n);   /* sign-extend */
    return push_int(u, (int64_t)x);
}

static dp_status append(unpickler *u, int container, int item)
{
    py_value *c = &u->t->v[container];
    if (grow(&c->items, &c->cap, c->n + 1))
        return up_oom(u);
    c->items[c->n++] = item;
    return DP_OK;
}

static int is_dict(int kind) { return kind == DP_PY_DICT || kind == DP_PY_ODICT; }

/* The items from stack position first up: into a new tuple, list or dict. */
static dp_status collect(unpickler *u, int kind, int first)
{
    int n = u->sn - first;
    if (is_dict(kind) && n % 2)
        return up_bad(u, "a dict built from an odd number of keys and values");
    int v = new_value(u, kind);
    if (v < 0)
        return up_oom(u);
    for (int i = first; i < u->sn; i++)
        if (append(u, v, u->stack[i]))
            return up_oom(u);
    u->sn = first;
    return push(u, v);
}

/* APPEND(S) and SETITEM(S): the items from stack position first up go
 * into the list or dict just below them. */
static dp_status add_items(unpickler *u, int first, int to_dict)
{
    if (first <= floor_of_stack(u))
        return up_bad(u, "%s with no %s below its items", to_dict ? "SETITEMS" : "APPENDS", to_dict ? "dict" : "list");
    int c = u->stack[first - 1], kind = u->t->v[c].kind;
    if (to_dict ? !is_dict(kind) : kind != DP_PY_LIST)
        return up_bad(u, "%s into a value that is not a %s", to_dict ? "SETITEM" : "APPEND", to_dict ? "dict" : "list");
    if (to_dict && (u->sn - first) % 2)
        return up_bad(u, "SETITEMS with a key but no value");
    for (int i = first; i < u->sn; i++)
        if (append(u, c, u->stack[i]))
            return up_oom(u);
    u->sn = first;
    return DP_OK;
}

static dp_status push_global(unpickler *u, const char *module, const char *name)
{
    for (size_t i = 0; i < sizeof py_globals / sizeof py_globals[0]; i++)
        if (strcmp(module, py_globals[i].module) == 0 && strcmp(name, py_globals[i].name) == 0) {
            int v = new_value(u, PY_GLOBAL);
            if (v >= 0)
                u->t->v[v].sub = py_globals[i].which;
            return push(u, v);
        }
    if (strcmp(module, "torch") == 0) {
        for (int i = 0; py_storage_types[i].name; i++)
            if (strcmp(name, py_storage_types[i].name) == 0) {
                int v = new_value(u, PY_GLOBAL);
                if (v >= 0) {
                    u->t->v[v].sub = G_STORAGE;
                    u->t->v[v].i = i;
                }
                return push(u, v);
            }
        for (int i = 0; py_dtype_names[i]; i++)
            if (strcmp(name, py_dtype_names[i]) == 0)
                return push_string(u, DP_PY_DTYPE, (const unsigned char *)name, strlen(name));
    }
    return up_bad(u, "it refers to the Python global %.100s.%.100s, which torch.load does not load: a "
                  "checkpoint may hold tensors, numbers, strings, lists, tuples and dicts (no other objects, "
                  "and nothing is ever run)", module, name);
}

/* GLOBAL: "module\nname\n" */
static dp_status op_global(unpickler *u)
{
    char part[2][256];
    for (int k = 0; k < 2; k++) {
        const unsigned char *nl = memchr(u->p + u->pos, '\n', u->len - u->pos);
        size_t n = nl ? (size_t)(nl - (u->p + u->pos)) : 0;
        if (!nl || n >= sizeof part[k] || memchr(u->p + u->pos, 0, n))
            return up_bad(u, "a malformed GLOBAL (a module or name without its newline, or too long)");
        memcpy(part[k], u->p + u->pos, n);
        part[k][n] = 0;
        u->pos += n + 1;
    }
    return push_global(u, part[0], part[1]);
}

static dp_status op_stack_global(unpickler *u)
{
    int name, module;
    dp_status st;
    if ((st = pop(u, &name)) || (st = pop(u, &module)))
        return st;
    const py_value *n = &u->t->v[name], *m = &u->t->v[module];
    if (n->kind != DP_PY_STR || m->kind != DP_PY_STR || n->len != strlen(n->s) || m->len != strlen(m->s))
        return up_bad(u, "STACK_GLOBAL of values that are not a module and a name");
    return push_global(u, m->s, n->s);
}

static int int_arg(const py_tree *t, int v, int64_t *x)
{
    const py_value *p = &t->v[v];
    if (p->kind != DP_PY_INT && p->kind != DP_PY_BOOL)
        return -1;
    *x = p->i;
    return 0;
}

static dp_status int_tuple(unpickler *u, int v, const char *what, int *ndim, int64_t *out)
{
    const py_value *p = &u->t->v[v];
    if (p->kind != DP_PY_TUPLE && p->kind != DP_PY_LIST)
        return up_bad(u, "a tensor's %s is not a tuple of integers", what);
    if (p->n > DP_MAX_DIMS)
        return up_bad(u, "a tensor of %d dims; at most %d are supported", p->n, DP_MAX_DIMS);
    for (int d = 0; d < p->n; d++)
        if (int_arg(u->t, p->items[d], &out[d]) || out[d] < 0)
            return up_bad(u, "a tensor's %s holds something other than a non-negative integer", what);
    *ndim = p->n;
    return DP_OK;
}

/* _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata]) */
static dp_status rebuild_tensor(unpickler *u, const py_value *args, int *out)
{
    py_view view;
    int sdim = 0;
    dp_status st;
    if (args->n != 6 && args->n != 7)
        return up_bad(u, "_rebuild_tensor_v2 with %d arguments (expected 6 or 7)", args->n);
    view.storage = args->items[0];
    const py_value *s = &u->t->v[view.storage];
    if (s->kind != PY_STORAGE)
        return up_bad(u, "_rebuild_tensor_v2 of something that is not a storage");
    if (int_arg(u->t, args->items[1], &view.offset) || view.offset < 0)
        return up_bad(u, "a tensor's storage offset is not a non-negative integer");
    if ((st = int_tuple(u, args->items[2], "size", &view.ndim, view.size)) ||
        (st = int_tuple(u, args->items[3], "stride", &sdim, view.stride)))
        return st;
    if (sdim != view.ndim)
        return up_bad(u, "a tensor with %d sizes but %d strides", view.ndim, sdim);
    /* the last element it reads must lie inside the storage */
    int64_t last = view.offset, numel = 1;
    int over = 0;
    for (int d = 0; d < view.ndim; d++) {
        int64_t step;
        over |= __builtin_mul_overflow(view.size[d], numel, &numel);
        if (view.size[d] == 0)
            continue;
        over |= __builtin_mul_overflow(view.size[d] - 1, view.stride[d], &step);
        over |= __builtin_add_overflow(last, step, &last);
    }
    if (!over && numel > 0 && last >= s->i)
        over = 1;
    if (over || (numel == 0 && view.offset > s->i)) {
        char sb[160];
        return up_bad(u, "a tensor of size %s (offset %lld) reaches past the %lld elements of storage '%.100s'",
                      dp_shape_str(sb, sizeof sb, view.ndim, view.size), (long long)view.offset, (long long)s->i, s->s);
    }
    /* More elements than the storage holds means a view that overlaps
     * itself (an expand, stride 0): copied out it could be far larger than
     * the file, so it is refused rather than allocated. */
    if (numel > s->i)
        return up_bad(u, "a tensor of %lld elements over the %lld of storage '%.100s' (an expanded view, stride 0): "
                      "save it with .clone() or .contiguous()", (long long)numel, (long long)s->i, s->s);
    int v = new_value(u, DP_PY_TENSOR);
    py_view *pv = v < 0 ? NULL : malloc(sizeof *pv);
    if (!pv)
        return up_oom(u);
    *pv = view;
    u->t->v[v].view = pv;
    *out = v;
    return DP_OK;
}

/* torch.device('cuda', 0), torch.device('cpu') */
static dp_status rebuild_device(unpickler *u, const py_value *args)
{
    char name[80];
    int64_t index;
    const py_value *type = args->n >= 1 ? &u->t->v[args->items[0]] : NULL;
    if (!type || type->kind != DP_PY_STR || args->n > 2 || type->len > 32 || type->len != strlen(type->s))
        return up_bad(u, "torch.device with arguments other than a type and an index");
    if (args->n == 2 && u->t->v[args->items[1]].kind != DP_PY_NONE) {
        if (int_arg(u->t, args->items[1], &index))
            return up_bad(u, "torch.device with an index that is not an integer");
        snprintf(name, sizeof name, "%s:%lld", type->s, (long long)index);
    } else {
        snprintf(name, sizeof name, "%s", type->s);
    }
    return push_string(u, DP_PY_DEVICE, (const unsigned char *)name, strlen(name));
}

/* _codecs.encode(text, 'latin1'): each character of the (UTF-8) text,
 * all below U+0100, becomes one byte. */
static dp_status rebuild_bytes(unpickler *u, const py_value *args)
{
    const py_value *text = args->n == 2 ? &u->t->v[args->items[0]] : NULL;
    const py_value *enc = args->n == 2 ? &u->t->v[args->items[1]] : NULL;
    if (!text || text->kind != DP_PY_STR || enc->kind != DP_PY_STR || strcmp(enc->s, "latin1") != 0)
        return up_bad(u, "_codecs.encode with arguments other than a string and 'latin1'");
    unsigned char *out = malloc(text->len + 1);
    size_t n = 0;
    if (!out)
        return up_oom(u);
    const unsigned char *p = (const unsigned char *)text->s, *end = p + text->len;
    while (p < end) {
        if (*p < 0x80) {
            out[n++] = *p++;
        } else if ((*p == 0xC2 || *p == 0xC3) && p + 1 < end && (p[1] & 0xC0) == 0x80) {
            out[n++] = (unsigned char)((p[0] & 0x1F) << 6 | (p[1] & 0x3F));
            p += 2;
        } else {
            free(out);
            return up_bad(u, "_codecs.encode of a string with a character that latin1 cannot hold");
        }
    }
    dp_status st = push_string(u, DP_PY_BYTES, out, n);
    free(out);
    return st;
}

static dp_status op_reduce(unpickler *u)
{
    int args, fn, v;
    dp_status st;
    if ((st = pop(u, &args)) || (st = pop(u, &fn)))
        return st;
    const py_value *f = &u->t->v[fn], *a = &u->t->v[args];
    if (f->kind != PY_GLOBAL || f->sub == G_STORAGE)
        return up_bad(u, "REDUCE calls something that is not a known function");
    if (a->kind != DP_PY_TUPLE)
        return up_bad(u, "REDUCE with arguments that are not a tuple");
    switch (f->sub) {
    case G_ODICT:
        if (a->n != 0)
            return up_bad(u, "OrderedDict called with arguments");
        return push(u, new_value(u, DP_PY_ODICT));
    case G_REBUILD_TENSOR:
        if ((st = rebuild_tensor(u, a, &v)))
            return st;
        return push(u, v);
    case G_REBUILD_PARAM:
        if (a->n < 1 || u->t->v[a->items[0]].kind != DP_PY_TENSOR)
            return up_bad(u, "_rebuild_parameter of something that is not a tensor");
        return push(u, a->items[0]);
    case G_DEVICE:
        return rebuild_device(u, a);
    case G_SIZE:
        if (a->n != 1 || (u->t->v[a->items[0]].kind != DP_PY_TUPLE && u->t->v[a->items[0]].kind != DP_PY_LIST))
            return up_bad(u, "torch.Size called with something other than a tuple");
        return push(u, a->items[0]);   /* a tuple already; a list stays one */
    case G_ENCODE:
        return rebuild_bytes(u, a);
    case G_BYTES:
        if (a->n != 0)
            return up_bad(u, "bytes() called with arguments");
        return push_string(u, DP_PY_BYTES, (const unsigned char *)"", 0);
    }
    return up_bad(u, "REDUCE calls something that is not a known function");
}

/* BINPERSID: ('storage', torch.FloatStorage, key, location, numel) */
static dp_status op_persid(unpickler *u)
{
    int pid;
    int64_t numel;
    dp_status st = pop(u, &pid);
    if (st)
        return st;
    const py_value *p = &u->t->v[pid];
    if (p->kind != DP_PY_TUPLE || p->n != 5)
        return up_bad(u, "a persistent id that is not the tuple ('storage', type, key, location, numel)");
    const py_value *tag = &u->t->v[p->items[0]], *type = &u->t->v[p->items[1]], *key = &u->t->v[p->items[2]];
    if (tag->kind != DP_PY_STR || strcmp(tag->s, "storage") != 0)
        return up_bad(u, "a persistent id that is not a storage");
    if (type->kind != PY_GLOBAL || type->sub != G_STORAGE)
        return up_bad(u, "a storage whose type is not one of torch's storage classes");
    if (key->kind != DP_PY_STR || key->len != strlen(key->s) || key->len > 64 || strchr(key->s, '/'))
        return up_bad(u, "a storage key that is not a short string");
    if (int_arg(u->t, p->items[4], &numel) || numel < 0)
        return up_bad(u, "storage '%.64s' has a length that is not a non-negative integer", key->s);
    int type_index = (int)type->i;
    if ((st = push_string(u, PY_STORAGE, (const unsigned char *)key->s, key->len)))
        return st;
    py_value *s = &u->t->v[u->stack[u->sn - 1]];
    s->sub = type_index;
    s->i = numel;
    return DP_OK;
}

static dp_status memo_put(unpickler *u, uint64_t index)
{
    int v;
    dp_status st = top(u, &v);
    if (st)
        return st;
    if (index > (uint64_t)u->memon)
        return up_bad(u, "memo index %llu skips past the %d values memoized so far", (unsigned long long)index, u->memon);
    if (index == (uint64_t)u->memon) {
        if (grow(&u->memo, &u->memocap, u->memon + 1))
            return up_oom(u);
        u->memon++;
    }
    u->memo[index] = v;
    return DP_OK;
}

static dp_status memo_get(unpickler *u, uint64_t index)
{
    if (index >= (uint64_t)u->memon)
        return up_bad(u, "memo index %llu was never stored", (unsigned long long)index);
    return push(u, u->memo[index]);
}

/* BUILD sets an object's state; torch.save writes it for the attributes
 * of a state dict (its _metadata), which a checkpoint here does not keep. */
static dp_status op_build(unpickler *u)
{
    int state, obj;
    dp_status st;
    if ((st = pop(u, &state)) || (st = top(u, &obj)))
        return st;
    int kind = u->t->v[obj].kind;
    if (!is_dict(kind) && kind != DP_PY_TENSOR)
        return up_bad(u, "BUILD of a value that is not a dict or a tensor");
    return DP_OK;
}

static dp_status scalar_op(unpickler *u, int op, int *handled)
{
    const unsigned char *b, *s;
    size_t n;
    dp_status st;
    *handled = 1;
    switch (op) {
    case 'N': return push(u, new_value(u, DP_PY_NONE));
    case 0x88: case 0x89: {
        int v = new_value(u, DP_PY_BOOL);
        if (v >= 0)
            u->t->v[v].i = op == 0x88;
        return push(u, v);
    }
    case 'K': if ((st = take(u, 1, &b))) return st; return push_int(u, b[0]);
    case 'M': if ((st = take(u, 2, &b))) return st; return push_int(u, (int64_t)le(b, 2));
    case 'J': if ((st = take(u, 4, &b))) return st; return push_int(u, (int32_t)(uint32_t)le(b, 4));
    case 0x8a: return push_long(u, 1);
    case 0x8b: return push_long(u, 4);
    case 'G': {
        if ((st = take(u, 8, &b)))
            return st;
        uint64_t bits = 0;
        for (int i = 0; i < 8; i++)
            bits = bits << 8 | b[i];   /* big-endian */
        int v = new_value(u, DP_PY_FLOAT);
        if (v >= 0)
            memcpy(&u->t->v[v].f, &bits, 8);
        return push(u, v);
    }
    case 'X': if ((st = take_counted(u, 4, &s, &n))) return st; return push_string(u, DP_PY_STR, s, n);
    case 0x8c: if ((st = take_counted(u, 1, &s, &n))) return st; return push_string(u, DP_PY_STR, s, n);
    case 0x8d: if ((st = take_counted(u, 8, &s, &n))) return st; return push_string(u, DP_PY_STR, s, n);
    case 'B': case 'T': if ((st = take_counted(u, 4, &s, &n))) return st; return push_string(u, DP_PY_BYTES, s, n);
    case 'C': case 'U': if ((st = take_counted(u, 1, &s, &n))) return st; return push_string(u, DP_PY_BYTES, s, n);
    case 0x8e: if ((st = take_counted(u, 8, &s, &n))) return st; return push_string(u, DP_PY_BYTES, s, n);
    }
    *handled = 0;
    return DP_OK;
}

static dp_status run_op(unpickler *u, int op)
{
    const unsigned char *b;
    int v, w, first, handled;
    dp_status st = scalar_op(u, op, &handled);
    if (handled || st)
        return st;
    switch (op) {
    case 0x80:
        if ((st = take(u, 1, &b)))
            return st;
        if (b[0] > 5)
            return up_bad(u, "pickle protocol %d (the newest is 5)", b[0]);
        return DP_OK;
    case 0x95: return take(u, 8, &b);   /* FRAME: its length is only a hint */
    case '(':
        if (grow(&u->marks, &u->mcap, u->mn + 1))
            return up_oom(u);
        u->marks[u->mn++] = u->sn;
        return DP_OK;
    case ')': return push(u, new_value(u, DP_PY_TUPLE));
    case ']': return push(u, new_value(u, DP_PY_LIST));
    case '}': return push(u, new_value(u, DP_PY_DICT));
    case 't': if ((st = pop_mark(u, &first))) return st; return collect(u, DP_PY_TUPLE, first);
    case 'l': if ((st = pop_mark(u, &first))) return st; return collect(u, DP_PY_LIST, first);
    case 'd': if ((st = pop_mark(u, &first))) return st; return collect(u, DP_PY_DICT, first);
    case 0x85: case 0x86: case 0x87:
        if (u->sn - floor_of_stack(u) < op - 0x84)
            return up_bad(u, "TUPLE%d with fewer values on the stack", op - 0x84);
        return collect(u, DP_PY_TUPLE, u->sn - (op - 0x84));
    case 'a': return add_items(u, u->sn - 1, 0);
    case 'e': if ((st = pop_mark(u, &first))) return st; return add_items(u, first, 0);
    case 's':
        if (u->sn - floor_of_stack(u) < 3)
            return up_bad(u, "SETITEM with fewer than a dict, a key and a value on the stack");
        return add_items(u, u->sn - 2, 1);
    case 'u': if ((st = pop_mark(u, &first))) return st; return add_items(u, first, 1);
    case 'c': return op_global(u);
    case 0x93: return op_stack_global(u);
    case 'R': return op_reduce(u);
    case 'Q': return op_persid(u);
    case 'b': return op_build(u);
    case 'q': if ((st = take(u, 1, &b))) return st; return memo_put(u, b[0]);
    case 'r': if ((st = take(u, 4, &b))) return st; return memo_put(u, le(b, 4));
    case 0x94: return memo_put(u, (uint64_t)u->memon);
    case 'h': if ((st = take(u, 1, &b))) return st; return memo_get(u, b[0]);
    case 'j': if ((st = take(u, 4, &b))) return st; return memo_get(u, le(b, 4));
    case '0': return pop(u, &v);
    case '1':
        if ((st = pop_mark(u, &first)))
            return st;
        u->sn = first;
        return DP_OK;
    case '2': if ((st = top(u, &w))) return st; return push(u, w);
    }
    if (op >= 0x20 && op < 0x7f)
        return up_bad(u, "opcode '%c' (0x%02x), which torch.load does not run", op, op);
    return up_bad(u, "opcode 0x%02x, which torch.load does not run", op);
}

dp_status py_unpickle(py_tree *tree, const char *data, size_t len, const char *what)
{
    unpickler u;
    memset(&u, 0, sizeof u);
    memset(tree, 0, sizeof *tree);
    u.t = tree;
    u.p = (const unsigned char *)data;
    u.len = len;
    u.what = what;
    dp_status st = DP_OK;
    int done = 0;
    while (!st && !done) {
        u.op_pos = u.pos;
        if (u.pos >= u.len) {
            st = up_bad(&u, "the pickle ends without its STOP opcode (a truncated file?)");
            break;
        }
        int op = u.p[u.pos++];
        if (op == '.') {
            done = 1;
            st = pop(&u, &tree->root);
        } else {
            st = run_op(&u, op);
        }
    }
    free(u.stack);
    free(u.marks);
    free(u.memo);
    if (st)
        py_tree_free(tree);
    return st;
}

void py_tree_free(py_tree *tree)
{
    for (int i = 0; i < tree->n; i++) {
        free(tree->v[i].s);
        free(tree->v[i].items);
        free(tree->v[i].view);
    }
    free(tree->v);
    memset(tree, 0, sizeof *tree);
}

/* ---------------------------------------------------------------- the pickler */

void py_pickler_init(py_pickler *p)
{
    memset(p, 0, sizeof *p);
}

void py_pickler_free(py_pickler *p)
{
    free(p->p);
    free(p->tensors);
    memset(p, 0, sizeof *p);
}

static void put(py_pickler *p, const void *s, size_t n)
{
    if (p->oom)
        return;
    if (p->cap - p->len < n) {
        size_t cap = p->cap ? p->cap : 1024;
        while (cap - p->len < n)
            cap *= 2;
        char *q = realloc(p->p, cap);
        if (!q) {
            p->oom = 1;
            return;
        }
        p->p = q;
        p->cap = cap;
    }
    memcpy(p->p + p->len, s, n);
    p->len += n;
}

static void put_op(py_pickler *p, int op) { unsigned char c = (unsigned char)op; put(p, &c, 1); }

static void put_le(py_pickler *p, uint64_t v, int n)
{
    unsigned char b[8];
    for (int i = 0; i < n; i++)
        b[i] = (unsigned char)(v >> (8 * i));
    put(p, b, (size_t)n);
}

static dp_status status_of(const py_pickler *p)
{
    return p->oom ? dp_fail(DP_ERR_MEMORY, "pickle: out of memory") : DP_OK;
}

static void put_global(py_pickler *p, const char *module, const char *name)
{
    put_op(p, 'c');
    put(p, module, strlen(module));
    put_op(p, '\n');
    put(p, name, strlen(name));
    put_op(p, '\n');
}

static void emit_int(py_pickler *p, int64_t v)
{
    if (v >= 0 && v < 256) {
        put_op(p, 'K');
        put_le(p, (uint64_t)v, 1);
    } else if (v >= 0 && v < 65536) {
        put_op(p, 'M');
        put_le(p, (uint64_t)v, 2);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
        put_op(p, 'J');
        put_le(p, (uint64_t)v, 4);
    } else {
        /* LONG1: the fewest two's complement bytes that keep the sign */
        int n = 8;
        while (n > 1 && ((v >> (8 * (n - 1) - 1)) == 0 || (v >> (8 * (n - 1) - 1)) == -1))
            n--;
        put_op(p, 0x8a);
        put_le(p, (uint64_t)n, 1);
        put_le(p, (uint64_t)v, n);
    }
}

static void emit_str(py_pickler *p, const char *s, size_t len)
{
    put_op(p, 'X');
    put_le(p, len, 4);
    put(p, s, len);
}

dp_status py_put_none(py_pickler *p) { put_op(p, 'N'); return status_of(p); }
dp_status py_put_bool(py_pickler *p, int v) { put_op(p, v ? 0x88 : 0x89); return status_of(p); }
dp_status py_put_int(py_pickler *p, int64_t v) { emit_int(p, v); return status_of(p); }

dp_status py_put_float(py_pickler *p, double v)
{
    uint64_t bits;
    unsigned char b[8];
    memcpy(&bits, &v, 8);
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(bits >> (56 - 8 * i));
    put_op(p, 'G');
    put(p, b, 8);
    return status_of(p);
}

dp_status py_put_str(py_pickler *p, const char *s, size_t len)
{
    if (len > 0xFFFFFFFFu)
        return dp_fail(DP_ERR_ARG, "pickle: a string of %zu bytes is over the 4 GiB that protocol 2 holds", len);
    emit_str(p, s, len);
    return status_of(p);
}

static const char *torch_dtype_name(int dtype)
{
    switch (dtype) {
    case DP_FLOAT32: return "float32";
    case DP_FLOAT64: return "float64";
    case DP_INT64: return "int64";
    case DP_INT32: return "int32";
    case DP_UINT8: return "uint8";
    case DP_BOOL: return "bool";
    case DP_BFLOAT16: return "bfloat16";
    }
    return NULL;
}

dp_status py_put_dtype(py_pickler *p, int dtype)
{
    const char *name = torch_dtype_name(dtype);
    if (!name)
        return dp_fail(DP_ERR_DTYPE, "pickle: unknown dtype %d", dtype);
    put_global(p, "torch", name);
    return status_of(p);
}

dp_status py_put_device(py_pickler *p, const char *type, int index)
{
    put_global(p, "torch", "device");
    put_op(p, '(');
    emit_str(p, type, strlen(type));
    if (index >= 0)
        emit_int(p, index);
    put_op(p, 't');
    put_op(p, 'R');
    return status_of(p);
}

static const char *storage_class(int dtype)
{
    switch (dtype) {
    case DP_FLOAT32: return "FloatStorage";
    case DP_FLOAT64: return "DoubleStorage";
    case DP_INT64: return "LongStorage";
    case DP_INT32: return "IntStorage";
    case DP_UINT8: return "ByteStorage";
    case DP_BOOL: return "BoolStorage";
    case DP_BFLOAT16: return "BFloat16Storage";
    }
    return NULL;
}

/* A tensor over a contiguous storage of its own (one per distinct tensor). */
dp_status py_put_tensor(py_pickler *p, dp_tensor *t)
{
    const char *cls = storage_class(t->dtype);
    char key[24];
    int k = 0;
    if (!cls)
        return dp_fail(DP_ERR_DTYPE, "pickle: a tensor of dtype %s has no torch storage class", dp_dtype_name(t->dtype));
    while (k < p->ntensors && p->tensors[k] != t)
        k++;
    if (k == p->ntensors) {
        if (p->ntensors == p->tcap) {
            int cap = p->tcap ? 2 * p->tcap : 16;
            dp_tensor **q = realloc(p->tensors, sizeof *q * (size_t)cap);
            if (!q)
                return dp_fail(DP_ERR_MEMORY, "pickle: out of memory");
            p->tensors = q;
            p->tcap = cap;
        }
        p->tensors[p->ntensors++] = t;
    }
    snprintf(key, sizeof key, "%d", k);
    put_global(p, "torch._utils", "_rebuild_tensor_v2");
    put_op(p, '(');
    put_op(p, '(');
    emit_str(p, "storage", 7);
    put_global(p, "torch", cls);
    emit_str(p, key, strlen(key));
    emit_str(p, "cpu", 3);
    emit_int(p, dp_tensor_numel(t));
    put_op(p, 't');
    put_op(p, 'Q');
    emit_int(p, 0);
    int64_t stride = 1, strides[DP_MAX_DIMS];
    for (int d = t->ndim - 1; d >= 0; d--) {
        strides[d] = stride;
        stride *= t->shape[d];
    }
    put_op(p, '(');
    for (int d = 0; d < t->ndim; d++)
        emit_int(p, t->shape[d]);
    put_op(p, 't');
    put_op(p, '(');
    for (int d = 0; d < t->ndim; d++)
        emit_int(p, strides[d]);
    put_op(p, 't');
    put_op(p, 0x89);
    put_global(p, "collections", "OrderedDict");
    put_op(p, ')');
    put_op(p, 'R');
    put_op(p, 't');
    put_op(p, 'R');
    return status_of(p);
}

dp_status py_begin(py_pickler *p, int kind)
{
    if (p->depth == (int)(sizeof p->kinds / sizeof p->kinds[0]))
        return dp_fail(DP_ERR_ARG, "pickle: containers nested deeper than %d levels", p->depth);
    switch (kind) {
    case DP_PY_LIST: put_op(p, ']'); break;
    case DP_PY_DICT: put_op(p, '}'); break;
    case DP_PY_ODICT: put_global(p, "collections", "OrderedDict"); put_op(p, ')'); put_op(p, 'R'); break;
    case DP_PY_TUPLE: break;
    default: return dp_fail(DP_ERR_ARG, "pickle: kind %d is not a container", kind);
    }
    put_op(p, '(');
    p->kinds[p->depth++] = kind;
    return status_of(p);
}

dp_status py_end(py_pickler *p)
{
    if (p->depth == 0)
        return dp_fail(DP_ERR_STATE, "pickle: a container closed that was never opened");
    int kind = p->kinds[--p->depth];
    put_op(p, kind == DP_PY_LIST ? 'e' : kind == DP_PY_TUPLE ? 't' : 'u');
    return status_of(p);
}

dp_status py_finish(py_pickler *p)
{
    if (p->depth)
        return dp_fail(DP_ERR_STATE, "pickle: %d containers still open", p->depth);
    put_op(p, '.');
    if (!p->oom) {   /* PROTO 2 in front */
        put(p, "\0\0", 2);
        if (!p->oom) {
            memmove(p->p + 2, p->p, p->len - 2);
            p->p[0] = (char)0x80;
            p->p[1] = 2;
        }
    }
    return status_of(p);
}
