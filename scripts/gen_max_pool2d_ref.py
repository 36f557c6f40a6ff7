#!/usr/bin/python3
"""Writes tests/ref/max_pool2d.lua: PyTorch's F.max_pool2d outputs and the
input's gradient (of the output weighted by cos of its flat index) for
tests/lua/test_conv2d.lua, in float64. Inputs are sin(1 + 0.3 k) over flat
indices k, or for "ties" round(2 sin k), whose windows hold equal
largest elements (rebuilt in the test).
    /usr/bin/python3 scripts/gen_max_pool2d_ref.py > tests/ref/max_pool2d.lua
"""
import math

import torch
import torch.nn.functional as F
from reflua import filled, lua, print_cases

cases = {  # name: (input shape, kernel, options)
    "mnist": ((2, 3, 8, 8), 2, {}),
    "odd": ((2, 2, 7, 9), 2, {}),
    "stride_pad": ((1, 3, 9, 8), 3, {"stride": 2, "padding": 1}),
    "rect": ((2, 2, 6, 10), (2, 3), {"stride": (1, 2)}),
    "dilation": ((1, 2, 11, 10), 3, {"dilation": 2, "padding": 1}),
    "ties": ((2, 2, 8, 7), 3, {"stride": 1, "padding": 1}),
    "ceil": ((2, 2, 7, 9), 2, {"ceil_mode": True}),
    "ceil_stride_pad": ((1, 3, 10, 8), 3, {"stride": 2, "padding": 1, "ceil_mode": True}),
    "ceil_dilation": ((1, 2, 11, 12), 3, {"stride": 2, "dilation": 2, "ceil_mode": True}),
}

out = {}
for name, (shape, k, o) in cases.items():
    f = (lambda i: float(round(2 * math.sin(i)))) if name == "ties" else (lambda i: math.sin(1 + 0.3 * i))
    x = filled(shape, f).requires_grad_()
    y = F.max_pool2d(x, k, **o)
    wt = torch.cos(torch.arange(y.numel(), dtype=torch.float64)).reshape(y.shape)
    (y * wt).sum().backward()
    out[name] = {"shape": list(y.shape), "y": y.reshape(-1).tolist(), "dx": x.grad.reshape(-1).tolist()}
print_cases("gen_max_pool2d_ref.py", out, lua)
