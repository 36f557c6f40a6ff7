# scripts/bench/gpt2.py: gpt2.lua's GPT-2 124M step on PyTorch: nanoGPT's
# model (F.scaled_dot_product_attention, its flash kernel here), bf16
# autocast, fused AdamW, clip_grad_norm_(1.0); eager, or under
# torch.compile with "compile" (a compile that fails prints its error on
# every row).
#   python3 scripts/bench/gpt2.py eager|compile [B [STEPS]]
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

if not torch.cuda.is_available():
    print("no_gpu", flush=True)
    raise SystemExit(0)

MODE = sys.argv[1] if len(sys.argv) > 1 else "eager"
B = int(sys.argv[2]) if len(sys.argv) > 2 else 8
STEPS = int(sys.argv[3]) if len(sys.argv) > 3 else 20
T, V, L, H, C = 1024, 50304, 12, 12, 768
PEAK_BF16_TFLOPS = (("H100 PCIe", 756), ("H100 NVL", 835), ("H100", 989), ("H200", 989), ("A100", 312))
NAME = torch.cuda.get_device_name()
print(f"version PyTorch {torch.__version__} ({MODE}) on {NAME}", flush=True)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (z.view(b, t, H, c // H).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(C), Attention(), nn.LayerNorm(C)
        self.mlp = nn.Sequential(nn.Linear(C, 4 * C), nn.GELU(approximate="tanh"), nn.Linear(4 * C, C))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.blocks = nn.ModuleList([Block() for _ in range(L)])
        self.ln_f = nn.LayerNorm(C)
        self.lm_head = nn.Linear(C, V, bias=False)
        self.lm_head.weight = self.wte.weight
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * L))
            elif name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, V), targets.view(-1))


def main():
    torch.manual_seed(0)
    torch.cuda.reset_peak_memory_stats()
    model = GPT().cuda()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), fused=True)
    run = torch.compile(model) if MODE == "compile" else model
    x = torch.randint(0, 50257, (B, T), device="cuda")
    y = torch.randint(0, 50257, (B, T), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = run(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(STEPS):
        step()
    torch.cuda.synchronize()
    s = (time.perf_counter() - t0) / STEPS
    tok_s = B * T / s
    n = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
    print(f"ms {s * 1000:.3f}")
    print(f"tok_s {tok_s:.1f}")
    peak = next((v for k, v in PEAK_BF16_TFLOPS if k in NAME), None)
    if peak:
        print(f"mfu {100 * (6 * n + 12 * L * T * C) * tok_s / (peak * 1e12):.2f}")
    else:
        print(f"mfu error: unknown bf16 peak for {NAME}")
    print(f"mem_mib {torch.cuda.max_memory_allocated() / 2**20:.1f}")


try:
    main()
except Exception as e:  # every row says why (a compile that fails, an out-of-memory)
    msg = " | ".join(f"{type(e).__name__}: {e}".split("\n"))[:300]
    for row in ("ms", "tok_s", "mfu", "mem_mib"):
        print(f"{row} error: {msg}", flush=True)
