#!/usr/bin/python3
"""Writes tests/ref/losses.lua: PyTorch's values and input gradients of
the losses F.binary_cross_entropy, smooth_l1_loss, huber_loss, kl_div,
soft_margin_loss, cosine_embedding_loss, margin_ranking_loss,
hinge_embedding_loss, poisson_nll_loss, gaussian_nll_loss,
triplet_margin_loss, triplet_margin_with_distance_loss, multi_margin_loss,
multilabel_margin_loss and multilabel_soft_margin_loss, and of the tensor
ops addcmul, addcdiv and lerp,
for tests/lua/test_losses.lua: every reduction and option, edge values
(probabilities of 0 and 1, beta = 0, differences equal to beta or delta,
targets of 0, a zero row), broadcasting; in float64 and float32.
    /usr/bin/python3 scripts/gen_loss_ref.py > tests/ref/losses.lua

A case is {fn=, args=, opts=, grad=, f64=, f32=} (or int64=): args the
positional arguments, each a number or a tensor {shape=, values=}
(dtype= when it keeps its own dtype, else the case's); opts the options
table (a tensor in it as in args; distance_function "cosine" stands for
1 - cosine_similarity(a, b)); grad the 1-based positions of the
arguments whose gradients are kept. Per dtype: y (flat values), shape,
and dx = {[position] = flat gradient} of sum(y * cos(1 + k)) over y's flat
index k (a 0-d y: of y).
"""
import math
import warnings

import torch
import torch.nn.functional as F

warnings.simplefilter("ignore")   # the broadcast and "mean" warnings

DTYPES = {"float64": torch.float64, "float32": torch.float32, "int64": torch.int64}


def values(shape, f):
    """A flat list of f(k) over this shape's flat indices, rounded to 6 decimals."""
    return [round(f(k), 6) for k in range(math.prod(shape))]


def T(shape, f, dtype=None):
    """An argument tensor: shape and values (f a function of the flat index, or a list)."""
    v = f if isinstance(f, list) else values(shape, f)
    assert len(v) == math.prod(shape)
    t = {"shape": list(shape), "values": v}
    if dtype:
        t["dtype"] = dtype
    return t


def prob(shape, seed):
    """Values in (0, 1)."""
    return T(shape, lambda k: 0.05 + 0.9 * (0.5 + 0.5 * math.sin(seed + 1.7 * k)))


def wave(shape, seed, scale=2.0):
    return T(shape, lambda k: scale * math.sin(seed + 0.9 * k + 0.3 * k * k))


def signs(shape, seed, dtype=None):
    """1 or -1."""
    return T(shape, lambda k: 1.0 if math.sin(seed + 2.3 * k) > 0 else -1.0, dtype)


CASES = {}


def case(name, fn, args, opts=None, grad=(1,), dtypes=("float64", "float32")):
    assert name not in CASES, name
    CASES[name] = {"fn": fn, "args": args, "opts": opts or {}, "grad": list(grad), "dtypes": dtypes}


# ---------------------------------------------------------------- losses

RED = ("mean", "sum", "none")
for r in RED:
    case("bce_" + r, "binary_cross_entropy", [prob([3, 4], 1), prob([3, 4], 2)], {"reduction": r})
case("bce_weight_row", "binary_cross_entropy", [prob([3, 4], 3), prob([3, 4], 4)],
     {"weight": T([4], lambda k: 0.5 + k)})
case("bce_weight_full_sum", "binary_cross_entropy", [prob([2, 3], 5), prob([2, 3], 6)],
     {"weight": T([2, 3], lambda k: 2.0 - 0.3 * k), "reduction": "sum"})
# logs clamped at -100, gradients w (x - t) / max(x (1 - x), 1e-12)
case("bce_edges", "binary_cross_entropy",
     [T([8], [0.0, 0.0, 1.0, 1.0, 1e-50, 1.0 - 1e-7, 1e-20, 0.5]),
      T([8], [0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.3, 0.0])], {"reduction": "none"})
case("bce_target_grad", "binary_cross_entropy", [prob([5], 7), prob([5], 8)], {"reduction": "sum"}, grad=(1, 2))
case("bce_0d", "binary_cross_entropy", [T([], [0.25]), T([], [0.75])])

