/*
 * gloo.cc — the Gloo backend of process groups: CPU tensors over Gloo's
 * TCP transport. The one C++ file of dplua; its face is the plain C of
 * pg.h (pg_gloo_*), so pg.c never sees a C++ type.
 *
 * Rendezvous goes through our store: Gloo's rendezvous::Store is
 * implemented below over pg_store_set/get/wait (pg.c's locked, polling
 * face of dp_store_*) under the group's prefix, so several groups' keys
 * coexist. Each group has its own device (one event-loop thread) and
 * context; pg.c runs at most one op of a group at a time, and each op's
 * tag comes from its sequence number (see op_tag).
 *
 * Reductions are done here, per dtype: integers wrap (two's complement, as
 * in PyTorch), bool is uint8 with SUM and MAX as OR and PRODUCT and MIN as
 * AND, bfloat16 is reduced in a float32 copy and rounded once at the end,
 * and AVG is a SUM divided by the group size (floating dtypes only: pg.c
 * rejects the others). Every Gloo exception becomes a status and a message.
 */
#include "dist/pg.h"
#include "common/dtype_conv.h"   /* bfloat16 <-> float, as the tensors convert */

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/gather.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/scatter.h>
#include <gloo/transport/tcp/device.h>

#include <dlfcn.h>
#include <typeinfo>

#include <algorithm>
#include <chrono>
#include <deque>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

using std::chrono::milliseconds;

/* ---------------------------------------------------------------- store */

/* Gloo's rendezvous store over ours. Failures throw, as Gloo expects; the
 * message is the store's own (it names the key and the timeout). */
class DpStore : public gloo::rendezvous::Store {
public:
    DpStore(dp_store *s, const char *prefix, double timeout_s)
        : s_(s), prefix_(prefix), timeout_s_(timeout_s) {}

    void set(const std::string &key, const std::vector<char> &data) override
    {
        if (pg_store_set(s_, (prefix_ + key).c_str(), data.data(), data.size()))
            throw gloo::IoException(dp_last_error());
    }

    std::vector<char> get(const std::string &key) override
    {
        void *v = nullptr;
        size_t n = 0;
        if (pg_store_get(s_, (prefix_ + key).c_str(), &v, &n, timeout_s_))
            throw gloo::IoException(dp_last_error());
        std::vector<char> out((char *)v, (char *)v + n);
        dp_free(v);
        return out;
    }

    void wait(const std::vector<std::string> &keys) override { wait(keys, milliseconds(0)); }

    void wait(const std::vector<std::string> &keys, const milliseconds &timeout) override
    {
        std::vector<std::string> full;
        std::vector<const char *> ptrs;
        for (const auto &k : keys)
            full.push_back(prefix_ + k);
        for (const auto &k : full)
            ptrs.push_back(k.c_str());
        double t = timeout.count() > 0 ? timeout.count() / 1000.0 : timeout_s_;
        if (pg_store_wait(s_, ptrs.data(), (int)ptrs.size(), t))
            throw gloo::IoException(missing(keys, t));
    }

private:
    /* Gloo's rendezvous keys are the ranks' numbers: say which ranks did
     * not join, or else what the store said. */
    std::string missing(const std::vector<std::string> &keys, double t)
    {
        std::string why = dp_last_error(), ranks;
        int n = 0;
        for (const auto &k : keys) {
            std::string full = prefix_ + k;
            const char *key = full.c_str();
            int present = 1;
            if (k.empty() || k.find_first_not_of("0123456789") != std::string::npos ||
                pg_store_check(s_, &key, 1, &present))
                return why;
            if (!present)
                ranks += (n++ ? ", " : "") + k;
        }
        char buf[128];
        snprintf(buf, sizeof buf, " did not join within %g s", t);
        return (n == 1 ? "rank " : "ranks ") + ranks + buf;
    }

    dp_store *s_;
    std::string prefix_;
    double timeout_s_;
};

struct pg_gloo {
    std::shared_ptr<gloo::transport::Device> dev;
    std::shared_ptr<gloo::rendezvous::Context> ctx;
    milliseconds timeout;
    int rank, size;
    std::deque<std::shared_ptr<void>> parked;   /* see park() */
};

