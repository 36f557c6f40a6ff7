#!/usr/bin/python3
"""gen_parity.py -- PyTorch's training runs for tests/lua/test_parity.lua.

Run from the source tree with a Python that has torch (the committed files
were written with Debian's python3-torch 1.13, which scripts/setup-debian
leaves out: `apt-get install python3-torch`):

    /usr/bin/python3 scripts/gen_parity.py [OUTDIR]      (default tests/ref)

It writes three Lua chunks, each returning one table:

parity_seed.lua   the seed model (SimpleNN: Linear(10,10), relu, Linear(10,2);
                  CrossEntropyLoss), its initial state dict, one batch
                  (x 32x10, y 32) and three runs on that batch (the same batch
                  every step), each with the loss before every step and the
                  final state dict in full:
                    sgd            SGD(lr=0.01), 100 steps
                    sgd_nesterov   SGD(lr=0.01, momentum=0.9, nesterov=True,
                                   weight_decay=0.01), 5 steps
                    adam_amsgrad   Adam(lr=0.01, amsgrad=True), 5 steps
parity_mlp.lua    a 784-256-128-10 ReLU MLP, AdamW(lr=1e-3, weight_decay=0.01),
                  clip_grad_norm_(max_norm=1.0), SequentialLR(LinearLR(
                  start_factor=0.1, total_iters=10), CosineAnnealingLR(T_max=90),
                  milestones={10}), 100 steps, a new batch every step.
                  Weights and data come from the closed formula below, so
                  nothing big is stored: per step the loss, the total gradient
                  norm that clip_grad_norm_ returns and the lr used; digests of
                  the initial parameters, of step 1's batch and of the final
                  parameters (see DIGEST).
parity_cnn.lua    a small CNN (Conv2d, ReLU, MaxPool2d, Conv2d with stride 2
                  and padding 1, Flatten, Linear, Dropout in eval mode,
                  Linear; CrossEntropyLoss) on a non-square input: its state
                  dict, the input, the targets, and after one forward and
                  backward the logits, the loss, every parameter's gradient
                  and the input's gradient.

Inputs (weights, data) are float32 values written as the shortest decimal
that reads back as the same *double* (exact, so Lua's torch.tensor rounds
them to exactly the float32 PyTorch used); results are written as the
shortest decimal that reads back as the same float32; float64 statistics as
Python's repr. Everything is deterministic (torch.manual_seed, one thread):
running the script twice writes the same bytes.

The MLP formula (all integer arithmetic exact in doubles, so Lua computes
bit-identical float32 values):

    h(a, b, c) = (7919*a + 104729*b + 1299709*c + 31*a*b + 13*a*a + 17*b*b) % 65521
    layer l = 1, 2, 3 (784->256, 256->128, 128->10), fan_in = its in_features,
    s_l = 1 / sqrt(fan_in) (a double):
      weight_l[i][j] = float32((2*h(i, j, l) / 65521 - 1) * s_l)        i, j 0-based
      bias_l[i]      = float32((2*h(i, 0, 10 + l) / 65521 - 1) * s_l)
    batch of step t = 1..100 (32 rows):
      x[n][k]   = float32(h(n, k, 1000 + t) / 65521)                    n 0..31, k 0..783
      y[n]      = h(n, 5, 2000 + t) % 10

DIGEST of a float32 tensor p (flattened, 0-based): sum, abs_sum, sq_sum
(float64 sums of the float32 values), max_abs, and `samples`, {index, value}
for the indices (k * 7919 + 17) % numel, k = 0..23 (plus the last index).
The final digest also holds d_abs_sum and d_sq_sum: the sums of
|final - init| and (final - init)^2 in float64.

The tolerance rule the test applies (float32, the issue's 1e-5 relative):
  - a tensor's entries:  |got - expected| <= 1e-5 * max(|expected|, 0.1 * M),
    M the largest |expected| in that tensor (entries much smaller than their
    tensor carry its rounding errors: a gradient that is a sum with
    cancellation, an Adam update whose denominator is near eps);
  - scalars (losses, gradient norms, digest abs_sum, sq_sum, max_abs):
    |got - expected| <= 1e-5 * |expected|; a digest's sum: <= 1e-5 * abs_sum;
    d_abs_sum and d_sq_sum (the update, ~10x smaller than the weights): 1e-4;
  - lrs (float64 arithmetic on both sides): 1e-10 relative.
Before writing, each run is repeated in float64 from the same float32 inputs
and the largest float32-vs-float64 difference is reported as a fraction of
that tolerance (stderr), so a case that float32 rounding alone would push
near the tolerance is caught here, not in a flaky test. Over the MLP's full
final weights some 30 of 235k entries are that ill-conditioned (Adam
denominators near eps); the sampled ones are not, which the report shows.
"""

