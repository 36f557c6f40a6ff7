# PyTorch's side of scripts/bench/ddp_scaling: the same models, batches,
# steps and timing as ddp_scaling.lua; rank 0 prints
# "ddp_scaling MODEL RANKS SAMPLES_PER_S_PER_RANK".
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim

from dist_setup import init  # scripts/bench/dist_setup.py

which = sys.argv[1] if len(sys.argv) > 1 else "mlp"
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 50
if which not in ("big", "mlp") or steps < 1:
    sys.exit(f"ddp_scaling: the model is 'big' or 'mlp' and steps at least 1, got {which!r}, {steps}")
gpu, device, sync = init()

torch.manual_seed(0)
if which == "big":
    N = batch = 8192
    model = nn.Sequential(nn.Linear(N, N, bias=False), nn.ReLU(), nn.Linear(N, N, bias=False), nn.ReLU(),
                          nn.Linear(N, N, bias=False), nn.ReLU(), nn.Linear(N, N, bias=False))
    model.to(device, torch.bfloat16)
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = optim.SGD(ddp.parameters(), lr=0.001)
    x = torch.rand(batch, N).to(device, torch.bfloat16)

    def step():
        opt.zero_grad()
        ddp(x).square().mean().backward()
        opt.step()
else:
    batch = 128
    model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10)).to(device)
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = optim.Adam(ddp.parameters(), lr=1e-3)
    crit = nn.CrossEntropyLoss()
    x, y = torch.rand(batch, 784).to(device), torch.randint(0, 10, (batch,)).to(device)

    def step():
        opt.zero_grad()
        crit(ddp(x), y).backward()
        opt.step()

for _ in range(max(3, steps // 10)):
    step()
sync()
dist.barrier()
t0 = time.perf_counter()
for _ in range(steps):
    step()
sync()
t = time.perf_counter() - t0
if dist.get_rank() == 0:
    print(f"ddp_scaling {which} {dist.get_world_size()} {batch * steps / t:.2f}", flush=True)
dist.destroy_process_group()
