/*
 * json.h — a strict JSON parser (RFC 8259) for the headers of file
 * formats: the text is untrusted, so nothing is accepted that the RFC
 * does not allow (no trailing commas, no comments, no single quotes),
 * strings must be valid UTF-8 (no overlong forms, no surrogates) and
 * their escapes valid, an object may not name a key twice, and nesting
 * stops at JSON_MAX_DEPTH levels.
 *
 *     json_arena *arena = NULL;
 *     json_value root;
 *     json_error err;
 *     size_t end;
 *     if (json_parse(text, len, &arena, &root, &end, &err) != 0)
 *         ... err.why at byte err.offset ...
 *     ... root.type == JSON_OBJECT, root.keys[i], root.items[i] ...
 *     json_arena_free(arena);
 *
 * Every value, string and list the parser makes lives in the arena and
 * is freed with it. The parser records no dp error: its caller words
 * the message (it knows which file and which part of it).
 */
#ifndef DP_IO_JSON_H
#define DP_IO_JSON_H

#include <stddef.h>
#include <stdint.h>

#define JSON_MAX_DEPTH 64

/* Memory freed all at once. */
typedef struct json_arena json_arena;
/* n bytes aligned to 16 from *arena (NULL: an empty one); NULL when out of memory. */
void *json_arena_alloc(json_arena **arena, size_t n);
void json_arena_free(json_arena *arena);   /* NULL is fine */

enum { JSON_NULL, JSON_FALSE, JSON_TRUE, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT };

typedef struct json_value {
    int type;
    int n;                    /* array elements or object members */
    struct json_value *items; /* array elements, object member values */
    char **keys;              /* object member names (decoded, NUL-terminated) */
    size_t *key_lens;         /* their lengths (a name may hold a NUL) */
    char *str;                /* a string (decoded, NUL-terminated) or a number's text (not terminated) */
    size_t len;
    size_t pos;               /* where it starts in the text, for messages */
} json_value;

typedef struct {
    size_t offset;            /* the byte of the text where the parser stopped */
    int out_of_memory;
    char why[160];            /* what was wrong there */
} json_error;

/* Parses the value at the start of text[0, len) into *root. *end gets
 * where it ends, with the whitespace after it: len when nothing else
 * follows. Returns 0, or -1 with *err filled in. */
int json_parse(const char *text, size_t len, json_arena **arena, json_value *root, size_t *end,
               json_error *err);

/* A number without sign, fraction or exponent that fits in int64: 0 and
 * *out set; -1 when it is not one, -2 when it is too large. */
int json_uint(const json_value *v, int64_t *out);

/* "null", "a number", "an array", ...: for messages. */
const char *json_type_name(int type);

/* Whether the NUL-terminated s is valid UTF-8 (what a JSON string may hold). */
int json_utf8_valid(const char *s);

/* A decoded string for a message, in buf: cut short, control characters
 * escaped as \xNN. Returns buf. */
const char *json_printable(char *buf, size_t size, const char *s, size_t len);

#endif /* DP_IO_JSON_H */
