# PyTorch's side of scripts/bench/allreduce: the same sizes, timed the same
# way as allreduce.lua; rank 0 prints "allreduce BYTES US" lines.
import sys
import time

import torch
import torch.distributed as dist

from dist_setup import init  # scripts/bench/dist_setup.py

gpu, device, sync = init()

largest = int(float(sys.argv[1])) if len(sys.argv) > 1 else (2**30 if gpu else 2**24)
sizes = [8, 64, 512, 4096, 32768, 262144, 1048576, 4194304, 16777216, 67108864, 268435456, 1073741824]
for nbytes in sizes:
    if nbytes > largest:
        break
    x = torch.ones(nbytes // 4, device=device)
    for _ in range(5):
        dist.all_reduce(x)
    sync()
    dist.barrier()
    t0 = time.perf_counter()
    dist.all_reduce(x)
    sync()
    # every rank must make the same number of calls: the slowest rank's
    once = torch.tensor([max(time.perf_counter() - t0, 1e-6)], dtype=torch.float64)
    dist.all_reduce(once, dist.ReduceOp.MAX)
    calls = max(5, min(1000, int(0.2 / once.item())))
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(calls):
        dist.all_reduce(x)
    sync()
    us = (time.perf_counter() - t0) / calls * 1e6
    if dist.get_rank() == 0:
        print(f"allreduce {nbytes} {us:.2f}", flush=True)
    del x
dist.destroy_process_group()
