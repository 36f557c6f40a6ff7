/*
 * optim.c — flat parameter groups and the fused optimizer steps.
 *
 * A group's parameters are moved into one flat buffer (each parameter
 * becomes a view of it) and get grad slots in one flat gradient buffer,
 * so that an optimizer step is a single pass and DDP buckets are slices.
 */
#include "dplua_cuda.h"
#include "dplua_internal.h"
#include "core/autograd.h"
#include "core/kernels.h"

#include <stdlib.h>
#include <string.h>

/* The parameters, the gradient and the state buffers (n of them; NULL
 * ones are skipped) of one float dtype and device, of the parameters'
 * size, contiguous. */
static dp_status flat_check(const char *fn, dp_tensor *p, dp_tensor *g, int n, dp_tensor *const *state)
{
    char a[160], b[160];
    if (!p || !g)
        return dp_fail(DP_ERR_ARG, "%s: expected parameter and gradient tensors", fn);
    if (p->dtype != DP_FLOAT32 && p->dtype != DP_FLOAT64 && p->dtype != DP_BFLOAT16)
        return dp_fail(DP_ERR_DTYPE, "%s: fused updates take float32, float64 or bfloat16 parameters, got %s", fn,
                       dp_dtype_name(p->dtype));
    for (int i = -1; i < n; i++) {
        const dp_tensor *t = i < 0 ? g : state[i];
        if (!t)
            continue;
        if (t->dtype != p->dtype || dp_tensor_numel(t) != dp_tensor_numel(p))
            return dp_fail(DP_ERR_SHAPE, "%s: buffer %s (%s) does not match the parameters %s (%s)", fn,
                           dp_shape_str(a, sizeof a, t->ndim, t->shape), dp_dtype_name(t->dtype),
                           dp_shape_str(b, sizeof b, p->ndim, p->shape), dp_dtype_name(p->dtype));
        if (t->device != p->device)
            return dp_fail(DP_ERR_DEVICE, "%s: a buffer is on %s, the parameters on %s", fn,
                           dp_device_str(a, sizeof a, t->device), dp_device_str(b, sizeof b, p->device));
        if (!tensor_is_contiguous(t))
            return dp_fail(DP_ERR_ARG, "%s: buffers must be contiguous", fn);
    }
    if (!tensor_is_contiguous(p))
        return dp_fail(DP_ERR_ARG, "%s: parameters must be contiguous", fn);
    return DP_OK;
}

dp_status dp_sgd_step(dp_tensor *param, dp_tensor *grad, dp_tensor *momentum_buf, double lr, double momentum,
                      double dampening, int nesterov, double weight_decay, int first_step)
{
    dp_status st = flat_check("sgd_step", param, grad, 1, &momentum_buf);
    if (st)
        return st;
    if (momentum != 0 && !momentum_buf)
        return dp_fail(DP_ERR_ARG, "sgd_step: momentum %g needs a momentum buffer", momentum);
    if (nesterov && (momentum <= 0 || dampening != 0))
        return dp_fail(DP_ERR_ARG, "SGD: nesterov momentum requires a momentum and zero dampening");
    param->storage->version++;
    if (momentum_buf)
        momentum_buf->storage->version++;
    return k_sgd_step(param, grad, momentum != 0 ? momentum_buf : NULL, lr, momentum, dampening, nesterov,
                        weight_decay, first_step);
}

/* With a master copy (bfloat16 parameters, their float32 master copy w
 * and float32 moments; a bfloat16 or float32 gradient), else every buffer
 * of the parameters' dtype. */
