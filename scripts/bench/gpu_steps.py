# PyTorch's side of scripts/bench/gpu_steps: the same steps as
# gpu_steps.lua (same shapes, seeds, step counts, timing), printed as
# "name value" lines, or "name error: message" when one fails; first a
# "version" line naming PyTorch and the GPU.
import sys
import time
import warnings

import torch
import torch.nn as nn
import torch.optim as optim

from models import MnistCNN, SimpleNN, mlp  # scripts/bench/models.py
from timing import row

warnings.filterwarnings("ignore")  # allow_tf32's deprecation notice, in newer PyTorch
dev = "cuda"

SMALL = dict(warm=100, probe=50, blocks=7, block_s=0.2, min=20, max=5000)
BIG = dict(warm=2, probe=1, blocks=5, block_s=0.3, min=1, max=20)


def measure(step, o):
    """Seconds per call of step(): warm up, time a few calls to choose how
    many make a block of about block_s, then the median of the timed
    blocks, each between two synchronize() calls."""
    for _ in range(o["warm"]):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(o["probe"]):
        step()
    torch.cuda.synchronize()
    per = (time.perf_counter() - t0) / o["probe"]
    n = max(o["min"], min(o["max"], int(o["block_s"] / per)))
    times = []
    for _ in range(o["blocks"]):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) / n)
    times.sort()
    return times[(len(times) + 1) // 2 - 1]


def setup(make, batch, in_features, classes, lr):
    """model on the GPU, SGD, cross-entropy, a fixed batch; step() is one
    whole training step (zero_grad, forward, loss, backward, step)"""
    torch.manual_seed(0)
    model = make().to(dev)
    x = torch.rand(batch, in_features).to(dev)
    y = torch.randint(0, classes, (batch,)).to(dev)
    criterion = nn.CrossEntropyLoss()
    opt = optim.SGD(model.parameters(), lr=lr)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = criterion(model(x), y)
        loss.backward()
        opt.step()

    return step


if not torch.cuda.is_available():
    print("no_gpu", flush=True)
    sys.exit(0)
print(f"version PyTorch {torch.__version__} on {torch.cuda.get_device_name()}", flush=True)
MiB = 1024 * 1024
mem = {}


def seed_eager():
    return measure(setup(SimpleNN, 32, 10, 2, 0.001), SMALL) * 1e6


def mlp_step():
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    t = measure(setup(mlp, 256, 784, 10, 0.01), SMALL)
    mem["peak"] = torch.cuda.max_memory_allocated()
    mem["step"] = mem["peak"] - base
    return t * 1e6


def cnn_step():
    """pytorch/examples' MNIST CNN, batch 64 (inputs 1 x 28 x 28)"""
    torch.manual_seed(0)
    model = MnistCNN().to(dev)
    x = torch.rand(64, 1, 28, 28).to(dev)
    y = torch.randint(0, 10, (64,)).to(dev)
    criterion = nn.CrossEntropyLoss()
    opt = optim.SGD(model.parameters(), lr=0.01)

    def step():
        opt.zero_grad(set_to_none=True)
        criterion(model(x), y).backward()
        opt.step()

    return measure(step, SMALL) * 1e6


row("seed_eager", seed_eager)
row("mlp", mlp_step)
row("cnn", cnn_step)
row("mlp_peak_mib", lambda: mem["peak"] / MiB)
row("mlp_step_mib", lambda: mem["step"] / MiB)

# 4 x Linear(8192, 8192, bias=False) with ReLU between, batch 8192, loss
# mean(out^2), SGD: 6 * batch * 8192^2 * 4 FLOPs per step (fwd + bwd).
N = 8192


def big(dtype, tf32):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(N, N, bias=False), nn.ReLU(), nn.Linear(N, N, bias=False), nn.ReLU(),
                              nn.Linear(N, N, bias=False), nn.ReLU(), nn.Linear(N, N, bias=False))
        model.to(dev, dtype)
        x = torch.rand(N, N).to(dev, dtype)
        opt = optim.SGD(model.parameters(), lr=0.001)

        def step():
            opt.zero_grad(set_to_none=True)
            loss = model(x).square().mean()
            loss.backward()
            opt.step()

        return 6 * N * N * N * 4 / measure(step, BIG) / 1e12
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False


row("big_bf16", lambda: big(torch.bfloat16, False))
row("big_tf32", lambda: big(torch.float32, True))
row("big_fp32", lambda: big(torch.float32, False))


def seed_graph():
    """The standard recipe: warm up on a side stream, capture one whole
    step (zero_grad(set_to_none=True) inside) on static tensors, replay."""
    step = setup(SimpleNN, 32, 10, 2, 0.001)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(20):
            step()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    return measure(g.replay, SMALL) * 1e6


row("seed_graph", seed_graph)
