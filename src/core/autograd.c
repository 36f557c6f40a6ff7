/*
 * autograd.c — the tape's engine: grad mode, recording nodes, and the
 * reverse walk that computes and accumulates gradients.
 *
 * Ownership: an output owns its node; a node owns the nodes and leaves it
 * points to and its saved tensors. Saved outputs are aliases without a
 * node, so there are no cycles and refcounting frees everything.
 */
#include "dplua_cuda.h"
#include "dplua_internal.h"
#include "core/autograd.h"
#include "core/kernels.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static bool grad_enabled = true;
static uint64_t next_seq = 1;   /* 0 stands for no node (dp_grad_fn_seq) */

struct ag_hook {
    dp_grad_hook fn;
    void *ctx;
    struct ag_hook *next;
};

bool ag_grad_enabled(void) { return grad_enabled; }
int dp_is_grad_enabled(void) { return grad_enabled; }

int dp_set_grad_enabled(int enabled)
{
    int was = grad_enabled;
    grad_enabled = enabled != 0;
    return was;
}

/* ---------------------------------------------------------------- tensors */

int dp_requires_grad(const dp_tensor *t) { return t->requires_grad; }
int dp_is_leaf(const dp_tensor *t) { return t->grad_fn == NULL; }

uint64_t dp_grad_fn_seq(const dp_tensor *t) { return t->grad_fn ? t->grad_fn->seq : 0; }

/* Anomaly detection (torch.autograd.set_detect_anomaly) */
static bool detect_anomaly;
static uint64_t anomaly_node;

int dp_set_detect_anomaly(int on)
{
    int was = detect_anomaly;
    detect_anomaly = on != 0;
    return was;
}

uint64_t dp_anomaly_node(void) { return anomaly_node; }

/* Fails, naming n as PyTorch does, when a gradient n computed holds NaN;
 * a GPU tensor costs a synchronisation, as in PyTorch. */
static dp_status check_nan(const ag_node *n, dp_tensor *const *gin)
{
    for (int i = 0; i < n->ninputs; i++) {
        dp_tensor *g = gin[i], *ne = NULL, *any = NULL;
        double found = 0;
        if (!g || !dp_dtype_is_floating(g->dtype))
            continue;
        dp_status st = dp_binary(&ne, DP_NE, g, g);
        if (!st)
            st = dp_reduce(&any, DP_ANY, ne, DP_ALL_DIMS, 0, 0);
        if (!st)
            st = dp_item(any, &found);
        dp_tensor_release(ne);
        dp_tensor_release(any);
        if (st)
            return st;
        if (found) {
            anomaly_node = n->seq;
            return dp_fail(DP_ERR_STATE, "Function '%s' returned nan values in its %dth output.", n->name, i);
        }
    }
    return DP_OK;
}

/* Backward timing for the profiler: the nodes' times since the last take */
typedef struct {
    const char *name;
    double start, seconds;
} node_time;
static bool time_nodes;
static node_time *node_times;
static int ntimes, times_cap, times_taken;

void dp_set_backward_timing(int on)
{
    time_nodes = on != 0;
    if (!time_nodes) {
        free(node_times);
        node_times = NULL;
        ntimes = times_cap = times_taken = 0;
    }
}

int dp_backward_times(const char **names, double *starts, double *seconds, int cap)
{
    int n = 0;
    for (; n < cap && times_taken < ntimes; n++, times_taken++) {
        names[n] = node_times[times_taken].name;
        starts[n] = node_times[times_taken].start;
        seconds[n] = node_times[times_taken].seconds;
    }
    if (times_taken == ntimes)
        ntimes = times_taken = 0;
    return n;
}

/* Keeps one node's time; past what memory allows the time is dropped. */
static void keep_time(const char *name, double start)
{
    double end = dp_clock_monotonic();
    if (ntimes == times_cap) {
        int cap = times_cap ? 2 * times_cap : 1024;
        node_time *grown = realloc(node_times, sizeof *grown * (size_t)cap);
        if (!grown)
            return;
        node_times = grown;
        times_cap = cap;
    }
    node_times[ntimes++] = (node_time){ name, start, end - start };
}

const char *dp_grad_fn_name(const dp_tensor *t)
{
    return t->grad_fn ? t->grad_fn->name : NULL;
}

dp_status dp_set_requires_grad(dp_tensor *t, int requires_grad)
{
    if (t->grad_fn && !requires_grad)
        return dp_fail(DP_ERR_STATE, "requires_grad_: you can only change requires_grad flags of leaf "
                       "tensors (use detach() to get a tensor that does not require grad)");
    if (requires_grad && !dp_dtype_is_floating(t->dtype))
        return dp_fail(DP_ERR_DTYPE, "requires_grad_: only tensors of floating point dtype can require "
                       "gradients, got %s", dp_dtype_name(t->dtype));
    t->requires_grad = requires_grad != 0;
    return DP_OK;
}

dp_status dp_detach_(dp_tensor *t)
{
    ag_node *n = t->grad_fn;
    t->grad_fn = NULL;
    t->requires_grad = false;
    ag_node_release(n);
    return DP_OK;
}

dp_tensor *dp_get_grad(dp_tensor *t)
{
    dp_tensor_retain(t->grad);
    return t->grad;
}

dp_status dp_set_grad(dp_tensor *t, dp_tensor *grad)
{
    char a[160], b[160];
    if (grad && (grad->ndim != t->ndim || memcmp(grad->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim)))
        return dp_fail(DP_ERR_SHAPE, "grad: assigned grad has shape %s, expected the tensor's shape %s",
                       dp_shape_str(a, sizeof a, grad->ndim, grad->shape), dp_shape_str(b, sizeof b, t->ndim, t->shape));
    if (grad && (grad->dtype != t->dtype || grad->device != t->device))
        return dp_fail(DP_ERR_DTYPE, "grad: assigned grad has dtype %s, expected %s",
                       dp_dtype_name(grad->dtype), dp_dtype_name(t->dtype));
    dp_tensor_retain(grad);
    dp_tensor_release(t->grad);
    t->grad = grad;
    return DP_OK;
}