static dp_status master_check(dp_tensor *param, dp_tensor *grad, dp_tensor *const state[3], dp_tensor *w)
{
    char a[160], b[160];
    if (param->dtype != DP_BFLOAT16)
        return dp_fail(DP_ERR_DTYPE, "adam_step: a float32 master copy goes with bfloat16 parameters, got %s "
                       "parameters", dp_dtype_name(param->dtype));
    if (grad->dtype != DP_BFLOAT16 && grad->dtype != DP_FLOAT32)
        return dp_fail(DP_ERR_DTYPE, "adam_step: with a master copy the gradient must be bfloat16 or float32, "
                       "got %s", dp_dtype_name(grad->dtype));
    const dp_tensor *ts[5] = { grad, w, state[0], state[1], state[2] };
    for (int i = 0; i < 5; i++) {
        const dp_tensor *t = ts[i];
        if (!t)
            continue;
        if ((i > 0 && t->dtype != DP_FLOAT32) || t->device != param->device ||
            dp_tensor_numel(t) != dp_tensor_numel(param))
            return dp_fail(DP_ERR_SHAPE, "adam_step: buffer %s (%s) does not match the bfloat16 parameters %s "
                           "(the master copy and the moments are float32, on the parameters' device)",
                           dp_shape_str(a, sizeof a, t->ndim, t->shape), dp_dtype_name(t->dtype),
                           dp_shape_str(b, sizeof b, param->ndim, param->shape));
        if (!tensor_is_contiguous(t))
            return dp_fail(DP_ERR_ARG, "adam_step: buffers must be contiguous");
    }
    if (!tensor_is_contiguous(param))
        return dp_fail(DP_ERR_ARG, "adam_step: parameters must be contiguous");
    return DP_OK;
}

static dp_status adam_check(dp_tensor *param, dp_tensor *grad, dp_tensor *exp_avg, dp_tensor *exp_avg_sq,
                            dp_tensor *max_exp_avg_sq, dp_tensor *master)
{
    if (!param || !grad)
        return dp_fail(DP_ERR_ARG, "adam_step: expected parameter and gradient tensors");
    if (!exp_avg || !exp_avg_sq)
        return dp_fail(DP_ERR_ARG, "adam_step: expected exp_avg and exp_avg_sq buffers");
    if (master)
        return master_check(param, grad, (dp_tensor *[3]){ exp_avg, exp_avg_sq, max_exp_avg_sq }, master);
    return flat_check("adam_step", param, grad, 3, (dp_tensor *[3]){ exp_avg, exp_avg_sq, max_exp_avg_sq });
}

dp_status dp_adam_step(dp_tensor *param, dp_tensor *grad, dp_tensor *exp_avg, dp_tensor *exp_avg_sq,
                       dp_tensor *max_exp_avg_sq, dp_tensor *master, double lr, double beta1, double beta2,
                       double eps, double weight_decay, int decoupled, int64_t step)
{
    dp_status st = adam_check(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, master);
    if (st)
        return st;
    if (step < 1)
        return dp_fail(DP_ERR_ARG, "adam_step: step must be at least 1, got %lld", (long long)step);
    if (!ON_CPU(param) && dp_cuda_capturing())
        return dp_fail(DP_ERR_CUDA, "torch.cuda.graph: this Adam keeps its step count (bias correction) on the "
                       "host, and a replay would repeat this step's; make it with {capturable = true} to capture "
                       "it, as in PyTorch");
    param->storage->version++;
    if (master)
        master->storage->version++;
    return k_adam_step(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, master, lr, beta1, beta2, eps,
                       weight_decay, decoupled, step);
}

/* Capturable Adam: the step count is a 0-d float64 tensor beside the
 * parameters, incremented by this call (on the GPU by a kernel, so that a
 * CUDA graph replays every step with its own count). */
dp_status dp_adam_step_t(dp_tensor *param, dp_tensor *grad, dp_tensor *exp_avg, dp_tensor *exp_avg_sq,
                         dp_tensor *max_exp_avg_sq, dp_tensor *master, double lr, double beta1, double beta2,
                         double eps, double weight_decay, int decoupled, dp_tensor *step)
{
    dp_status st = adam_check(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, master);
    if (st)
        return st;
    if (!step || step->ndim != 0 || step->dtype != DP_FLOAT64 || step->device != param->device)
        return dp_fail(DP_ERR_ARG, "adam_step: the step count must be a 0-d float64 tensor on the parameters' "
                       "device");
    param->storage->version++;
    if (master)
        master->storage->version++;
    if (ON_CPU(param)) {
        double *count = (double *)tensor_ptr(step);
        *count += 1;
        return adam_step_on_cpu(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, master, lr, beta1, beta2, eps,
                                weight_decay, decoupled, (int64_t)*count);
    }
    return gpu_adam_step(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, master, lr, beta1, beta2, eps,
                         weight_decay, decoupled, 0, step);
}

