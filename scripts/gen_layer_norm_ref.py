#!/usr/bin/python3
"""Writes tests/ref/layer_norm.lua: inputs, outputs and gradients of
F.layer_norm for tests/lua/test_layer_norm.lua.

Each case runs torch.nn.functional.layer_norm in float64 (the test casts
the inputs to float32 and compares within float32's precision), with and
without weight and bias, over one or two normalized dims, with several
eps; the add_* cases are the residual variant, layer_norm(x + residual),
whose residual gets the gradient of x. The inputs are not stored but
made by gen() below, whose float64 operations give the same bits in
Lua; the outputs are stored to 13 significant digits.

    /usr/bin/python3 scripts/gen_layer_norm_ref.py > tests/ref/layer_norm.lua
"""
import torch
import torch.nn.functional as F

from reflua import print_cases

torch.manual_seed(20261206)
torch.set_default_dtype(torch.float64)


class Gen:
    """Element i of a tensor of the shape: ((i * a + s) % 197 - 98) / 49 * scale + offset."""

    def __init__(self, shape, a, s, scale=1.0, offset=0.0):
        self.shape, self.args = list(shape), (a, s, scale, offset)

    def tensor(self):
        a, s, scale, offset = self.args
        n = 1
        for d in self.shape:
            n *= d
        v = [((i * a + s) % 197 - 98) / 49 * scale + offset for i in range(n)]
        return torch.tensor(v).reshape(self.shape).requires_grad_()


def case(shape, k, weight=True, bias=True, eps=1e-5, residual=False, offset=0.0, spread=1.0):
    norm = shape[-k:]
    seed = len(cases_made)
    cases_made.append(shape)
    gens = {"x": Gen(shape, 31, seed, spread, offset), "dout": Gen(shape, 53, seed + 7)}
    if residual:
        gens["residual"] = Gen(shape, 67, seed + 3)
    if weight:
        gens["weight"] = Gen(norm, 11, seed + 1, 0.25, 1.0)
    if bias:
        gens["bias"] = Gen(norm, 13, seed + 2, 0.5)
    t = {name: g.tensor() for name, g in gens.items()}
    x, w, b = t["x"], t.get("weight"), t.get("bias")
    h = x + t["residual"] if residual else x
    # LayerNorm does not change when a constant is taken from its input, and
    # x - offset is exact here: PyTorch's backward forms dx from x itself, so
    # with x near 1000 and a spread of 0.01 it keeps only about 9 digits
    out = F.layer_norm(h - offset, norm, w, b, eps)
    out.backward(t["dout"].detach())
    c = dict(gens)
    c.update({"out": out, "dx": x.grad, "normalized_shape": list(norm), "eps": eps})
    if weight:
        c["dweight"] = w.grad
    if bias:
        c["dbias"] = b.grad
    return c


cases_made = []
cases = {
    "row_1x7": case((1, 7), 1),
    "rows_3x5x33": case((3, 5, 33), 1),
    "gpt_4x768": case((4, 768), 1),
    "two_dims_2x3x4": case((2, 3, 4), 2, eps=1e-3),
    "no_affine_3x5x33": case((3, 5, 33), 1, weight=False, bias=False),
    "weight_only_6x10": case((6, 10), 1, bias=False, eps=1e-6),
    "bias_only_6x10": case((6, 10), 1, weight=False),
    "large_eps_5x8": case((5, 8), 1, eps=0.5),
    "offset_4x64": case((4, 64), 1, offset=1000.0, spread=0.01),
    "one_dim_9": case((9,), 1),
    "add_3x5x33": case((3, 5, 33), 1, residual=True),
    "add_2x768": case((2, 768), 1, residual=True),
    "add_no_affine_2x7": case((2, 7), 1, weight=False, bias=False, residual=True),
}


def lua(v):
    if isinstance(v, Gen):
        return "{shape = {%s}, gen = {%s}}" % (", ".join(map(str, v.shape)), ", ".join("%.17g" % a for a in v.args))
    if isinstance(v, torch.Tensor):
        return "{shape = {%s}, %s}" % (", ".join(map(str, v.shape)),
                                       ", ".join("%.13g" % x for x in v.detach().flatten().tolist()))
    if isinstance(v, list):
        return "{%s}" % ", ".join(map(str, v))
    return "%.17g" % v


print_cases("gen_layer_norm_ref.py", cases, lua)
