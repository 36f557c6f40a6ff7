#!/usr/bin/python3
"""Writes tests/ref/func.lua: torch.func's transforms (functorch 1.13 here)
against dplua's, in float64, for tests/lua/test_func.lua. A Linear(3, 4) -
Tanh - Linear(4, 2) model whose parameter k (named_parameters order) holds
0.5 sin(1 + 0.7 j + k) at flat index j; inputs x.flat[j] = cos(0.3 j) (5 x
3), targets y.flat[j] = sin(0.4 j) (5 x 2); the loss is mse_loss. Records
functional_call's output with the parameters scaled by 1.5, the gradient
by name ("0.weight" as p0_weight), the per-sample gradients (vmap of grad over x and y), a vjp of
sin(x) * x with cotangent cos(j), and jacrev of tanh(W a) at a = (0.2, -0.4, 0.6).
    cd scripts && /usr/bin/python3 gen_func_ref.py > ../tests/ref/func.lua
"""
import math

import functorch
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.stateless import functional_call
from reflua import filled, lua_value, print_cases

torch.set_default_dtype(torch.float64)

model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
with torch.no_grad():
    for k, (_, p) in enumerate(model.named_parameters()):
        p.copy_(filled(p.shape, lambda j, k=k: 0.5 * math.sin(1 + 0.7 * j + k)))
params = {n: p.detach() for n, p in model.named_parameters()}
x = filled((5, 3), lambda j: math.cos(0.3 * j))
y = filled((5, 2), lambda j: math.sin(0.4 * j))


def loss(ps, xb, yb):
    return F.mse_loss(functional_call(model, ps, (xb,)), yb)


out = {}
scaled = {n: p * 1.5 for n, p in params.items()}
out["functional_call"] = {"y": functional_call(model, scaled, (x,)).reshape(-1).tolist()}
g = functorch.grad(loss)(params, x, y)
out["grad"] = {"p" + n.replace(".", "_"): t.reshape(-1).tolist() for n, t in g.items()}
out["grad"]["loss"] = loss(params, x, y).item()
per = functorch.vmap(functorch.grad(loss), in_dims=(None, 0, 0))(params, x, y)
out["per_sample"] = {"p" + n.replace(".", "_"): t.reshape(-1).tolist() for n, t in per.items()}
_, vjp_fn = functorch.vjp(lambda a: a.sin() * a, x)
(ct,) = vjp_fn(torch.cos(torch.arange(15.0)).reshape(5, 3))
out["vjp"] = {"g": ct.reshape(-1).tolist()}
W = params["0.weight"]
J = functorch.jacrev(lambda a: torch.tanh(W @ a))(torch.tensor([0.2, -0.4, 0.6]))
out["jacrev"] = {"J": J.reshape(-1).tolist()}
print_cases("gen_func_ref.py", out, lua_value)