/* ---------------------------------------------------------------- Adadelta, RMSprop, Adagrad */

/* The step of rule r over the checked buffers (common/optim_rule.h). */
static dp_status rule_step(const optim_rule *r, dp_tensor *param, dp_tensor *grad, dp_tensor *const state[3])
{
    param->storage->version++;
    for (int i = 0; i < 3; i++)
        if (state[i])
            state[i]->storage->version++;
    return k_rule_step(r, param, grad, state);
}

dp_status dp_adadelta_step(dp_tensor *param, dp_tensor *grad, dp_tensor *square_avg, dp_tensor *acc_delta,
                           double lr, double rho, double eps, double weight_decay)
{
    dp_tensor *state[3] = { square_avg, acc_delta, NULL };
    dp_status st = flat_check("adadelta_step", param, grad, 3, state);
    if (st)
        return st;
    if (!square_avg || !acc_delta)
        return dp_fail(DP_ERR_ARG, "adadelta_step: expected square_avg and acc_delta buffers");
    const optim_rule r = { .kind = OPTIM_ADADELTA, .fn = "adadelta_step", .lr = lr, .eps = eps,
                           .weight_decay = weight_decay, .decay = rho };
    return rule_step(&r, param, grad, state);
}

dp_status dp_rmsprop_step(dp_tensor *param, dp_tensor *grad, dp_tensor *square_avg, dp_tensor *grad_avg,
                          dp_tensor *momentum_buf, double lr, double alpha, double eps, double weight_decay,
                          double momentum, int centered)
{
    dp_tensor *state[3] = { square_avg, centered ? grad_avg : NULL, momentum > 0 ? momentum_buf : NULL };
    dp_status st = flat_check("rmsprop_step", param, grad, 3, state);
    if (st)
        return st;
    if (!square_avg)
        return dp_fail(DP_ERR_ARG, "rmsprop_step: expected a square_avg buffer");
    if (centered && !grad_avg)
        return dp_fail(DP_ERR_ARG, "rmsprop_step: centered needs a grad_avg buffer");
    if (momentum > 0 && !momentum_buf)
        return dp_fail(DP_ERR_ARG, "rmsprop_step: momentum %g needs a momentum buffer", momentum);
    const optim_rule r = { .kind = OPTIM_RMSPROP, .fn = "rmsprop_step", .lr = lr, .eps = eps,
                           .weight_decay = weight_decay, .decay = alpha, .momentum = momentum,
                           .centered = centered != 0 };
    return rule_step(&r, param, grad, state);
}

/* The learning rate decays with the step count, which lives on the host:
 * a CUDA graph would replay the captured step's. */
dp_status dp_adagrad_step(dp_tensor *param, dp_tensor *grad, dp_tensor *sum, double lr, double lr_decay,
                          double weight_decay, double eps, int64_t step)
{
    dp_tensor *state[3] = { sum, NULL, NULL };
    dp_status st = flat_check("adagrad_step", param, grad, 3, state);
    if (st)
        return st;
    if (!sum)
        return dp_fail(DP_ERR_ARG, "adagrad_step: expected a sum buffer");
    if (step < 1)
        return dp_fail(DP_ERR_ARG, "adagrad_step: step must be at least 1, got %lld", (long long)step);
    if (lr_decay != 0 && !ON_CPU(param) && dp_cuda_capturing())
        return dp_fail(DP_ERR_CUDA, "torch.cuda.graph: Adagrad's lr_decay decays the learning rate with a step "
                       "count kept on the host, and a replay would repeat this step's; capture it with lr_decay = 0");
    const optim_rule r = { .kind = OPTIM_ADAGRAD, .fn = "adagrad_step",
                           .lr = lr / (1 + (double)(step - 1) * lr_decay), .eps = eps, .weight_decay = weight_decay };
    return rule_step(&r, param, grad, state);
}