for r in RED:
    case("smooth_l1_" + r, "smooth_l1_loss", [wave([3, 4], 1), wave([3, 4], 2)], {"reduction": r}, grad=(1, 2))
for beta in (0.0, 0.5, 2.5):
    tag = str(beta).replace(".", "_")
    case("smooth_l1_beta_" + tag, "smooth_l1_loss", [wave([3, 4], 3), wave([3, 4], 4)],
         {"beta": beta, "reduction": "none"}, grad=(1, 2))
    case("smooth_l1_beta_" + tag + "_mean", "smooth_l1_loss", [wave([2, 5], 5), wave([2, 5], 6)], {"beta": beta})
# differences of exactly 0, beta and -beta (binary fractions), and a broadcast target
case("smooth_l1_at_beta", "smooth_l1_loss", [T([4], [1.5, -0.25, 0.75, 2.0]), T([4], [1.0, 0.25, 0.75, 0.0])],
     {"beta": 0.5, "reduction": "none"}, grad=(1, 2))
case("smooth_l1_beta_0_at_0", "smooth_l1_loss", [T([3], [1.5, 0.25, -2.0]), T([3], [1.5, 0.0, 1.0])],
     {"beta": 0.0, "reduction": "none"})
case("smooth_l1_broadcast", "smooth_l1_loss", [wave([3, 4], 7), wave([3, 1], 8)], {"reduction": "sum"}, grad=(1, 2))

for r in RED:
    case("huber_" + r, "huber_loss", [wave([3, 4], 9), wave([3, 4], 10)], {"reduction": r}, grad=(1, 2))
for delta in (0.3, 2.0):
    tag = str(delta).replace(".", "_")
    case("huber_delta_" + tag, "huber_loss", [wave([3, 4], 11), wave([3, 4], 12)],
         {"delta": delta, "reduction": "none"}, grad=(1, 2))
case("huber_at_delta", "huber_loss", [T([4], [1.5, -0.25, 0.75, 2.0]), T([4], [1.0, 0.25, 0.75, 0.0])],
     {"delta": 0.5, "reduction": "none"}, grad=(1, 2))
case("huber_broadcast", "huber_loss", [wave([2, 3], 13), wave([3], 14)], {"delta": 0.7}, grad=(1, 2))


def log_probs(shape, seed):
    t = torch.tensor(values(shape, lambda k: math.sin(seed + 1.3 * k)), dtype=torch.float64).reshape(shape)
    return T(shape, t.log_softmax(-1).reshape(-1).tolist())


def probs(shape, seed, zeros=False):
    t = torch.tensor(values(shape, lambda k: math.cos(seed + 0.7 * k)), dtype=torch.float64).reshape(shape)
    p = t.softmax(-1).reshape(-1)
    if zeros:
        p[::3] = 0.0
    return T(shape, p.tolist())


for r in ("mean", "sum", "none", "batchmean"):
    case("kl_div_" + r, "kl_div", [log_probs([3, 4], 1), probs([3, 4], 2, zeros=True)], {"reduction": r})
    case("kl_div_log_target_" + r, "kl_div", [log_probs([3, 4], 3), log_probs([3, 4], 4)],
         {"reduction": r, "log_target": True}, grad=(1, 2))
case("kl_div_target_grad", "kl_div", [log_probs([2, 3], 5), probs([2, 3], 6)], {"reduction": "sum"}, grad=(1, 2))
case("kl_div_batchmean_3d", "kl_div", [log_probs([2, 3, 4], 7), probs([2, 3, 4], 8)], {"reduction": "batchmean"})
case("kl_div_batchmean_1d", "kl_div", [log_probs([5], 9), probs([5], 10)], {"reduction": "batchmean"})
case("kl_div_broadcast", "kl_div", [log_probs([3, 4], 11), probs([1, 4], 12)], {"reduction": "batchmean"})

for r in RED:
    case("soft_margin_" + r, "soft_margin_loss", [wave([3, 4], 15, 4.0), signs([3, 4], 1)], {"reduction": r})