/* ---------------------------------------------------------------- parking */

/* Destroying a tcp::UnboundBuffer spins on sched_yield until Gloo's event
 * loop has dropped its reference to it, which the loop does just after
 * completing the op. Destroyed at once, on a busy machine, that yield
 * hands the core to another process for a whole scheduler tick (4 ms
 * here: small all_reduces went from ~60 us to 2-4 ms). So the options
 * (which own the buffers) of an op that succeeded are parked and
 * destroyed a few ops later. A failed op's buffers are destroyed at once:
 * Gloo may still hold a receive for them, and a destroyed buffer is the
 * only thing that stops it from writing into memory its caller may free. */
enum { PG_PARKED = 8 };

template <typename O>
static void park(pg_gloo *g, std::shared_ptr<O> o)
{
    g->parked.push_back(std::move(o));
    if (g->parked.size() > PG_PARKED)
        g->parked.pop_front();
}

/* Runs one Gloo collective whose options the caller has filled in (its
 * buffers, root, reduction), with the op's tag and the group's timeout,
 * then parks the options. */
template <typename O, typename F>
static void run_op(pg_gloo *g, std::shared_ptr<O> o, uint32_t tag, F collective)
{
    o->setTag(tag);
    o->setTimeout(g->timeout);
    collective(*o);
    park(g, o);
}

/* ---------------------------------------------------------------- tags */

/* Gloo matches messages by slot, built from an op's tag, and a message
 * longer than the buffer posted for its slot fails an enforce on Gloo's
 * event-loop thread, which ends the process. So the tag is not just the
 * sequence number but a hash of everything the ranks must agree on (seq,
 * op, dtype, count, root, reduction): ranks that called different
 * collectives or sizes post different slots, nothing moves, and each side
 * times out with an error instead. */
static uint32_t mix(uint32_t h, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        h ^= (uint32_t)(v >> (8 * i)) & 0xff;
        h *= 16777619u;   /* FNV-1a */
    }
    return h;
}

static uint32_t op_tag(const pg_op *op)
{
    uint32_t h = 2166136261u;
    h = mix(h, op->seq);
    h = mix(h, (uint64_t)op->kind << 48 | (uint64_t)op->dtype << 32 | (uint32_t)op->redop);
    h = mix(h, (uint64_t)op->count);
    return mix(h, (uint64_t)(int64_t)op->root);
}

/* Point-to-point slots live above every collective's (Gloo puts a small
 * prefix in the top byte): 0xd0, then 24 bits of the user's tag, then a
 * hash of the byte count and dtype, so that a send and a recv of
 * different sizes time out instead of meeting. */
static uint64_t p2p_slot(int tag, int64_t count, dp_dtype dtype)
{
    uint32_t h = mix(mix(2166136261u, (uint64_t)count), (uint64_t)dtype);
    return (0xd0ULL << 56) | ((uint64_t)(tag & 0xffffff) << 32) | h;
}

/* ---------------------------------------------------------------- reductions */

typedef void (*reduce_fn)(void *, const void *, const void *, size_t);

/* c = a op b over n elements; integers through their unsigned type so
 * that overflow wraps instead of being undefined. */
template <typename T, int OP>
static void reduce_elems(void *c_, const void *a_, const void *b_, size_t n)
{
    T *c = (T *)c_;
    const T *a = (const T *)a_, *b = (const T *)b_;
    typedef typename std::conditional<std::is_integral<T>::value, std::make_unsigned<T>, std::common_type<T>>::type::type U;
    for (size_t i = 0; i < n; i++) {
        switch (OP) {
        case DP_SUM: case DP_MEAN: c[i] = (T)((U)a[i] + (U)b[i]); break;
        case DP_PROD: c[i] = (T)((U)a[i] * (U)b[i]); break;
        case DP_MAX: c[i] = std::max(a[i], b[i]); break;
        case DP_MIN: c[i] = std::min(a[i], b[i]); break;
        }
    }
}