/* ---------------------------------------------------------------- bfloat16 on the CPU */

/* bfloat16 buffers (parameter, gradient, state; NULL ones stay NULL): the
 * float32 step runs on float copies, and each result is rounded back on
 * store (PyTorch computes bf16 updates in float too). */
static dp_status float_copies(dp_tensor **f, dp_tensor *const *bufs, int n)
{
    dp_status st = DP_OK;
    for (int i = 0; i < n; i++)
        f[i] = NULL;
    for (int i = 0; i < n && !st; i++)
        if (bufs[i] && !(st = tensor_new(&f[i], bufs[i]->ndim, bufs[i]->shape, DP_FLOAT32, bufs[i]->device)))
            st = cpu_copy(f[i], bufs[i]);
    return st;
}

/* Writes the copies back into every buffer but the gradient (index 1)
 * when the step went well (st), and releases them. */
static dp_status store_back(dp_tensor *const *bufs, dp_tensor **f, int n, dp_status st)
{
    for (int i = 0; i < n; i++) {
        if (!st && i != 1 && f[i])
            st = cpu_copy(bufs[i], f[i]);
        dp_tensor_release(f[i]);
    }
    return st;
}

dp_status sgd_step_on_cpu(dp_tensor *p, dp_tensor *g, dp_tensor *buf, double lr, double momentum,
                          double dampening, int nesterov, double weight_decay, int first_step)
{
    if (p->dtype != DP_BFLOAT16)
        return cpu_sgd_step(p, g, buf, lr, momentum, dampening, nesterov, weight_decay, first_step);
    dp_tensor *bufs[3] = { p, g, buf }, *f[3];
    dp_status st = float_copies(f, bufs, 3);
    if (!st)
        st = cpu_sgd_step(f[0], f[1], f[2], lr, momentum, dampening, nesterov, weight_decay, first_step);
    return store_back(bufs, f, 3, st);
}

dp_status adam_step_on_cpu(dp_tensor *p, dp_tensor *g, dp_tensor *m, dp_tensor *v, dp_tensor *vmax,
                           dp_tensor *master, double lr, double beta1, double beta2, double eps, double weight_decay,
                           int decoupled, int64_t step)
{
    if (master)
        return cpu_adam_step_master(p, master, g, m, v, vmax, lr, beta1, beta2, eps, weight_decay, decoupled, step);
    if (p->dtype != DP_BFLOAT16)
        return cpu_adam_step(p, g, m, v, vmax, lr, beta1, beta2, eps, weight_decay, decoupled, step);
    dp_tensor *bufs[5] = { p, g, m, v, vmax }, *f[5];
    dp_status st = float_copies(f, bufs, 5);
    if (!st)
        st = cpu_adam_step(f[0], f[1], f[2], f[3], f[4], lr, beta1, beta2, eps, weight_decay, decoupled, step);
    return store_back(bufs, f, 5, st);
}

dp_status rule_step_on_cpu(const optim_rule *r, dp_tensor *p, dp_tensor *g, dp_tensor *const state[3])
{
    if (p->dtype != DP_BFLOAT16)
        return cpu_rule_step(r, p, g, state);
    dp_tensor *bufs[5] = { p, g, state[0], state[1], state[2] }, *f[5];
    dp_status st = float_copies(f, bufs, 5);
    if (!st)
        st = cpu_rule_step(r, f[0], f[1], f + 2);
    return store_back(bufs, f, 5, st);
}

/* ---------------------------------------------------------------- a bucket's gradients */

