/*
 * zip.c — the zip container as PyTorch's torch.save writes it (since 1.6):
 * every entry stored without compression, each local header padded (an
 * extra field) so that the entry's bytes start 64-byte aligned.
 *
 * The reader trusts nothing: the end-of-central-directory record is
 * searched in the file's last 64 KiB, the zip64 records are followed when
 * the 32-bit fields say so, and every entry's local header and bytes must
 * lie inside the file. A compressed or encrypted entry is refused by name
 * (PyTorch never writes one). Data is read with pread(), not mapped, so a
 * file that shrinks under the reader fails a read instead of raising
 * SIGBUS.
 *
 * The writer writes local header, bytes, local header, bytes, ... then the
 * central directory; times are a fixed 1980-01-01 so that the same
 * checkpoint gives the same bytes.
 */
#include "io/zip.h"
#include "core/tensor.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#define SIG_LOCAL   0x04034b50u
#define SIG_CENTRAL 0x02014b50u
#define SIG_END     0x06054b50u
#define SIG_END64   0x06064b50u
#define SIG_LOC64   0x07064b50u
#define END_LEN 22
#define MAX_COMMENT 65535
#define ALIGN 64
#define CHUNK (1 << 24)

static uint32_t rd16(const unsigned char *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }
static uint32_t rd32(const unsigned char *p) { return rd16(p) | rd16(p + 2) << 16; }
static uint64_t rd64(const unsigned char *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }

/* ---------------------------------------------------------------- the reader */

