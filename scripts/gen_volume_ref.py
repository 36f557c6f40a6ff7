#!/usr/bin/python3
"""Writes tests/ref/volume.lua: PyTorch's conv3d, conv_transpose3d,
max_pool3d, avg_pool3d, adaptive_avg_pool3d and adaptive_max_pool3d
outputs and the gradients of the input, weight and bias (of the output
weighted by cos of its flat index) for tests/lua/test_volume.lua, in
float64. Inputs are sin(1 + 0.3 k), weights cos(2 + 0.7 k) and biases
sin(3 + k) over flat indices k (rebuilt in the test).
    cd scripts && /usr/bin/python3 gen_volume_ref.py > ../tests/ref/volume.lua
"""
import math

import torch
import torch.nn.functional as F
from reflua import filled, lua, print_cases

X = (2, 3, 5, 6, 7)


CONV = {  # name: (conv3d or conv_transpose3d, weight shape, bias, options)
    "conv_plain": (F.conv3d, (4, 3, 3, 3, 3), True, {}),
    "conv_stride_pad": (F.conv3d, (4, 3, 3, 2, 3), True, {"stride": (2, 1, 2), "padding": (1, 0, 1)}),
    "conv_dilation_groups": (F.conv3d, (6, 1, 2, 2, 2), False, {"dilation": (2, 1, 2), "groups": 3}),
    "transpose_plain": (F.conv_transpose3d, (3, 2, 2, 3, 2), True, {}),
    "transpose_stride_pad_out": (F.conv_transpose3d, (3, 4, 3, 3, 3), True,
                                 {"stride": 2, "padding": 1, "output_padding": (1, 0, 1)}),
    "transpose_groups_dilation": (F.conv_transpose3d, (3, 2, 2, 2, 2), False, {"groups": 3, "dilation": (2, 1, 1)}),
}
POOL = {
    "max_k2": lambda x: F.max_pool3d(x, 2),
    "max_k3_s2_p1": lambda x: F.max_pool3d(x, 3, stride=2, padding=1),
    "max_dilation_ceil": lambda x: F.max_pool3d(x, (2, 3, 2), stride=(1, 2, 2), dilation=(2, 1, 2), ceil_mode=True),
    "avg_k2": lambda x: F.avg_pool3d(x, 2),
    "avg_k3_s2_p1": lambda x: F.avg_pool3d(x, 3, stride=2, padding=1),
    "avg_k3_s2_p1_nopad": lambda x: F.avg_pool3d(x, 3, stride=2, padding=1, count_include_pad=False),
    "avg_ceil": lambda x: F.avg_pool3d(x, (2, 3, 3), stride=2, padding=(1, 1, 0), ceil_mode=True),
    "avg_divisor": lambda x: F.avg_pool3d(x, 2, divisor_override=5),
    "adaptive_avg_1": lambda x: F.adaptive_avg_pool3d(x, 1),
    "adaptive_avg_234": lambda x: F.adaptive_avg_pool3d(x, (2, 3, 4)),
    "adaptive_max_324": lambda x: F.adaptive_max_pool3d(x, (3, 2, 4)),
}


def run(f, params=()):
    x = filled(X, lambda k: math.sin(1 + 0.3 * k)).requires_grad_()
    y = f(x)
    wt = torch.cos(torch.arange(y.numel(), dtype=torch.float64)).reshape(y.shape)
    (y * wt).sum().backward()
    out = {"shape": list(y.shape), "y": y.reshape(-1).tolist(), "dx": x.grad.reshape(-1).tolist()}
    for name, p in params:
        out[name] = p.grad.reshape(-1).tolist()
    return out


cases = {}
for name, (conv, ws, use_bias, o) in CONV.items():
    w = filled(ws, lambda k: math.cos(2 + 0.7 * k)).requires_grad_()
    cout = ws[1] * o.get("groups", 1) if conv is F.conv_transpose3d else ws[0]
    b = filled((cout,), lambda k: math.sin(3 + k)).requires_grad_() if use_bias else None
    params = [("dw", w)] + ([("db", b)] if use_bias else [])
    cases[name] = run(lambda x, conv=conv, w=w, b=b, o=o: conv(x, w, b, **o), params)
for name, f in POOL.items():
    cases[name] = run(f)
# the indices of max_pool3d; max_unpool3d of its output (the gradient of
# the unpooled output weighted by cos of its flat index)
x = filled(X, lambda k: math.sin(1 + 0.3 * k))
c = run(lambda x: F.max_unpool3d(*F.max_pool3d(x, 3, stride=2, padding=1, return_indices=True), 3, stride=2,
                                 padding=1, output_size=X[2:]))
c["indices"] = F.max_pool3d(x, 3, stride=2, padding=1, return_indices=True)[1].reshape(-1).tolist()
cases["unpool_k3_s2_p1"] = c
_, idx = F.max_pool3d(x, (2, 3, 2), stride=(1, 2, 2), dilation=(2, 1, 2), ceil_mode=True, return_indices=True)
cases["indices_dilation_ceil"] = {"indices": idx.reshape(-1).tolist()}
print_cases("gen_volume_ref.py", cases, lua)
