#!/usr/bin/python3
"""Writes tests/ref/swa.lua: torch.optim.swa_utils against PyTorch, in
float64, for tests/lua/test_swa.lua. A Linear(3, 4) - BatchNorm1d(4) -
ReLU - Linear(4, 2) model (weights w.flat[k] = 0.5 sin(1 + 0.7 k + layer),
biases 0.1 k) trains 6 SGD steps (lr 0.1, momentum 0.9) on the batches
x.flat[k] = cos(0.3 k + step), target sin(0.2 k + step), mean squared error;
an AveragedModel (equal weights) and an exponential moving average (decay
0.8, use_buffers) are updated after each step. Then update_bn over the
three batches x.flat[k] = cos(0.5 k + b) of the averaged model. SWALR's
learning rates over 8 epochs for each anneal strategy and for no anneal.
    cd scripts && /usr/bin/python3 gen_swa_ref.py > ../tests/ref/swa.lua
"""
import math

import torch
import torch.nn as nn
from torch.optim.swa_utils import AveragedModel, SWALR, update_bn
from reflua import filled, lua_value, print_cases

torch.set_default_dtype(torch.float64)


def model_of():
    m = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))
    with torch.no_grad():
        for layer, lin in ((0, m[0]), (3, m[3])):
            lin.weight.copy_(filled(lin.weight.shape, lambda k, layer=layer: 0.5 * math.sin(1 + 0.7 * k + layer)))
            lin.bias.copy_(filled(lin.bias.shape, lambda k: 0.1 * k))
    return m


def flat_params(m):
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()]).tolist()


def flat_buffers(m):
    return torch.cat([b.detach().reshape(-1).double() for b in m.buffers()]).tolist()


out = {}
model = model_of()
swa = AveragedModel(model)
ema = AveragedModel(model, avg_fn=lambda avg, cur, n: 0.8 * avg + 0.2 * cur, use_buffers=True)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
for step in range(6):
    x = filled((5, 3), lambda k, s=step: math.cos(0.3 * k + s))
    y = filled((5, 2), lambda k, s=step: math.sin(0.2 * k + s))
    opt.zero_grad()
    ((model(x) - y) ** 2).mean().backward()
    opt.step()
    swa.update_parameters(model)
    ema.update_parameters(model)
out["train"] = {
    "model": flat_params(model), "swa": flat_params(swa.module), "ema": flat_params(ema.module),
    "ema_buffers": flat_buffers(ema.module),
    "n_averaged": swa.n_averaged.item(),
}
batches = [filled((4, 3), lambda k, b=b: math.cos(0.5 * k + b)) for b in range(3)]
update_bn(batches, swa)
bn = swa.module[1]
out["update_bn"] = {"running_mean": bn.running_mean.tolist(), "running_var": bn.running_var.tolist(),
                    "momentum": bn.momentum, "training": swa.training}

for name, kwargs in {"cos": {"anneal_epochs": 3}, "linear": {"anneal_epochs": 4, "anneal_strategy": "linear"},
                     "no_anneal": {"anneal_epochs": 0}}.items():
    p = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([p], lr=0.5)
    sched = SWALR(opt, swa_lr=0.05, **kwargs)
    lrs = [opt.param_groups[0]["lr"]]
    for _ in range(8):
        opt.step()
        sched.step()
        lrs.append(opt.param_groups[0]["lr"])
    out["swalr_" + name] = {"lrs": lrs}
print_cases("gen_swa_ref.py", out, lua_value)
