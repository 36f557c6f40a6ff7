#!/usr/bin/python3
"""Writes tests/ref/fractional.lua: F.fractional_max_pool2d and
fractional_max_pool3d against PyTorch, in float64, for tests/lua/test_pool.lua,
with the samples given (_random_samples): the input x.flat[k] = sin(k), the
samples s.flat[k] = frac(0.37 k + 0.11); outputs, indices and the input's
gradient of the output weighted by cos of its flat index.
    cd scripts && /usr/bin/python3 gen_fractional_ref.py > ../tests/ref/fractional.lua
"""
import math

import torch
import torch.nn.functional as F
from reflua import filled, lua_value, print_cases, weighted_sum

torch.set_default_dtype(torch.float64)

CASES = {  # name: (function, input shape, samples shape, kernel, options)
    "f2d_size": (F.fractional_max_pool2d, (2, 3, 7, 9), (2, 3, 2), (2, 3), {"output_size": (4, 5)}),
    "f2d_ratio": (F.fractional_max_pool2d, (2, 3, 7, 9), (2, 3, 2), 2, {"output_ratio": 0.5}),
    "f2d_one": (F.fractional_max_pool2d, (1, 2, 5, 5), (1, 2, 2), 3, {"output_size": 1}),
    "f3d_size": (F.fractional_max_pool3d, (1, 2, 5, 6, 7), (1, 2, 3), (2, 2, 3), {"output_size": (3, 4, 3)}),
}

out = {}
for name, (f, xshape, sshape, k, opts) in CASES.items():
    x = filled(xshape, lambda j: math.sin(j)).requires_grad_()
    s = filled(sshape, lambda j: (0.37 * j + 0.11) % 1.0)
    y, idx = f(x, k, return_indices=True, _random_samples=s, **opts)
    weighted_sum(y).backward()
    out[name] = {"shape": list(y.shape), "y": y.reshape(-1).tolist(), "indices": idx.reshape(-1).tolist(),
                 "dx": x.grad.reshape(-1).tolist()}
print_cases("gen_fractional_ref.py", out, lua_value)
