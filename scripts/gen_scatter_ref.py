#!/usr/bin/python3
"""Writes tests/ref/scatter.lua: PyTorch's outputs and gradients of
scatter, scatter_add, index_add, index_copy and index_fill (and the
values of their in-place forms), for tests/lua/test_scatter.lua.

    cd scripts && /usr/bin/python3 gen_scatter_ref.py > ../tests/ref/scatter.lua

A case names the op, dim, the input's shape, the index (int64 values), the
source's shape (or a value) and the options; the input holds sin(1 + 0.7k)
and the source cos(2 + 1.3k) at flat index k, both float64. y is the
output's flat values; dinput and dsrc the gradients of sum(y * cos(k))
(dsrc only where the source has the index's shape: PyTorch's backward
refuses a larger one).
Indices of scatter (which keeps one of several writes to one position) never
repeat; those of the adding ops do.
"""
import math

import torch
from reflua import filled, lua_value, print_cases

torch.set_default_dtype(torch.float64)


CASES = {}


def case(name, op, dim, shape, index, index_shape, src_shape=None, value=None, opts=None):
    CASES[name] = dict(op=op, dim=dim, shape=shape, index=index, index_shape=index_shape, src_shape=src_shape,
                       value=value, opts=opts or {})


# scatter: PyTorch's documented example, along both dims, negative dim, an index smaller than src, 3-D
case("scatter_doc", "scatter", 0, [3, 5], [0, 1, 2, 0], [1, 4], [2, 5])
case("scatter_dim1", "scatter", 1, [3, 5], [4, 0, 2, 1, 3, 0], [3, 2], [3, 3])
case("scatter_neg_dim", "scatter", -1, [2, 4], [3, 1, 0, 2], [2, 2], [2, 2])
case("scatter_3d", "scatter", 1, [2, 3, 4], [2, 0, 1, 0, 1, 2, 0, 2, 1, 1, 0, 2, 2, 1, 0, 0], [2, 2, 4], [2, 3, 4])
case("scatter_value", "scatter", 1, [3, 4], [3, 0, 1], [3, 1], value=-2.5)
case("scatter_reduce_add", "scatter", 0, [3, 4], [0, 2, 2, 0, 2, 2, 2, 0], [2, 4], [2, 4], opts={"reduce": "add"})
# scatter_add: repeated positions add up
case("scatter_add_repeats", "scatter_add", 0, [3, 5], [0, 1, 2, 0, 0, 2, 0, 0, 1, 2], [2, 5], [2, 5])
case("scatter_add_dim1_small_index", "scatter_add", 1, [3, 4], [1, 1, 3, 0, 0, 0], [3, 2], [3, 3])
case("scatter_add_1d", "scatter_add", 0, [6], [5, 0, 5, 2, 0], [5], [5])
# index_add / index_copy / index_fill over a 1-D index
case("index_add_rows", "index_add", 0, [5, 3], [0, 4, 2], [3], [3, 3])
case("index_add_repeats_alpha", "index_add", 1, [2, 5], [4, 1, 4, 0], [4], [2, 4], opts={"alpha": -1.5})
case("index_add_3d", "index_add", 2, [2, 3, 4], [3, 0], [2], [2, 3, 2])
case("index_copy_rows", "index_copy", 0, [5, 3], [1, 4, 0], [3], [3, 3])
case("index_copy_dim1", "index_copy", 1, [3, 4], [3, 1], [2], [3, 2])
case("index_fill_dim1", "index_fill", 1, [3, 4], [0, 2], [2], value=-1.0)
case("index_fill_3d", "index_fill", 0, [3, 2, 2], [2], [1], value=7.25)


def run(c):
    # scatter with reduce= has no derivative in PyTorch: its values only
    differentiable = "reduce" not in c["opts"]
    x = filled(c["shape"], lambda k: math.sin(1 + 0.7 * k)).requires_grad_(differentiable)
    index = torch.tensor(c["index"], dtype=torch.int64).reshape(c["index_shape"])
    src = None
    if c["src_shape"] is not None:
        src = filled(c["src_shape"], lambda k: math.cos(2 + 1.3 * k))
        # PyTorch's backward refuses a source larger than the index
        # (its gathered gradient has the index's shape)
        spread = c["op"] in ("index_add", "index_copy")
        src.requires_grad_(differentiable and (spread or list(src.shape) == c["index_shape"]))
    op, dim, opts = c["op"], c["dim"], c["opts"]
    if op == "scatter":
        y = x.scatter(dim, index, src if src is not None else c["value"], **opts)
    elif op == "scatter_add":
        y = x.scatter_add(dim, index, src)
    elif op == "index_add":
        y = x.index_add(dim, index, src, **opts)
    elif op == "index_copy":
        y = x.index_copy(dim, index, src)
    else:
        y = x.index_fill(dim, index, c["value"])
    out = {"y": y.detach().reshape(-1).tolist()}
    if not differentiable:
        return out
    w = torch.cos(torch.arange(y.numel(), dtype=torch.float64)).reshape(y.shape)
    (y * w).sum().backward()
    out["dinput"] = x.grad.reshape(-1).tolist()
    if src is not None and src.requires_grad:
        out["dsrc"] = src.grad.reshape(-1).tolist()
    return out


cases = {}
for name in CASES:
    c = dict(CASES[name])
    c.update(run(CASES[name]))
    cases[name] = c
print_cases("gen_scatter_ref.py", cases, lua_value)
