#!/usr/bin/python3
"""Writes tests/ref/interpolate.lua: PyTorch's F.interpolate outputs and
input gradients (of the output weighted by cos of its flat index) for
tests/lua/test_interpolate.lua, in float64: nearest and bilinear (both
align_corners), by size and by scale factor, up and down. The input is
x.flat[i] = sin(1 + 0.7 i) of shape (2, 3, 5, 7) (rebuilt in the test).
    /usr/bin/python3 scripts/gen_interpolate_ref.py > tests/ref/interpolate.lua
"""
import math

import torch
import torch.nn.functional as F
from reflua import lua, print_cases

SHAPE = (2, 3, 5, 7)
cases = {  # name: F.interpolate's keyword arguments
    "nearest_scale_2": {"scale_factor": 2},
    "nearest_size_up": {"size": (8, 11)},
    "nearest_size_down": {"size": (3, 4)},
    "nearest_scale_1_5": {"scale_factor": 1.5},
    "bilinear_size_up": {"size": (9, 10), "mode": "bilinear"},
    "bilinear_size_down": {"size": (3, 4), "mode": "bilinear"},
    "bilinear_scale_2": {"scale_factor": 2, "mode": "bilinear"},
    "bilinear_scale_0_6": {"scale_factor": (0.6, 0.5), "mode": "bilinear"},
    "bilinear_corners": {"size": (9, 4), "mode": "bilinear", "align_corners": True},
    "bilinear_corners_one": {"size": (1, 3), "mode": "bilinear", "align_corners": True},
}

out = {}
for name, kw in cases.items():
    n = math.prod(SHAPE)
    x = torch.tensor([math.sin(1 + 0.7 * i) for i in range(n)], dtype=torch.float64).reshape(SHAPE)
    x.requires_grad_()
    y = F.interpolate(x, **kw)
    wt = torch.cos(torch.arange(y.numel(), dtype=torch.float64)).reshape(y.shape)
    (y * wt).sum().backward()
    out[name] = {"shape": list(y.shape), "y": y.reshape(-1).tolist(), "dx": x.grad.reshape(-1).tolist()}
print_cases("gen_interpolate_ref.py", out, lua)
