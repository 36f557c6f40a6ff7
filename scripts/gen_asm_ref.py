#!/usr/bin/python3
"""Writes tests/ref/asm.lua: nn.AdaptiveLogSoftmaxWithLoss against
PyTorch, in float64, for tests/lua/test_losses.lua. in_features 8,
n_classes 20, cutoffs {5, 12}, div_value 2, with and without head_bias;
parameter k of the module (in named_parameters order) holds
0.3 sin(1 + 0.7 j + k) at flat index j, the input cos(0.4 j); targets
{0, 4, 5, 11, 12, 19}. Records output, loss, the gradients of the loss,
log_prob and predict.
    cd scripts && /usr/bin/python3 gen_asm_ref.py > ../tests/ref/asm.lua
"""
import math

import torch
import torch.nn as nn
from reflua import filled, lua_value, print_cases

torch.set_default_dtype(torch.float64)

out = {}
for name, head_bias in [("plain", False), ("head_bias", True)]:
    m = nn.AdaptiveLogSoftmaxWithLoss(8, 20, [5, 12], div_value=2.0, head_bias=head_bias)
    with torch.no_grad():
        for k, (_, p) in enumerate(m.named_parameters()):
            p.copy_(filled(p.shape, lambda j, k=k: 0.3 * math.sin(1 + 0.7 * j + k)))
    x = filled((6, 8), lambda j: math.cos(0.4 * j)).requires_grad_()
    target = torch.tensor([0, 4, 5, 11, 12, 19])
    r = m(x, target)
    r.loss.backward()
    c = {"output": r.output.tolist(), "loss": r.loss.item(), "dx": x.grad.reshape(-1).tolist(),
         "log_prob": m.log_prob(x).reshape(-1).tolist(), "predict": m.predict(x).tolist(),
         "names": [n for n, _ in m.named_parameters()]}
    for n, p in m.named_parameters():
        c["d_" + n.replace(".", "_")] = p.grad.reshape(-1).tolist()
    out[name] = c
print_cases("gen_asm_ref.py", out, lua_value)
