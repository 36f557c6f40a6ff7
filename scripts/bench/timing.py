# scripts/bench/timing.py: what the PyTorch sides of the benches share,
# timed as timing.lua times dplua's (see there).
import gc
import time

import torch


def row(name, f, digits=2):
    try:
        print(f"{name} {f():.{digits}f}", flush=True)
    except Exception as e:  # a failed row says why and the others go on
        msg = " | ".join(f"{type(e).__name__}: {e}".split("\n"))
        print(f"{name} error: {msg[:300]}", flush=True)
    gc.collect()


def host_us(f):
    for _ in range(50):
        f()
    torch.cuda.synchronize()
    n, t = 2000, time.perf_counter()
    for _ in range(n):
        f()
    us = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return us


def gpu_ms(f, calls=5):
    for _ in range(calls):
        f()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(calls):
        f()
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) / calls


def cpu_ms(f, n):
    f()
    f()
    best = float("inf")
    for _ in range(5):
        t0 = time.process_time()
        for _ in range(n):
            f()
        best = min(best, (time.process_time() - t0) / n)
    return best * 1e3
