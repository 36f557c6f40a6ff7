# PyTorch's side of scripts/bench/ddp_seed: the seed step under DDP on the
# GPU of this rank (NCCL), printed as "ddp_seed us_per_step" by rank 0.
import os
import time
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim

from models import SimpleNN  # scripts/bench/models.py


dist.init_process_group("nccl")
local_rank = int(os.environ.get("LOCAL_RANK", 0))
device = torch.device(f"cuda:{local_rank}")
torch.cuda.set_device(device)
model = nn.parallel.DistributedDataParallel(SimpleNN().to(device))
criterion = nn.CrossEntropyLoss()
optimizer = optim.SGD(model.parameters(), lr=0.01)
x = torch.rand(32, 10).to(device)
y = torch.randint(0, 2, (32,)).to(device)


def step():
    optimizer.zero_grad()
    criterion(model(x), y).backward()
    optimizer.step()


for _ in range(200):
    step()
torch.cuda.synchronize()
steps, best = 2000, float("inf")
for _ in range(5):
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    best = min(best, (time.perf_counter() - t0) / steps)
if dist.get_rank() == 0:
    print(f"ddp_seed {best * 1e6:.2f}", flush=True)
dist.destroy_process_group()
