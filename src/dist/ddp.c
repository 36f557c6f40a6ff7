/*
 * ddp.c — DistributedDataParallel's reducer: gradient buckets that are
 * slices of the flat gradient buffer, all-reduced (AVG) as soon as the
 * autograd hooks say every gradient in them is final, overlapping the rest
 * of backward. Backward's final callback waits for them, so gradients are
 * averaged when loss:backward() returns.
 *
 * Buckets follow PyTorch: reverse parameter order (the order gradients
 * become ready), the first bucket small (1 MB) so communication starts
 * early, the others bucket_cap_mb (25 MB). They are launched in bucket
 * order on every rank, so the collectives match across ranks.
 *
 * Sharded gradients (ZeRO-2, dp_ddp_shard_grads): rank r keeps only
 * [r*S, (r+1)*S) of the flat gradient, S = ceil(total / size), the same
 * contiguous shard that ZeroRedundancyOptimizer steps. Parameters then have
 * no gradient slot: a final gradient is copied into its bucket's staging
 * buffer and dropped, and a ready bucket is reduced (AVG) to each rank whose
 * shard it overlaps, one reduce per owner (a reduce_scatter whose split
 * follows the shards rather than the bucket). finish() keeps this rank's
 * part in grad_shard and frees the staging buffers, so between backwards a
 * rank holds 1/size of the gradients.
 *
 * Compressed communication (dp_ddp_set_comm_dtype, PyTorch's
 * bf16_compress_hook): a ready bucket is cast to the narrower dtype, its
 * average taken in that dtype, and the result cast back into the flat
 * gradient when backward ends: half the bytes on the wire.
 */
#include "core/autograd.h"
#include "dist/pg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t start, end;      /* element range in the flat gradient */
    int nparams, pending;
    dp_work *work;
    bool launched;
    dp_tensor *staging;      /* sharded: the bucket's gradients during one backward */
    dp_tensor *compressed;   /* compressed: the bucket in comm_dtype while it is reduced */
    dp_work **works;         /* sharded: one reduce per owner */
    int nworks;
} ddp_bucket;

typedef struct {
    struct dp_ddp *ddp;
    int index;               /* parameter index */
    int bucket;
    int64_t offset;          /* where it starts in the flat buffers */
    bool ready;
} ddp_param;

struct dp_ddp {
    dp_pg *pg;
    int nparams, nbuckets, next_launch;
    dp_tensor **params;
    char **names;
    ddp_param *entries;
    ddp_bucket *buckets;
    dp_tensor *flat_param, *flat_grad;
    bool sync, find_unused, in_backward, sharded;
    int comm_dtype;          /* -1, or the dtype buckets are averaged in */
    int64_t total, shard_start, shard_end;
    dp_tensor *grad_shard;   /* sharded: this rank's averaged gradients */
    dp_status error;
    char message[512];
};

static dp_status slice_of(dp_tensor **out, dp_tensor *flat, int64_t start, int64_t end)
{
    return dp_narrow(out, flat, 0, start, end - start);
}