# 0 (where the gradient is -t / 2) and large |t x|
case("soft_margin_edges", "soft_margin_loss", [T([6], [0.0, 0.0, 30.0, -30.0, 12.5, -80.0]),
                                               T([6], [1.0, -1.0, -1.0, -1.0, 1.0, 1.0])], {"reduction": "none"})
case("soft_margin_broadcast", "soft_margin_loss", [wave([3, 4], 16), signs([4], 2)])

cos_target = T([5], [1, -1, 1, -1, 0], "int64")
for r in RED:
    case("cosine_embedding_" + r, "cosine_embedding_loss", [wave([5, 3], 17), wave([5, 3], 18), cos_target],
         {"reduction": r}, grad=(1, 2))
for m in (0.3, -0.2):
    tag = str(m).replace(".", "_").replace("-", "neg")
    case("cosine_embedding_margin_" + tag, "cosine_embedding_loss",
         [wave([5, 3], 19), wave([5, 3], 20), cos_target], {"margin": m, "reduction": "none"}, grad=(1, 2))
case("cosine_embedding_zero_row", "cosine_embedding_loss",
     [wave([3, 4], 21), T([3, 4], [0.0] * 4 + values([8], lambda k: math.cos(k))), signs([3], 3)],
     {"reduction": "none"}, grad=(1, 2))
case("cosine_embedding_pair", "cosine_embedding_loss", [wave([4], 22), wave([4], 23), T([], [-1.0])],
     {"margin": 0.1}, grad=(1, 2))
case("cosine_embedding_broadcast", "cosine_embedding_loss", [wave([4, 3], 24), wave([1, 3], 25), signs([4], 4)],
     {}, grad=(1, 2))

for r in RED:
    case("margin_ranking_" + r, "margin_ranking_loss", [wave([6], 26), wave([6], 27), signs([6], 5)],
         {"reduction": r}, grad=(1, 2))
case("margin_ranking_margin", "margin_ranking_loss", [wave([2, 3], 28), wave([2, 3], 29), signs([2, 3], 6)],
     {"margin": 0.5, "reduction": "none"}, grad=(1, 2))
case("margin_ranking_broadcast", "margin_ranking_loss", [wave([5], 30), wave([1], 31), signs([5], 7)],
     {"margin": 0.2, "reduction": "sum"}, grad=(1, 2))

for r in RED:
    case("hinge_embedding_" + r, "hinge_embedding_loss", [wave([3, 4], 32), signs([3, 4], 8)], {"reduction": r})
case("hinge_embedding_margin", "hinge_embedding_loss", [wave([3, 4], 33), signs([3, 4], 9, "int64")],
     {"margin": 0.5, "reduction": "none"})
case("hinge_embedding_broadcast", "hinge_embedding_loss", [wave([3, 4], 34), signs([4], 10)], {"margin": 2.0})

def counts(shape, seed):
    """Event counts 0..5, as Poisson targets."""
    return T(shape, lambda k: float(int(3.0 + 2.9 * math.sin(seed + 1.1 * k))))


def classes(values):
    return T([len(values)], values, "int64")


for r in RED:
    case("poisson_nll_" + r, "poisson_nll_loss", [wave([3, 4], 51), counts([3, 4], 1)], {"reduction": r},
         grad=(1, 2))
case("poisson_nll_no_log", "poisson_nll_loss", [prob([3, 4], 52), counts([3, 4], 2)],
     {"log_input": False, "eps": 1e-3, "reduction": "none"}, grad=(1, 2))
# Stirling's term where the target exceeds 1 (targets of 0 and 1 are left out)
case("poisson_nll_full", "poisson_nll_loss", [wave([3, 4], 53), counts([3, 4], 3)],
     {"full": True, "reduction": "none"})
case("poisson_nll_full_no_log_sum", "poisson_nll_loss", [prob([2, 5], 54), counts([2, 5], 4)],
     {"full": True, "log_input": False, "reduction": "sum"})

for r in RED:
    case("gaussian_nll_" + r, "gaussian_nll_loss", [wave([3, 4], 55), wave([3, 4], 56), prob([3, 4], 57)],
         {"reduction": r}, grad=(1, 2, 3))
