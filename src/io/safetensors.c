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
 * the strict JSON parser below (RFC 8259: no trailing commas, no comments,
 * valid UTF-8, no duplicate keys, a nesting limit); every tensor's dtype,
 * shape and byte count must agree; and, as the reference implementation
 * requires, the tensors must tile the data exactly: in bounds, no overlap,
 * no hole, nothing left over. So every byte a tensor reads lies inside the
 * file, and no allocation is larger than the file. Data is read with
 * pread() into new tensors (not mmap: a file truncated under a mapping
 * would kill the process with SIGBUS instead of failing the read).
 *
 * The writer writes `path.tmp.<pid>`, fsyncs it, renames it over `path`
 * and fsyncs the directory: a reader (or a crash) sees the old file or
 * the new one, never a part of either.
 *
 * Every failure is a dp_fail that names the file and the problem.
 */
#include "core/tensor.h"

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
#define ST_MAX_DEPTH 64
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

/* ---------------------------------------------------------------- arena */

/* Everything the parser makes lives in one arena, freed at once. */
typedef struct arena_block {
    struct arena_block *next;
    size_t used, cap;
    _Alignas(16) char data[];
} arena_block;

static void *arena_alloc(arena_block **a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (!*a || (*a)->cap - (*a)->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        arena_block *b = malloc(sizeof *b + cap);
        if (!b)
            return NULL;
        b->next = *a;
        b->used = 0;
        b->cap = cap;
        *a = b;
    }
    void *p = (*a)->data + (*a)->used;
    (*a)->used += n;
    return p;
}

static void arena_free(arena_block *a)
{
    while (a) {
        arena_block *next = a->next;
        free(a);
        a = next;
    }
}

/* A name for messages: cut short, control characters escaped. */
static const char *printable(char *buf, size_t size, const char *s, size_t len)
{
    size_t o = 0, i;
    for (i = 0; i < len && o + 8 < size; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f)
            o += (size_t)snprintf(buf + o, size - o, "\\x%02x", c);
        else
            buf[o++] = (char)c;
    }
    if (i < len)
        o += (size_t)snprintf(buf + o, size - o, "...");
    buf[o < size ? o : size - 1] = 0;
    return buf;
}

/* ---------------------------------------------------------------- JSON */

enum { JS_NULL, JS_FALSE, JS_TRUE, JS_NUMBER, JS_STRING, JS_ARRAY, JS_OBJECT };

typedef struct js_value {
    int type;
    int n;                    /* array elements or object members */
    struct js_value *items;   /* array elements, object member values */
    char **keys;              /* object member names (decoded) */
    size_t *key_lens;
    char *str;                /* a string (decoded) or a number's text */
    size_t len;
    size_t pos;               /* where it starts in the header, for messages */
} js_value;

typedef struct {
    const char *text, *p, *end;
    const char *path;
    arena_block **arena;
    dp_status st;             /* the first failure */
} js_parser;

static dp_status js_fail(js_parser *js, const char *fmt, const char *what)
{
    if (!js->st)
        js->st = dp_fail(DP_ERR_IO, "safetensors: '%s': malformed header JSON at byte %lld of the header: %s%s",
                         js->path, (long long)(js->p - js->text), fmt, what ? what : "");
    return js->st;
}

static void js_skip_ws(js_parser *js)
{
    while (js->p < js->end && (*js->p == ' ' || *js->p == '\t' || *js->p == '\n' || *js->p == '\r'))
        js->p++;
}

static int hex_value(int c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int js_hex4(js_parser *js, unsigned *out)
{
    if (js->end - js->p < 4)
        return js_fail(js, "truncated \\u escape", NULL);
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hex_value((unsigned char)js->p[i]);
        if (h < 0)
            return js_fail(js, "bad hex digit in a \\u escape", NULL);
        v = v << 4 | (unsigned)h;
    }
    js->p += 4;
    *out = v;
    return 0;
}