static void remember(dp_ddp *d, dp_status st)
{
    if (st && !d->error) {
        d->error = st;
        snprintf(d->message, sizeof d->message, "%s", dp_last_error());
    }
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

static int64_t shard_size(const dp_ddp *d)
{
    int64_t size = dp_pg_size(d->pg);
    return (d->total + size - 1) / size;
}

/* The staging buffer of a sharded bucket, zeros at first (the slices of
 * unused parameters stay zero). */
static dp_status staging_of(dp_ddp *d, ddp_bucket *b)
{
    if (b->staging)
        return DP_OK;
    int64_t n = b->end - b->start;
    return dp_full(&b->staging, 1, &n, 0, d->params[0]->dtype, d->params[0]->device);
}

/* Sharded: moves parameter e's gradient (if any) into its bucket's staging
 * buffer and drops it. */
static dp_status stage(dp_ddp *d, ddp_param *e)
{
    dp_tensor *p = d->params[e->index], *slice = NULL, *view = NULL;
    ddp_bucket *b = &d->buckets[e->bucket];
    dp_status st = staging_of(d, b);
    if (!st && p->grad && !(st = dp_narrow(&slice, b->staging, 0, e->offset - b->start, dp_tensor_numel(p))) &&
        !(st = dp_view(&view, slice, p->ndim, p->shape)))
        st = dp_copy_into(view, p->grad);
    dp_tensor_release(slice);
    dp_tensor_release(view);
    return st ? st : dp_set_grad(p, NULL);
}

/* Sharded: the bucket's part of each rank's shard, reduced to that rank. */
static dp_status launch_sharded(dp_ddp *d, ddp_bucket *b)
{
    dp_status st = staging_of(d, b);
    int size = dp_pg_size(d->pg);
    int64_t s = shard_size(d);
    for (int r = 0; r < size && size > 1 && !st; r++) {
        int64_t lo = max64(b->start, r * s), hi = min64(b->end, (r + 1) * s);
        if (lo >= hi)
            continue;
        dp_tensor *slice;
        if (!(st = dp_narrow(&slice, b->staging, 0, lo - b->start, hi - lo))) {
            if (!(st = dp_pg_reduce(d->pg, slice, r, DP_MEAN, &b->works[b->nworks])))
                b->nworks++;
            dp_tensor_release(slice);
        }
    }
    return st;
}

/* Sharded, once the bucket's reduces are done: this rank's part of it into
 * grad_shard; the staging buffer is freed. */
static dp_status keep_shard(dp_ddp *d, ddp_bucket *b)
{
    int64_t lo = max64(b->start, d->shard_start), hi = min64(b->end, d->shard_end);
    dp_status st = DP_OK;
    if (b->staging && lo < hi) {
        dp_tensor *from = NULL, *to = NULL;
        if (!(st = dp_narrow(&from, b->staging, 0, lo - b->start, hi - lo)) &&
            !(st = dp_narrow(&to, d->grad_shard, 0, lo - d->shard_start, hi - lo)))
            st = dp_copy_into(to, from);
        dp_tensor_release(from);
        dp_tensor_release(to);
    }
    dp_tensor_release(b->staging);
    b->staging = NULL;
    return st;
}

static dp_status launch(dp_ddp *d, ddp_bucket *b)
{
    b->launched = true;
    if (d->sharded)
        return launch_sharded(d, b);
    const bool compress = d->comm_dtype >= 0 && d->comm_dtype != (int)d->flat_grad->dtype;
    if (dp_pg_size(d->pg) == 1 && !compress)
        return DP_OK;   /* the average over one rank is the gradient itself */
    dp_tensor *slice;
    dp_status st = slice_of(&slice, d->flat_grad, b->start, b->end);
    if (!st && compress) {   /* (on one rank too: the gradients are rounded, as PyTorch's hook rounds them) */
        int64_t n = b->end - b->start;
        if (!(st = dp_empty(&b->compressed, 1, &n, (dp_dtype)d->comm_dtype, slice->device)) &&
            !(st = dp_copy_into(b->compressed, slice)) && dp_pg_size(d->pg) > 1)
            st = dp_pg_all_reduce(d->pg, b->compressed, DP_MEAN, &b->work);
    } else if (!st) {
        st = dp_pg_all_reduce(d->pg, slice, DP_MEAN, &b->work);
    }
    dp_tensor_release(slice);
    return st;
}

/* Compressed: the bucket's average, back into the flat gradient. */
static dp_status decompress(dp_ddp *d, ddp_bucket *b)
{
    if (!b->compressed)
        return DP_OK;
    dp_tensor *slice;
    dp_status st = slice_of(&slice, d->flat_grad, b->start, b->end);
    if (!st) {
        st = dp_copy_into(slice, b->compressed);
        dp_tensor_release(slice);
    }
    dp_tensor_release(b->compressed);
    b->compressed = NULL;
    return st;
}

/* Launches, in bucket order, every bucket whose gradients are all final. */
static void launch_ready(dp_ddp *d)
{
    while (d->next_launch < d->nbuckets && d->buckets[d->next_launch].pending == 0)
        remember(d, launch(d, &d->buckets[d->next_launch++]));
}

static dp_status finish(void *ctx);

static void grad_ready(dp_tensor *leaf, void *ctx)
{
    ddp_param *e = ctx;
    dp_ddp *d = e->ddp;
    (void)leaf;
    if (!d->sync || e->ready)
        return;
    if (!d->in_backward) {
        d->in_backward = true;
        remember(d, ag_queue_final_callback(finish, d));
    }
    e->ready = true;
    if (d->sharded)
        remember(d, stage(d, e));
    d->buckets[e->bucket].pending--;
    launch_ready(d);
}

/* Parameters that got no gradient: zeros (find_unused_parameters) or an
 * error naming them. */
static dp_status handle_unused(dp_ddp *d)
{
    char list[256] = "";
    int missing = 0;
    for (int i = 0; i < d->nparams; i++) {
        ddp_param *e = &d->entries[i];
        if (e->ready)
            continue;
        if (!d->find_unused) {
            if (missing++ < 4)
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", missing > 1 ? ", " : "",
                         d->names[i]);
            continue;
        }
        dp_tensor *p = d->params[i];
        dp_status st = d->sharded ? stage(d, e) : p->grad ? DP_OK : dp_fill_into(p->grad_slot, 0);
        if (st)
            return st;
        if (!p->grad && !d->sharded) {
            dp_tensor_retain(p->grad_slot);
            p->grad = p->grad_slot;
        }
        e->ready = true;
        d->buckets[e->bucket].pending--;
    }
    if (missing)
        return dp_fail(DP_ERR_STATE, "DistributedDataParallel: %d parameter(s) received no gradient in this "
                       "backward: %s%s. Pass find_unused_parameters=true to DistributedDataParallel if parts of "
                       "the model are not used in every iteration.", missing, list, missing > 4 ? ", ..." : "");
    launch_ready(d);
    return DP_OK;
}