import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# the seed model as the PyTorch benches build it (scripts/bench/models.py)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench"))
from models import SimpleNN  # noqa: E402

torch.set_num_threads(1)

RTOL = 1e-5
SCALE = 0.1     # entries smaller than SCALE * the tensor's largest are compared at that size
D_RTOL = 1e-4   # the sums of the update (final - init), ~10x smaller than the weights


# ---------------------------------------------------------------- formatting

def f32_repr(x):
    """The shortest decimal that reads back as the same float32."""
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    for p in range(6, 10):
        s = "%.*g" % (p, x)
        if struct.unpack("f", struct.pack("f", float(s)))[0] == x:
            return s
    return repr(x)


def exact_repr(x):
    """A float32 value written exactly (as the double it is)."""
    x = float(x)
    r = repr(x)
    return r[:-2] if r.endswith(".0") else r


def f64_repr(x):
    return repr(float(x))


def lua_str(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def flat_list(t, fmt):
    vals = t.detach().reshape(-1).tolist()
    return "{" + ",".join(fmt(v) for v in vals) + "}"


def lua_tensor(t, fmt):
    shape = "{" + ",".join(str(s) for s in t.shape) + "}"
    return "{shape=%s, values=%s}" % (shape, flat_list(t, fmt))


def lua_named(pairs, fmt, indent="    "):
    """An ordered list of {name=, shape=, values=} (values flat, row-major)."""
    lines = []
    for name, t in pairs:
        shape = "{" + ",".join(str(s) for s in t.shape) + "}"
        lines.append('%s{name=%s, shape=%s, values=%s},' % (indent, lua_str(name), shape, flat_list(t, fmt)))
    return "{\n" + "\n".join(lines) + "\n" + indent[:-2] + "}"


def lua_list(vals, fmt):
    return "{" + ",".join(fmt(v) for v in vals) + "}"


def chunk_head(*comments):
    """The first lines of a generated chunk: where it comes from, what it
    holds, and the opening of the table it returns."""
    return (["-- Generated by scripts/gen_parity.py with PyTorch %s; do not edit." % torch.__version__]
            + ["-- " + c for c in comments]
            + ["return {", "  torch_version = %s," % lua_str(torch.__version__)])


def lua_inputs(init, x, y):
    """A model's initial state dict and its batch, exact float32 values."""
    return ["  init = %s," % lua_named(list(init.items()), exact_repr),
            "  x = %s," % lua_tensor(x, exact_repr),
            "  y = %s," % lua_list(y.tolist(), str)]


# ---------------------------------------------------------------- tolerance report

WORST = []   # (ratio, what)


def bound(e, floor=None, rtol=RTOL):
    """The test's rule: |got - expected| <= RTOL * max(|expected|, floor), with
    floor = SCALE * the largest |value| of the expected tensor unless given
    (0 for scalars: plain relative)."""
    e = np.asarray(e, dtype=np.float64).reshape(-1)
    if floor is None:
        floor = SCALE * float(np.abs(e).max()) if e.size else 0.0
    return rtol * np.maximum(np.abs(e), floor)


def track(what, got64, ref32, floor=None, idx=None, rtol=RTOL):
    """Records how close float32 (ref32, what the test compares against) is to
    float64 (got64) under the test's rule; ratio 1 is the tolerance. With idx,
    only those flat indices count (the floor still comes from the whole tensor)."""
    g = np.asarray(got64, dtype=np.float64).reshape(-1)
    e = np.asarray(ref32, dtype=np.float64).reshape(-1)
    r = np.abs(g - e) / bound(e, floor, rtol)
    if idx is not None:
        r = r[idx]
    ratio = float(r.max()) if r.size else 0.0
    WORST.append((ratio, what))
    return ratio


def report():
    WORST.sort(reverse=True)
    sys.stderr.write("float32 vs float64, as a fraction of the test's tolerance (worst first):\n")
    for r, what in WORST[:12]:
        sys.stderr.write("  %.4f  %s\n" % (r, what))
    if WORST and WORST[0][0] > 0.25:
        sys.stderr.write("WARNING: float32 rounding alone uses more than a quarter of the tolerance\n")


# ---------------------------------------------------------------- the seed model

SEED_RUNS = [
    # name, steps, optimizer factory, Lua options (documentation for the test)
    ("sgd", 100, lambda p: torch.optim.SGD(p, lr=0.01)),
    ("sgd_nesterov", 5, lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9, nesterov=True, weight_decay=0.01)),
    ("adam_amsgrad", 5, lambda p: torch.optim.Adam(p, lr=0.01, amsgrad=True)),
]