# var below eps: clamped in value, its gradient passed through as it is
case("gaussian_nll_clamped", "gaussian_nll_loss",
     [wave([5], 58), wave([5], 59), T([5], [1e-8, 0.5, 1e-4, 0.0, 2.0])],
     {"full": True, "eps": 1e-3, "reduction": "none"}, grad=(1, 2, 3))
case("gaussian_nll_var_per_row", "gaussian_nll_loss", [wave([3, 4], 60), wave([3, 4], 61), prob([3], 62)],
     {}, grad=(1, 2, 3))
case("gaussian_nll_var_last_1", "gaussian_nll_loss", [wave([3, 4], 63), wave([3, 4], 64), prob([3, 1], 65)],
     {"full": True, "reduction": "sum"}, grad=(1, 2, 3))

for r in RED:
    case("triplet_" + r, "triplet_margin_loss", [wave([4, 5], 66), wave([4, 5], 67), wave([4, 5], 68)],
         {"reduction": r}, grad=(1, 2, 3))
case("triplet_p1_swap", "triplet_margin_loss", [wave([4, 3], 69), wave([4, 3], 70), wave([4, 3], 71)],
     {"p": 1.0, "swap": True, "margin": 0.5, "reduction": "none"}, grad=(1, 2, 3))
case("triplet_p3_eps", "triplet_margin_loss", [wave([3, 4], 72), wave([3, 4], 73), wave([3, 4], 74)],
     {"p": 3.0, "eps": 0.1, "margin": 2.0, "reduction": "none"}, grad=(1, 2, 3))
case("triplet_1d", "triplet_margin_loss", [wave([6], 75), wave([6], 76), wave([6], 77)], {"margin": 4.0},
     grad=(1, 2, 3))
for r in RED:
    case("triplet_distance_" + r, "triplet_margin_with_distance_loss",
         [wave([4, 5], 78), wave([4, 5], 79), wave([4, 5], 80)], {"reduction": r}, grad=(1, 2, 3))
case("triplet_distance_cosine_swap", "triplet_margin_with_distance_loss",
     [wave([4, 3], 81), wave([4, 3], 82), wave([4, 3], 83)],
     {"distance_function": "cosine", "swap": True, "margin": 0.3, "reduction": "none"}, grad=(1, 2, 3))

mm_target = classes([0, 3, 4, 1])
for r in RED:
    case("multi_margin_" + r, "multi_margin_loss", [wave([4, 5], 84), mm_target], {"reduction": r})
case("multi_margin_p2_weight", "multi_margin_loss", [wave([4, 5], 85), mm_target],
     {"p": 2, "margin": 0.7, "weight": T([5], lambda k: 0.5 + 0.3 * k), "reduction": "none"})
case("multi_margin_one_row", "multi_margin_loss", [wave([5], 86), T([], [2], "int64")], {"margin": 1.5})

# per row: two targets, one target then values past the -1, every class,
# a class listed twice (counted twice, as PyTorch counts it)
ml_target = T([4, 5], [3, 0, -1, 1, 2, 4, -1, 0, 0, 0, 0, 1, 2, 3, 4, 2, 2, -1, 3, 3], "int64")
for r in RED:
    case("multilabel_margin_" + r, "multilabel_margin_loss", [wave([4, 5], 87, 0.6), ml_target], {"reduction": r})
case("multilabel_margin_one_row", "multilabel_margin_loss", [wave([4], 88, 0.6), classes([3, 0, -1, 1])])

def labels(shape, seed):
    return T(shape, lambda k: 1.0 if math.sin(seed + 1.9 * k) > 0 else 0.0)


for r in RED:
    case("multilabel_soft_margin_" + r, "multilabel_soft_margin_loss", [wave([3, 4], 89, 4.0), labels([3, 4], 1)],
         {"reduction": r}, grad=(1, 2))
case("multilabel_soft_margin_weight", "multilabel_soft_margin_loss", [wave([3, 4], 90), labels([3, 4], 2)],
     {"weight": T([4], lambda k: 0.5 + k), "reduction": "none"}, grad=(1, 2))

# ---------------------------------------------------------------- tensor ops

