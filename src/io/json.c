/*
 * json.c — the strict JSON parser of json.h: a recursive descent over
 * the text, values decoded into an arena, RFC 8259's grammar and nothing
 * more. Every length and count is checked before it is used; the first
 * failure stops the parse and is the one reported.
 */
#include "io/json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JS_STR(x) #x
#define JS_XSTR(x) JS_STR(x)

/* ---------------------------------------------------------------- arena */

struct json_arena {
    struct json_arena *next;
    size_t used, cap;
    _Alignas(16) char data[];
};

void *json_arena_alloc(json_arena **a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (!*a || (*a)->cap - (*a)->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        json_arena *b = malloc(sizeof *b + cap);
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

void json_arena_free(json_arena *a)
{
    while (a) {
        json_arena *next = a->next;
        free(a);
        a = next;
    }
}

/* ---------------------------------------------------------------- messages */

const char *json_printable(char *buf, size_t size, const char *s, size_t len)
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

/* ---------------------------------------------------------------- the parser */

typedef struct {
    const char *text, *p, *end;
    json_arena **arena;
    json_error *err;
    int failed;               /* the first failure is the one reported */
} js_parser;

/* Records a failure at the current position: why, then what (NULL: nothing). Returns -1. */
static int js_fail(js_parser *js, const char *why, const char *what)
{
    if (!js->failed) {
        js->failed = 1;
        js->err->offset = (size_t)(js->p - js->text);
        snprintf(js->err->why, sizeof js->err->why, "%s%s", why, what ? what : "");
    }
    return -1;
}

static int js_out_of_memory(js_parser *js)
{
    if (!js->failed)
        js->err->out_of_memory = 1;
    return js_fail(js, "out of memory", NULL);
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
static size_t utf8_sequence(const unsigned char *p, const unsigned char *end)
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
    char *o = json_arena_alloc(js->arena, (size_t)(close - q) + 1);
    if (!o)
        return js_out_of_memory(js);
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
                    return -1;
                if (cp >= 0xDC00 && cp <= 0xDFFF)
                    return js_fail(js, "a lone low surrogate in a \\u escape", NULL);
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    if (js->end - js->p < 2 || js->p[0] != '\\' || js->p[1] != 'u')
                        return js_fail(js, "a high surrogate without its low surrogate", NULL);
                    js->p += 2;
                    if (js_hex4(js, &lo))
                        return -1;
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
            size_t k = utf8_sequence((const unsigned char *)js->p, (const unsigned char *)js->end);
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
static int js_number(js_parser *js, json_value *v)
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
    v->type = JSON_NUMBER;
    v->str = (char *)s;
    v->len = (size_t)(js->p - s);
    return 0;
}

static int js_parse_value(js_parser *js, json_value *v, int depth);

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
        return js_out_of_memory(js);
    *items = p;
    *cap = ncap;
    return 0;
}

/* Moves the temporary vectors into the arena. */
static int js_settle(js_parser *js, json_value *v, json_value *items, char **keys, size_t *lens, int n)
{
    v->n = n;
    v->items = NULL;
    v->keys = NULL;
    v->key_lens = NULL;
    if (n == 0)
        return 0;
    v->items = json_arena_alloc(js->arena, sizeof *items * (size_t)n);
    if (keys) {
        v->keys = json_arena_alloc(js->arena, sizeof *keys * (size_t)n);
        v->key_lens = json_arena_alloc(js->arena, sizeof *lens * (size_t)n);
    }
    if (!v->items || (keys && (!v->keys || !v->key_lens)))
        return js_out_of_memory(js);
    memcpy(v->items, items, sizeof *items * (size_t)n);
    if (keys) {
        memcpy(v->keys, keys, sizeof *keys * (size_t)n);
        memcpy(v->key_lens, lens, sizeof *lens * (size_t)n);
    }
    return 0;
}

/* Steps over an array's or object's opening bracket: 1 when the closing
 * one follows at once (an empty one, stepped over too), else 0. */
static int js_open(js_parser *js, char close)
{
    js->p++;
    js_skip_ws(js);
    if (js->p < js->end && *js->p == close) {
        js->p++;
        return 1;
    }
    return 0;
}

/* After an element of an array or a member of an object: a ',' (1:
 * another follows), the closing bracket (0), or a failure (-1). */
static int js_after_item(js_parser *js, char close, const char *expected, const char *unterminated)
{
    js_skip_ws(js);
    if (js->p < js->end && *js->p == ',') {
        js->p++;
        return 1;
    }
    if (js->p < js->end && *js->p == close) {
        js->p++;
        return 0;
    }
    return js_fail(js, js->p < js->end ? expected : unterminated, NULL);
}

static int js_array(js_parser *js, json_value *v, int depth)
{
    json_value *items = NULL;
    int cap = 0, n = 0, more = 1;
    v->type = JSON_ARRAY;
    if (js_open(js, ']'))
        return js_settle(js, v, NULL, NULL, NULL, 0);
    while (more > 0) {
        if (js_grow(js, (void **)&items, sizeof *items, &cap, n) || js_parse_value(js, &items[n], depth + 1))
            break;
        n++;
        more = js_after_item(js, ']', "expected ',' or ']' in an array", "unterminated array");
    }
    if (more == 0)
        js_settle(js, v, items, NULL, NULL, n);
    free(items);
    return js->failed ? -1 : 0;
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
        return js_out_of_memory(js);
    for (int i = 0; i < n; i++) {
        refs[i].s = keys[i];
        refs[i].len = lens[i];
    }
    qsort(refs, (size_t)n, sizeof *refs, key_cmp);
    for (int i = 1; i < n; i++)
        if (key_cmp(&refs[i - 1], &refs[i]) == 0) {
            char kb[96];
            js_fail(js, "duplicate key ", json_printable(kb, sizeof kb, refs[i].s, refs[i].len));
            break;
        }
    free(refs);
    return js->failed ? -1 : 0;
}

/* Duplicate names are refused: JSON leaves them undefined, and a reader
 * that kept the first would see another file than one that kept the last.
 * Small objects are scanned, large ones sorted (a copy). */
static int js_check_duplicates(js_parser *js, char **keys, size_t *lens, int n)
{
    if (n >= 64)
        return js_check_duplicates_sorted(js, keys, lens, n);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++)
            if (lens[i] == lens[j] && memcmp(keys[i], keys[j], lens[i]) == 0) {
                char kb[96];
                return js_fail(js, "duplicate key ", json_printable(kb, sizeof kb, keys[i], lens[i]));
            }
    return 0;
}

