# scripts/bench/gpt2.py: gpt2.lua's GPT-2 124M step on PyTorch: nanoGPT's
# model (F.scaled_dot_product_attention, its flash kernel here), bf16
# autocast, fused AdamW, clip_grad_norm_(1.0); eager, or under
# torch.compile with "compile" (a compile that fails prints its error on
# every row).
#   python3 scripts/bench/gpt2.py eager|compile [B [STEPS]]
# With "ddp", one process per rank (launch_torch.sh's env://): the eager
# step under DistributedDataParallel, one rank per GPU (cuda:LOCAL_RANK,
# NCCL), batch B on every rank; only rank 0 prints, as gpt2.lua's "ddp"
# (the slowest rank's ms, tokens/s over all ranks, MFU over all GPUs, the
# largest rank's max_memory_allocated). With "fsdp", the same under
# FullyShardedDataParallel, each Block a unit (FULL_SHARD, PyTorch's
# defaults: activations kept, no recomputation); "fsdp_grad_op" with
# ShardingStrategy.SHARD_GRAD_OP.
# DPLUA_BENCH_TINY=1: gpt2.lua's tiny model on the CPU (Gloo for "ddp").
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

TINY = os.environ.get("DPLUA_BENCH_TINY") == "1"
if not TINY and not torch.cuda.is_available():
    print("no_gpu", flush=True)
    raise SystemExit(0)

MODE = sys.argv[1] if len(sys.argv) > 1 else "eager"
FSDP_MODES = ("fsdp", "fsdp_grad_op")
if MODE not in ("eager", "compile", "ddp") + FSDP_MODES:
    sys.exit(f"gpt2.py: the mode is eager, compile, ddp, fsdp or fsdp_grad_op, got {MODE!r}")
DIST = MODE == "ddp" or MODE in FSDP_MODES
B = int(sys.argv[2]) if len(sys.argv) > 2 else 8
STEPS = int(sys.argv[3]) if len(sys.argv) > 3 else 20
T, V, L, H, C = (64, 512, 2, 4, 64) if TINY else (1024, 50304, 12, 12, 768)
N_TOKENS = 512 if TINY else 50257
DEVICE_TYPE = "cpu" if TINY else "cuda"
PEAK_BF16_TFLOPS = (("H100 PCIe", 756), ("H100 NVL", 835), ("H100", 989), ("H200", 989), ("A100", 312))
# only rank 0's lines reach the table
RANK = int(os.environ.get("RANK", "0")) if DIST else 0
WORLD = int(os.environ.get("WORLD_SIZE", "1")) if DIST else 1
NAME = "cpu" if TINY else torch.cuda.get_device_name(0)  # rank 0's GPU: its bf16 peak is MFU's denominator


def say(line):
    if RANK == 0:
        print(line, flush=True)


ranks = f", {WORLD} ranks ({'gloo' if TINY else 'nccl'})" if DIST else ""
say(f"version PyTorch {torch.__version__} ({MODE}{ranks}) on {NAME}")


def causal_attention(q, k, v):
    """F.scaled_dot_product_attention(q, k, v, is_causal=True), or its
    arithmetic where PyTorch has none (before 2.0: Debian's 1.13, which
    runs the tiny check)."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    t = q.size(-2)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    att = att.masked_fill(torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return F.softmax(att, dim=-1) @ v


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (z.view(b, t, H, c // H).transpose(1, 2) for z in (q, k, v))
        y = causal_attention(q, k, v)
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
    device = torch.device(DEVICE_TYPE)
    if DIST:
        global RANK, WORLD
        from dist_setup import init  # scripts/bench/dist_setup.py
        _, device, _ = init(cpu=TINY)
        RANK, WORLD = dist.get_rank(), dist.get_world_size()
    gpu = device.type == "cuda"

    def sync():
        if gpu:
            torch.cuda.synchronize()

    def max_over_ranks(v):  # the largest of the ranks' values (one rank: its own)
        if not DIST:
            return v
        t = torch.tensor([v], dtype=torch.float64, device=device)
        dist.all_reduce(t, dist.ReduceOp.MAX)
        return t.item()

    torch.manual_seed(0)
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    model = GPT().to(device)
    n = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
    fused = {"fused": True} if gpu else {}  # PyTorch 1.13's AdamW has no fused, nor 2.x's on the CPU before 2.4
    clip = lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    if MODE in FSDP_MODES:
        from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
        try:
            from torch.distributed.fsdp.wrap import ModuleWrapPolicy
            policy = ModuleWrapPolicy({Block})
        except ImportError:  # before 2.1
            import functools
            from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
            policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})
        strategy = ShardingStrategy.SHARD_GRAD_OP if MODE == "fsdp_grad_op" else ShardingStrategy.FULL_SHARD
        run = FullyShardedDataParallel(model, auto_wrap_policy=policy, device_id=device if gpu else None,
                                       sharding_strategy=strategy)
        opt = torch.optim.AdamW(run.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, **fused)
        clip = lambda: run.clip_grad_norm_(1.0)
    else:
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                lr=6e-4, betas=(0.9, 0.95), **fused)
    if MODE == "ddp":
        run = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if gpu else None)
    elif MODE not in FSDP_MODES:
        run = torch.compile(model) if MODE == "compile" else model
    if DIST:
        torch.manual_seed(1 + RANK)  # a batch of its own on every rank
    x = torch.randint(0, N_TOKENS, (B, T), device=device)
    y = torch.randint(0, N_TOKENS, (B, T), device=device)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(DEVICE_TYPE, dtype=torch.bfloat16):
            loss = run(x, y)
        loss.backward()
        clip()
        opt.step()

    for _ in range(3):
        step()
    sync()
    if DIST:
        dist.barrier()
    t0 = time.perf_counter()
    for _ in range(STEPS):
        step()
    sync()
    s = max_over_ranks((time.perf_counter() - t0) / STEPS)
    tok_s = WORLD * B * T / s
    say(f"ms {s * 1000:.3f}")
    say(f"tok_s {tok_s:.1f}")
    peak = next((v for k, v in PEAK_BF16_TFLOPS if k in NAME), None)
    if peak:
        say(f"mfu {100 * (6 * n + 12 * L * T * C) * tok_s / (WORLD * peak * 1e12):.2f}")
    else:
        say(f"mfu error: unknown bf16 peak for {NAME}")
    if gpu:
        say(f"mem_mib {max_over_ranks(torch.cuda.max_memory_allocated()) / 2**20:.1f}")
    else:
        say("mem_mib error: no max_memory_allocated on the CPU (DPLUA_BENCH_TINY)")


try:
    main()
except Exception as e:  # every row says why (a compile that fails, an out-of-memory)
    msg = " | ".join(f"{type(e).__name__}: {e}".split("\n"))[:300]
    if RANK == 0:
        for row in ("ms", "tok_s", "mfu", "mem_mib"):
            print(f"{row} error: {msg}", flush=True)
    else:
        print(f"gpt2.py: rank {RANK}: {msg}", file=sys.stderr, flush=True)
if DIST and dist.is_initialized():
    dist.destroy_process_group()