static dp_status finish(void *ctx)
{
    dp_ddp *d = ctx;
    dp_status st = d->error;
    if (st)
        dp_fail(st, "%s", d->message);
    if (!st)
        st = handle_unused(d);
    for (int i = 0; i < d->nbuckets; i++) {
        ddp_bucket *b = &d->buckets[i];
        if (b->work) {
            dp_status w = dp_work_wait(b->work);
            if (!st)
                st = w;
            dp_work_free(b->work);
            b->work = NULL;
        }
        dp_status c = decompress(d, b);
        if (!st)
            st = c;
        for (int k = 0; k < b->nworks; k++) {
            dp_status w = dp_work_wait(b->works[k]);
            if (!st)
                st = w;
            dp_work_free(b->works[k]);
        }
        b->nworks = 0;
        if (d->sharded) {
            dp_status k = keep_shard(d, b);
            if (!st)
                st = k;
        }
        b->launched = false;
        b->pending = b->nparams;
    }
    for (int i = 0; i < d->nparams; i++)
        d->entries[i].ready = false;
    d->next_launch = 0;
    d->in_backward = false;
    d->error = DP_OK;
    return st;
}

/* Assigns parameters to buckets walking them in reverse order. */
static void make_buckets(dp_ddp *d, int64_t first_bytes, int64_t cap_bytes)
{
    int64_t es = (int64_t)dp_dtype_size(d->params[0]->dtype), end = dp_tensor_numel(d->flat_grad);
    int64_t cap = first_bytes, bytes = 0;
    ddp_bucket *b = &d->buckets[0];
    b->end = end;
    d->nbuckets = 1;
    for (int i = d->nparams - 1; i >= 0; i--) {
        int64_t n = dp_tensor_numel(d->params[i]);
        if (bytes > 0 && bytes + n * es > cap) {
            b->start = end;
            b = &d->buckets[d->nbuckets++];
            b->end = end;
            bytes = 0;
            cap = cap_bytes;
        }
        end -= n;
        bytes += n * es;
        d->entries[i].bucket = d->nbuckets - 1;
        d->entries[i].offset = end;
        b->nparams++;
    }
    b->start = end;
    for (int i = 0; i < d->nbuckets; i++)
        d->buckets[i].pending = d->buckets[i].nparams;
}

