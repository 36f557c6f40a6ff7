#!/usr/bin/python3
"""Writes tests/ref/ctc.lua: PyTorch's F.ctc_loss of log_softmax(logits)
and the gradient of the logits, for tests/lua/test_losses.lua, in float64.
The logits are sin(1 + 0.37 k) * 3 over flat indices k (rebuilt in the
test); each case gives the shape, the targets, the lengths and the options.
PyTorch's own gradient of log_probs assumes they are a log_softmax, so the
logits' gradient is what both sides share.
    /usr/bin/python3 scripts/gen_ctc_ref.py > tests/ref/ctc.lua
"""
import math

import torch
import torch.nn.functional as F
from reflua import lua_value, print_cases

CASES = {
    # name: (T, N, C), targets (padded list of rows or concatenated), input lengths, target lengths, options
    "padded_mean": ((8, 3, 5), [[1, 2, 2, 0], [3, 1, 4, 4], [2, 0, 0, 0]], [8, 6, 5], [3, 4, 1], {}),
    "padded_none": ((8, 3, 5), [[1, 2, 2, 0], [3, 1, 4, 4], [2, 0, 0, 0]], [8, 6, 5], [3, 4, 1],
                    {"reduction": "none"}),
    "concatenated_sum": ((7, 2, 4), [1, 3, 3, 2, 1], [7, 7], [3, 2], {"reduction": "sum"}),
    "blank_last": ((6, 2, 4), [[0, 1], [2, 2]], [6, 5], [2, 2], {"blank": 3, "reduction": "none"}),
    "empty_target": ((5, 2, 3), [[1, 2], [0, 0]], [5, 4], [2, 0], {"reduction": "none"}),
    "impossible_zero_infinity": ((4, 2, 4), [[1, 1, 1], [2, 3, 0]], [4, 4], [3, 2],
                                 {"reduction": "none", "zero_infinity": True}),
    "unbatched": ((6, 4), [1, 2, 1], 6, 3, {}),
}


def run(name):
    shape, targets, il, tl, opts = CASES[name]
    n = math.prod(shape)
    logits = torch.tensor([math.sin(1 + 0.37 * k) * 3 for k in range(n)], dtype=torch.float64).reshape(shape)
    logits.requires_grad_()
    lp = logits.log_softmax(-1)
    if len(shape) == 2:
        loss = F.ctc_loss(lp, torch.tensor(targets), torch.tensor(il), torch.tensor(tl), **opts)
    else:
        loss = F.ctc_loss(lp, torch.tensor(targets), torch.tensor(il), torch.tensor(tl), **opts)
    wt = torch.cos(torch.arange(loss.numel(), dtype=torch.float64)).reshape(loss.shape)
    finite = torch.isfinite(loss)
    (torch.where(finite, loss, torch.zeros_like(loss)) * wt).sum().backward()
    return {"shape": list(shape), "targets": targets, "input_lengths": il, "target_lengths": tl,
            "opts": opts, "loss": loss.detach().reshape(-1).tolist(), "dlogits": logits.grad.reshape(-1).tolist()}


print_cases("gen_ctc_ref.py", {name: run(name) for name in CASES}, lua_value)