dp_status dp_flat_grad_status(const char *fn, dp_tensor *flat_param, dp_tensor *flat_grad, int n,
                              dp_tensor *const *params, const int64_t *offsets, int *all, int *any)
{
    *all = 1;
    *any = 0;
    for (int j = 0; j < n; j++) {
        const dp_tensor *p = params[j], *g = p->grad;
        if (p->storage != flat_param->storage || p->offset != flat_param->offset + offsets[j])
            return dp_fail(DP_ERR_STATE, "%s.step: parameter %d of a group is no longer in this optimizer's flat "
                           "buffer: another optimizer or wrapper flattened it differently after this one was built",
                           fn, j + 1);
        if (!g) {
            *all = 0;
            continue;
        }
        *any = 1;
        if (g->storage != flat_grad->storage || g->offset != flat_grad->offset + offsets[j])
            *all = 0;
    }
    return DP_OK;
}

/* ---------------------------------------------------------------- runs of gradients */

typedef struct {
    const dp_tensor *t;
    int index;
} run_item;

static int by_place(const void *a, const void *b)
{
    const dp_tensor *x = ((const run_item *)a)->t, *y = ((const run_item *)b)->t;
    if (x->storage != y->storage)
        return (uintptr_t)x->storage < (uintptr_t)y->storage ? -1 : 1;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    return ((const run_item *)a)->index - ((const run_item *)b)->index;
}

/* Whether b continues the run that ends with a at element `end`. */
static bool continues(const dp_tensor *a, const dp_tensor *b, int64_t end)
{
    return b->storage == a->storage && b->dtype == a->dtype && b->device == a->device && b->offset == end &&
           tensor_is_contiguous(b);
}

dp_status dp_flat_runs(int n, dp_tensor *const *ts, dp_tensor **runs, int *nruns)
{
    *nruns = 0;
    if (n <= 0)
        return DP_OK;
    run_item *items = malloc(sizeof *items * (size_t)n);
    if (!items)
        return dp_fail(DP_ERR_MEMORY, "flat_runs: out of memory");
    for (int i = 0; i < n; i++)
        items[i] = (run_item){ ts[i], i };
    qsort(items, (size_t)n, sizeof *items, by_place);
    dp_status st = DP_OK;
    for (int i = 0; i < n && !st;) {
        dp_tensor *first = (dp_tensor *)items[i].t;
        int64_t end = first->offset + dp_tensor_numel(first);
        int j = i + 1;
        while (tensor_is_contiguous(first) && j < n && continues(first, items[j].t, end))
            end += dp_tensor_numel(items[j++].t);
        if (j == i + 1) {
            dp_tensor_retain(first);
            runs[(*nruns)++] = first;
        } else {
            int64_t numel = end - first->offset, stride = 1;
            if (!(st = tensor_view_of(&runs[*nruns], first, 1, &numel, &stride, first->offset)))
                (*nruns)++;
        }
        i = j;
    }
    free(items);
    if (st) {
        for (int k = 0; k < *nruns; k++)
            dp_tensor_release(runs[k]);
        *nruns = 0;
    }
    return st;
}

/* ---------------------------------------------------------------- flattening */

/* How many of params, from the first, are neighbours in one flat buffer:
 * contiguous views of one storage, each starting where the one before
 * ends, whose grad slots are views of one gradient storage at the same
 * offsets. 0 when the first has no grad slot (it is in no flat buffer). */
int dp_flat_run_length(int n, dp_tensor *const *ps)
{
    if (n <= 0)
        return 0;
    const dp_tensor *first = ps[0], *first_slot = first->grad_slot;
    if (!first_slot || !tensor_is_contiguous(first) || first_slot->offset != first->offset)
        return 0;
    int64_t at = first->offset;
    int k = 0;
    for (; k < n; k++) {
        const dp_tensor *p = ps[k], *slot = p->grad_slot;
        if (p->storage != first->storage || p->offset != at || !tensor_is_contiguous(p) || !slot ||
            slot->storage != first_slot->storage || slot->offset != at || p->dtype != first->dtype)
            break;
        at += dp_tensor_numel(p);
    }
    return k;
}