void dp_ddp_free(dp_ddp *d)
{
    if (!d)
        return;
    for (int i = 0; i < d->nparams; i++) {
        if (d->params[i]) {
            dp_clear_grad_hooks(d->params[i]);
            dp_tensor_release(d->params[i]);
        }
        free(d->names[i]);
    }
    for (int i = 0; i < d->nbuckets; i++) {
        ddp_bucket *b = &d->buckets[i];
        if (b->work)
            dp_work_free(b->work);
        for (int k = 0; k < b->nworks; k++)
            dp_work_free(b->works[k]);
        free(b->works);
        dp_tensor_release(b->staging);
        dp_tensor_release(b->compressed);
    }
    dp_tensor_release(d->grad_shard);
    dp_tensor_release(d->flat_param);
    dp_tensor_release(d->flat_grad);
    pg_release(d->pg);   /* this DDP's reference */
    free(d->params);
    free(d->names);
    free(d->entries);
    free(d->buckets);
    free(d);
}

dp_status dp_ddp_new(dp_ddp **out, dp_pg *pg, int n, dp_tensor *const *params, const char *const *names,
                     int64_t first_bucket_bytes, int64_t bucket_bytes, int find_unused)
{
    if (n <= 0)
        return dp_fail(DP_ERR_ARG, "DistributedDataParallel: the module has no parameters that require grad");
    if (first_bucket_bytes <= 0 || bucket_bytes <= 0)
        return dp_fail(DP_ERR_ARG, "DistributedDataParallel: bucket sizes must be positive");
    dp_ddp *d = calloc(1, sizeof *d);
    if (!d || !(d->params = calloc((size_t)n, sizeof *d->params)) || !(d->names = calloc((size_t)n, sizeof *d->names)) ||
        !(d->entries = calloc((size_t)n, sizeof *d->entries)) || !(d->buckets = calloc((size_t)n, sizeof *d->buckets))) {
        dp_ddp_free(d);
        return dp_fail(DP_ERR_MEMORY, "DistributedDataParallel: out of memory");
    }
    d->pg = pg;
    pg_retain(pg);   /* its hooks use it: after destroy_process_group they fail, "destroyed", on memory still there */
    d->nparams = n;
    d->sync = true;
    d->find_unused = find_unused != 0;
    d->comm_dtype = -1;
    dp_status st = dp_flatten_params(&d->flat_param, &d->flat_grad, n, params);
    for (int i = 0; i < n && !st; i++) {
        d->params[i] = params[i];
        dp_tensor_retain(params[i]);
        d->names[i] = strdup(names && names[i] ? names[i] : "?");
        d->entries[i] = (ddp_param){ .ddp = d, .index = i };
        st = dp_add_grad_hook(params[i], grad_ready, &d->entries[i]);
    }
    if (st) {
        dp_ddp_free(d);
        return st;
    }
    d->total = dp_tensor_numel(d->flat_grad);
    make_buckets(d, first_bucket_bytes, bucket_bytes);
    *out = d;
    return DP_OK;
}

void dp_ddp_set_sync(dp_ddp *d, int sync)
{
    d->sync = sync != 0;
}