/* Flat gradient buffers: once a slot is set, the leaf's gradient is always
 * written into it (set_to_none only forgets that it holds a value). */
dp_status dp_set_grad_slot(dp_tensor *t, dp_tensor *slot)
{
    dp_status st = slot ? dp_set_grad(t, slot) : dp_set_grad(t, NULL);
    if (st)
        return st;
    dp_tensor_retain(slot);
    dp_tensor_release(t->grad_slot);
    t->grad_slot = slot;
    return DP_OK;
}

dp_status dp_add_grad_hook(dp_tensor *leaf, dp_grad_hook fn, void *ctx)
{
    if (leaf->grad_fn || !leaf->requires_grad)
        return dp_fail(DP_ERR_STATE, "register_hook: grad-ready hooks go on leaf tensors that require grad");
    struct ag_hook *h = malloc(sizeof *h);
    if (!h)
        return dp_fail(DP_ERR_MEMORY, "register_hook: out of memory");
    h->fn = fn;
    h->ctx = ctx;
    h->next = leaf->hooks;
    leaf->hooks = h;
    return DP_OK;
}

void dp_clear_grad_hooks(dp_tensor *leaf)
{
    while (leaf->hooks) {
        struct ag_hook *h = leaf->hooks;
        leaf->hooks = h->next;
        free(h);
    }
}

/* ---------------------------------------------------------------- nodes */

static void lua_node_done(ag_node *n);

static void node_free_saved(ag_node *n)
{
    for (int i = 0; i < n->nsaved; i++) {
        dp_tensor_release(n->saved[i]);
        n->saved[i] = NULL;
    }
    lua_node_done(n);
}

/* The nodes waiting to be freed by the ag_node_release running on this
 * thread (NULL: none runs). */
typedef struct {
    ag_node **items, *small[64];
    int top, cap;
} node_worklist;
static _Thread_local node_worklist *releasing;

static void worklist_push(node_worklist *w, ag_node *n)
{
    if (w->top == w->cap) {
        ag_node **bigger = malloc(sizeof *bigger * (size_t)w->cap * 2);
        if (!bigger)
            return;   /* out of memory: the node leaks rather than crash */
        memcpy(bigger, w->items, sizeof *bigger * (size_t)w->top);
        if (w->items != w->small)
            free(w->items);
        w->items = bigger;
        w->cap *= 2;
    }
    w->items[w->top++] = n;
}

/* Iterative, so that releasing a long chain cannot overflow the C stack:
 * a node whose last reference goes while another is being freed on this
 * thread, through its inputs or through a saved tensor's grad_fn (the
 * saved input of y = y + x holds the node before it), joins that loop's
 * worklist instead of recursing. */
void ag_node_release(ag_node *n)
{
    if (!n || --n->refcount != 0)
        return;   /* (still held; never freed on an underflow) */
    if (releasing) {
        worklist_push(releasing, n);
        return;
    }
    node_worklist w = { .top = 0, .cap = 64 };
    w.items = w.small;
    releasing = &w;
    worklist_push(&w, n);
    while (w.top > 0) {
        ag_node *m = w.items[--w.top];
        for (int i = 0; i < m->ninputs; i++) {
            dp_tensor_release(m->leaf[i]);
            ag_node_release(m->next[i]);
        }
        node_free_saved(m);
        if (m->lua_hook)
            ag_lua_hook_done(m->lua_hook);
        dp_tensor_release(m->grad);
        cpu_free(m, m->capacity);
    }
    releasing = NULL;
    if (w.items != w.small)
        free(w.items);
}

bool ag_needs_record(int n, dp_tensor *const *inputs)
{
    if (!grad_enabled)
        return false;
    for (int i = 0; i < n; i++)
        if (inputs[i] && inputs[i]->requires_grad)
            return true;
    return false;
}