def seed_run(init, x, y, steps, make_opt, dtype):
    model = SimpleNN().to(dtype)
    model.load_state_dict({k: v.to(dtype) for k, v in init.items()})
    crit = nn.CrossEntropyLoss()
    opt = make_opt(model.parameters())
    xx = x.to(dtype)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = crit(model(xx), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def gen_seed():
    torch.manual_seed(0)
    model = SimpleNN()
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    x = torch.rand(32, 10)
    y = torch.randint(0, 2, (32,))
    out = chunk_head("The seed model: initial state dict, one batch, and per optimizer the loss",
                     "before each step and the final state dict. Inputs are exact float32 values.")
    out += lua_inputs(init, x, y)
    out.append("  runs = {")
    for name, steps, make_opt in SEED_RUNS:
        l32, p32 = seed_run(init, x, y, steps, make_opt, torch.float32)
        l64, p64 = seed_run(init, x, y, steps, make_opt, torch.float64)
        track("seed %s losses" % name, l64, l32, floor=0)
        for k in p32:
            track("seed %s final %s" % (name, k), p64[k].numpy(), p32[k].numpy())
        sys.stderr.write("seed %-13s loss %.6f -> %.6f\n" % (name, l32[0], l32[-1]))
        out.append("    %s = {" % name)
        out.append("      steps = %d," % steps)
        out.append("      losses = %s," % lua_list(l32, f32_repr))
        out.append("      final = %s," % lua_named(list(p32.items()), f32_repr, indent="        "))
        out.append("    },")
    out.append("  },")
    out.append("}")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- the MLP

P = 65521
MLP_SIZES = [784, 256, 128, 10]
MLP_STEPS = 100
MLP_BATCH = 32


def h(a, b, c):
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    return (7919 * a + 104729 * b + 1299709 * c + 31 * a * b + 13 * a * a + 17 * b * b) % P


def mlp_init():
    params = []
    for l in range(1, 4):
        fin, fout = MLP_SIZES[l - 1], MLP_SIZES[l]
        s = 1.0 / math.sqrt(fin)
        i = np.arange(fout).reshape(-1, 1)
        j = np.arange(fin).reshape(1, -1)
        w = ((2 * h(i, j, l) / P - 1) * s).astype(np.float32)
        b = ((2 * h(np.arange(fout), 0, 10 + l) / P - 1) * s).astype(np.float32)
        params.append(("%d.weight" % (2 * (l - 1)), torch.from_numpy(w)))
        params.append(("%d.bias" % (2 * (l - 1)), torch.from_numpy(b)))
    return params


def mlp_batch(t):
    n = np.arange(MLP_BATCH).reshape(-1, 1)
    k = np.arange(784).reshape(1, -1)
    x = (h(n, k, 1000 + t) / P).astype(np.float32)
    y = h(np.arange(MLP_BATCH), 5, 2000 + t) % 10
    return torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))