dp_status dp_ddp_set_comm_dtype(dp_ddp *d, int dtype)
{
    if (dtype >= 0 && dtype != DP_BFLOAT16 && dtype != DP_FLOAT32)
        return dp_fail(DP_ERR_ARG, "DistributedDataParallel: gradients can be communicated in bfloat16 or float32, "
                       "not %s", dp_dtype_name((dp_dtype)dtype));
    if (dtype >= 0 && d->sharded)
        return dp_fail(DP_ERR_STATE, "DistributedDataParallel: compressed communication is for unsharded "
                       "gradients, not sharding_strategy \"SHARD_GRAD_OP\"");
    if (d->in_backward)
        return dp_fail(DP_ERR_STATE, "DistributedDataParallel: the communication dtype cannot change during a backward");
    d->comm_dtype = dtype;
    return DP_OK;
}

int dp_ddp_num_buckets(const dp_ddp *d)
{
    return d->nbuckets;
}

dp_status dp_ddp_bucket_range(const dp_ddp *d, int i, int64_t *start, int64_t *end)
{
    if (i < 0 || i >= d->nbuckets)
        return dp_fail(DP_ERR_INDEX, "bucket %d out of range", i);
    *start = d->buckets[i].start;
    *end = d->buckets[i].end;
    return DP_OK;
}

dp_tensor *dp_ddp_flat_param(dp_ddp *d)
{
    dp_tensor_retain(d->flat_param);
    return d->flat_param;
}

dp_status dp_ddp_shard_grads(dp_ddp *d, dp_tensor **grad_shard, int64_t *start, int64_t *end)
{
    if (!d->sharded) {
        if (d->in_backward)
            return dp_fail(DP_ERR_STATE, "DistributedDataParallel: gradients cannot be sharded during a backward");
        if (d->comm_dtype >= 0)
            return dp_fail(DP_ERR_STATE, "DistributedDataParallel: gradients communicated in another dtype (a "
                           "compression hook) cannot be sharded");
        int size = dp_pg_size(d->pg);
        int64_t s = shard_size(d), rank = dp_pg_rank(d->pg);
        d->shard_start = min64(rank * s, d->total);
        d->shard_end = min64((rank + 1) * s, d->total);
        int64_t n = d->shard_end - d->shard_start;
        dp_status st = dp_full(&d->grad_shard, 1, &n, 0, d->params[0]->dtype, d->params[0]->device);
        for (int i = 0; i < d->nbuckets && !st; i++)
            if (!(d->buckets[i].works = calloc((size_t)size, sizeof *d->buckets[i].works)))
                st = dp_fail(DP_ERR_MEMORY, "DistributedDataParallel: out of memory");
        for (int i = 0; i < d->nparams && !st; i++)
            st = dp_set_grad_slot(d->params[i], NULL);   /* gradients are staged by bucket, then dropped */
        if (st)
            return st;   /* (dp_ddp_free releases what was made) */
        dp_tensor_release(d->flat_grad);
        d->flat_grad = NULL;
        d->sharded = true;
    }
    dp_tensor_retain(d->grad_shard);
    *grad_shard = d->grad_shard;
    *start = d->shard_start;
    *end = d->shard_end;
    return DP_OK;
}

/* Join: a rank out of inputs matches the collectives of the others'
 * backward with zero gradients, so it ends with their average (divided by
 * the whole group's size, as theirs are). */
dp_status dp_ddp_join_backward(dp_ddp *d)
{
    if (d->in_backward)
        return dp_fail(DP_ERR_STATE, "DistributedDataParallel: join_backward during a backward");
    d->in_backward = true;
    dp_status st = DP_OK;
    for (int i = d->nparams - 1; i >= 0 && !st; i--) {
        ddp_param *e = &d->entries[i];
        dp_tensor *p = d->params[i];
        if (d->sharded) {
            if (!(st = dp_set_grad(p, NULL)))
                st = staging_of(d, &d->buckets[e->bucket]);
        } else if (!(st = dp_fill_into(p->grad_slot, 0))) {
            st = dp_set_grad(p, p->grad_slot);
        }
        e->ready = true;
        d->buckets[e->bucket].pending--;
        if (!st)
            launch_ready(d);
    }
    remember(d, st);
    return finish(d);
}