dp_status ag_record(dp_tensor *out, const char *name, ag_backward_fn fn, int n,
                    dp_tensor *const *inputs, ag_node **node)
{
    *node = NULL;
    if (!dp_dtype_is_floating(out->dtype) || !ag_needs_record(n, inputs))
        return DP_OK;
    /* one block: node, then the three per-input arrays */
    size_t size = sizeof(ag_node) + (size_t)n * (sizeof(ag_node *) + sizeof(dp_tensor *) + sizeof(ag_input));
    size_t capacity;
    ag_node *nd = cpu_alloc(size, &capacity);   /* the caching allocator: a step records dozens */
    if (!nd)
        return dp_fail(DP_ERR_MEMORY, "autograd: out of memory recording %s", name);
    memset(nd, 0, size);
    nd->capacity = capacity;
    nd->next = (ag_node **)(nd + 1);
    nd->leaf = (dp_tensor **)(nd->next + n);
    nd->in = (ag_input *)(nd->leaf + n);
    nd->refcount = 1;
    nd->seq = next_seq++;
    nd->name = name;
    nd->backward = fn;
    nd->ninputs = n;
    nd->mask_input = -1;
    for (int i = 0; i < n; i++) {
        dp_tensor *t = inputs[i];
        if (!t)
            continue;
        nd->in[i].ndim = t->ndim;
        memcpy(nd->in[i].shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
        nd->in[i].dtype = t->dtype;
        nd->in[i].device = t->device;
        nd->in[i].needs_grad = t->requires_grad;
        if (!t->requires_grad)
            continue;
        if (t->grad_fn) {
            nd->next[i] = t->grad_fn;
            t->grad_fn->refcount++;
        } else {
            nd->leaf[i] = t;
            dp_tensor_retain(t);
        }
    }
    out->requires_grad = true;
    out->grad_fn = nd;
    *node = nd;
    return DP_OK;
}

dp_status ag_record_or_drop(dp_tensor **out, const char *name, ag_backward_fn fn, int n,
                           dp_tensor *const *inputs, ag_node **node)
{
    dp_status st = ag_record(*out, name, fn, n, inputs, node);
    if (st) {
        dp_tensor_release(*out);
        *out = NULL;
    }
    return st;
}

void ag_save(ag_node *n, dp_tensor *t)
{
    dp_tensor_retain(t);
    n->saved_version[n->nsaved] = t->storage->version;
    n->saved[n->nsaved++] = t;
}

void ag_save_output(ag_node *n, dp_tensor *out)
{
    dp_tensor *alias;
    if (dp_alias(&alias, out)) {
        /* cannot happen short of OOM; then backward reports the missing tensor */
        n->saved[n->nsaved++] = NULL;
        return;
    }
    n->saved_version[n->nsaved] = out->storage->version;
    n->saved[n->nsaved++] = alias;
}

dp_status ag_check_inplace(const char *fn, dp_tensor *dst)
{
    if (grad_enabled && dst->requires_grad)
        return dp_fail(DP_ERR_STATE, "%s: a tensor that requires grad is being used in an in-place "
                       "operation; use the out-of-place form, or wrap the update in torch.no_grad()", fn);
    dst->storage->version++;
    return DP_OK;
}

/* ---------------------------------------------------------------- Lua inside backward */

/* torch.utils.checkpoint records one node per checkpointed call, whose
 * backward recomputes the call in Lua, and torch.autograd.Function one
 * node per call, whose backward is the user's: the engine calls the
 * function the Lua library registered (dp_set_lua_backward) with the
 * node's id (iarg 0), which names the library's entry for the call. The
 * hooks of Tensor:register_hook are the same function called with the
 * tensor's id (lua_hook of the leaf or of its node). Only a graph holding
 * such a node or tensor runs Lua inside backward. When a node's saved
 * state goes (after a backward without retain_graph, or with the node),
 * or a hooked tensor goes, its id is queued for the library to drop its
 * entry (dp_lua_nodes_done); iarg 1 marks a node queued. Nodes may be
 * released on any thread, hence the lock. */
static dp_lua_backward lua_backward;
static pthread_mutex_t lua_mu = PTHREAD_MUTEX_INITIALIZER;
static int64_t lua_live;          /* ids not yet queued */
static int64_t *lua_done;         /* the queue */
static int lua_ndone, lua_done_cap;

/* A gradient for Lua to read: never the cached implicit 1, which a
 * careless in-place write there would change for every later backward. */
static dp_status lua_visible(dp_tensor **g)
{
    if (!*g || !ag_is_implicit_one(*g))
        return DP_OK;
    dp_tensor *c;
    dp_status st = dp_full(&c, (*g)->ndim, (*g)->shape, 1.0, (*g)->dtype, (*g)->device);
    if (st)
        return st;
    dp_tensor_release(*g);
    *g = c;
    return DP_OK;
}

static dp_status bw_lua(ag_node *n, dp_tensor *g, dp_tensor **gi)
{
    char msg[1024] = "";
    if (!lua_backward)
        return dp_fail(DP_ERR_STATE, "backward: %s has no Lua function to run", n->name);
    dp_tensor_retain(g);
    dp_status st = lua_visible(&g);
    if (st) {
        dp_tensor_release(g);
        return st;
    }
    int r = lua_backward(n->iarg[0], g, n->ninputs, gi, msg, sizeof msg);
    dp_tensor_release(g);
    if (r)
        return dp_fail(DP_ERR_STATE, "%s", msg[0] ? msg : "backward: the Lua backward failed");
    char a[160], b[160];
    for (int i = 0; i < n->ninputs; i++) {
        const ag_input *in = &n->in[i];
        if (gi[i] && (gi[i]->ndim != in->ndim || memcmp(gi[i]->shape, in->shape, sizeof(int64_t) * (size_t)in->ndim)))
            return dp_fail(DP_ERR_SHAPE, "backward: %s gave input %d a gradient of shape %s, expected %s", n->name,
                           i, dp_shape_str(a, sizeof a, gi[i]->ndim, gi[i]->shape),
                           dp_shape_str(b, sizeof b, in->ndim, in->shape));
    }
    return DP_OK;
}

/* Runs the Lua hooks id on *g, which they may replace. */
static dp_status run_lua_hook(int64_t id, dp_tensor **g)
{
    char msg[1024] = "";
    dp_tensor *repl = NULL;
    dp_status st = lua_visible(g);
    if (st)
        return st;
    if (!lua_backward)
        return dp_fail(DP_ERR_STATE, "backward: a tensor hook has no Lua function to run");
    if (lua_backward(id, *g, 1, &repl, msg, sizeof msg))
        return dp_fail(DP_ERR_STATE, "%s", msg[0] ? msg : "backward: a tensor hook failed");
    if (repl) {
        dp_tensor_release(*g);
        *g = repl;
    }
    return DP_OK;
}

static void queue_done(int64_t id)
{
    pthread_mutex_lock(&lua_mu);
    lua_live--;
    if (lua_ndone == lua_done_cap) {
        int cap = lua_done_cap ? 2 * lua_done_cap : 64;
        int64_t *bigger = realloc(lua_done, sizeof *bigger * (size_t)cap);
        if (bigger) {
            lua_done = bigger;
            lua_done_cap = cap;
        }
    }
    if (lua_ndone < lua_done_cap)   /* (out of memory: the entry stays, a leak and no more) */
        lua_done[lua_ndone++] = id;
    pthread_mutex_unlock(&lua_mu);
}

static void lua_node_done(ag_node *n)
{
    if (n->backward != bw_lua || n->iarg[1])
        return;
    n->iarg[1] = 1;
    queue_done(n->iarg[0]);
}

void ag_lua_hook_done(int64_t id)
{
    queue_done(id);
}

void dp_set_lua_backward(dp_lua_backward fn)
{
    lua_backward = fn;
}

/* Node names live as long as the program: a node keeps a plain pointer. */
struct interned_name {
    struct interned_name *next;
    char s[];
};
static struct interned_name *names;

static const char *intern(const char *s)
{
    for (struct interned_name *k = names; k; k = k->next)
        if (strcmp(k->s, s) == 0)
            return k->s;
    size_t len = strlen(s) + 1;
    struct interned_name *k = malloc(sizeof *k + len);
    if (!k)
        return NULL;
    memcpy(k->s, s, len);
    k->next = names;
    names = k;
    return k->s;
}

dp_status dp_lua_node(dp_tensor **out, dp_tensor *value, int n, dp_tensor *const *inputs, int64_t id,
                      const char *name)
{
    pthread_mutex_lock(&lua_mu);
    const char *nm = intern(name ? name : "CheckpointFunctionBackward");
    pthread_mutex_unlock(&lua_mu);
    if (!nm)
        return dp_fail(DP_ERR_MEMORY, "autograd: out of memory naming a node");
    dp_status st = dp_alias(out, value);
    if (st)
        return st;
    ag_node *node;
    if ((st = ag_record(*out, nm, bw_lua, n, inputs, &node))) {
        dp_tensor_release(*out);
        *out = NULL;
        return st;
    }
    if (node) {
        node->iarg[0] = id;
        pthread_mutex_lock(&lua_mu);
        lua_live++;
        pthread_mutex_unlock(&lua_mu);
    }
    return DP_OK;
}

dp_status dp_set_lua_hook(dp_tensor *t, int64_t id)
{
    if (!t->requires_grad)
        return dp_fail(DP_ERR_STATE, "register_hook: cannot register a hook on a tensor that doesn't require gradient");
    int64_t *slot = t->grad_fn ? &t->grad_fn->lua_hook : &t->lua_hook;
    pthread_mutex_lock(&lua_mu);
    lua_live += (id != 0) - (*slot != 0);
    pthread_mutex_unlock(&lua_mu);
    *slot = id;
    return DP_OK;
}

int64_t dp_lua_hook_id(const dp_tensor *t)
{
    return t->grad_fn ? t->grad_fn->lua_hook : t->lua_hook;
}

int64_t dp_lua_nodes_live(void)
{
    pthread_mutex_lock(&lua_mu);
    int64_t live = lua_live;
    pthread_mutex_unlock(&lua_mu);
    return live;
}

int dp_lua_nodes_done(int64_t *ids, int cap)
{
    pthread_mutex_lock(&lua_mu);
    int k = lua_ndone < cap ? lua_ndone : cap;
    if (k > 0)
        memcpy(ids, lua_done + (lua_ndone - k), sizeof *ids * (size_t)k);
    lua_ndone -= k;
    pthread_mutex_unlock(&lua_mu);
    return k;
}

/* ---------------------------------------------------------------- final callbacks */

/* One-shot callbacks that run when the current backward has finished (DDP
 * waits for its reductions there); their status becomes backward's. */
typedef struct {
    dp_status (*fn)(void *ctx);
    void *ctx;
} final_callback;

static final_callback finals[16];
static int nfinals;

dp_status ag_queue_final_callback(dp_status (*fn)(void *ctx), void *ctx)
{
    for (int i = 0; i < nfinals; i++)
        if (finals[i].fn == fn && finals[i].ctx == ctx)
            return DP_OK;
    if (nfinals == 16)
        return dp_fail(DP_ERR_STATE, "backward: too many final callbacks");
    finals[nfinals].fn = fn;
    finals[nfinals++].ctx = ctx;
    return DP_OK;
}

static dp_status run_final_callbacks(dp_status st)
{
    /* every queued callback runs even after an error, so none keeps stale state */
    for (int i = 0; i < nfinals; i++) {
        dp_status r = finals[i].fn(finals[i].ctx);
        if (!st)
            st = r;
    }
    nfinals = 0;
    return st;
}

/* ---------------------------------------------------------------- the walk */

/* Max-heap of ready nodes by seq: the most recently created runs first,
 * which is reverse layer order, so DDP buckets of the last layers fill first. */
typedef struct {
    ag_node **v;
    int n, cap;
} node_heap;

static dp_status heap_push(node_heap *h, ag_node *x)
{
    if (h->n == h->cap) {
        /* the first array is the caller's (on its stack): copy, never realloc it */
        int cap = h->cap * 2;
        ag_node **v = malloc(sizeof *v * (size_t)cap);
        if (!v)
            return dp_fail(DP_ERR_MEMORY, "backward: out of memory");
        memcpy(v, h->v, sizeof *v * (size_t)h->n);
        if (h->cap > 128)
            free(h->v);
        h->v = v;
        h->cap = cap;
    }
    int i = h->n++;
    while (i > 0 && h->v[(i - 1) / 2]->seq < x->seq) {
        h->v[i] = h->v[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->v[i] = x;
    return DP_OK;
}

static ag_node *heap_pop(node_heap *h)
{
    ag_node *top = h->v[0], *last = h->v[--h->n];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && h->v[c + 1]->seq > h->v[c]->seq) c++;
        if (h->v[c]->seq <= last->seq) break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (h->n > 0)
        h->v[i] = last;
    return top;
}

/* The inputs of a dp_grad walk, and their gradients so far; NULL while
 * a backward walk runs. */
typedef struct {
    int n;
    dp_tensor *const *inputs;
    dp_tensor **grads;
} capture_set;
static capture_set *capturing;

int dp_grad_capturing(void) { return capturing != NULL; }

/* The nodes of a walk, each once: an array that starts as the caller's. */
typedef struct {
    ag_node **v, **small;
    int n, cap;
} node_list;

static dp_status list_add(node_list *l, ag_node *m)
{
    if (l->n == l->cap) {
        ag_node **bigger = malloc(sizeof *bigger * (size_t)l->cap * 2);
        if (!bigger)
            return dp_fail(DP_ERR_MEMORY, "backward: out of memory");
        memcpy(bigger, l->v, sizeof *bigger * (size_t)l->n);
        if (l->v != l->small)
            free(l->v);
        l->v = bigger;
        l->cap *= 2;
    }
    m->in_walk = true;
    l->v[l->n++] = m;
    return DP_OK;
}

/* Lists every node reachable from the roots, each once, and counts how
 * many edges point at each (deps); with count_leaves, also for every leaf
 * how many gradients it will receive (leaf->ag_pending). The list
 * doubles as the BFS work queue. On failure the caller still cleans up
 * the nodes listed. */
static dp_status count_deps(int nroots, ag_node *const *roots, bool count_leaves, node_list *l)
{
    dp_status st = DP_OK;
    for (int r = 0; r < nroots && !st; r++)
        if (roots[r] && !roots[r]->in_walk) {
            roots[r]->deps = 0;
            st = list_add(l, roots[r]);
        }
    for (int i = 0; i < l->n && !st; i++) {
        ag_node *m = l->v[i];
        for (int k = 0; k < m->ninputs && !st; k++) {
            if (m->leaf[k] && count_leaves)
                m->leaf[k]->ag_pending++;
            ag_node *nx = m->next[k];
            if (!nx)
                continue;
            nx->deps++;
            if (!nx->in_walk)
                st = list_add(l, nx);
        }
    }
    return st;
}

static int by_seq(const void *a, const void *b)
{
    uint64_t x = (*(ag_node *const *)a)->seq, y = (*(ag_node *const *)b)->seq;
    return x < y ? -1 : x > y;
}

/* The index of leaf among the inputs of the running dp_grad, or -1. */
static int capture_index(const dp_tensor *leaf)
{
    for (int i = 0; i < capturing->n; i++)
        if (capturing->inputs[i] == leaf)
            return i;
    return -1;
}

/* For a dp_grad walk: marks the nodes that are inputs (capture), and the
 * nodes whose backward leads to an input (run), which alone will run. A
 * node's inputs were made before it, so in creation order every node
 * comes after the nodes it points to. Leaves are not counted: a leaf
 * that is an input gathers its gradient in the result at once, whatever
 * an outer backward waits for. */
static void plan_capture(ag_node **all, int nall)
{
    for (int i = 0; i < capturing->n; i++) {
        ag_node *m = capturing->inputs[i]->grad_fn;
        if (m && m->in_walk && !m->capture)
            m->capture = i + 1;
    }
    qsort(all, (size_t)nall, sizeof *all, by_seq);
    for (int i = 0; i < nall; i++) {
        ag_node *m = all[i];
        for (int k = 0; k < m->ninputs && !m->run; k++)
            m->run = (m->leaf[k] && capture_index(m->leaf[k]) >= 0) ||
                     (m->next[k] && (m->next[k]->run || m->next[k]->capture));
    }
}

/* Adds g into a gradient being gathered (*sum: NULL, or a reference). */
static dp_status gather(dp_tensor **sum, dp_tensor *g)
{
    if (!*sum) {
        dp_tensor_retain(g);
        *sum = g;
        return DP_OK;
    }
    dp_tensor *t;
    dp_status st = dp_binary(&t, DP_ADD, *sum, g);
    if (st)
        return st;
    dp_tensor_release(*sum);
    *sum = t;
    return DP_OK;
}

/* Whether t can stand as input in's gradient as it is: its dtype, device
 * and shape, contiguous. */
static bool fits_input(const dp_tensor *t, const ag_input *in)
{
    return t->dtype == in->dtype && t->device == in->device && t->ndim == in->ndim &&
           memcmp(t->shape, in->shape, sizeof(int64_t) * (size_t)in->ndim) == 0 && tensor_is_contiguous(t);
}

/* Where a backward function can write input i's gradient: the leaf's slot
 * in its flat gradient buffer when the leaf has no gradient yet (the
 * engine then finds it in place and copies nothing), else a new tensor of
 * the input's shape and dtype. */
dp_status ag_grad_output(ag_node *n, int i, dp_tensor **out)
{
    const ag_input *in = &n->in[i];
    dp_tensor *leaf = n->leaf ? n->leaf[i] : NULL;
    dp_tensor *slot = leaf && !leaf->grad && !leaf->lua_hook && !capturing ? leaf->grad_slot : NULL;
    for (int k = 0; slot && k < n->ninputs; k++)
        if (k != i && n->leaf[k] == leaf)
            slot = NULL;   /* the leaf's other gradient from this node is accumulated into the slot too */
    if (slot && fits_input(slot, in)) {
        dp_tensor_retain(slot);
        *out = slot;
        return DP_OK;
    }
    return tensor_new(out, in->ndim, in->shape, in->dtype, in->device);
}

dp_tensor *ag_pending_grad(ag_node *n, int i)
{
    const ag_node *c = n->next ? n->next[i] : NULL;
    dp_tensor *g = c ? c->grad : NULL;
    /* one holder and one tensor on the storage: no other input was given
     * this tensor (add's backward gives one to both) and no view of it lives */
    if (!g || k_holders(g) != 1 || g->storage->refcount != 1 || !fits_input(g, &n->in[i]))
        return NULL;
    return g;
}

/* A gradient handed over by a backward function may be shared (add gives
 * the same tensor to both inputs) or a broadcast view; a leaf stores its
 * own contiguous copy unless we hold the only reference. */
static dp_status accumulate_leaf(dp_tensor *leaf, dp_tensor *g)
{
    dp_status st = DP_OK;
    if (leaf->grad) {
        leaf->grad->storage->version++;
        return dp_binary_into(leaf->grad, DP_ADD, leaf->grad, g);
    }
    if (leaf->grad_slot) {
        if (g != leaf->grad_slot && (st = dp_copy_into(leaf->grad_slot, g)))   /* (ag_grad_output wrote it there) */
            return st;
        dp_tensor_retain(leaf->grad_slot);
        leaf->grad = leaf->grad_slot;
        return DP_OK;
    }
    if (k_holders(g) == 1 && tensor_is_contiguous(g) && g->dtype == leaf->dtype && g->ndim == leaf->ndim &&
        !g->grad_fn && g->storage->refcount == 1) {
        dp_tensor_retain(g);
        leaf->grad = g;
        return DP_OK;
    }
    dp_tensor *c;
    if ((st = tensor_new(&c, leaf->ndim, leaf->shape, leaf->dtype, leaf->device)))
        return st;
    if ((st = dp_copy_into(c, g))) {
        dp_tensor_release(c);
        return st;
    }
    leaf->grad = c;
    return DP_OK;
}

static dp_status accumulate_node(ag_node *n, dp_tensor *g)
{
    if (!n->grad) {
        dp_tensor_retain(g);
        n->grad = g;
        return DP_OK;
    }
    dp_tensor *sum;
    dp_status st = dp_binary(&sum, DP_ADD, n->grad, g);
    if (st)
        return st;
    dp_tensor_release(n->grad);
    n->grad = sum;
    return DP_OK;
}

static void fire_hooks(dp_tensor *leaf)
{
    for (struct ag_hook *h = leaf->hooks; h; h = h->next)
        h->fn(leaf, h->ctx);
}

/* A gradient for a leaf: accumulated into .grad at once, unless Lua hooks
 * must see the leaf's whole gradient first; a dp_grad walk gathers it in
 * its result instead (and drops it for a leaf that is no input). */
static dp_status leaf_receive(dp_tensor *leaf, dp_tensor *g)
{
    if (capturing) {
        int i = capture_index(leaf);
        return i >= 0 ? gather(&capturing->grads[i], g) : DP_OK;
    }
    if (leaf->lua_hook)
        return gather(&leaf->ag_buffer, g);
    return accumulate_leaf(leaf, g);
}

/* The leaf's last gradient of this backward has come: its Lua hooks see
 * it, it is accumulated, then its post-accumulate hooks run (Lua's, with
 * the leaf, then C's). */
static dp_status leaf_done(dp_tensor *leaf)
{
    dp_tensor *g = leaf->ag_buffer;
    leaf->ag_buffer = NULL;
    dp_status st = DP_OK;
    if (g && leaf->lua_hook)
        st = run_lua_hook(leaf->lua_hook, &g);
    if (!st && g)
        st = accumulate_leaf(leaf, g);
    dp_tensor_release(g);
    if (!st && g && leaf->lua_hook && lua_backward) {
        char msg[1024] = "";
        if (lua_backward(leaf->lua_hook, leaf, 0, NULL, msg, sizeof msg))
            st = dp_fail(DP_ERR_STATE, "%s", msg[0] ? msg : "backward: a post-accumulate hook failed");
    }
    if (!st)
        fire_hooks(leaf);
    return st;
}

static dp_status check_saved(ag_node *n)
{
    if (n->freed)
        return dp_fail(DP_ERR_STATE, "backward: trying to backward through the graph a second time "
                       "(through %s); its saved tensors were freed by the first backward. Pass "
                       "retain_graph=true to the first backward if you need to do this.", n->name);
    for (int i = 0; i < n->nsaved; i++)
        if (n->saved[i] && n->saved[i]->storage->version != n->saved_version[i])
            return dp_fail(DP_ERR_STATE, "backward: a tensor saved by %s for the gradient was modified "
                           "by an in-place operation after it was used", n->name);
    return DP_OK;
}

static int64_t activation_folds;

int64_t dp_activation_backwards_folded(void)
{
    return activation_folds;
}

void ag_set_relu_mask(ag_node *n, int saved_index)
{
    n->fold_saved = saved_index + 1;
    n->fold_kind = AG_FOLD_RELU;
}

void ag_set_gelu_fold(ag_node *n, int saved_index)
{
    n->fold_saved = saved_index + 1;
    n->fold_kind = AG_FOLD_GELU_TANH;
}

dp_tensor *ag_offered_mask(const ag_node *n, int i, int *op)
{
    if (i != n->mask_input)
        return NULL;
    const ag_node *c = n->next[i];
    if (c->fold_kind != AG_FOLD_RELU && c->fold_kind != AG_FOLD_GELU_TANH)
        return NULL;
    *op = c->fold_kind == AG_FOLD_RELU ? DP_RELU : DP_GELU_TANH;
    return c->saved[c->fold_saved - 1];
}

void ag_set_log_softmax_fold(ag_node *n, int saved_index)
{
    n->fold_saved = saved_index + 1;
    n->fold_kind = AG_FOLD_LOG_SOFTMAX;
}

dp_tensor *ag_offered_log_softmax(const ag_node *n, int i, int dim)
{
    if (i != n->mask_input || n->next[i]->fold_kind != AG_FOLD_LOG_SOFTMAX || n->next[i]->iarg[0] != dim)
        return NULL;
    return n->next[i]->saved[n->next[i]->fold_saved - 1];
}

void ag_took_mask(ag_node *n)
{
    n->mask_taken = n->mask_input >= 0;
}

/* The input of n whose node's backward (a ReLU's mask, a log_softmax's)
 * n's backward may apply (see ag_offered_mask), or -1: that node waits for
 * this gradient alone (nothing accumulated, no other edge left), and its
 * saved output is intact and shaped as the input. */
static int mask_input(const ag_node *n)
{
    for (int i = 0; i < n->ninputs; i++) {
        const ag_node *c = n->next[i];
        if (!c || !c->fold_saved || c->freed || c->deps != 1 || c->grad || !n->in[i].needs_grad ||
            c->lua_hook || c->capture)   /* (whose gradient is seen as it comes, unmasked) */
            continue;
        const dp_tensor *y = c->saved[c->fold_saved - 1];
        if (y && y->storage->version == c->saved_version[c->fold_saved - 1] && fits_input(y, &n->in[i]))
            return i;
    }
    return -1;
}

/* Runs one node and hands its input gradients on. */
static dp_status run_node(ag_node *n, node_heap *ready, bool retain)
{
    dp_tensor *grads[64], **gin = grads;
    dp_status st = DP_OK;
    if (n->lua_hook && n->grad && (st = run_lua_hook(n->lua_hook, &n->grad)))
        return st;
    if (n->capture && n->grad && (st = gather(&capturing->grads[n->capture - 1], n->grad)))
        return st;
    if (capturing && !n->run) {
        dp_tensor_release(n->grad);
        n->grad = NULL;
        return DP_OK;
    }
    if ((st = check_saved(n)))
        return st;
    if (n->ninputs > 64 && !(gin = calloc((size_t)n->ninputs, sizeof *gin)))
        return dp_fail(DP_ERR_MEMORY, "backward: out of memory");
    memset(gin, 0, sizeof *gin * (size_t)n->ninputs);
    n->mask_input = mask_input(n);
    n->mask_taken = false;
    double start = time_nodes ? dp_clock_monotonic() : 0;
    st = n->backward(n, n->grad, gin);
    if (time_nodes)
        keep_time(n->name, start);
    if (!st && detect_anomaly)
        st = check_nan(n, gin);
    if (!st && n->mask_taken && gin[n->mask_input]) {
        n->next[n->mask_input]->grad_masked = true;
        activation_folds += n->next[n->mask_input]->fold_kind != AG_FOLD_LOG_SOFTMAX;
    }
    n->mask_input = -1;
    n->grad_masked = false;
    dp_tensor_release(n->grad);
    n->grad = NULL;
    if (!retain) {
        node_free_saved(n);
        n->freed = true;
    }
    for (int i = 0; i < n->ninputs; i++) {
        dp_tensor *g = gin[i];
        if (!st && g && n->leaf[i])
            st = leaf_receive(n->leaf[i], g);
        if (n->leaf[i] && !capturing && --n->leaf[i]->ag_pending == 0 && !st)
            st = leaf_done(n->leaf[i]);
        ag_node *nx = n->next[i];
        if (nx) {
            if (!st && g)
                st = accumulate_node(nx, g);
            if (--nx->deps == 0 && !st)
                st = heap_push(ready, nx);
        }
        dp_tensor_release(g);
    }
    if (gin != grads)
        free(gin);
    return st;
}

/* The implicit gradient of a 0-d loss, 1, made once per dtype and device
 * (a step's backward then costs no allocation or fill kernel for it).
 * Backward functions never write into the gradient they are given, and a
 * leaf takes its own copy of a gradient that is shared, so the cached one
 * stays 1. Not cached while a CUDA graph is captured: memory made then is
 * filled only when the graph replays. On a GPU it is kept only once filled
 * (one synchronisation per dtype and device), so that any stream may read
 * it. */
#define ONES_DEVICES 64
static dp_tensor *ones_0d[DP_NUM_DTYPES][ONES_DEVICES + 1];

static dp_status scalar_one(dp_tensor **g, int dtype, int device)
{
    dp_tensor **slot = dtype >= 0 && dtype < DP_NUM_DTYPES && device >= DP_CPU && device < ONES_DEVICES
                       ? &ones_0d[dtype][device + 1] : NULL;
    if (slot && *slot) {
        dp_tensor_retain(*slot);
        *g = *slot;
        return DP_OK;
    }
    dp_status st = dp_full(g, 0, NULL, 1.0, dtype, device);
    if (!st && slot && (device == DP_CPU || !dp_cuda_capturing())) {
        /* A later backward may run on another stream, which nothing orders
         * after this stream's fill: wait for it, once. */
        if (device != DP_CPU && (st = dp_cuda_synchronize(device))) {
            dp_tensor_release(*g);
            *g = NULL;
            return st;
        }
        dp_tensor_retain(*g);
        *slot = *g;
    }
    return st;
}

bool ag_is_implicit_one(const dp_tensor *g)
{
    return g->dtype >= 0 && g->dtype < DP_NUM_DTYPES && g->device >= DP_CPU && g->device < ONES_DEVICES &&
           ones_0d[g->dtype][g->device + 1] == g;
}

static dp_status initial_grad(dp_tensor **g, dp_tensor *root, dp_tensor *grad)
{
    char a[160], b[160];
    if (!grad) {
        if (dp_tensor_numel(root) != 1)
            return dp_fail(DP_ERR_SHAPE, "backward: grad can be implicitly created only for scalar outputs "
                           "(this tensor has shape %s); pass a gradient argument",
                           dp_shape_str(a, sizeof a, root->ndim, root->shape));
        if (root->ndim == 0)
            return scalar_one(g, root->dtype, root->device);
        return dp_full(g, root->ndim, root->shape, 1.0, root->dtype, root->device);
    }
    if (grad->ndim != root->ndim || memcmp(grad->shape, root->shape, sizeof(int64_t) * (size_t)root->ndim))
        return dp_fail(DP_ERR_SHAPE, "backward: gradient has shape %s, expected the output's shape %s",
                       dp_shape_str(a, sizeof a, grad->ndim, grad->shape),
                       dp_shape_str(b, sizeof b, root->ndim, root->shape));
    return dp_to(g, grad, root->dtype, root->device);
}

/* How many walks run: a node computed in Lua runs another inside the
 * first (torch.utils.checkpoint), and the final callbacks wait for the
 * outermost. */
static int backward_depth;

static dp_status walk(int nroots, dp_tensor *const *roots, dp_tensor *const *grads, int retain_graph);

dp_status dp_backward(dp_tensor *root, dp_tensor *grad, int retain_graph)
{
    capture_set *outer = capturing;
    capturing = NULL;
    backward_depth++;
    dp_status st = walk(1, &root, &grad, retain_graph);
    backward_depth--;
    capturing = outer;
    return backward_depth == 0 ? run_final_callbacks(st) : st;
}

dp_status dp_grad(int nout, dp_tensor *const *outputs, dp_tensor *const *grad_outputs, int nin,
                  dp_tensor *const *inputs, dp_tensor **grads, int retain_graph)
{
    for (int i = 0; i < nin; i++) {
        grads[i] = NULL;
        if (!inputs[i]->requires_grad)
            return dp_fail(DP_ERR_STATE, "grad: input %d does not require grad", i + 1);
    }
    capture_set set = { nin, inputs, grads }, *outer = capturing;
    capturing = &set;
    backward_depth++;
    dp_status st = walk(nout, outputs, grad_outputs, retain_graph);
    backward_depth--;
    capturing = outer;
    st = backward_depth == 0 ? run_final_callbacks(st) : st;
    /* a leaf's hooks see its whole gradient; an input listed twice was
     * gathered at its first place */
    for (int i = 0; i < nin && !st; i++) {
        int first = 0;
        while (inputs[first] != inputs[i])
            first++;
        if (first < i) {
            dp_tensor_retain(grads[first]);
            grads[i] = grads[first];
        } else if (grads[i] && !inputs[i]->grad_fn && inputs[i]->lua_hook) {
            st = run_lua_hook(inputs[i]->lua_hook, &grads[i]);
        }
    }
    /* a gradient handed out may be shared with the graph (the seed, an
     * add's two inputs): each result is the caller's own tensor */
    for (int i = 0; i < nin && !st; i++) {
        dp_tensor *c;
        if (grads[i] && !(st = dp_clone(&c, grads[i]))) {
            dp_tensor_release(grads[i]);
            grads[i] = c;
        }
    }
    if (st)
        for (int i = 0; i < nin; i++) {
            dp_tensor_release(grads[i]);
            grads[i] = NULL;
        }
    return st;
}

static dp_status walk(int nroots, dp_tensor *const *roots, dp_tensor *const *grads, int retain_graph)
{
    ag_node *small_roots[8] = { NULL }, **root_nodes = small_roots;
    if (nroots > 8 && !(root_nodes = calloc((size_t)nroots, sizeof *root_nodes)))
        return dp_fail(DP_ERR_MEMORY, "backward: out of memory");
    for (int r = 0; r < nroots; r++) {
        root_nodes[r] = roots[r]->grad_fn;
        if (!roots[r]->requires_grad) {
            if (root_nodes != small_roots)
                free(root_nodes);
            return dp_fail(DP_ERR_STATE, "backward: element %d of tensors does not require grad and does not "
                           "have a grad_fn", r);
        }
    }
    /* small graphs (a training step of a small model) need no allocation */
    ag_node *small_all[128], *small_heap[128];
    node_list all = { small_all, small_all, 0, 128 };
    dp_status st = count_deps(nroots, root_nodes, !capturing, &all);
    if (root_nodes != small_roots)
        free(root_nodes);
    if (!st && capturing)
        plan_capture(all.v, all.n);
    /* seed the roots; a root that is a leaf takes its gradient now */
    for (int r = 0; r < nroots && !st; r++) {
        dp_tensor *g;
        if ((st = initial_grad(&g, roots[r], grads[r])))
            break;
        if (roots[r]->grad_fn)
            st = accumulate_node(roots[r]->grad_fn, g);
        else if (!(st = leaf_receive(roots[r], g)) && !capturing && roots[r]->ag_pending == 0)
            st = leaf_done(roots[r]);
        dp_tensor_release(g);
    }
    bool was = grad_enabled;
    grad_enabled = false;
    node_heap ready = { small_heap, 0, 128 };
    for (int i = 0; i < all.n && !st; i++)
        if (all.v[i]->deps == 0 && (!capturing || all.v[i]->run || all.v[i]->capture))
            st = heap_push(&ready, all.v[i]);
    while (!st && ready.n > 0)
        st = run_node(heap_pop(&ready), &ready, retain_graph);
    grad_enabled = was;
    /* leave no engine state behind for the next backward (after a
     * successful backward every count is back where it was: a leaf that
     * an outer backward also waits for keeps its count) */
    for (int i = 0; i < all.n; i++) {
        ag_node *m = all.v[i];
        m->deps = 0;
        m->grad_masked = false;
        m->in_walk = false;
        m->run = false;
        m->capture = 0;
        dp_tensor_release(m->grad);
        m->grad = NULL;
        for (int k = 0; k < m->ninputs && st; k++)
            if (m->leaf[k]) {
                m->leaf[k]->ag_pending = 0;
                dp_tensor_release(m->leaf[k]->ag_buffer);
                m->leaf[k]->ag_buffer = NULL;
            }
    }
    for (int r = 0; r < nroots && st; r++) {
        dp_tensor_release(roots[r]->ag_buffer);
        roots[r]->ag_buffer = NULL;
    }
    if (ready.v != small_heap)
        free(ready.v);
    if (all.v != small_all)
        free(all.v);
    return st;
}
