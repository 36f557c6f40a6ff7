#!/usr/bin/python3
"""Writes tests/ref/norm_extra.lua: PyTorch's F.group_norm, F.normalize,
F.cosine_similarity and F.pairwise_distance outputs and input gradients (of the output weighted by cos of its flat
index; for group_norm also the weight's and bias's) for
tests/lua/test_norm_extra.lua, in float64. The input is x.flat[i] =
sin(1 + 0.7 i) of the case's shape, scaled and shifted per case (rebuilt in
the test); the weight 1 + 0.1 c and the bias 0.05 c for channel c.
    /usr/bin/python3 scripts/gen_norm_extra_ref.py > tests/ref/norm_extra.lua
"""
import math

import torch
import torch.nn.functional as F
from reflua import lua, print_cases

cases = {  # name: (shape, scale, shift, function of x, w, b)
    "group_norm_2_of_6": ((3, 6, 5), 1.0, 0.0, lambda x, w, b: F.group_norm(x, 2, w, b)),
    "group_norm_4d_eps": ((2, 4, 3, 5), 3.0, 10.0, lambda x, w, b: F.group_norm(x, 4, w, b, eps=1e-3)),
    "group_norm_one_group": ((2, 4, 7), 1.0, 0.0, lambda x, w, b: F.group_norm(x, 1, w, b)),
    "group_norm_no_affine": ((2, 6, 2, 2), 1.0, 0.5, lambda x, w, b: F.group_norm(x, 3)),
    "group_norm_2d_input": ((5, 6), 1.0, 0.0, lambda x, w, b: F.group_norm(x, 3, w, b)),
    "normalize_p2": ((4, 5), 1.0, 0.0, lambda x, w, b: F.normalize(x)),
    "normalize_p1_last": ((3, 4, 5), 1.0, 0.0, lambda x, w, b: F.normalize(x, p=1.0, dim=-1)),
    "normalize_small_eps": ((3, 4), 1e-14, 0.0, lambda x, w, b: F.normalize(x, dim=0, eps=1e-12)),
    # the second operand: cos(x) + 0.3
    "cosine_similarity": ((4, 5, 3), 1.0, 0.0, lambda x, w, b: F.cosine_similarity(x, x.cos() + 0.3)),
    "cosine_similarity_last": ((4, 5), 1.0, 0.0, lambda x, w, b: F.cosine_similarity(x, x.cos() + 0.3, dim=-1)),
    "pairwise_distance": ((4, 5), 1.0, 0.0, lambda x, w, b: F.pairwise_distance(x, x.cos() + 0.3)),
    "pairwise_distance_p1_keepdim": ((2, 3, 5), 1.0, 0.0,
                                     lambda x, w, b: F.pairwise_distance(x, x.cos() + 0.3, p=1.0, keepdim=True)),
}

out = {}
for name, (shape, scale, shift, f) in cases.items():
    n = math.prod(shape)
    x = (torch.tensor([math.sin(1 + 0.7 * i) for i in range(n)], dtype=torch.float64) * scale + shift).reshape(shape)
    x.requires_grad_()
    C = shape[1]
    w = torch.tensor([1 + 0.1 * c for c in range(C)], dtype=torch.float64, requires_grad=True)
    b = torch.tensor([0.05 * c for c in range(C)], dtype=torch.float64, requires_grad=True)
    y = f(x, w, b)
    wt = torch.cos(torch.arange(y.numel(), dtype=torch.float64)).reshape(y.shape)
    (y * wt).sum().backward()
    case = {"shape": list(shape), "scale": scale, "shift": shift, "y": y.reshape(-1).tolist(),
            "dx": x.grad.reshape(-1).tolist()}
    if w.grad is not None:
        case["dw"], case["db"] = w.grad.tolist(), b.grad.tolist()
    out[name] = case
print_cases("gen_norm_extra_ref.py", out, lua)
