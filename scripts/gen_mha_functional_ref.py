#!/usr/bin/python3
"""Writes tests/ref/mha_functional.lua: F.multi_head_attention_forward
against PyTorch, in float64, for tests/lua/test_transformer.lua: embed_dim
6, 2 heads, query (4, 2, 6), key (5, 2, 4) and value (5, 2, 3) through
separate projection weights, bias_k and bias_v, a key padding mask (the
last key of batch entry 1), an additive attention mask, per-head weights.
Tensor number t of the list below holds 0.4 sin(1 + 0.7 k + t) at flat
index k; the loss is the output weighted by cos of its flat index plus the
weights' sum weighted alike.
    cd scripts && /usr/bin/python3 gen_mha_functional_ref.py > ../tests/ref/mha_functional.lua
"""
import math

import torch
import torch.nn.functional as F
from reflua import filled, lua_value, print_cases, weighted_sum

torch.set_default_dtype(torch.float64)

SHAPES = [("query", (4, 2, 6)), ("key", (5, 2, 4)), ("value", (5, 2, 3)), ("q_proj_weight", (6, 6)),
          ("k_proj_weight", (6, 4)), ("v_proj_weight", (6, 3)), ("in_proj_bias", (18,)), ("bias_k", (1, 1, 6)),
          ("bias_v", (1, 1, 6)), ("out_proj_weight", (6, 6)), ("out_proj_bias", (6,)), ("attn_mask", (4, 5))]
t = {name: filled(shape, lambda k, i=i: 0.4 * math.sin(1 + 0.7 * k + i)).requires_grad_(name != "attn_mask")
     for i, (name, shape) in enumerate(SHAPES)}
kpm = torch.tensor([[False] * 5, [False] * 4 + [True]])
out, w = F.multi_head_attention_forward(
    t["query"], t["key"], t["value"], 6, 2, None, t["in_proj_bias"], t["bias_k"], t["bias_v"], False, 0.0,
    t["out_proj_weight"], t["out_proj_bias"], training=True, key_padding_mask=kpm, need_weights=True,
    attn_mask=t["attn_mask"], use_separate_proj_weight=True, q_proj_weight=t["q_proj_weight"],
    k_proj_weight=t["k_proj_weight"], v_proj_weight=t["v_proj_weight"], average_attn_weights=False)
(weighted_sum(out) + weighted_sum(w)).backward()
case = {"out": out.reshape(-1).tolist(), "weights": w.reshape(-1).tolist(), "weights_shape": list(w.shape)}
for name, _ in SHAPES:
    if t[name].grad is not None:
        case["d_" + name] = t[name].grad.reshape(-1).tolist()
print_cases("gen_mha_functional_ref.py", {"separate": case}, lua_value)