template <typename T>
static reduce_fn reducer_of(dp_redop op)
{
    switch (op) {
    case DP_SUM: case DP_MEAN: return reduce_elems<T, DP_SUM>;
    case DP_PROD: return reduce_elems<T, DP_PROD>;
    case DP_MAX: return reduce_elems<T, DP_MAX>;
    default: return reduce_elems<T, DP_MIN>;
    }
}

/* bool holds 0 or 1: OR is max, AND is min. */
static dp_redop bool_op(dp_redop op)
{
    return op == DP_SUM || op == DP_MAX ? DP_MAX : DP_MIN;
}

/* ---------------------------------------------------------------- typed collectives */

/* The reducing collectives work on an array of T; bfloat16 arrives here
 * already as float. `buf` is reduced in place (all_reduce) or into `out`
 * (reduce: only the root's out holds the result). */
template <typename T>
static void allreduce_t(pg_gloo *g, T *buf, size_t n, dp_redop op, uint32_t tag)
{
    auto o = std::make_shared<gloo::AllreduceOptions>(g->ctx);
    o->setOutput(buf, n);
    o->setReduceFunction(reducer_of<T>(op));
    run_op(g, o, tag, gloo::allreduce);
}

template <typename T>
static void reduce_t(pg_gloo *g, T *in, T *out, size_t n, int root, dp_redop op, uint32_t tag)
{
    auto o = std::make_shared<gloo::ReduceOptions>(g->ctx);
    o->setInput(in, n);
    o->setOutput(out, n);
    o->setRoot(root);
    o->setReduceFunction(reducer_of<T>(op));
    run_op(g, o, tag, gloo::reduce);
}

template <typename T>
static void divide(T *p, size_t n, int size)
{
    for (size_t i = 0; i < n; i++)
        p[i] /= (T)size;
}

/* all_reduce, reduce and reduce_scatter on one storage type T (the op's
 * dtype, or float for bfloat16 with `in`/`out` already converted). */
template <typename T>
static void reducing_op(pg_gloo *g, const pg_op *op, T *in, T *out)
{
    uint32_t tag = op_tag(op);
    size_t n = (size_t)op->count;
    bool avg = op->redop == DP_MEAN;
    switch (op->kind) {
    case PG_ALL_REDUCE:
        allreduce_t(g, out, n, op->redop, tag);
        if (avg)
            divide(out, n, g->size);
        break;
    case PG_REDUCE:
        if (g->rank == op->root) {
            reduce_t(g, in, out, n, op->root, op->redop, tag);
            if (avg)
                divide(out, n, g->size);
        } else {
            std::vector<T> scratch(n);   /* non-roots keep their tensor */
            reduce_t(g, in, scratch.data(), n, op->root, op->redop, tag);
        }
        break;
    case PG_REDUCE_SCATTER: {
        /* all_reduce a copy of the whole input, keep this rank's slice */
        std::vector<T> all(in, in + n * g->size);
        allreduce_t(g, all.data(), all.size(), op->redop, tag);
        std::copy(all.begin() + n * g->rank, all.begin() + n * (g->rank + 1), out);
        if (avg)
            divide(out, n, g->size);
        break;
    }
    }
}

static size_t in_count(const pg_op *op, int size)
{
    return op->kind == PG_REDUCE_SCATTER ? (size_t)op->count * size : (size_t)op->count;
}

static void reducing_bf16(pg_gloo *g, const pg_op *op)
{
    size_t nin = in_count(op, g->size), nout = (size_t)op->count;
    std::vector<float> in(nin), out(nout);
    const uint16_t *src = (const uint16_t *)op->in;
    for (size_t i = 0; i < nin; i++)
        in[i] = bf16_to_f32(src[i]);
    if (op->kind == PG_ALL_REDUCE)
        out = in;
    reducing_op<float>(g, op, in.data(), out.data());
    if (op->kind == PG_REDUCE && g->rank != op->root)
        return;
    uint16_t *dst = (uint16_t *)op->out;
    for (size_t i = 0; i < nout; i++)
        dst[i] = f32_to_bf16(out[i]);
}

