/*
 * alloc.c — the CPU caching allocator. Training loops free and allocate
 * the same sizes every step; glibc's memalign/free pairs then spend more
 * time consolidating than the kernels spend computing on small tensors.
 * Blocks up to 64 MiB are kept on per-size-class free lists (four classes
 * per power of two) and reused; larger ones go straight to the system.
 * The limit is that high because fresh pages cost: a language model's
 * 700 x 10000 logits and their float64 softmax (28 and 56 MB) took five
 * times longer to allocate afresh each step than to compute. At most
 * 1 GiB waits on the lists: a small ResNet's step at batch 128 frees
 * more than 256 MiB of activations, and with a smaller cap its next step
 * faulted fresh pages for a seventh of its time. When a freed block
 * would take the cache past that, blocks of the classes used least
 * recently go back to the system first: a program that trains one model
 * after another would otherwise keep the first model's blocks and give
 * the next one fresh pages at every step.
 */
#include "core/tensor.h"

#include <stdlib.h>

#define MIN_SHIFT 6            /* 64 bytes */
#define MAX_SHIFT 26           /* 64 MiB */
#define NCLASSES ((MAX_SHIFT - MIN_SHIFT + 1) * 4)
#define MAX_CACHED_BYTES (1LL << 30)

typedef struct free_block { struct free_block *next; } free_block;

static free_block *free_lists[NCLASSES];
static uint64_t last_use[NCLASSES];   /* a tick of each class's last alloc or free */
static uint64_t ticks;
static int64_t cached_bytes;

/* Smallest class holding n bytes: 2^k * (1 + q/4), q in 0..3. */
static int size_class(size_t n, size_t *capacity)
{
    if (n < ((size_t)1 << MIN_SHIFT))
        n = (size_t)1 << MIN_SHIFT;
    int k = 63 - __builtin_clzll((unsigned long long)n);
    if (k > MAX_SHIFT)
        return -1;
    for (int q = 0; q < 4; q++) {
        size_t c = ((size_t)1 << k) + (size_t)q * ((size_t)1 << k) / 4;
        if (c >= n) {
            *capacity = c;
            return (k - MIN_SHIFT) * 4 + q;
        }
    }
    if (k + 1 > MAX_SHIFT)
        return -1;
    *capacity = (size_t)1 << (k + 1);
    return (k + 1 - MIN_SHIFT) * 4;
}

void cpu_alloc_size(size_t n, size_t *capacity)
{
    if (size_class(n, capacity) < 0)
        *capacity = (n + 63) & ~(size_t)63;
}

#if defined(__SANITIZE_ADDRESS__)
/* Under AddressSanitizer every block comes from and goes back to the
 * system at once: reused blocks would hide use-after-free and overflows. */
#define NO_CACHE 1
#endif

void *cpu_alloc(size_t n, size_t *capacity)
{
#ifdef NO_CACHE
    *capacity = (n + 63) & ~(size_t)63;
    return aligned_alloc(64, *capacity ? *capacity : 64);
#endif
    int c = size_class(n, capacity);
    if (c < 0) {
        *capacity = (n + 63) & ~(size_t)63;
        return aligned_alloc(64, *capacity);
    }
    last_use[c] = ++ticks;
    free_block *b = free_lists[c];
    if (b) {
        free_lists[c] = b->next;
        cached_bytes -= (int64_t)*capacity;
        return b;
    }
    /* aligned_alloc wants a multiple of the alignment (classes like 224 are not) */
    return aligned_alloc(64, (*capacity + 63) & ~(size_t)63);
}

/* The capacity of class c's blocks. */
static size_t class_capacity(int c)
{
    int k = c / 4 + MIN_SHIFT, q = c % 4;
    return ((size_t)1 << k) + (size_t)q * ((size_t)1 << k) / 4;
}

/* Gives cached blocks of the least recently used classes other than
 * `keep` back to the system until `need` more bytes fit; false when
 * they cannot. */
static bool make_room(int keep, int64_t need)
{
    while (cached_bytes + need > MAX_CACHED_BYTES) {
        int oldest = -1;
        for (int c = 0; c < NCLASSES; c++)
            if (c != keep && free_lists[c] && (oldest < 0 || last_use[c] < last_use[oldest]))
                oldest = c;
        if (oldest < 0)
            return false;
        free_block *b = free_lists[oldest];
        free_lists[oldest] = b->next;
        cached_bytes -= (int64_t)class_capacity(oldest);
        free(b);
    }
    return true;
}

void cpu_free(void *p, size_t capacity)
{
#ifdef NO_CACHE
    (void)capacity;
    free(p);
    return;
#endif
    size_t cap;
    int c = size_class(capacity, &cap);
    if (!p)
        return;
    if (c < 0 || cap != capacity || !make_room(c, (int64_t)capacity)) {
        free(p);
        return;
    }
    last_use[c] = ++ticks;
    free_block *b = p;
    b->next = free_lists[c];
    free_lists[c] = b;
    cached_bytes += (int64_t)capacity;
}

/* Memory that the API hands to its caller with malloc (a store value),
 * freed on the library's side of the boundary: a caller from another
 * language or with another C runtime cannot call this free() itself. */
void dp_free(void *p)
{
    free(p);
}
