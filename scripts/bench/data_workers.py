# scripts/bench/data_workers.py: data_workers.lua's measurements on
# PyTorch's DataLoader (worker processes forked, as on Linux by default).
import math
import time

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info
from timing import row

torch.set_num_threads(1)
N, B = 4096, 64
base = torch.linspace(-1, 1, 128 * 128).view(128, 128)


def sample(i):
    x = base + i / N
    return torch.tanh(x.mm(x) / 128).sum(0), i % 10


class Map(Dataset):
    def __len__(self):
        return N

    def __getitem__(self, i):
        return sample(i)


class Stream(IterableDataset):
    def __iter__(self):
        info, lo, hi = get_worker_info(), 0, N
        if info is not None:
            per = math.ceil(N / info.num_workers)
            lo, hi = info.id * per, min(info.id * per + per, N)
        return (sample(i) for i in range(lo, hi))


def pass_s(dataset, workers):
    loader = DataLoader(dataset, batch_size=B, num_workers=workers)
    best = math.inf
    for rnd in range(4):
        t, n = time.perf_counter(), 0
        for x, _ in loader:
            n += x.size(0)
        assert n == N, f"a pass saw {n} samples"
        if rnd > 0:
            best = min(best, (time.perf_counter() - t) * 1000)
    return best


print(f"version PyTorch {torch.__version__}", flush=True)
for w in (0, 2):
    row(f"map_w{w}", lambda: pass_s(Map(), w), 1)
    row(f"stream_w{w}", lambda: pass_s(Stream(), w), 1)