static void reducing(pg_gloo *g, const pg_op *op)
{
    switch (op->dtype) {
    case DP_FLOAT32: reducing_op<float>(g, op, (float *)op->in, (float *)op->out); break;
    case DP_FLOAT64: reducing_op<double>(g, op, (double *)op->in, (double *)op->out); break;
    case DP_INT64: reducing_op<int64_t>(g, op, (int64_t *)op->in, (int64_t *)op->out); break;
    case DP_INT32: reducing_op<int32_t>(g, op, (int32_t *)op->in, (int32_t *)op->out); break;
    case DP_UINT8: reducing_op<uint8_t>(g, op, (uint8_t *)op->in, (uint8_t *)op->out); break;
    case DP_BOOL: {
        pg_op b = *op;
        b.redop = bool_op(op->redop);
        reducing_op<uint8_t>(g, &b, (uint8_t *)op->in, (uint8_t *)op->out);
        break;
    }
    case DP_BFLOAT16: reducing_bf16(g, op); break;
    default: throw std::invalid_argument("unsupported dtype");
    }
}

/* ---------------------------------------------------------------- byte collectives */

static void broadcast_bytes(pg_gloo *g, const pg_op *op, size_t nbytes)
{
    auto o = std::make_shared<gloo::BroadcastOptions>(g->ctx);
    o->setOutput((uint8_t *)op->out, nbytes);
    o->setRoot(op->root);
    run_op(g, o, op_tag(op), gloo::broadcast);
}

static void allgather_bytes(pg_gloo *g, const pg_op *op, size_t nbytes)
{
    auto o = std::make_shared<gloo::AllgatherOptions>(g->ctx);
    o->setInput((uint8_t *)op->in, nbytes);
    o->setOutput((uint8_t *)op->out, nbytes * g->size);
    run_op(g, o, op_tag(op), gloo::allgather);
}

static void alltoall_bytes(pg_gloo *g, const pg_op *op, size_t nbytes)
{
    auto o = std::make_shared<gloo::AlltoallOptions>(g->ctx);
    o->setInput((uint8_t *)op->in, nbytes * g->size);
    o->setOutput((uint8_t *)op->out, nbytes * g->size);
    run_op(g, o, op_tag(op), gloo::alltoall);
}

static void barrier(pg_gloo *g, const pg_op *op)
{
    run_op(g, std::make_shared<gloo::BarrierOptions>(g->ctx), op_tag(op), gloo::barrier);
}

static void send_recv(pg_gloo *g, const pg_op *op, size_t nbytes)
{
    std::shared_ptr<gloo::transport::UnboundBuffer> buf = g->ctx->createUnboundBuffer(op->in, nbytes);
    if (op->kind == PG_SEND) {
        buf->send(op->root, p2p_slot(op->tag, op->count, op->dtype));
        if (!buf->waitSend(g->timeout))
            throw gloo::IoException("send was aborted");
    } else {
        buf->recv(op->root, p2p_slot(op->tag, op->count, op->dtype));
        if (!buf->waitRecv(g->timeout))
            throw gloo::IoException("recv was aborted");
    }
    park(g, buf);
}

/* gather and scatter on bytes: each rank's part is nbytes. */
static void gather_bytes(pg_gloo *g, const pg_op *op, size_t nbytes)
{
    auto o = std::make_shared<gloo::GatherOptions>(g->ctx);
    o->setInput((uint8_t *)op->in, nbytes);
    if (g->rank == op->root)
        o->setOutput((uint8_t *)op->out, nbytes * g->size);
    o->setRoot(op->root);
    run_op(g, o, op_tag(op), gloo::gather);
}

static void scatter_bytes(pg_gloo *g, const pg_op *op, size_t nbytes)
{
    auto o = std::make_shared<gloo::ScatterOptions>(g->ctx);
    if (g->rank == op->root) {
        std::vector<uint8_t *> parts;
        for (int r = 0; r < g->size; r++)
            parts.push_back((uint8_t *)op->in + r * nbytes);
        o->setInputs(parts.data(), parts.size(), nbytes);
    }
    o->setOutput((uint8_t *)op->out, nbytes);
    o->setRoot(op->root);
    run_op(g, o, op_tag(op), gloo::scatter);
}

/* A posted PG_P2P batch: one unbound buffer per send or receive, waited
 * for by pg_gloo_finish. */