static int js_object(js_parser *js, json_value *v, int depth)
{
    json_value *items = NULL;
    char **keys = NULL;
    size_t *lens = NULL;
    int cap = 0, kcap = 0, lcap = 0, n = 0, more = 1;
    v->type = JSON_OBJECT;
    if (js_open(js, '}'))
        return js_settle(js, v, NULL, NULL, NULL, 0);
    while (more > 0) {
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
        if (js_parse_value(js, &items[n], depth + 1))
            break;
        n++;
        more = js_after_item(js, '}', "expected ',' or '}' in an object", "unterminated object");
    }
    if (more == 0 && js_check_duplicates(js, keys, lens, n) == 0)
        js_settle(js, v, items, keys, lens, n);
    free(items);
    free(keys);
    free(lens);
    return js->failed ? -1 : 0;
}

static int js_literal(js_parser *js, const char *word, int type, json_value *v)
{
    size_t n = strlen(word);
    if ((size_t)(js->end - js->p) < n || memcmp(js->p, word, n) != 0)
        return js_fail(js, "an unexpected character", NULL);
    js->p += n;
    v->type = type;
    return 0;
}

static int js_parse_value(js_parser *js, json_value *v, int depth)
{
    memset(v, 0, sizeof *v);
    if (depth > JSON_MAX_DEPTH)
        return js_fail(js, "nesting deeper than " JS_XSTR(JSON_MAX_DEPTH) " levels", NULL);
    js_skip_ws(js);
    if (js->p >= js->end)
        return js_fail(js, "unexpected end of the text (a value was expected)", NULL);
    v->pos = (size_t)(js->p - js->text);
    switch (*js->p) {
    case '{': return js_object(js, v, depth);
    case '[': return js_array(js, v, depth);
    case '"': v->type = JSON_STRING; return js_string(js, &v->str, &v->len);
    case 't': return js_literal(js, "true", JSON_TRUE, v);
    case 'f': return js_literal(js, "false", JSON_FALSE, v);
    case 'n': return js_literal(js, "null", JSON_NULL, v);
    default:
        if (*js->p == '-' || is_digit(*js->p))
            return js_number(js, v);
        return js_fail(js, "an unexpected character", NULL);
    }
}

/* ---------------------------------------------------------------- the interface */

int json_parse(const char *text, size_t len, json_arena **arena, json_value *root, size_t *end,
               json_error *err)
{
    js_parser js = { text, text, text + len, arena, err, 0 };
    memset(err, 0, sizeof *err);
    if (js_parse_value(&js, root, 0))
        return -1;
    js_skip_ws(&js);
    *end = (size_t)(js.p - text);
    return 0;
}

int json_uint(const json_value *v, int64_t *out)
{
    if (v->type != JSON_NUMBER || v->len == 0 || v->str[0] == '-')
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

const char *json_type_name(int type)
{
    static const char *const names[] = { "null", "false", "true", "a number", "a string", "an array", "an object" };
    return names[type];
}

int json_utf8_valid(const char *s)
{
    const unsigned char *p = (const unsigned char *)s, *end = p + strlen(s);
    while (p < end) {
        size_t k = utf8_sequence(p, end);
        if (!k)
            return 0;
        p += k;
    }
    return 1;
}