def mlp_model():
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))


def mlp_run(dtype):
    model = mlp_model().to(dtype)
    model.load_state_dict({k: v.to(dtype) for k, v in mlp_init()})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=10)
    cos = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=MLP_STEPS - 10)
    sched = torch.optim.lr_scheduler.SequentialLR(opt, schedulers=[warm, cos], milestones=[10])
    crit = nn.CrossEntropyLoss()
    losses, norms, lrs = [], [], []
    for t in range(1, MLP_STEPS + 1):
        x, y = mlp_batch(t)
        opt.zero_grad()
        loss = crit(model(x.to(dtype)), y)
        loss.backward()
        norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
        losses.append(loss.item())
        norms.append(norm.item())
    return losses, norms, lrs, [(k, v.detach().clone()) for k, v in model.state_dict().items()]


SAMPLES = 24


def sample_indices(numel):
    idx = [(k * 7919 + 17) % numel for k in range(SAMPLES)]
    if numel - 1 not in idx:
        idx.append(numel - 1)
    return idx


def digest(t, init=None):
    v = t.detach().reshape(-1).to(torch.float64).numpy()
    d = {"sum": float(v.sum()), "abs_sum": float(np.abs(v).sum()), "sq_sum": float((v * v).sum()),
         "max_abs": float(np.abs(v).max())}
    if init is not None:
        dv = v - init.detach().reshape(-1).to(torch.float64).numpy()
        d["d_abs_sum"] = float(np.abs(dv).sum())
        d["d_sq_sum"] = float((dv * dv).sum())
    d["samples"] = [(i, float(v[i])) for i in sample_indices(v.size)]
    return d


def lua_digest(name, t, d, sample_fmt):
    parts = ["name=%s" % lua_str(name), "shape={%s}" % ",".join(str(s) for s in t.shape)]
    for k in ("sum", "abs_sum", "sq_sum", "max_abs", "d_abs_sum", "d_sq_sum"):
        if k in d:
            parts.append("%s=%s" % (k, f64_repr(d[k])))
    parts.append("samples={%s}" % ",".join("{%d,%s}" % (i, sample_fmt(v)) for i, v in d["samples"]))
    return "    {" + ", ".join(parts) + "},"


def gen_mlp():
    init = mlp_init()
    init_map = dict(init)
    l32, n32, lr32, p32 = mlp_run(torch.float32)
    l64, n64, lr64, p64 = mlp_run(torch.float64)
    track("mlp losses", l64, l32, floor=0)
    track("mlp grad norms", n64, n32, floor=0)
    track("mlp lrs (float64 runs agree)", lr64, lr32, floor=0)
    p64m = dict(p64)
    for k, v in p32:
        # Only the sampled entries are stored; a few entries of all (those
        # whose Adam denominators are near eps) are ill-conditioned in float32.
        idx = sample_indices(v.numel())
        track("mlp final %s samples" % k, p64m[k].numpy(), v.numpy(), idx=idx)
        r = np.abs(p64m[k].numpy().reshape(-1) - v.numpy().reshape(-1).astype(np.float64)) / bound(v.numpy())
        sys.stderr.write("mlp final %-9s %6d of %6d entries past a quarter of the tolerance in float32 (%.3g x at worst)\n"
                         % (k, int((r > 0.25).sum()), r.size, float(r.max())))
        d32, d64 = digest(v, init_map[k]), digest(p64m[k], init_map[k])
        for key in ("sum", "abs_sum", "sq_sum", "max_abs", "d_abs_sum", "d_sq_sum"):
            # the test bounds a sum by its abs_sum (sums may cancel), the rest relatively
            track("mlp final %s %s" % (k, key), [d64[key]], [d32[key]],
                  floor=d32["abs_sum"] if key == "sum" else 0,
                  rtol=D_RTOL if key.startswith("d_") else RTOL)
    clipped = sum(1 for n in n32 if n > 1.0)
    sys.stderr.write("mlp loss %.6f -> %.6f; grad norm %.4f .. %.4f, clipped in %d of %d steps\n" % (
        l32[0], l32[-1], min(n32), max(n32), clipped, MLP_STEPS))
    x1, y1 = mlp_batch(1)
    out = chunk_head("The 784-256-128-10 MLP with AdamW, warm-up + cosine schedule and clipping;",
                     "weights and data follow the formula in gen_parity.py and test_parity.lua.")
    out += ["  steps = %d," % MLP_STEPS,
            "  losses = %s," % lua_list(l32, f32_repr),
            "  grad_norms = %s," % lua_list(n32, f32_repr),
            "  lrs = %s," % lua_list(lr32, f64_repr),
            "  init = {"]
    for k, v in init:
        out.append(lua_digest(k, v, digest(v), exact_repr))
    out.append("  },")
    out.append("  batch1 = {")
    out.append("    x = " + lua_digest("x", x1, digest(x1), exact_repr).lstrip())
    out.append("    y = %s," % lua_list(y1.tolist(), str))
    out.append("  },")
    out.append("  final = {")
    for k, v in p32:
        out.append(lua_digest(k, v, digest(v, init_map[k]), f32_repr))
    out.append("  },")
    out.append("}")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- the CNN