struct p2p_batch {
    std::vector<pg_p2p> parts;
    std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> bufs;
};

/* Posts every part (Gloo's send waits for the peer's matching receive,
 * so nothing here may wait). Empty parts post nothing, as the peer's
 * matching part does. */
static void post_p2p(pg_gloo *g, const pg_op *op)
{
    std::unique_ptr<p2p_batch> b(new p2p_batch());
    for (int i = 0; i < op->nparts; i++) {
        const pg_p2p &p = op->parts[i];
        size_t nbytes = (size_t)p.count * dp_dtype_size(p.dtype);
        b->parts.push_back(p);
        b->bufs.push_back(nbytes ? g->ctx->createUnboundBuffer(p.buf, nbytes) : nullptr);
        if (!nbytes)
            continue;
        if (p.send)
            b->bufs.back()->send(p.peer, p2p_slot(p.tag, p.count, p.dtype));
        else
            b->bufs.back()->recv(p.peer, p2p_slot(p.tag, p.count, p.dtype));
    }
    *op->pending = b.release();
}

static void run(pg_gloo *g, const pg_op *op)
{
    if (op->kind == PG_P2P) {
        post_p2p(g, op);
        return;
    }
    size_t nbytes = (size_t)op->count * dp_dtype_size(op->dtype);
    if (op->kind != PG_BARRIER && nbytes == 0)
        return;   /* nothing to move; every rank sees the same count */
    switch (op->kind) {
    case PG_ALL_REDUCE: case PG_REDUCE: case PG_REDUCE_SCATTER: reducing(g, op); break;
    case PG_BROADCAST: broadcast_bytes(g, op, nbytes); break;
    case PG_ALL_GATHER: allgather_bytes(g, op, nbytes); break;
    case PG_ALL_TO_ALL: alltoall_bytes(g, op, nbytes); break;
    case PG_SEND: case PG_RECV: send_recv(g, op, nbytes); break;
    case PG_BARRIER: barrier(g, op); break;
    case PG_GATHER: gather_bytes(g, op, nbytes); break;
    case PG_SCATTER: scatter_bytes(g, op, nbytes); break;
    }
}

/* ---------------------------------------------------------------- abort */

/* Gloo offers no public way to end a collective from another thread: an
 * op waits for its peers until its timeout. tcp::Pair has one for its
 * device, signalExceptionExternal (under the pair's lock, it fails every
 * op of this rank waiting on the pair; a peer's op ends when its own
 * check finds the same mismatch, or when this process exits), but
 * tcp/pair.h, which declares it, needs headers Debian's Gloo does not
 * ship. So it is found by its symbol and called through a plain function
 * of the same calling convention (the Itanium C++ ABI: the returned
 * exception_ptr's slot, then `this`, then the string), only on a pair
 * whose dynamic type is tcp::Pair, whose first base is transport::Pair
 * (so both pointers are one). Without the symbol, nothing happens: the op
 * ends at its timeout, with the same message. */
typedef std::exception_ptr (*pair_signal_fn)(gloo::transport::Pair *self, const std::string &msg);

static pair_signal_fn pair_signal()
{
    static pair_signal_fn fn = (pair_signal_fn)dlsym(
        RTLD_DEFAULT, "_ZN4gloo9transport3tcp4Pair23signalExceptionExternalERKNSt7__cxx1112basic_"
                      "stringIcSt11char_traitsIcESaIcEEE");
    return fn;
}

extern "C" void pg_gloo_abort(pg_gloo *g)
{
    pair_signal_fn signal = pair_signal();
    if (!signal)
        return;
    const std::string why = "aborted: the ranks called different collectives";
    for (int r = 0; r < g->size; r++) {
        if (r == g->rank)
            continue;
        try {
            gloo::transport::Pair *p = g->ctx->getPair(r).get();
            if (p && strcmp(typeid(*p).name(), "N4gloo9transport3tcp4PairE") == 0)
                (void)signal(p, why);
        } catch (...) {
        }
    }
}

/* ---------------------------------------------------------------- the C face */