static size_t utf8_put(char *o, unsigned cp)
{
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | cp >> 6); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12); o[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18); o[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (char)(0x80 | (cp >> 6 & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* The length of the valid UTF-8 sequence at p (strict: no overlong forms,
 * no surrogates, nothing above U+10FFFF), or 0. */
static size_t utf8_valid(const unsigned char *p, const unsigned char *end)
{
    unsigned c = p[0];
    size_t n;
    unsigned cp, min;
    if (c < 0x80) return 1;
    if ((c & 0xE0) == 0xC0) { n = 2; cp = c & 0x1F; min = 0x80; }
    else if ((c & 0xF0) == 0xE0) { n = 3; cp = c & 0x0F; min = 0x800; }
    else if ((c & 0xF8) == 0xF0) { n = 4; cp = c & 0x07; min = 0x10000; }
    else return 0;
    if ((size_t)(end - p) < n)
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80)
            return 0;
        cp = cp << 6 | (p[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return n;
}

/* A string at js->p (the opening quote), decoded into the arena. */
static int js_string(js_parser *js, char **out, size_t *out_len)
{
    const char *q = js->p + 1;
    /* the decoded text is never longer than the source */
    const char *close = q;
    while (close < js->end && *close != '"') {
        if (*close == '\\' && close + 1 < js->end)
            close++;
        close++;
    }
    if (close >= js->end)
        return js_fail(js, "unterminated string", NULL);
    char *o = arena_alloc(js->arena, (size_t)(close - q) + 1);
    if (!o)
        return js->st = dp_fail(DP_ERR_MEMORY, "safetensors: '%s': out of memory parsing the header", js->path);
    size_t n = 0;
    js->p = q;
    while (js->p < js->end && *js->p != '"') {
        unsigned char c = (unsigned char)*js->p;
        if (c < 0x20)
            return js_fail(js, "a control character inside a string", NULL);
        if (c == '\\') {
            js->p++;
            if (js->p >= js->end)
                return js_fail(js, "unterminated escape", NULL);
            char e = *js->p++;
            switch (e) {
            case '"': o[n++] = '"'; break;
            case '\\': o[n++] = '\\'; break;
            case '/': o[n++] = '/'; break;
            case 'b': o[n++] = '\b'; break;
            case 'f': o[n++] = '\f'; break;
            case 'n': o[n++] = '\n'; break;
            case 'r': o[n++] = '\r'; break;
            case 't': o[n++] = '\t'; break;
            case 'u': {
                unsigned cp, lo;
                if (js_hex4(js, &cp))
                    return js->st;
                if (cp >= 0xDC00 && cp <= 0xDFFF)
                    return js_fail(js, "a lone low surrogate in a \\u escape", NULL);
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    if (js->end - js->p < 2 || js->p[0] != '\\' || js->p[1] != 'u')
                        return js_fail(js, "a high surrogate without its low surrogate", NULL);
                    js->p += 2;
                    if (js_hex4(js, &lo))
                        return js->st;
                    if (lo < 0xDC00 || lo > 0xDFFF)
                        return js_fail(js, "a high surrogate without its low surrogate", NULL);
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                }
                n += utf8_put(o + n, cp);
                break;
            }
            default:
                return js_fail(js, "an invalid escape in a string", NULL);
            }
        } else {
            size_t k = utf8_valid((const unsigned char *)js->p, (const unsigned char *)js->end);
            if (k == 0)
                return js_fail(js, "invalid UTF-8 in a string", NULL);
            memcpy(o + n, js->p, k);
            n += k;
            js->p += k;
        }
    }
    if (js->p >= js->end)
        return js_fail(js, "unterminated string", NULL);
    js->p++;
    o[n] = 0;
    *out = o;
    *out_len = n;
    return 0;
}

static int is_digit(int c) { return c >= '0' && c <= '9'; }

/* A number: RFC 8259's grammar; the text is kept for later conversion. */
static int js_number(js_parser *js, js_value *v)
{
    const char *s = js->p;
    if (js->p < js->end && *js->p == '-')
        js->p++;
    if (js->p >= js->end || !is_digit(*js->p))
        return js_fail(js, "a malformed number", NULL);
    if (*js->p == '0') {
        js->p++;
        if (js->p < js->end && is_digit(*js->p))
            return js_fail(js, "a number with a leading zero", NULL);
    } else {
        while (js->p < js->end && is_digit(*js->p))
            js->p++;
    }
    if (js->p < js->end && *js->p == '.') {
        js->p++;
        if (js->p >= js->end || !is_digit(*js->p))
            return js_fail(js, "a malformed number (no digit after '.')", NULL);
        while (js->p < js->end && is_digit(*js->p))
            js->p++;
    }
    if (js->p < js->end && (*js->p == 'e' || *js->p == 'E')) {
        js->p++;
        if (js->p < js->end && (*js->p == '+' || *js->p == '-'))
            js->p++;
        if (js->p >= js->end || !is_digit(*js->p))
            return js_fail(js, "a malformed number (no digit in the exponent)", NULL);
        while (js->p < js->end && is_digit(*js->p))
            js->p++;
    }
    v->type = JS_NUMBER;
    v->str = (char *)s;
    v->len = (size_t)(js->p - s);
    return 0;
}

static int js_value_parse(js_parser *js, js_value *v, int depth);

/* Grows a temporary vector of parsed elements; returns 0 or a failure. */
static int js_grow(js_parser *js, void **items, size_t elem, int *cap, int n)
{
    if (n < *cap)
        return 0;
    if (*cap > (1 << 28))
        return js_fail(js, "too many elements in one array or object", NULL);
    int ncap = *cap ? *cap * 2 : 8;
    void *p = realloc(*items, (size_t)ncap * elem);
    if (!p)
        return js->st = dp_fail(DP_ERR_MEMORY, "safetensors: '%s': out of memory parsing the header", js->path);
    *items = p;
    *cap = ncap;
    return 0;
}

/* Moves the temporary vectors into the arena. */
static int js_settle(js_parser *js, js_value *v, js_value *items, char **keys, size_t *lens, int n)
{
    v->n = n;
    v->items = NULL;
    v->keys = NULL;
    v->key_lens = NULL;
    if (n == 0)
        return 0;
    v->items = arena_alloc(js->arena, sizeof *items * (size_t)n);
    if (keys) {
        v->keys = arena_alloc(js->arena, sizeof *keys * (size_t)n);
        v->key_lens = arena_alloc(js->arena, sizeof *lens * (size_t)n);
    }
    if (!v->items || (keys && (!v->keys || !v->key_lens)))
        return js->st = dp_fail(DP_ERR_MEMORY, "safetensors: '%s': out of memory parsing the header", js->path);
    memcpy(v->items, items, sizeof *items * (size_t)n);
    if (keys) {
        memcpy(v->keys, keys, sizeof *keys * (size_t)n);
        memcpy(v->key_lens, lens, sizeof *lens * (size_t)n);
    }
    return 0;
}

static int js_array(js_parser *js, js_value *v, int depth)
{
    js_value *items = NULL;
    int cap = 0, n = 0;
    v->type = JS_ARRAY;
    js->p++;
    js_skip_ws(js);
    if (js->p < js->end && *js->p == ']') {
        js->p++;
        return js_settle(js, v, NULL, NULL, NULL, 0);
    }
    for (;;) {
        if (js_grow(js, (void **)&items, sizeof *items, &cap, n) || js_value_parse(js, &items[n], depth + 1))
            break;
        n++;
        js_skip_ws(js);
        if (js->p < js->end && *js->p == ',') {
            js->p++;
            continue;
        }
        if (js->p < js->end && *js->p == ']') {
            js->p++;
            js_settle(js, v, items, NULL, NULL, n);
            break;
        }
        js_fail(js, js->p < js->end ? "expected ',' or ']' in an array" : "unterminated array", NULL);
        break;
    }
    free(items);
    return js->st;
}

/* Duplicate names are refused: JSON leaves them undefined, and a reader
 * that kept the first would see another file than one that kept the last. */
static int js_check_duplicates(js_parser *js, char **keys, size_t *lens, int n)
{
    /* small objects: a quadratic scan; large: sort a copy */
    if (n < 64) {
        for (int i = 0; i < n; i++)
            for (int j = 0; j < i; j++)
                if (lens[i] == lens[j] && memcmp(keys[i], keys[j], lens[i]) == 0) {
                    char kb[96];
                    return js_fail(js, "duplicate key ", printable(kb, sizeof kb, keys[i], lens[i]));
                }
        return 0;
    }
    return -1;   /* checked by the caller after sorting */
}

typedef struct { const char *s; size_t len; } key_ref;

static int key_cmp(const void *a, const void *b)
{
    const key_ref *x = a, *y = b;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->s, y->s, n);
    if (c)
        return c;
    return x->len < y->len ? -1 : x->len > y->len;
}

static int js_check_duplicates_sorted(js_parser *js, char **keys, size_t *lens, int n)
{
    key_ref *refs = malloc(sizeof *refs * (size_t)n);
    if (!refs)
        return js->st = dp_fail(DP_ERR_MEMORY, "safetensors: '%s': out of memory parsing the header", js->path);
    for (int i = 0; i < n; i++) {
        refs[i].s = keys[i];
        refs[i].len = lens[i];
    }
    qsort(refs, (size_t)n, sizeof *refs, key_cmp);
    for (int i = 1; i < n; i++)
        if (key_cmp(&refs[i - 1], &refs[i]) == 0) {
            char kb[96];
            js_fail(js, "duplicate key ", printable(kb, sizeof kb, refs[i].s, refs[i].len));
            break;
        }
    free(refs);
    return js->st;
}

static int js_object(js_parser *js, js_value *v, int depth)
{
    js_value *items = NULL;
    char **keys = NULL;
    size_t *lens = NULL;
    int cap = 0, kcap = 0, lcap = 0, n = 0;
    v->type = JS_OBJECT;
    js->p++;
    js_skip_ws(js);
    if (js->p < js->end && *js->p == '}') {
        js->p++;
        return js_settle(js, v, NULL, NULL, NULL, 0);
    }
    for (;;) {
        if (js_grow(js, (void **)&items, sizeof *items, &cap, n) ||
            js_grow(js, (void **)&keys, sizeof *keys, &kcap, n) ||
            js_grow(js, (void **)&lens, sizeof *lens, &lcap, n))
            break;
        js_skip_ws(js);
        if (js->p >= js->end || *js->p != '"') {
            js_fail(js, js->p < js->end ? "expected a string key in an object" : "unterminated object", NULL);
            break;
        }
        if (js_string(js, &keys[n], &lens[n]))
            break;
        js_skip_ws(js);
        if (js->p >= js->end || *js->p != ':') {
            js_fail(js, "expected ':' after a key", NULL);
            break;
        }
        js->p++;
        if (js_value_parse(js, &items[n], depth + 1))
            break;
        n++;
        js_skip_ws(js);
        if (js->p < js->end && *js->p == ',') {
            js->p++;
            continue;
        }
        if (js->p < js->end && *js->p == '}') {
            js->p++;
            if (js_check_duplicates(js, keys, lens, n) < 0)
                js_check_duplicates_sorted(js, keys, lens, n);
            if (!js->st)
                js_settle(js, v, items, keys, lens, n);
            break;
        }
        js_fail(js, js->p < js->end ? "expected ',' or '}' in an object" : "unterminated object", NULL);
        break;
    }
    free(items);
    free(keys);
    free(lens);
    return js->st;
}

static int js_literal(js_parser *js, const char *word, int type, js_value *v)
{
    size_t n = strlen(word);
    if ((size_t)(js->end - js->p) < n || memcmp(js->p, word, n) != 0)
        return js_fail(js, "an unexpected character", NULL);
    js->p += n;
    v->type = type;
    return 0;
}

static int js_value_parse(js_parser *js, js_value *v, int depth)
{
    memset(v, 0, sizeof *v);
    if (depth > ST_MAX_DEPTH)
        return js_fail(js, "nesting deeper than 64 levels", NULL);
    js_skip_ws(js);
    if (js->p >= js->end)
        return js_fail(js, "unexpected end of the header (a value was expected)", NULL);
    v->pos = (size_t)(js->p - js->text);
    switch (*js->p) {
    case '{': return js_object(js, v, depth);
    case '[': return js_array(js, v, depth);
    case '"': v->type = JS_STRING; return js_string(js, &v->str, &v->len);
    case 't': return js_literal(js, "true", JS_TRUE, v);
    case 'f': return js_literal(js, "false", JS_FALSE, v);
    case 'n': return js_literal(js, "null", JS_NULL, v);
    default:
        if (*js->p == '-' || is_digit(*js->p))
            return js_number(js, v);
        return js_fail(js, "an unexpected character", NULL);
    }
}

/* A non-negative integer without fraction or exponent, up to INT64_MAX. */
static int js_uint(const js_value *v, int64_t *out)
{
    if (v->type != JS_NUMBER || v->len == 0 || v->str[0] == '-')
        return -1;
    int64_t x = 0;
    for (size_t i = 0; i < v->len; i++) {
        if (!is_digit(v->str[i]))
            return -1;
        int d = v->str[i] - '0';
        if (x > (INT64_MAX - d) / 10)
            return -2;
        x = x * 10 + d;
    }
    *out = x;
    return 0;
}

static const char *js_type_name(int type)
{
    static const char *const names[] = { "null", "false", "true", "a number", "a string", "an array", "an object" };
    return names[type];
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
    arena_block *arena;
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

static dp_status st_metadata(dp_safetensors *f, const js_value *m)
{
    char nb[96];
    if (m->type != JS_OBJECT)
        return st_bad(f, "\"__metadata__\" is %s, expected an object of strings", js_type_name(m->type));
    f->n_meta = m->n;
    f->meta_keys = arena_alloc(&f->arena, sizeof(char *) * (size_t)(m->n + 1));
    f->meta_values = arena_alloc(&f->arena, sizeof(char *) * (size_t)(m->n + 1));
    if (!f->meta_keys || !f->meta_values)
        return dp_fail(DP_ERR_MEMORY, "safetensors: '%s': out of memory", f->path);
    for (int i = 0; i < m->n; i++) {
        const js_value *v = &m->items[i];
        printable(nb, sizeof nb, m->keys[i], m->key_lens[i]);
        if (v->type != JS_STRING)
            return st_bad(f, "\"__metadata__\" entry \"%s\" is %s, expected a string", nb, js_type_name(v->type));
        if (strlen(m->keys[i]) != m->key_lens[i] || strlen(v->str) != v->len)
            return st_bad(f, "\"__metadata__\" entry \"%s\" contains a NUL character", nb);
        f->meta_keys[i] = m->keys[i];
        f->meta_values[i] = v->str;
    }
    return DP_OK;
}

static int st_dtype_lookup(const js_value *v, int *dtype)
{
    for (int i = 0; i < ST_NUM_DTYPES; i++)
        if (strlen(st_dtypes[i].name) == v->len && memcmp(st_dtypes[i].name, v->str, v->len) == 0) {
            *dtype = st_dtypes[i].dtype;
            return 1;
        }
    return 0;
}

static dp_status st_shape(dp_safetensors *f, const char *nb, const js_value *v, st_entry *e)
{
    if (v->type != JS_ARRAY)
        return st_bad(f, "tensor \"%s\": \"shape\" is %s, expected an array of sizes", nb, js_type_name(v->type));
    if (v->n > DP_MAX_DIMS)
        return st_bad(f, "tensor \"%s\": %d dims, at most %d are supported", nb, v->n, DP_MAX_DIMS);
    e->ndim = v->n;
    for (int d = 0; d < v->n; d++) {
        int r = js_uint(&v->items[d], &e->shape[d]);
        if (r == -2)
            return st_bad(f, "tensor \"%s\": size %d of \"shape\" is too large", nb, d);
        if (r)
            return st_bad(f, "tensor \"%s\": size %d of \"shape\" is not a non-negative integer", nb, d);
    }
    return DP_OK;
}

static dp_status st_offsets(dp_safetensors *f, const char *nb, const js_value *v, st_entry *e)
{
    if (v->type != JS_ARRAY || v->n != 2)
        return st_bad(f, "tensor \"%s\": \"data_offsets\" must be an array of two integers [begin, end]", nb);
    for (int k = 0; k < 2; k++) {
        int r = js_uint(&v->items[k], k ? &e->end : &e->begin);
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
static dp_status st_entry_parse(dp_safetensors *f, const char *name, size_t name_len, const js_value *v,
                                st_entry *e)
{
    char nb[96], sb[160], need[32];
    dp_status st;
    const js_value *dt = NULL, *shape = NULL, *offs = NULL;
    printable(nb, sizeof nb, name, name_len);
    if (strlen(name) != name_len)
        return st_bad(f, "tensor name \"%s\" contains a NUL character", nb);
    if (v->type != JS_OBJECT)
        return st_bad(f, "tensor \"%s\" is %s, expected an object with dtype, shape and data_offsets",
                      nb, js_type_name(v->type));
    for (int i = 0; i < v->n; i++) {
        const char *k = v->keys[i];
        size_t kl = v->key_lens[i];
        if (kl == 5 && memcmp(k, "dtype", 5) == 0) dt = &v->items[i];
        else if (kl == 5 && memcmp(k, "shape", 5) == 0) shape = &v->items[i];
        else if (kl == 12 && memcmp(k, "data_offsets", 12) == 0) offs = &v->items[i];
        else {
            char kb[64];
            return st_bad(f, "tensor \"%s\": unexpected field \"%s\" (expected dtype, shape and data_offsets)",
                          nb, printable(kb, sizeof kb, k, v->key_lens[i]));
        }
    }
    if (!dt || !shape || !offs)
        return st_bad(f, "tensor \"%s\": missing \"%s\"", nb, !dt ? "dtype" : !shape ? "shape" : "data_offsets");
    e->name = name;
    if (dt->type != JS_STRING)
        return st_bad(f, "tensor \"%s\": \"dtype\" is %s, expected a string such as \"F32\"", nb, js_type_name(dt->type));
    if (!st_dtype_lookup(dt, &e->dtype)) {
        char db[48];
        return st_bad(f, "tensor \"%s\": unknown dtype \"%s\" (dplua reads " ST_SUPPORTED ")", nb,
                      printable(db, sizeof db, dt->str, dt->len));
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
                        printable(ab, sizeof ab, prev->name, strlen(prev->name)), (long long)prev->begin,
                        (long long)prev->end, printable(bb, sizeof bb, e->name, strlen(e->name)),
                        (long long)e->begin, (long long)e->end);
        else if (e->begin > pos)
            st = st_bad(f, "bytes %lld to %lld of the data belong to no tensor (a hole before \"%s\")",
                        (long long)pos, (long long)e->begin, printable(ab, sizeof ab, e->name, strlen(e->name)));
        pos = e->end;
        prev = e;
    }
    if (!st && pos != f->data_len)
        st = st_bad(f, "the tensors end at byte %lld of the data but the file holds %lld bytes of data "
                    "(trailing bytes after the last tensor)", (long long)pos, (long long)f->data_len);
    free(order);
    return st;
}

static dp_status st_header(dp_safetensors *f, const char *text, int64_t len)
{
    js_parser js = { text, text, text + len, f->path, &f->arena, DP_OK };
    js_value root;
    if (len == 0 || text[0] != '{')
        return st_bad(f, "the header does not start with '{' (not a safetensors file?)");
    if (js_value_parse(&js, &root, 0))
        return js.st;
    js_skip_ws(&js);
    if (js.p != js.end)
        return js_fail(&js, "unexpected data after the header object", NULL);
    int ntensors = 0;
    for (int i = 0; i < root.n; i++)
        ntensors += strcmp(root.keys[i], "__metadata__") != 0 || root.key_lens[i] != 12;
    f->entries = arena_alloc(&f->arena, sizeof *f->entries * (size_t)(ntensors + 1));
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
    arena_free(f->arena);
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
                          printable(nb, sizeof nb, e->name, strlen(e->name)), p[i], (long long)i);
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
        st = st_bad(f, "reading tensor \"%s\": %s", printable(nb, sizeof nb, e->name, strlen(e->name)), strerror(errno));
    } else if (got != n) {
        st = st_bad(f, "reading tensor \"%s\": the file ended early (it changed after it was opened?)",
                    printable(nb, sizeof nb, e->name, strlen(e->name)));
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

static int utf8_string_valid(const char *s)
{
    const unsigned char *p = (const unsigned char *)s, *end = p + strlen(s);
    while (p < end) {
        size_t k = utf8_valid(p, end);
        if (!k)
            return 0;
        p += k;
    }
    return 1;
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
        if (!utf8_string_valid(names[i]))
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

/* fsyncs the directory that holds path, so that the rename is durable.
 * Filesystems that cannot sync a directory (EINVAL) are let be. */
static dp_status st_sync_dir(const char *path)
{
    char *dir = strdup(path);
    if (!dir)
        return dp_fail(DP_ERR_MEMORY, "safetensors: saving '%s': out of memory", path);
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
            st = dp_fail(DP_ERR_IO, "safetensors: saving '%s': fsync of the directory '%s' failed: %s",
                         path, dir, strerror(errno));
        close(fd);
    }
    free(dir);
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
    if (!st && fsync(fd) != 0)
        st = dp_fail(DP_ERR_IO, "safetensors: fsync of '%s' failed: %s", tmp, strerror(errno));
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
        if (!meta_values[i] || !utf8_string_valid(meta_values[i]))
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
    char *tmp = malloc(strlen(path) + 32);
    if (!tmp) {
        free(h.p);
        return dp_fail(DP_ERR_MEMORY, "safetensors: saving '%s': out of memory", path);
    }
    sprintf(tmp, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        st = dp_fail(DP_ERR_IO, "safetensors: cannot create '%s': %s", tmp, strerror(errno));
    } else {
        st = st_write_file(fd, tmp, &h, n, tensors);
        if (close(fd) != 0 && !st)
            st = dp_fail(DP_ERR_IO, "safetensors: closing '%s' failed: %s", tmp, strerror(errno));
        if (!st && rename(tmp, path) != 0)
            st = dp_fail(DP_ERR_IO, "safetensors: cannot rename '%s' to '%s': %s", tmp, path, strerror(errno));
        if (st)
            unlink(tmp);
        else
            st = st_sync_dir(path);
    }
    free(tmp);
    free(h.p);
    return st;
}