for v in (None, 0.5, -2.0):
    tag = "" if v is None else "_value_" + str(v).replace(".", "_").replace("-", "neg")
    opts = {} if v is None else {"value": v}
    case("addcmul" + tag, "addcmul", [wave([3, 4], 35), wave([3, 4], 36), wave([3, 4], 37)], opts, grad=(1, 2, 3))
    case("addcdiv" + tag, "addcdiv", [wave([3, 4], 38), wave([3, 4], 39), T([3, 4], lambda k: 0.5 + 0.2 * k)], opts,
         grad=(1, 2, 3))
case("addcmul_broadcast", "addcmul", [wave([3, 1], 40), wave([1, 4], 41), wave([3, 4], 42)], {"value": 0.25},
     grad=(1, 2, 3))
case("addcdiv_broadcast", "addcdiv", [wave([4], 43), wave([3, 1], 44), T([1, 4], lambda k: -1.5 + k)],
     {"value": 3.0}, grad=(1, 2, 3))
case("addcmul_int64", "addcmul", [T([2, 3], lambda k: k - 2, "int64"), T([2, 3], lambda k: 3 - k, "int64"),
                                  T([3], lambda k: k + 1, "int64")], {"value": 2}, grad=(), dtypes=("int64",))
for w in (0.3, 0.5, 0.7, 1.0, -0.6, 1.5):
    tag = str(w).replace(".", "_").replace("-", "neg")
    case("lerp_" + tag, "lerp", [wave([3, 4], 45), wave([3, 4], 46), w], grad=(1, 2))
case("lerp_tensor_weight", "lerp", [wave([3, 4], 47), wave([3, 4], 48),
                                    T([3, 4], lambda k: -1.0 + 0.25 * k)], grad=(1, 2, 3))
case("lerp_broadcast", "lerp", [wave([3, 1], 49), wave([4], 50), T([3, 4], lambda k: 0.1 * k - 0.2)],
     grad=(1, 2, 3))

# ---------------------------------------------------------------- PyTorch

def tensor(a, dtype):
    return torch.tensor(a["values"], dtype=DTYPES[a.get("dtype", dtype)]).reshape(a["shape"])


def run(c, dtype):
    args = [tensor(a, dtype) if isinstance(a, dict) else a for a in c["args"]]
    for i in c["grad"]:
        args[i - 1].requires_grad_()
    opts = {k: tensor(v, dtype) if isinstance(v, dict) else v for k, v in c["opts"].items()}
    if opts.get("distance_function") == "cosine":
        opts["distance_function"] = lambda a, b: 1 - F.cosine_similarity(a, b)
    fn = getattr(F, c["fn"], None) or getattr(torch, c["fn"])
    y = fn(*args, **opts)
    out = {"y": y.detach().reshape(-1).tolist(), "shape": list(y.shape)}
    if c["grad"]:
        wt = torch.cos(1 + torch.arange(y.numel(), dtype=torch.float64)).to(y.dtype).reshape(y.shape)
        (y * wt).sum().backward() if y.dim() > 0 else y.backward()
        out["dx"] = {i: args[i - 1].grad.reshape(-1).tolist() for i in c["grad"]}
    return out


# ---------------------------------------------------------------- Lua

def lua(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"%s"' % v
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if v != v:
            return "0/0"
        if v in (float("inf"), float("-inf")):
            return "math.huge" if v > 0 else "-math.huge"
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "{" + ", ".join(lua(x) for x in v) + "}"
    if isinstance(v, dict):
        items = []
        for k in sorted(v, key=str):
            key = "[%d]" % k if isinstance(k, int) else k
            items.append("%s = %s" % (key, lua(v[k])))
        return "{ " + ", ".join(items) + " }"
    raise TypeError(type(v))


print("-- generated by scripts/gen_loss_ref.py with torch %s; do not edit" % torch.__version__)
print("return {")
for name in sorted(CASES):
    c = CASES[name]
    fields = {k: c[k] for k in ("fn", "args", "opts", "grad")}
    for dt in c["dtypes"]:
        fields[dt] = run(c, dt)
    print("  %s = {" % name)
    for k in sorted(fields):
        print("    %s = %s," % (k, lua(fields[k])))
    print("  },")
print("}")
