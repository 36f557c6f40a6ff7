# PyTorch's side of scripts/bench/gpu_parts: the same calls as
# gpu_parts.lua, timed the same way, printed as "name value" lines.
import sys
import time

import torch
import torch.nn.functional as F
from timing import gpu_ms, host_us, row

if not torch.cuda.is_available():
    print("no_gpu", flush=True)
    sys.exit(0)
print(f"version PyTorch {torch.__version__} on {torch.cuda.get_device_name()}", flush=True)
d = "cuda"


a, b = torch.rand(32, 10, device=d), torch.rand(32, 10, device=d)
w, bias = torch.rand(10, 10, device=d), torch.rand(10, device=d)
y = torch.randint(0, 2, (32,), device=d)
xm = torch.rand(256, 256, device=d)
row("empty", lambda: host_us(lambda: torch.empty(32, 10, device=d)))
row("add", lambda: host_us(lambda: a + b))
row("relu", lambda: host_us(lambda: a.relu()))
row("add_", lambda: host_us(lambda: a.add_(b)))
row("linear_small", lambda: host_us(lambda: F.linear(a, w, bias)))
row("mm_256", lambda: host_us(lambda: xm.mm(xm)))
row("cross_entropy", lambda: host_us(lambda: F.cross_entropy(a, y)))

def replay_us(k):
    x, one = torch.zeros(1, device=d), torch.ones(1, device=d)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3 * k):
            x.add_(one)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(k):
            x.add_(one)
    for _ in range(50):
        g.replay()
    torch.cuda.synchronize()
    n, t = 2000, time.perf_counter()
    for _ in range(n):
        g.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


row("graph_1", lambda: replay_us(1))
row("graph_16", lambda: replay_us(16) / 16)

N = 8192
x8 = torch.rand(N, N, device=d, dtype=torch.bfloat16)
w8 = torch.rand(N, N, device=d, dtype=torch.bfloat16)
row("big_mm", lambda: gpu_ms(lambda: x8.mm(w8)))
row("big_linear", lambda: gpu_ms(lambda: F.linear(x8, w8)))
row("big_relu", lambda: gpu_ms(lambda: x8.relu()))
row("big_mean", lambda: gpu_ms(lambda: x8.mean()))
row("big_sum_float", lambda: gpu_ms(lambda: x8.float().sum()))
