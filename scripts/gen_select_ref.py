#!/usr/bin/python3
"""Writes tests/ref/select.lua: inputs and PyTorch's results of sort,
argsort, topk, cumsum (with the gradients of sort, topk and cumsum),
one_hot, nonzero and advanced indexing (reads and writes), for
tests/lua/test_select.lua. multinomial and randperm draw from dplua's own
stream, so their test checks distributions instead.

    /usr/bin/python3 scripts/gen_select_ref.py > tests/ref/select.lua
"""
import math

import torch
import torch.nn.functional as F

from reflua import print_cases

torch.manual_seed(20261206)


def lua(v):
    if isinstance(v, torch.Tensor):
        shape = "{%s}" % ", ".join(map(str, v.shape))
        flat = v.detach().flatten().tolist()
        if v.dtype == torch.bool:
            return "{shape = %s, dtype = \"bool\", %s}" % (shape, ", ".join("true" if x else "false" for x in flat))
        if not v.dtype.is_floating_point:
            return "{shape = %s, dtype = \"int64\", %s}" % (shape, ", ".join(integer(x) for x in flat))
        return "{shape = %s, dtype = \"%s\", %s}" % (shape, str(v.dtype).replace("torch.", ""),
                                                     ", ".join(num(x) for x in flat))
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return "{%s}" % ", ".join(lua(x) for x in v)
    return num(v)


def integer(x):
    # beyond 2^53 a Lua number is not exact: a LuaJIT int64 literal
    return "%dLL" % x if abs(x) >= 2 ** 53 else "%d" % x


def num(x):
    if math.isnan(x):
        return "0/0"
    if math.isinf(x):
        return "math.huge" if x > 0 else "-math.huge"
    return "%.17g" % x


cases = {}

# A matrix with ties (values on a coarse grid) and one row of equal values.
ties = torch.randint(0, 4, (4, 7)).double() / 2
ties[2] = 1.5
cases["ties"] = {"x": ties}
for dim in (-1, 0):
    for desc in (False, True):
        v, i = torch.sort(ties, dim=dim, descending=desc, stable=True)
        cases["ties"]["sort_%d_%s" % (dim + 1, "desc" if desc else "asc")] = [v, i]

nan = torch.tensor([3.0, float("nan"), 1.0, float("nan"), 2.0, -float("inf"), 1.0])
cases["nan"] = {"x": nan}
for desc in (False, True):
    v, i = torch.sort(nan, descending=desc, stable=True)
    cases["nan"]["sort_" + ("desc" if desc else "asc")] = [v, i]

big = torch.tensor([2 ** 62 + 1, 2 ** 62, -5, 2 ** 62 + 1, 7, -(2 ** 62)], dtype=torch.int64)
v, i = torch.sort(big, stable=True)
cases["int64"] = {"x": big, "sort_asc": [v, i], "argsort_desc": torch.argsort(big, descending=True)}

# topk on distinct values (indices exact) and on ties (values exact)
x = torch.randn(3, 10, dtype=torch.float64)
cases["topk"] = {"x": x}
for k, dim, largest in ((4, -1, True), (3, -1, False), (2, 0, True), (10, -1, True), (0, -1, True)):
    v, i = torch.topk(x, k, dim=dim, largest=largest)
    cases["topk"]["k%d_dim%d_%s" % (k, dim + 1, "largest" if largest else "smallest")] = [v, i]
v, i = torch.topk(ties, 3)
cases["ties"]["topk3"] = [v, i]

# gradients: the values' gradient goes back to the indices
g = torch.randn(3, 4, dtype=torch.float64)
xs = x.clone().requires_grad_()
torch.topk(xs, 4)[0].backward(g)
cases["topk"]["grad_out"] = g
cases["topk"]["grad_k4"] = xs.grad
g = torch.randn(3, 10, dtype=torch.float64)
xs = x.clone().requires_grad_()
torch.sort(xs, dim=0, descending=True)[0].backward(g)
cases["topk"]["sort_grad_out"] = g
cases["topk"]["sort_grad_dim0_desc"] = xs.grad

