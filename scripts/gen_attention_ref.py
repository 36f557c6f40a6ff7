#!/usr/bin/python3
"""Writes tests/ref/attention.lua: inputs, outputs and gradients of
scaled dot product attention for tests/lua/test_attention.lua.

PyTorch's F.scaled_dot_product_attention is documented as equal to the
math below (its reference implementation: scaled scores, a causal
tril(ones(L, S)) or an attention mask, softmax, then the product with v);
torch 1.13 predates the function, so the math runs here in float64.

    /usr/bin/python3 scripts/gen_attention_ref.py > tests/ref/attention.lua
"""
import math

import torch

from reflua import print_cases

torch.manual_seed(20261206)
torch.set_default_dtype(torch.float64)


def sdpa(q, k, v, attn_mask=None, is_causal=False, scale=None):
    L, S = q.size(-2), k.size(-2)
    scale = 1 / math.sqrt(q.size(-1)) if scale is None else scale
    s = q @ k.transpose(-2, -1) * scale
    if is_causal:
        s = s.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(), float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            s = s.masked_fill(~attn_mask, float("-inf"))
        else:
            s = s + attn_mask
    return s.softmax(-1) @ v


def case(lead, L, S, E, Ev, mask=None, **opts):
    q = torch.randn(*lead, L, E, requires_grad=True)
    k = torch.randn(*lead, S, E, requires_grad=True)
    v = torch.randn(*lead, S, Ev, requires_grad=True)
    out = sdpa(q, k, v, mask, **opts)
    dout = torch.randn(out.shape)
    out.backward(dout)
    c = {"q": q, "k": k, "v": v, "out": out, "dout": dout, "dq": q.grad, "dk": k.grad, "dv": v.grad}
    if mask is not None:
        c["mask"] = mask
    c.update(opts)
    return c


cases = {
    "plain": case((2, 3), 5, 7, 4, 3),
    "causal": case((2, 2), 5, 7, 4, 4, is_causal=True),
    "causal_square_scale": case((1, 2), 9, 9, 8, 8, is_causal=True, scale=0.3),
    "causal_long_query": case((1, 1), 7, 4, 3, 3, is_causal=True),
    "bool_mask": case((2, 2), 4, 6, 3, 3, mask=torch.rand(4, 6) > 0.3),
    "float_mask": case((2, 2), 4, 6, 3, 2, mask=torch.randn(2, 1, 4, 6)),
    "three_dims": case((3,), 6, 5, 4, 4),
    "one_query": case((2, 2), 1, 6, 4, 4),
}


def lua(v):
    if isinstance(v, torch.Tensor):
        if v.dtype == torch.bool:
            return "{shape = {%s}, bool = {%s}}" % (", ".join(map(str, v.shape)),
                                                    ", ".join("true" if x else "false" for x in v.flatten().tolist()))
        return "{shape = {%s}, %s}" % (", ".join(map(str, v.shape)),
                                       ", ".join("%.17g" % x for x in v.detach().flatten().tolist()))
    if isinstance(v, bool):
        return "true" if v else "false"
    return "%.17g" % v


print_cases("gen_attention_ref.py", cases, lua)
