#!/usr/bin/python3
"""Writes the reference of a small GPT's training for
tests/lua/test_gpt_train.lua and tests/gpu/test_cuda_gpt_train.lua:

  tests/ref/gpt_small.safetensors  the initial weights (float32), under the
      names of examples/gpt2/model.lua's GPT (lm_head.weight, tied to
      wte.weight, written under both names as PyTorch's state dict has it)
  tests/ref/gpt_small.lua          the configuration, the optimizer's
      settings, 20 batches of token ids (B, T + 1), and per step the loss
      and the gradient norm that clip_grad_norm_ returned

    /usr/bin/python3 scripts/gen_gpt_ref.py

The model is nanoGPT's GPT-2 (2 layers, width 64, 4 heads, a vocabulary of
101, context 32, dropout 0), initialised as GPT-2 is (normal(0, 0.02), the
residual projections c_proj by 1/sqrt(2 * n_layer), biases zero), trained
in float32 with AdamW (betas 0.9/0.95, weight decay 0.1 on the matrices
only, none on biases and LayerNorm) and clip_grad_norm_(1.0). torch 1.13
has no F.scaled_dot_product_attention: the attention is its documented
math (causal mask, softmax, product with v). The batches come from a
fixed random Markov chain over the vocabulary, so that the loss falls.
The safetensors file is written by scripts/gen_safetensors_ref.py's
writer. Deterministic: two runs write the same bytes.
"""
import math
import os
import sys
from collections import OrderedDict

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_safetensors_ref import save_file  # noqa: E402

CONFIG = dict(block_size=32, vocab_size=101, n_layer=2, n_head=4, n_embd=64)
B, STEPS = 4, 20
LR, WEIGHT_DECAY, BETAS = 3e-3, 0.1, (0.9, 0.95)


class CausalSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_attn = nn.Linear(c["n_embd"], 3 * c["n_embd"])
        self.c_proj = nn.Linear(c["n_embd"], c["n_embd"])
        self.n_head = c["n_head"]

    def forward(self, x):
        Bn, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(Bn, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        y = att.softmax(dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(Bn, T, C))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c["n_embd"])
        self.attn = CausalSelfAttention(c)
        self.ln_2 = nn.LayerNorm(c["n_embd"])
        self.mlp = nn.Sequential(OrderedDict([
            ("c_fc", nn.Linear(c["n_embd"], 4 * c["n_embd"])),
            ("gelu", nn.GELU(approximate="tanh")),
            ("c_proj", nn.Linear(4 * c["n_embd"], c["n_embd"])),
        ]))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte = nn.Embedding(c["vocab_size"], c["n_embd"])
        self.wpe = nn.Embedding(c["block_size"], c["n_embd"])
        self.blocks = nn.ModuleList([Block(c) for _ in range(c["n_layer"])])
        self.ln_f = nn.LayerNorm(c["n_embd"])
        self.lm_head = nn.Linear(c["n_embd"], c["vocab_size"], bias=False)
        self.lm_head.weight = self.wte.weight
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("c_proj.weight"):
                    p.normal_(0.0, 0.02 / math.sqrt(2 * c["n_layer"]))
                elif name.endswith(".bias"):
                    p.zero_()
                elif p.dim() == 2:
                    p.normal_(0.0, 0.02)

    def forward(self, idx, targets):
        T = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for blk in self.blocks:
            x = blk(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)


def batches(gen):
    """STEPS batches of (B, T + 1) ids from a random chain: each token has 3 likely successors."""
    V, T = CONFIG["vocab_size"], CONFIG["block_size"]
    succ = torch.randint(0, V, (V, 3), generator=gen)
    out = []
    for _ in range(STEPS):
        seq = torch.empty(B, T + 1, dtype=torch.int64)
        seq[:, 0] = torch.randint(0, V, (B,), generator=gen)
        for t in range(1, T + 1):
            pick = torch.randint(0, 3, (B,), generator=gen)
            seq[:, t] = succ[seq[:, t - 1], pick]
        out.append(seq)
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ref_dir = os.path.join(here, "..", "tests", "ref")
    torch.manual_seed(20261206)
    model = GPT(CONFIG)
    sd = OrderedDict((k, v.detach().clone()) for k, v in model.state_dict().items())
    save_file(sd, os.path.join(ref_dir, "gpt_small.safetensors"))
    data = batches(torch.Generator().manual_seed(7))
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                             {"params": no_decay, "weight_decay": 0.0}], lr=LR, betas=BETAS)
    losses, norms = [], []
    for seq in data:
        opt.zero_grad(set_to_none=True)
        loss = model(seq[:, :-1], seq[:, 1:])
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item())
        opt.step()
        losses.append(loss.item())

    def nums(xs):
        return ", ".join("%.9g" % x for x in xs)

    with open(os.path.join(ref_dir, "gpt_small.lua"), "w") as f:
        f.write("-- generated by scripts/gen_gpt_ref.py with torch %s; do not edit\n" % torch.__version__)
        f.write("return {\n")
        f.write("  config = {%s},\n" % ", ".join("%s = %d" % (k, CONFIG[k]) for k in sorted(CONFIG)))
        f.write("  lr = %.17g, weight_decay = %.17g, betas = {%.17g, %.17g}, clip = 1.0,\n"
                % (LR, WEIGHT_DECAY, BETAS[0], BETAS[1]))
        f.write("  batches = {\n")
        for seq in data:
            f.write("    {shape = {%d, %d}, %s},\n" % (seq.size(0), seq.size(1), ", ".join(map(str, seq.flatten().tolist()))))
        f.write("  },\n")
        f.write("  losses = {%s},\n" % nums(losses))
        f.write("  norms = {%s},\n" % nums(norms))
        f.write("}\n")
    print("losses:", nums(losses))


if __name__ == "__main__":
    main()