static dp_status pread_full(int fd, void *buf, int64_t n, int64_t off)
{
    int64_t done = 0;
    while (done < n) {
        size_t want = (size_t)(n - done < CHUNK ? n - done : CHUNK);
        ssize_t r = pread(fd, (char *)buf + done, want, (off_t)(off + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return r < 0 ? DP_ERR_IO : DP_ERR_STATE;   /* STATE: the file ended early */
        done += r;
    }
    return DP_OK;
}

static dp_status zip_pread(const zip_reader *z, void *buf, int64_t n, int64_t off, const char *what)
{
    dp_status st = pread_full(z->fd, buf, n, off);
    if (st == DP_ERR_IO)
        return dp_fail(DP_ERR_IO, "zip archive '%s': reading %s: %s", z->path, what, strerror(errno));
    if (st)
        return dp_fail(DP_ERR_IO, "zip archive '%s': reading %s: the file ended early (it changed?)", z->path, what);
    return DP_OK;
}

static dp_status zip_bad(const zip_reader *z, const char *why)
{
    return dp_fail(DP_ERR_IO, "zip archive '%s': %s", z->path, why);
}

/* Finds the end-of-central-directory record in the file's tail; sets the
 * central directory's offset, size and entry count (from zip64 records
 * when the 32-bit fields are saturated). */
static dp_status zip_find_end(zip_reader *z, int64_t size, int64_t *cd_off, int64_t *cd_size, int64_t *count)
{
    int64_t tail = size < END_LEN + MAX_COMMENT ? size : END_LEN + MAX_COMMENT;
    unsigned char *buf = malloc((size_t)tail);
    if (!buf)
        return dp_fail(DP_ERR_MEMORY, "zip archive '%s': out of memory", z->path);
    dp_status st = zip_pread(z, buf, tail, size - tail, "the end of the archive");
    int64_t at = -1;
    for (int64_t i = tail - END_LEN; !st && i >= 0; i--)
        if (rd32(buf + i) == SIG_END) {
            at = i;
            break;
        }
    if (!st && at < 0)
        st = zip_bad(z, "no end-of-central-directory record (a truncated file, or not a zip archive)");
    if (st) {
        free(buf);
        return st;
    }
    const unsigned char *e = buf + at;
    *count = rd16(e + 10);
    *cd_size = rd32(e + 12);
    *cd_off = rd32(e + 16);
    int zip64 = *count == 0xFFFF || *cd_size == 0xFFFFFFFF || *cd_off == 0xFFFFFFFF;
    int64_t end_pos = size - tail + at;
    free(buf);
    if (!zip64)
        return DP_OK;
    unsigned char loc[20], rec[56];
    if (end_pos < 20 + 56)
        return zip_bad(z, "a zip64 archive without its zip64 locator");
    if ((st = zip_pread(z, loc, 20, end_pos - 20, "the zip64 locator")))
        return st;
    if (rd32(loc) != SIG_LOC64)
        return zip_bad(z, "a zip64 archive without its zip64 locator");
    uint64_t rec_off = rd64(loc + 8);
    if (rec_off > (uint64_t)(end_pos - 20 - 56))
        return zip_bad(z, "the zip64 end record lies outside the file");
    if ((st = zip_pread(z, rec, 56, (int64_t)rec_off, "the zip64 end record")))
        return st;
    if (rd32(rec) != SIG_END64)
        return zip_bad(z, "the zip64 locator points at no zip64 end record");
    uint64_t n = rd64(rec + 32), cs = rd64(rec + 40), co = rd64(rec + 48);
    if (n > (uint64_t)size || cs > (uint64_t)size || co > (uint64_t)size)
        return zip_bad(z, "the zip64 end record holds sizes larger than the file");
    *count = (int64_t)n;
    *cd_size = (int64_t)cs;
    *cd_off = (int64_t)co;
    return DP_OK;
}

/* The zip64 extra field of a central entry: the 64-bit values of the
 * saturated 32-bit fields, in the order size, compressed size, offset. */
static int zip64_extra(const unsigned char *x, uint32_t xlen, uint64_t *usize, uint64_t *csize, uint64_t *off)
{
    while (xlen >= 4) {
        uint32_t id = rd16(x), len = rd16(x + 2);
        if (len > xlen - 4)
            return -1;
        if (id == 1) {
            const unsigned char *p = x + 4, *end = x + 4 + len;
            uint64_t *fields[3] = { usize, csize, off };
            for (int k = 0; k < 3; k++) {
                if (*fields[k] != 0xFFFFFFFF)
                    continue;
                if (end - p < 8)
                    return -1;
                *fields[k] = rd64(p);
                p += 8;
            }
            return 0;
        }
        x += 4 + len;
        xlen -= 4 + len;
    }
    return 0;
}

/* One central-directory entry at *p (of the n bytes left); advances *p. */
static dp_status zip_central_entry(zip_reader *z, const unsigned char **p, int64_t *left, int64_t size,
                                   int64_t cd_off, zip_entry *e)
{
    char why[400];
    const unsigned char *c = *p;
    if (*left < 46 || rd32(c) != SIG_CENTRAL)
        return zip_bad(z, "a malformed central directory (an entry without its signature)");
    uint32_t flags = rd16(c + 8), method = rd16(c + 10);
    uint32_t nlen = rd16(c + 28), xlen = rd16(c + 30), clen = rd16(c + 32);
    uint64_t csize = rd32(c + 20), usize = rd32(c + 24), off = rd32(c + 42);
    if ((int64_t)(46 + nlen + xlen + clen) > *left)
        return zip_bad(z, "a malformed central directory (an entry runs past its end)");
    if (memchr(c + 46, 0, nlen))
        return zip_bad(z, "an entry name contains a NUL byte");
    if (!(e->name = malloc(nlen + 1)))
        return dp_fail(DP_ERR_MEMORY, "zip archive '%s': out of memory", z->path);
    memcpy(e->name, c + 46, nlen);
    e->name[nlen] = 0;
    if (zip64_extra(c + 46 + nlen, xlen, &usize, &csize, &off))
        return zip_bad(z, "a malformed zip64 extra field");
    snprintf(why, sizeof why, "entry '%.200s' ", e->name);
    size_t wl = strlen(why);
    if (flags & 1)
        return zip_bad(z, strcat(why, "is encrypted"));
    if (method != 0) {
        snprintf(why + wl, sizeof why - wl, "is compressed (method %u): PyTorch checkpoints store entries "
                 "uncompressed; was the archive re-zipped?", method);
        return zip_bad(z, why);
    }
    if (csize != usize)
        return zip_bad(z, strcat(why, "is stored but its two sizes differ"));
    if (off > (uint64_t)cd_off || (uint64_t)cd_off - off < 30)
        return zip_bad(z, strcat(why, "has its local header outside the archive's data"));
    unsigned char lh[30];
    dp_status st = zip_pread(z, lh, 30, (int64_t)off, "a local header");
    if (st)
        return st;
    if (rd32(lh) != SIG_LOCAL)
        return zip_bad(z, strcat(why, "has no local header where the central directory says"));
    e->data = (int64_t)off + 30 + rd16(lh + 26) + rd16(lh + 28);
    e->size = (int64_t)usize;
    e->crc = rd32(c + 16);
    if (e->data > cd_off || usize > (uint64_t)(cd_off - e->data) || e->data > size) {
        snprintf(why + wl, sizeof why - wl, "(%llu bytes) runs past the start of the central directory "
                 "(a truncated or damaged file)", (unsigned long long)usize);
        return zip_bad(z, why);
    }
    *p += 46 + nlen + xlen + clen;
    *left -= 46 + nlen + xlen + clen;
    return DP_OK;
}

dp_status zip_open(zip_reader *z, int fd, int64_t size, const char *path)
{
    int64_t cd_off = 0, cd_size = 0, count = 0;
    memset(z, 0, sizeof *z);
    z->fd = fd;
    z->path = path;
    dp_status st = zip_find_end(z, size, &cd_off, &cd_size, &count);
    if (st)
        return st;
    if (cd_off > size || cd_size > size - cd_off)
        return zip_bad(z, "the central directory lies outside the file (a truncated file?)");
    if (count > cd_size / 46)
        return zip_bad(z, "the central directory is too small for its number of entries");
    unsigned char *cd = malloc((size_t)cd_size + 1);
    z->entries = calloc((size_t)count + 1, sizeof *z->entries);
    if (!cd || !z->entries) {
        free(cd);
        return dp_fail(DP_ERR_MEMORY, "zip archive '%s': out of memory for its central directory", path);
    }
    st = zip_pread(z, cd, cd_size, cd_off, "the central directory");
    const unsigned char *p = cd;
    int64_t left = cd_size;
    for (int64_t i = 0; i < count && !st; i++) {
        st = zip_central_entry(z, &p, &left, size, cd_off, &z->entries[i]);
        z->n++;
    }
    free(cd);
    return st;
}

void zip_close(zip_reader *z)
{
    for (int i = 0; z->entries && i < z->n; i++)
        free(z->entries[i].name);
    free(z->entries);
    z->entries = NULL;
    z->n = 0;
}

int zip_find(const zip_reader *z, const char *name)
{
    for (int i = 0; i < z->n; i++)
        if (strcmp(z->entries[i].name, name) == 0)
            return i;
    return -1;
}

dp_status zip_read(const zip_reader *z, int i, void *buf, int64_t off, int64_t len)
{
    const zip_entry *e = &z->entries[i];
    if (off < 0 || len < 0 || off > e->size || len > e->size - off)
        return dp_fail(DP_ERR_INDEX, "zip archive '%s': bytes %lld..%lld of entry '%.200s' lie outside its %lld bytes",
                       z->path, (long long)off, (long long)(off + len), e->name, (long long)e->size);
    char what[256];
    snprintf(what, sizeof what, "entry '%.200s'", e->name);
    return zip_pread(z, buf, len, e->data + off, what);
}

dp_status zip_read_all(const zip_reader *z, int i, char **buf, int64_t *len)
{
    const zip_entry *e = &z->entries[i];
    *buf = malloc((size_t)e->size + 1);
    if (!*buf)
        return dp_fail(DP_ERR_MEMORY, "zip archive '%s': out of memory for entry '%.200s' (%lld bytes)", z->path,
                       e->name, (long long)e->size);
    dp_status st = zip_read(z, i, *buf, 0, e->size);
    if (!st && crc32(crc32(0, Z_NULL, 0), (const Bytef *)*buf, (uInt)e->size) != e->crc)
        st = dp_fail(DP_ERR_IO, "zip archive '%s': entry '%.200s' fails its CRC check (a damaged file)", z->path,
                     e->name);
    if (st) {
        free(*buf);
        *buf = NULL;
        return st;
    }
    (*buf)[e->size] = 0;
    *len = e->size;
    return DP_OK;
}

/* ---------------------------------------------------------------- the writer */

static void wr16(unsigned char *p, uint32_t v) { p[0] = (unsigned char)v; p[1] = (unsigned char)(v >> 8); }
static void wr32(unsigned char *p, uint32_t v) { wr16(p, v & 0xFFFF); wr16(p + 2, v >> 16); }

#define DOS_DATE 0x21   /* 1980-01-01 */

static dp_status zip_put(zip_writer *w, const void *p, size_t n)
{
    if (n && fwrite(p, 1, n, w->fp) != n)
        return dp_fail(DP_ERR_IO, "zip archive '%s': write failed: %s", w->path, strerror(errno));
    w->pos += (int64_t)n;
    return DP_OK;
}

static dp_status zip_too_large(const zip_writer *w)
{
    return dp_fail(DP_ERR_IO, "zip archive '%s': over 4 GiB, which needs zip64 records that this writer "
                   "does not write; save in the safetensors format instead", w->path);
}

dp_status zip_write_entry(zip_writer *w, const char *name, const void *data, int64_t len)
{
    static const unsigned char zeros[ALIGN];
    size_t nlen = strlen(name);
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 16;
        void *p = realloc(w->entries, sizeof *w->entries * (size_t)cap);
        if (!p)
            return dp_fail(DP_ERR_MEMORY, "zip archive '%s': out of memory", w->path);
        w->entries = p;
        w->cap = cap;
    }
    int64_t base = w->pos + 30 + (int64_t)nlen + 4;
    uint32_t pad = (uint32_t)((ALIGN - base % ALIGN) % ALIGN);
    if (w->pos + 30 + (int64_t)nlen + 4 + pad + len >= 0xFFFFFFFFll || nlen > 0xFFFF)
        return zip_too_large(w);
    struct zip_out_entry *e = &w->entries[w->n];
    if (!(e->name = strdup(name)))
        return dp_fail(DP_ERR_MEMORY, "zip archive '%s': out of memory", w->path);
    w->n++;
    e->header = w->pos;
    e->size = len;
    e->crc = 0;
    for (int64_t done = 0; done < len;) {   /* crc32 takes a 32-bit length */
        uInt part = (uInt)(len - done < CHUNK ? len - done : CHUNK);
        e->crc = (uint32_t)crc32(e->crc, (const Bytef *)data + done, part);
        done += part;
    }
    unsigned char h[30 + 4];
    memset(h, 0, sizeof h);
    wr32(h, SIG_LOCAL);
    wr16(h + 4, 20);              /* version needed: 2.0 */
    wr16(h + 12, DOS_DATE);
    wr32(h + 14, e->crc);
    wr32(h + 18, (uint32_t)len);
    wr32(h + 22, (uint32_t)len);
    wr16(h + 26, (uint32_t)nlen);
    wr16(h + 28, 4 + pad);
    wr16(h + 30, 0x4246);         /* the padding field's id, as PyTorch's writer names it: "FB" */
    wr16(h + 32, pad);
    dp_status st;
    if ((st = zip_put(w, h, 30)) || (st = zip_put(w, name, nlen)) || (st = zip_put(w, h + 30, 4)) ||
        (st = zip_put(w, zeros, pad)) || (st = zip_put(w, data, (size_t)len)))
        return st;
    return DP_OK;
}

dp_status zip_write_end(zip_writer *w)
{
    int64_t cd_off = w->pos;
    dp_status st;
    if (w->n > 0xFFFF)
        return zip_too_large(w);
    for (int i = 0; i < w->n; i++) {
        const struct zip_out_entry *e = &w->entries[i];
        size_t nlen = strlen(e->name);
        unsigned char c[46];
        memset(c, 0, sizeof c);
        wr32(c, SIG_CENTRAL);
        wr16(c + 4, 20);
        wr16(c + 6, 20);
        wr16(c + 14, DOS_DATE);
        wr32(c + 16, e->crc);
        wr32(c + 20, (uint32_t)e->size);
        wr32(c + 24, (uint32_t)e->size);
        wr16(c + 28, (uint32_t)nlen);
        wr32(c + 42, (uint32_t)e->header);
        if ((st = zip_put(w, c, 46)) || (st = zip_put(w, e->name, nlen)))
            return st;
    }
    int64_t cd_size = w->pos - cd_off;
    if (w->pos >= 0xFFFFFFFFll)
        return zip_too_large(w);
    unsigned char end[END_LEN];
    memset(end, 0, sizeof end);
    wr32(end, SIG_END);
    wr16(end + 8, (uint32_t)w->n);
    wr16(end + 10, (uint32_t)w->n);
    wr32(end + 12, (uint32_t)cd_size);
    wr32(end + 16, (uint32_t)cd_off);
    return zip_put(w, end, END_LEN);
}

void zip_writer_free(zip_writer *w)
{
    for (int i = 0; i < w->n; i++)
        free(w->entries[i].name);
    free(w->entries);
    w->entries = NULL;
    w->n = w->cap = 0;
}