class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(2, 4, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(4, 6, 3, stride=2, padding=1)
        self.flatten = nn.Flatten()
        self.fc1 = nn.Linear(36, 16)
        self.drop = nn.Dropout(0.5)
        self.fc2 = nn.Linear(16, 5)

    def forward(self, x):
        x = self.pool(torch.relu(self.conv1(x)))   # 3x4x8x10 -> 3x4x4x5
        x = torch.relu(self.conv2(x))              # -> 3x6x2x3
        x = self.flatten(x)                        # -> 3x36
        x = self.drop(torch.relu(self.fc1(x)))
        return self.fc2(x)


def cnn_run(init, x, y, dtype):
    model = SmallCNN().to(dtype)
    model.load_state_dict({k: v.to(dtype) for k, v in init.items()})
    model.eval()
    xx = x.detach().clone().to(dtype).requires_grad_(True)
    out = model(xx)
    loss = nn.CrossEntropyLoss()(out, y)
    loss.backward()
    grads = [(k, p.grad.detach().clone()) for k, p in model.named_parameters()]
    return out.detach(), loss.item(), grads, xx.grad.detach().clone()


def gen_cnn():
    torch.manual_seed(1)
    model = SmallCNN()
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    x = torch.randn(3, 2, 8, 10)
    y = torch.randint(0, 5, (3,))
    o32, l32, g32, xg32 = cnn_run(init, x, y, torch.float32)
    o64, l64, g64, xg64 = cnn_run(init, x, y, torch.float64)
    track("cnn logits", o64.numpy(), o32.numpy())
    track("cnn loss", [l64], [l32], floor=0)
    track("cnn x.grad", xg64.numpy(), xg32.numpy())
    for (k, a), (_, b) in zip(g32, g64):
        track("cnn grad %s" % k, b.numpy(), a.numpy())
    out = chunk_head("A small CNN in eval mode: state dict, input, targets; one forward and",
                     "backward: logits, loss, parameter gradients and the input's gradient.")
    out += lua_inputs(init, x, y)
    out += ["  logits = %s," % lua_tensor(o32, f32_repr),
            "  loss = %s," % f32_repr(l32),
            "  grads = %s," % lua_named(g32, f32_repr),
            "  x_grad = %s," % lua_tensor(xg32, f32_repr),
            "}"]
    return "\n".join(out) + "\n"


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "ref")
    files = {"parity_seed.lua": gen_seed(), "parity_mlp.lua": gen_mlp(), "parity_cnn.lua": gen_cnn()}
    for name, text in files.items():
        path = os.path.join(outdir, name)
        with open(path, "w") as f:
            f.write(text)
        sys.stderr.write("wrote %s (%d bytes)\n" % (path, len(text)))
    report()


if __name__ == "__main__":
    main()
