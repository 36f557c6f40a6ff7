/*
 * dplua_internal.h — functions that libdplua.so exports for the dplua
 * program and its Lua library only: the Lua binding's tensor box and
 * collection, the optimizers' bucket check, the deferred Linear's
 * switches and counters that tests read, the launcher and `dplua env`.
 * Not installed and not part of the C API: they change with the program.
 *
 * The Lua library reaches them through ffi.C like the rest, so they are
 * DP_API and between the DP_CDEF markers (plain C, see dplua.h).
 */
#ifndef DPLUA_INTERNAL_H
#define DPLUA_INTERNAL_H

#include "dplua.h"

#ifdef __cplusplus
extern "C" {
#endif

/* DP_CDEF_BEGIN */
/* The Lua binding's tensor object: a box whose finalizer is this C
 * function, so that collecting a tensor runs no Lua code. */
typedef struct dp_tensor_box { dp_tensor *p; } dp_tensor_box;
DP_API void dp_tensor_box_release(dp_tensor_box *box);

/* Memory pressure: tensors are freed by Lua's GC, which does not see their
 * size; the binding collects when this says enough was allocated. */
DP_API int dp_gc_wanted(void);
DP_API void dp_gc_done(double lua_heap_kb);   /* after the collection: collectgarbage("count") */

/* How many ReLU and tanh GELU backwards were folded into the backward of
 * the layer after them (see ag_offered_mask in src/core/autograd.h) since
 * the start: for tests, and to see whether a model's activations fold. */
DP_API int64_t dp_activation_backwards_folded(void);

/* An optimizer bucket's check before its fused step: every parameter
 * must still be the view at offsets[j] of flat_param (an error naming fn
 * otherwise); *any: some parameter has a gradient; *all: every one has,
 * and each is its slot at offsets[j] of flat_grad. */
DP_API dp_status dp_flat_grad_status(const char *fn, dp_tensor *flat_param, dp_tensor *flat_grad, int n,
                                     dp_tensor *const *params, const int64_t *offsets, int *all, int *any);

/* Nodes whose backward is computed in Lua (torch.utils.checkpoint,
 * torch.autograd.Function) and gradient hooks written in Lua
 * (Tensor:register_hook), src/core/autograd.c: fn(id, grad, n, grads_in,
 * err, errcap) fills grads_in[i] (new references, or NULL) for the node's
 * n inputs and returns 0, or writes a message into err and returns
 * non-zero; for a hook, n is 1 and grads_in[0] is the replacement of grad
 * (or NULL to keep it); once a hooked leaf's gradient is accumulated into
 * its .grad, fn runs again with grad the leaf, n 0 and no grads_in (its
 * post-accumulate hooks). dp_lua_node makes *out, an alias of value whose
 * node, named name (e.g. "MyExpBackward"), has inputs and id (when grad
 * mode is on and an input requires grad). dp_set_lua_hook gives a tensor
 * that requires grad the hook id (0: none), which dp_lua_hook_id reads.
 * dp_lua_nodes_live counts the nodes and hooked tensors a backward may
 * still meet; dp_lua_nodes_done takes up to cap ids of nodes whose saved
 * state is gone and of hooked tensors freed, and returns how many. */
typedef int (*dp_lua_backward)(int64_t id, dp_tensor *grad, int n, dp_tensor **grads_in, char *err, size_t errcap);
DP_API void dp_set_lua_backward(dp_lua_backward fn);
DP_API dp_status dp_lua_node(dp_tensor **out, dp_tensor *value, int n, dp_tensor *const *inputs, int64_t id,
                             const char *name);
DP_API dp_status dp_set_lua_hook(dp_tensor *t, int64_t id);
DP_API int64_t dp_lua_hook_id(const dp_tensor *t);
DP_API int64_t dp_lua_nodes_live(void);
DP_API int dp_lua_nodes_done(int64_t *ids, int cap);

/* torch.autograd.grad: the gradients of the nout outputs (seeded with
 * grad_outputs[i], NULL for the implicit 1 of a one-element output) with
 * respect to the nin inputs, as new tensors in grads[i] (NULL for an
 * input the outputs do not depend on). Runs only the part of the graph
 * that leads to the inputs, and touches no .grad. dp_grad_capturing
 * tells whether such a walk is running (a checkpointed call cannot be
 * recomputed inside it). */
DP_API dp_status dp_grad(int nout, dp_tensor *const *outputs, dp_tensor *const *grad_outputs, int nin,
                         dp_tensor *const *inputs, dp_tensor **grads, int retain_graph);
DP_API int dp_grad_capturing(void);

/* The tensors ts as runs that hold each element of each tensor once per
 * time the tensor is listed: contiguous tensors that lie back to back in
 * one storage (an optimizer's or DDP's flat gradient buffer) become one
 * 1-D view over them, any other tensor is its own run (retained). runs has room for n;
 * *nruns are written, new references. clip_grad_norm_ reduces and scales
 * one buffer at a time through them. */
DP_API dp_status dp_flat_runs(int n, dp_tensor *const *ts, dp_tensor **runs, int *nruns);

/* The deferred Linear (src/core/gpu_linear.c, "deferred launches"): how
 * many times a small Linear and the ReLU or GELU after it ran as one
 * launch; whether small Linears wait to share a launch (on by default;
 * tests turn it off to compare with each op's own launch); and launching
 * the waiting work now, before work that another thread will queue (a
 * process group's collectives) or a raw pointer leaves for Lua. */
DP_API int64_t dp_cuda_linear_fusions(void);
DP_API void dp_cuda_set_deferral(int on);
DP_API void dp_cuda_launch_deferred(void);

/* The launcher, `dplua --nproc_per_node=N script.lua args...`
 * (src/dist/launch.c, docs/DISTRIBUTED.md): starts the ranks of this node
 * and ends them all when one fails. argv[0] is the program, argv[1] the
 * first launcher flag. Returns the exit status: 0 when every rank exited
 * 0; the status of the first rank that failed (128 + signal number when a
 * signal killed it); 128 + the signal when the launcher was interrupted;
 * 2 for a bad command line; 1 when the ranks could not be started. */
DP_API int dp_launch_main(int argc, char **argv);
DP_API int dp_launch_is_flag(const char *arg);   /* "--nproc-per-node=4", "--tee": '_' or '-' */
/* In a rank the launcher started (DPLUA_LAUNCHER_PID is set), first thing
 * in main: stdout line-buffered when a pipe; on SIGTERM (the launcher
 * stopping the job, or dying) what was printed is flushed and the rank's
 * process group ended (src/dist/rank.c). Elsewhere it does nothing. */
DP_API void dp_launch_rank_setup(void);

/* `dplua env`: the libraries and devices of this build, one fact at a
 * time ("CUDA runtime", "13.0"), values that say why when something is
 * missing; never fails. */
typedef void (*dp_fact_fn)(const char *key, const char *value, void *ctx);
DP_API void dp_env_facts(dp_fact_fn fn, void *ctx);
/* DP_CDEF_END */

/* The line editor of the distributed REPL's prompt (src/dist/launch_repl.c),
 * given by the program (src/lua/host.c's, with libedit and the history):
 * reads a line after showing prompt into *line (malloc'd, no newline);
 * returns 0, -1 at the end of input, or 1 when wait(arg) gave up the line.
 * While it waits for a key it calls wait(arg), which returns 0 once stdin
 * has input; complete(arg, text) gives the words that text may become
 * (NULL-terminated, malloc'd, or NULL). Without one, the launcher reads
 * plain lines (dp_launch_read_plain_line). */
typedef int (*dp_line_reader)(const char *prompt, char **line, int (*wait)(void *arg),
                              char **(*complete)(void *arg, const char *text), void *arg);
void dp_launch_set_line_reader(dp_line_reader read_line);
/* The plain reader, a dp_line_reader without editing: the prompt when stdin
 * is a terminal, then stdin one byte at a time up to a newline, calling
 * wait(arg) before each, so that nothing is read ahead of the line. */
int dp_launch_read_plain_line(const char *prompt, char **line, int (*wait)(void *arg),
                              char **(*complete)(void *arg, const char *text), void *arg);

#ifdef __cplusplus
}
#endif
#endif /* DPLUA_INTERNAL_H */
