#!/usr/bin/python3
"""gen_autocast.py -- PyTorch's bfloat16 autocast answers for tests/lua/test_autocast.lua.

Run from the source tree with a Python that has torch (the committed files
were written with Debian's python3-torch 1.13, which scripts/setup-debian
leaves out: `apt-get install python3-torch`):

    /usr/bin/python3 scripts/gen_autocast.py [OUTDIR]      (default tests/ref)

It writes OUTDIR/autocast.lua, a Lua chunk returning one table with four
cases, each run forward under torch.autocast("cpu", dtype=torch.bfloat16)
and backward outside it, from float32 leaves:

mlp       Linear(6, 8), ReLU, Linear(8, 3) on a batch of 4, cross_entropy
          with int64 targets (the weights are the literals below)
mlp_mse   the same MLP, mse_loss against a float32 target
gelu_mlp  Linear(6, 8), GELU(approximate="tanh"), Linear(8, 3) (the MLP's
          weights), cross_entropy with label_smoothing=0.1 and a target of
          ignore_index (-100) in the second row
conv      conv2d (2 -> 3 channels, 3x3, padding 1) with bias on a 1x2x4x4
          input, mse_loss against a float32 target (values from the small
          formula in conv_case)

Each case holds its inputs (float32 values written exactly, as the double
they are, so that dplua's torch.tensor gets the same float32), the dtype of
the output and of the loss, the output values (bfloat16 values, exact), the
loss, and every parameter's gradient with its dtype (float32: the casts are
autograd-tracked, so the gradient of a bfloat16 copy arrives in float32 at
the float32 weight). The results come from PyTorch's CPU bf16 kernels, so
dplua can only be compared with a bfloat16 tolerance. Deterministic (one
thread, no randomness): running the script twice writes the same bytes.
"""
import os
import sys

import torch
import torch.nn.functional as F

torch.set_num_threads(1)

# ---------------------------------------------------------------- the MLP's numbers

X = [[0.5, -1.25, 0.75, 2.0, -0.5, 0.25],
     [1.5, 0.125, -0.875, -1.0, 0.625, -2.25],
     [-0.3, 0.9, 1.1, -0.7, 0.45, 0.05],
     [2.5, -0.6, 0.35, 0.8, -1.9, 1.2]]
Y = [0, 2, 1, 2]
W1 = [[0.31, -0.22, 0.15, 0.07, -0.41, 0.28],
      [-0.12, 0.36, -0.27, 0.19, 0.05, -0.33],
      [0.44, 0.02, 0.21, -0.38, 0.17, 0.09],
      [-0.29, -0.14, 0.33, 0.26, -0.08, 0.4],
      [0.11, 0.39, -0.06, -0.23, 0.31, -0.17],
      [0.23, -0.35, -0.18, 0.12, 0.27, 0.04],
      [-0.4, 0.08, 0.29, -0.11, -0.2, 0.37],
      [0.06, 0.24, -0.42, 0.35, 0.13, -0.26]]
B1 = [0.05, -0.1, 0.15, 0.0, -0.05, 0.2, 0.1, -0.15]
W2 = [[0.52, -0.31, 0.18, 0.44, -0.27, 0.09, 0.36, -0.13],
      [-0.21, 0.47, -0.38, 0.12, 0.33, -0.49, 0.07, 0.25],
      [0.14, -0.06, 0.41, -0.35, 0.22, 0.3, -0.45, 0.19]]
B2 = [0.1, -0.2, 0.05]
# mlp_mse's target
T = [[0.5, -0.25, 1.0],
     [-1.0, 0.75, 0.0],
     [0.25, 0.5, -0.5],
     [1.5, -1.0, 0.25]]


def f32(v):
    return torch.tensor(v, dtype=torch.float32)


