/*
 * pg_autograd.c — the collective that autograd differentiates:
 * torch.distributed.nn.functional.all_reduce (SUM), which SyncBatchNorm
 * uses for its batch statistics. Its backward is the same all_reduce of
 * the gradient over the same group: every rank's loss depends on every
 * rank's input through the sum, so the gradient of an input is the sum of
 * all ranks' gradients of the result. It runs in C, on the thread running
 * backward, like any other node.
 */
#include "config.h"

#include "dplua_internal.h"
#include "dist/pg_group.h"
#include "core/autograd.h"
#include "core/tensor.h"

/* A contiguous copy of t that autograd does not see. */
static dp_status plain_copy(dp_tensor **out, dp_tensor *t)
{
    dp_status st = tensor_new(out, t->ndim, t->shape, t->dtype, t->device);
    if (!st && (st = dp_copy_into(*out, t))) {
        dp_tensor_release(*out);
        *out = NULL;
    }
    return st;
}

/* iarg[0]: the group's pg_id */
static dp_status bw_all_reduce(ag_node *n, dp_tensor *g, dp_tensor **gi)
{
    dp_pg *pg = pg_find((uint64_t)n->iarg[0]);
    if (!pg)
        return dp_fail(DP_ERR_STATE, "backward: the process group of a torch.distributed.nn.functional.all_reduce "
                       "(a SyncBatchNorm's) was destroyed before its backward");
    dp_tensor *r = NULL;
    dp_status st = plain_copy(&r, g);
    if (!st)
        st = dp_pg_all_reduce(pg, r, DP_SUM, NULL);
    pg_release(pg);
    if (st) {
        dp_tensor_release(r);
        return st;
    }
    gi[0] = r;
    return DP_OK;
}

dp_status dp_pg_all_reduce_autograd(dp_tensor **out, dp_pg *pg, dp_tensor *in)
{
    *out = NULL;
    if (!pg || !in)
        return dp_fail(DP_ERR_ARG, "all_reduce: expected a process group and a tensor");
    dp_tensor *y = NULL;
    dp_status st = plain_copy(&y, in);
    if (!st)
        st = dp_pg_all_reduce(pg, y, DP_SUM, NULL);
    ag_node *node = NULL;
    if (!st)
        st = ag_record(y, "_AllReduceBackward", bw_all_reduce, 1, &in, &node);
    if (st) {
        dp_tensor_release(y);
        return st;
    }
    if (node)
        node->iarg[0] = (int64_t)pg_id(pg);
    *out = y;
    return DP_OK;
}