# cumsum
c = torch.randn(3, 5, dtype=torch.float64)
cs = c.clone().requires_grad_()
out = torch.cumsum(cs, 1)
gc = torch.randn(3, 5, dtype=torch.float64)
out.backward(gc)
cases["cumsum"] = {
    "x": c, "dim1": torch.cumsum(c, 1), "dim0": torch.cumsum(c, 0), "grad_out": gc, "grad_dim1": cs.grad,
    "ints": torch.tensor([[1, -2, 3], [4, 5, -6]]), "ints_dim1": torch.cumsum(torch.tensor([[1, -2, 3], [4, 5, -6]]), 1),
    "bools": torch.tensor([True, False, True, True]), "bools_dim0": torch.cumsum(torch.tensor([True, False, True, True]), 0),
}
cs = c.clone().requires_grad_()
torch.cumsum(cs, 0).backward(gc)
cases["cumsum"]["grad_dim0"] = cs.grad

# one_hot, nonzero
labels = torch.tensor([0, 2, 1, 2, 3])
cases["one_hot"] = {"x": labels, "default": F.one_hot(labels), "five": F.one_hot(labels, 5),
                    "two_d": F.one_hot(labels.view(1, 5), 6)}
nz = torch.tensor([[0, 1, 0], [2, 0, 3], [0, 0, 0]])
nz3 = (torch.randn(2, 3, 4) > 0.3)
cases["nonzero"] = {"x": nz, "result": torch.nonzero(nz), "x3": nz3, "result3": torch.nonzero(nz3)}

# advanced indexing: reads
t = torch.arange(120, dtype=torch.float64).reshape(4, 5, 6)
i1 = torch.tensor([3, 0, 3, -1])
i2 = torch.tensor([[1, 0], [4, 2]])
ia = torch.tensor([0, 2])
ib = torch.tensor([1, 3])
mask2 = t[:, :, 0] % 3 == 0
cases["index"] = {
    "t": t, "i1": i1, "i2": i2, "ia": ia, "ib": ib, "mask2": mask2,
    "r_i1": t[i1],                   # t[{i1}]
    "r_col_i1": t[:, i1 + 1],        # t[{{}, i1 + 1}]
    "r_i2": t[:, :, i2],             # t[{{}, {}, i2}]
    "r_pair": t[ia, ib],             # t[{ia, ib}]
    "r_pair_mid": t[:, ia, ib],      # t[{{}, ia, ib}]
    "r_split": t[ia, :, ib],         # t[{ia, {}, ib}]: apart, so at the front
    "r_int_adv": t[1, :, ia],        # t[{1, {}, ia}]: the number selects first
    "r_mask2": t[mask2],             # t[mask2]
    "r_mask_slice": t[1:3][mask2[1:3]],
}
# writes
w = t.clone()
w[i1] = -1
cases["index"]["w_i1_scalar"] = w
w = t.clone()
w[:, ia, ib] = torch.tensor([100.0, 200.0], dtype=torch.float64)
cases["index"]["w_pair_mid"] = w
w = t.clone()
w[mask2] = 0.5
cases["index"]["w_mask2"] = w
w = t.clone()
m3 = t % 7 == 1
w[m3] = torch.arange(int(m3.sum()), dtype=torch.float64) * -1
cases["index"]["m3"] = m3
cases["index"]["w_mask3_values"] = w
w = t.clone()
w[:, :, i2] = torch.tensor([[7.0, 8.0], [9.0, 10.0]], dtype=torch.float64)
cases["index"]["w_i2_broadcast"] = w
# gradient through a read: t[i1] of a leaf
tg = t.clone().requires_grad_()
gi = torch.randn(4, 5, 6, dtype=torch.float64)
tg[i1].backward(gi)
cases["index"]["grad_out_i1"] = gi
cases["index"]["grad_i1"] = tg.grad

print_cases("gen_select_ref.py", cases, lua)
