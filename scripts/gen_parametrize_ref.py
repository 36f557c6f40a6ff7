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
= 2 - 0.2 k, set after registration. parametrizations.orthogonal (the weight plus I(n, k)): each
map on a square weight (the output, the gradients, and the weight after
assigning an orthogonal matrix Q0 (the Q of QR of 0.3 cos(0.5 k^2) + I) and
after assigning the generator's weight again), a tall and a wide weight (the
base's random completion leaves only the output and the input's gradient
fixed), and use_trivialization=False.
    cd scripts && /usr/bin/python3 gen_parametrize_ref.py > ../tests/ref/parametrize.lua
"""

import math

import torch
import torch.nn as nn
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import orthogonal, spectral_norm
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

def flat(t):
    return t.detach().reshape(-1).tolist()


def orthogonal_case(make, xshape, fixed_grad, **kw):
    m, x = fixed_module(make, xshape)
    with torch.no_grad():   # the generator's weight is of rank 2: QR would leave columns free
        m.weight.add_(torch.eye(*m.weight.shape))
    w0 = m.weight.detach().clone()
    orthogonal(m, **kw)
    c = {"weight": flat(m.weight)}
    y = m(x)
    weighted_sum(y).backward()
    c.update({"y": flat(y), "dx": flat(x.grad)})
    if fixed_grad:
        c["d_original"] = flat(m.parametrizations.weight.original.grad)
    if fixed_grad and kw.get("use_trivialization", True):
        n = w0.shape[0]
        q0 = torch.linalg.qr(filled((n, n), lambda k: 0.3 * math.cos(0.5 * k * k)) + torch.eye(n))[0]
        with torch.no_grad():
            m.weight = q0
            c["weight_after_q0"] = flat(m.weight)
            m.weight = w0
            c["weight_after_w0"] = flat(m.weight)
    return c


for name, make, xshape, fixed, kw in [
        ("matrix_exp", lambda: nn.Linear(4, 4), (2, 4), True, {}),
        ("cayley", lambda: nn.Linear(4, 4), (2, 4), True, {"orthogonal_map": "cayley"}),
        ("householder", lambda: nn.Linear(4, 4), (2, 4), True, {"orthogonal_map": "householder"}),
        ("tall", lambda: nn.Linear(3, 5), (2, 3), False, {}),
        ("wide_cayley", lambda: nn.Linear(5, 3), (2, 5), False, {"orthogonal_map": "cayley"}),
        ("plain_householder", lambda: nn.Linear(3, 5), (2, 3), True, {"use_trivialization": False}),
        ("plain_matrix_exp", lambda: nn.Linear(4, 4), (2, 4), True, {"use_trivialization": False})]:
    out["orthogonal_" + name] = orthogonal_case(make, xshape, fixed, **kw)
print_cases("gen_parametrize_ref.py", out, lua_value)