/* Elements [start, start + numel) of a storage as a 1-D tensor. */
static dp_status storage_view(dp_tensor **out, dp_tensor *like, dp_storage *s, int64_t start, int64_t numel)
{
    dp_tensor base = *like;
    base.storage = s;
    int64_t stride = 1;
    return tensor_view_of(out, &base, 1, &numel, &stride, start);
}

/* Points param at [offset, offset + numel) of flat, keeping its shape. */
static void rebind(dp_tensor *p, dp_storage *flat, int64_t offset)
{
    flat->refcount++;
    storage_release(p->storage);
    p->storage = flat;
    p->offset = offset;
    int64_t s = 1;
    for (int d = p->ndim - 1; d >= 0; d--) {
        p->stride[d] = s;
        s *= p->shape[d];
    }
}

static dp_status flatten_new(dp_tensor **fp, dp_tensor **fg, int n, dp_tensor *const *ps, int64_t total)
{
    dp_status st;
    if ((st = tensor_new(fp, 1, &total, ps[0]->dtype, ps[0]->device)))
        return st;
    if ((st = dp_full(fg, 1, &total, 0, ps[0]->dtype, ps[0]->device))) {
        dp_tensor_release(*fp);
        return st;
    }
    int64_t at = 0;
    for (int i = 0; i < n && !st; i++) {
        dp_tensor *p = ps[i], *part = NULL, *dst = NULL, *slot = NULL;
        int64_t numel = dp_tensor_numel(p);
        if (!(st = dp_narrow(&part, *fp, 0, at, numel)) && !(st = dp_view(&dst, part, p->ndim, p->shape)) &&
            !(st = k_copy(dst, p)) && !(st = dp_narrow(&slot, *fg, 0, at, numel))) {
            dp_tensor *shaped;
            if (!(st = dp_view(&shaped, slot, p->ndim, p->shape))) {
                dp_tensor *old_grad = p->grad;
                if (old_grad)
                    st = k_copy(shaped, old_grad);
                rebind(p, (*fp)->storage, at);
                dp_tensor_release(p->grad_slot);
                p->grad_slot = shaped;
                if (old_grad) {
                    dp_tensor_retain(shaped);
                    p->grad = shaped;
                    dp_tensor_release(old_grad);
                }
            }
        }
        dp_tensor_release(part);
        dp_tensor_release(dst);
        dp_tensor_release(slot);
        at += numel;
    }
    return st;
}

dp_status dp_flatten_params(dp_tensor **flat_param, dp_tensor **flat_grad, int n, dp_tensor *const *params)
{
    if (n <= 0)
        return dp_fail(DP_ERR_ARG, "flatten_params: expected at least one parameter");
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        dp_tensor *p = params[i];
        if (p->dtype != params[0]->dtype || p->device != params[0]->device)
            return dp_fail(DP_ERR_DTYPE, "flatten_params: all parameters of a group must share dtype and device "
                           "(parameter %d is %s, parameter 0 is %s)", i, dp_dtype_name(p->dtype),
                           dp_dtype_name(params[0]->dtype));
        if (p->grad_fn)
            return dp_fail(DP_ERR_ARG, "flatten_params: parameter %d is not a leaf tensor", i);
        for (int j = 0; j < i; j++)
            if (params[j] == p)
                return dp_fail(DP_ERR_ARG, "flatten_params: parameter %d appears twice in the group", i);
        total += dp_tensor_numel(p);
    }
    if (dp_flat_run_length(n, params) == n) {   /* flat already: views of where they are */
        int64_t start = params[0]->offset;
        dp_status st = storage_view(flat_param, params[0], params[0]->storage, start, total);
        if (!st && (st = storage_view(flat_grad, params[0]->grad_slot, params[0]->grad_slot->storage, start, total)))
            dp_tensor_release(*flat_param);
        return st;
    }
    return flatten_new(flat_param, flat_grad, n, params, total);
}
