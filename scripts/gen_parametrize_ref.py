#!/usr/bin/python3
"""Writes tests/ref/parametrize.lua: torch.nn.utils.parametrize and
parametrizations.spectral_norm against PyTorch, in float64, for
tests/lua/test_parametrize.lua. Modules as in gen_weight_norm_ref.py (weight
0.5 sin(1 + 0.7 k), bias 0.1 k, input cos(0.3 k), the loss the output
weighted by cos of its flat index). "symmetric": Linear(3, 3) with its
weight parametrized as X.triu() + X.triu(1)^T (right_inverse X.triu()), then
(chained) times 2 (right_inverse / 2); the output, the gradients, and the original after
assigning weight = W0 (the generator's weight again, symmetrised). Spectral
norm: the power iteration starts from _u.flat[k] = 1 + 0.1 k and _v.flat[k]
= 2 - 0.2 k, set after registration.
    cd scripts && /usr/bin/python3 gen_parametrize_ref.py > ../tests/ref/parametrize.lua
"""

import torch
import torch.nn as nn
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import spectral_norm
from reflua import filled, fixed_module, lua_value, print_cases, weighted_sum

torch.set_default_dtype(torch.float64)


class Symmetric(nn.Module):
    def forward(self, X):
        return X.triu() + X.triu(1).transpose(-1, -2)

    def right_inverse(self, X):
        return X.triu()


class Twice(nn.Module):
    def forward(self, X):
        return X * 2

    def right_inverse(self, X):
        return X / 2


out = {}
m, x = fixed_module(lambda: nn.Linear(3, 3), (2, 3))
w0 = m.weight.detach().clone()
parametrize.register_parametrization(m, "weight", Symmetric())
parametrize.register_parametrization(m, "weight", Twice())
y = m(x)
weighted_sum(y).backward()
c = {"y": y.reshape(-1).tolist(), "dx": x.grad.reshape(-1).tolist(),
     "d_original": m.parametrizations.weight.original.grad.reshape(-1).tolist(), "db": m.bias.grad.tolist()}
with torch.no_grad():
    m.weight = w0 + w0.t()
c["original_after_assign"] = m.parametrizations.weight.original.reshape(-1).tolist()
c["weight_after_assign"] = m.weight.reshape(-1).tolist()
out["symmetric"] = c

for name, make, xshape in [("linear", lambda: nn.Linear(3, 4), (2, 3)),
                           ("conv_transpose2d", lambda: nn.ConvTranspose2d(2, 3, 2), (1, 2, 2, 2))]:
    m, x = fixed_module(make, xshape)
    spectral_norm(m, n_power_iterations=2)
    sn = m.parametrizations.weight[0]
    with torch.no_grad():
        sn._u.copy_(filled(sn._u.shape, lambda k: 1 + 0.1 * k))
        sn._v.copy_(filled(sn._v.shape, lambda k: 2 - 0.2 * k))
    y = m(x)
    weighted_sum(y).backward()
    c = {"y": y.reshape(-1).tolist(), "dx": x.grad.reshape(-1).tolist(), "u": sn._u.tolist(), "v": sn._v.tolist(),
         "d_original": m.parametrizations.weight.original.grad.reshape(-1).tolist()}
    m.eval()
    c["y_eval"] = m(x).reshape(-1).tolist()
    out["spectral_" + name] = c
print_cases("gen_parametrize_ref.py", out, lua_value)