/* Gloo's messages start with "[file.cc:123] ": keep only the words. */
static void set_err(char *err, size_t errlen, const char *what)
{
    const char *p = what;
    if (*p == '[') {
        const char *q = strstr(p, "] ");
        if (q)
            p = q + 2;
    }
    snprintf(err, errlen, "%s", p);
}

#define GLOO_TRY(body)                                           \
    try {                                                        \
        body;                                                    \
    } catch (const std::bad_alloc &) {                           \
        set_err(err, errlen, "out of memory");                   \
        return DP_ERR_MEMORY;                                    \
    } catch (const std::exception &e) {                          \
        set_err(err, errlen, e.what());                          \
        return DP_ERR_IO;                                        \
    } catch (...) {                                              \
        set_err(err, errlen, "unknown exception from Gloo");     \
        return DP_ERR_IO;                                        \
    }

static dp_status gloo_connect(pg_gloo *g, dp_store *store, const char *prefix, double timeout_s,
                              const char *host, const char *iface, char *err, size_t errlen)
{
    GLOO_TRY({
        gloo::transport::tcp::attr attr;
        if (iface && *iface)
            attr.iface = iface;
        else
            attr.hostname = host;
        g->dev = gloo::transport::tcp::CreateDevice(attr);
        g->ctx = std::make_shared<gloo::rendezvous::Context>(g->rank, g->size);
        g->ctx->setTimeout(g->timeout);
        DpStore s(store, prefix, timeout_s);
        g->ctx->connectFullMesh(s, g->dev);
    });
    return DP_OK;
}

extern "C" dp_status pg_gloo_new(pg_gloo **out, dp_store *store, const char *prefix, int rank, int size,
                                 double timeout_s, const char *host, const char *iface, char *err, size_t errlen)
{
    *out = nullptr;
    pg_gloo *g = new (std::nothrow) pg_gloo();
    if (!g) {
        set_err(err, errlen, "out of memory");
        return DP_ERR_MEMORY;
    }
    g->rank = rank;
    g->size = size;
    g->timeout = milliseconds((int64_t)(timeout_s * 1000 + 0.5));
    dp_status st = gloo_connect(g, store, prefix, timeout_s, host, iface, err, errlen);
    if (st) {
        pg_gloo_free(g);
        return st;
    }
    *out = g;
    return DP_OK;
}

extern "C" dp_status pg_gloo_run(pg_gloo *g, const pg_op *op, char *err, size_t errlen)
{
    GLOO_TRY(run(g, op));
    return DP_OK;
}

/* "the send of 4 float32 elements to group rank 1 (tag 0)" */
static std::string part_name(const pg_p2p &p)
{
    char buf[160];
    snprintf(buf, sizeof buf, "the %s of %lld %s elements %s group rank %d (tag %d)", p.send ? "send" : "receive",
             (long long)p.count, dp_dtype_name(p.dtype), p.send ? "to" : "from", p.peer, p.tag);
    return buf;
}

extern "C" dp_status pg_gloo_finish(pg_gloo *g, void *pending, char *err, size_t errlen)
{
    std::unique_ptr<p2p_batch> b((p2p_batch *)pending);
    size_t i = 0;
    try {
        for (; i < b->bufs.size(); i++) {
            auto &buf = b->bufs[i];
            if (buf && !(b->parts[i].send ? buf->waitSend(g->timeout) : buf->waitRecv(g->timeout)))
                throw gloo::IoException("it was aborted");
        }
    } catch (const std::exception &e) {
        std::string what = e.what();
        if (what[0] == '[' && what.find("] ") != std::string::npos)
            what = what.substr(what.find("] ") + 2);
        snprintf(err, errlen, "%s did not complete: %s", part_name(b->parts[i]).c_str(), what.c_str());
        return DP_ERR_IO;
    } catch (...) {
        snprintf(err, errlen, "%s did not complete", part_name(b->parts[i]).c_str());
        return DP_ERR_IO;
    }
    return DP_OK;
}

extern "C" void pg_gloo_free(pg_gloo *g)
{
    if (!g)
        return;
    try {
        g->parked.clear();
        g->ctx.reset();
        g->dev.reset();
    } catch (...) {
    }
    delete g;
}
