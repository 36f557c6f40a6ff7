#!/usr/bin/python3
"""Writes tests/ref/prune.lua: torch.nn.utils.prune's masks against PyTorch,
in float64, for tests/lua/test_prune.lua. Modules as in fixed_module
(weight 0.5 sin(1 + 0.7 k), bias 0.1 k, input cos(0.3 k)). "iterative":
Linear(4, 6) pruned by l1_unstructured(amount=0.3), then l1_unstructured(
amount=3) on what is left, then ln_structured(amount=0.34, n=2, dim=0);
the masks after each, the output and the gradients, and the weight after
remove. "conv": Conv2d(2, 4, 3) by ln_structured(amount=1, n=1, dim=1) then
ln_structured(amount=0.5, n=inf, dim=0). "rounding": Linear(5, 2) by
l1_unstructured with amounts 0.25 and 0.35 (Python's round: 2.5 -> 2, 3.5
-> 4). "importance": l1_unstructured(amount=5) of Linear(4, 6) ranked by
importance scores cos(0.9 k). "global": global_unstructured over a Linear(4,
6)'s weight and bias and a Conv2d(2, 4, 3)'s weight by L1Unstructured with
amount=0.25, the Linear's weight first pruned by l1_unstructured(amount=4).
    cd scripts && /usr/bin/python3 gen_prune_ref.py > ../tests/ref/prune.lua
"""
import math

import torch
import torch.nn as nn
import torch.nn.utils.prune as prune
from reflua import filled, fixed_module, lua_value, print_cases, weighted_sum

torch.set_default_dtype(torch.float64)


def flat(t):
    return t.detach().reshape(-1).tolist()


out = {}

m, x = fixed_module(lambda: nn.Linear(4, 6), (2, 4))
c = {}
prune.l1_unstructured(m, "weight", amount=0.3)
c["mask1"] = flat(m.weight_mask)
prune.l1_unstructured(m, "weight", amount=3)
c["mask2"] = flat(m.weight_mask)
prune.ln_structured(m, "weight", amount=0.34, n=2, dim=0)
c["mask3"] = flat(m.weight_mask)
y = m(x)
weighted_sum(y).backward()
c.update({"y": flat(y), "dx": flat(x.grad), "d_weight_orig": flat(m.weight_orig.grad)})
prune.remove(m, "weight")
c["weight_removed"] = flat(m.weight)
out["iterative"] = c

m, _ = fixed_module(lambda: nn.Conv2d(2, 4, 3), (1, 2, 3, 3))
prune.ln_structured(m, "weight", amount=1, n=1, dim=1)
c = {"mask1": flat(m.weight_mask)}
prune.ln_structured(m, "weight", amount=0.5, n=math.inf, dim=0)
c["mask2"] = flat(m.weight_mask)
out["conv"] = c

c = {}
for amount in (0.25, 0.35):
    m, _ = fixed_module(lambda: nn.Linear(5, 2), (1, 5))
    prune.l1_unstructured(m, "weight", amount=amount)
    c["mask_%d" % round(amount * 100)] = flat(m.weight_mask)
out["rounding"] = c

m, _ = fixed_module(lambda: nn.Linear(4, 6), (1, 4))
prune.l1_unstructured(m, "weight", amount=5, importance_scores=filled((6, 4), lambda k: math.cos(0.9 * k)))
out["importance"] = {"mask": flat(m.weight_mask)}

lin, _ = fixed_module(lambda: nn.Linear(4, 6), (1, 4))
conv, _ = fixed_module(lambda: nn.Conv2d(2, 4, 3), (1, 2, 3, 3))
prune.l1_unstructured(lin, "weight", amount=4)
prune.global_unstructured([(lin, "weight"), (lin, "bias"), (conv, "weight")], pruning_method=prune.L1Unstructured,
                          amount=0.25)
out["global"] = {"lin_weight": flat(lin.weight_mask), "lin_bias": flat(lin.bias_mask),
                 "conv_weight": flat(conv.weight_mask)}

print_cases("gen_prune_ref.py", out, lua_value)
