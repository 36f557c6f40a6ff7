# PyTorch's side of scripts/bench/ddp_memory: the same model, optimizer and
# steps as ddp_memory.lua under DistributedDataParallel (ddp) and
# ZeroRedundancyOptimizer (zero1); every rank prints
# "ddp_memory torch MODE RANKS RANK STATE_BYTES GRAD_BYTES" (state: the
# local optimizer's state tensors; gradients: every parameter's .grad).
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.optim import ZeroRedundancyOptimizer

from dist_setup import init  # scripts/bench/dist_setup.py

mode = sys.argv[1] if len(sys.argv) > 1 else "ddp"
if mode not in ("ddp", "zero1"):
    sys.exit(f"ddp_memory: PyTorch's side runs ddp or zero1, got {mode!r}")
init()
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 1024))
ddp = nn.parallel.DistributedDataParallel(model)
if mode == "ddp":
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    local = opt
else:
    opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
    local = opt.optim
x = torch.randn(32, 1024)
for _ in range(2):
    opt.zero_grad(set_to_none=False)
    ddp(x).square().mean().backward()
    opt.step()


def nbytes(t):
    return t.numel() * t.element_size()


state = sum(nbytes(v) for s in local.state.values() for v in s.values() if torch.is_tensor(v))
grads = sum(nbytes(p.grad) for p in ddp.parameters() if p.grad is not None)
print(f"ddp_memory torch {mode} {world} {rank} {state} {grads}", flush=True)
dist.destroy_process_group()
