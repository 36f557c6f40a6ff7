#!/usr/bin/python3
"""Writes tests/ref/weight_norm.lua: PyTorch's torch.nn.utils.weight_norm and
spectral_norm on Linear, Conv2d and ConvTranspose2d modules, in float64, for
tests/lua/test_weight_norm.lua. The weight is w.flat[k] = 0.5 sin(1 + 0.7 k),
the bias 0.1 k, the input x.flat[k] = cos(0.3 k) (rebuilt in the test); the
loss is the output weighted by cos of its flat index. For spectral_norm the
power iteration starts from u.flat[k] = 1 + 0.1 k and v.flat[k] = 2 - 0.2 k,
set after the module is wrapped; each case records the output of one
training forward and of one evaluation forward after it, the vectors after
the training one, and the gradients.
    cd scripts && /usr/bin/python3 gen_weight_norm_ref.py > ../tests/ref/weight_norm.lua
"""

import torch
import torch.nn as nn
from torch.nn.utils import spectral_norm, weight_norm
from reflua import filled, fixed_module, lua_value, print_cases, weighted_sum

torch.set_default_dtype(torch.float64)

modules = {  # name: (constructor, input shape)
    "linear": (lambda: nn.Linear(3, 4), (2, 3)),
    "conv2d": (lambda: nn.Conv2d(2, 3, 2), (1, 2, 3, 3)),
    "conv_transpose2d": (lambda: nn.ConvTranspose2d(2, 3, 2), (1, 2, 2, 2)),
}
cases = {  # name: (module, how it is wrapped, its argument, the dim in Lua)
    "weight_norm_linear": ("linear", "weight", 0),
    "weight_norm_linear_dim1": ("linear", "weight", 1),
    "weight_norm_linear_whole": ("linear", "weight", None),
    "weight_norm_conv2d": ("conv2d", "weight", 0),
    "weight_norm_conv_transpose2d_dim1": ("conv_transpose2d", "weight", 1),
    "spectral_norm_linear": ("linear", "spectral", 1),
    "spectral_norm_linear_3_iterations": ("linear", "spectral", 3),
    "spectral_norm_conv2d": ("conv2d", "spectral", 1),
    "spectral_norm_conv_transpose2d": ("conv_transpose2d", "spectral", 1),
}


out = {}
for name, (kind, how, arg) in cases.items():
    m, x = fixed_module(*modules[kind])
    case = {"module": kind}
    if how == "weight":
        weight_norm(m, dim=arg)
        case["dim"] = -1 if arg is None else arg
        y = m(x)
        weighted_sum(y).backward()
        case["g"] = m.weight_g.reshape(-1).tolist()
        case["dg"] = m.weight_g.grad.reshape(-1).tolist()
        case["dv"] = m.weight_v.grad.reshape(-1).tolist()
    else:
        spectral_norm(m, n_power_iterations=arg)
        case["n_power_iterations"] = arg
        with torch.no_grad():
            m.weight_u.copy_(filled(m.weight_u.shape, lambda k: 1 + 0.1 * k))
            m.weight_v.copy_(filled(m.weight_v.shape, lambda k: 2 - 0.2 * k))
        y = m(x)
        weighted_sum(y).backward()
        case["u"] = m.weight_u.tolist()
        case["v"] = m.weight_v.tolist()
        case["dw"] = m.weight_orig.grad.reshape(-1).tolist()
        m.eval()
        case["y_eval"] = m(x).reshape(-1).tolist()
        torch.nn.utils.remove_spectral_norm(m)
        case["removed_weight"] = m.weight.reshape(-1).tolist()
    case["y"] = y.reshape(-1).tolist()
    case["dx"] = x.grad.reshape(-1).tolist()
    case["db"] = m.bias.grad.tolist()
    out[name] = case
# fuse_conv_bn_weights on fixed statistics: conv_w.flat[k] = 0.5 sin(1 + 0.7 k)
# (3, 2, 2, 2), conv_b 0.1 k, running mean 0.2 k - 0.1, running var 0.5 + 0.3 k,
# eps 1e-3, bn weight 1 - 0.2 k, bn bias 0.05 k; transposed, the weight is (2, 3, 2, 2)
from torch.nn.utils import fuse_conv_bn_weights
stats = [filled((3,), f) for f in (lambda k: 0.2 * k - 0.1, lambda k: 0.5 + 0.3 * k, lambda k: 1 - 0.2 * k,
                                   lambda k: 0.05 * k)]
for name, shape, transpose, bias in (("fuse_conv_bn", (3, 2, 2, 2), False, True),
                                     ("fuse_conv_bn_no_bias", (3, 2, 2, 2), False, False),
                                     ("fuse_conv_transpose_bn", (2, 3, 2, 2), True, True)):
    w = filled(shape, lambda k: 0.5 * torch.sin(torch.tensor(1 + 0.7 * k)).item())
    b = filled((3,), lambda k: 0.1 * k) if bias else None
    fw, fb = fuse_conv_bn_weights(w, b, stats[0], stats[1], 1e-3, stats[2], stats[3], transpose)
    out[name] = {"w": fw.reshape(-1).tolist(), "b": fb.tolist()}
print_cases("gen_weight_norm_ref.py", out, lua_value)
