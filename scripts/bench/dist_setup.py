# What the PyTorch sides of the distributed benches share (as models.py):
# the process group on NCCL with this rank's GPU, or on Gloo on the CPU.
import os

import torch
import torch.distributed as dist


def init(cpu=False):
    """Joins the group; returns (gpu, device, sync), sync() waiting for the GPU.
    cpu=True keeps the ranks on the CPU (Gloo) where there is a GPU too."""
    gpu = torch.cuda.is_available() and not cpu
    dist.init_process_group("nccl" if gpu else "gloo")
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}") if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)

    def sync():
        if gpu:
            torch.cuda.synchronize()

    return gpu, device, sync