def mlp_case(loss_kind):
    x = f32(X)
    w1, b1, w2, b2 = (f32(v).requires_grad_() for v in (W1, B1, W2, B2))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = F.relu(F.linear(x, w1, b1))
        out = F.linear(h, w2, b2)
        if loss_kind == "cross_entropy":
            target = torch.tensor(Y, dtype=torch.int64)
            loss = F.cross_entropy(out, target)
        else:
            target = f32(T)
            loss = F.mse_loss(out, target)
    loss.backward()
    inputs = [("x", x), ("target", target)]
    params = [("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2)]
    return inputs, params, out, loss


def gelu_case():
    x = f32(X)
    w1, b1, w2, b2 = (f32(v).requires_grad_() for v in (W1, B1, W2, B2))
    target = torch.tensor([Y[0], -100, Y[2], Y[3]], dtype=torch.int64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = F.gelu(F.linear(x, w1, b1), approximate="tanh")
        out = F.linear(h, w2, b2)
        loss = F.cross_entropy(out, target, label_smoothing=0.1)
    loss.backward()
    inputs = [("x", x), ("target", target)]
    params = [("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2)]
    return inputs, params, out, loss


def formula(shape, a, b, c):
    """Deterministic float32 values in [-1, 1) on a grid of 1/64."""
    n = 1
    for s in shape:
        n *= s
    vals = [(((i * a + b) * c) % 128 - 64) / 64.0 for i in range(n)]
    return torch.tensor(vals, dtype=torch.float32).reshape(shape)


def conv_case():
    x = formula((1, 2, 4, 4), 37, 11, 5)
    w = (formula((3, 2, 3, 3), 29, 7, 3) * 0.5).requires_grad_()
    b = (formula((3,), 13, 5, 9) * 0.25).requires_grad_()
    target = formula((1, 3, 4, 4), 23, 3, 7)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = F.conv2d(x, w, b, padding=1)
        loss = F.mse_loss(out, target)
    loss.backward()
    return [("x", x), ("target", target)], [("weight", w), ("bias", b)], out, loss


# ---------------------------------------------------------------- formatting

def exact(v):
    """A float32 (or bfloat16) value written exactly, as the double it is."""
    r = repr(float(v))
    return r[:-2] if r.endswith(".0") else r


def dtype_name(t):
    return str(t.dtype).replace("torch.", "")


def lua_tensor(t):
    t = t.detach()
    shape = "{" + ",".join(str(s) for s in t.shape) + "}"
    vals = t.float().reshape(-1).tolist()
    return '{dtype="%s", shape=%s, values={%s}}' % (
        dtype_name(t), shape, ",".join(exact(v) for v in vals))


def lua_case(name, case):
    inputs, params, out, loss = case
    lines = ["  %s = {" % name, "    inputs = {"]
    for n, t in inputs:
        lines.append("      %s = %s," % (n, lua_tensor(t)))
    lines.append("    },")
    lines.append("    params = {")
    for n, p in params:
        lines.append('      {name="%s", value=%s,' % (n, lua_tensor(p)))
        lines.append("       grad=%s}," % lua_tensor(p.grad))
    lines.append("    },")
    lines.append("    out = %s," % lua_tensor(out))
    lines.append('    loss = {dtype="%s", value=%s},' % (dtype_name(loss), exact(loss.item())))
    lines.append("  },")
    return "\n".join(lines)


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "ref")
    cases = [("mlp", mlp_case("cross_entropy")), ("mlp_mse", mlp_case("mse")), ("gelu_mlp", gelu_case()),
             ("conv", conv_case())]
    for name, (_, params, out, loss) in cases:
        assert out.dtype == torch.bfloat16 and loss.dtype == torch.float32, name
        assert all(p.grad.dtype == torch.float32 for _, p in params), name
    text = ["-- tests/ref/autocast.lua: generated by scripts/gen_autocast.py with torch %s; do not edit."
            % torch.__version__,
            "-- Regenerate with: /usr/bin/python3 scripts/gen_autocast.py",
            "-- Forward under torch.autocast(\"cpu\", dtype=torch.bfloat16), backward outside it.",
            "return {",
            '  torch_version = "%s",' % torch.__version__]
    for name, case in cases:
        text.append(lua_case(name, case))
    text.append("}")
    path = os.path.join(outdir, "autocast.lua")
    with open(path, "w") as f:
        f.write("\n".join(text) + "\n")
    print("wrote", path)


if __name__ == "__main__":
    main()
