# PyTorch's side of scripts/bench/cpu_steps: the same two steps as
# cpu_steps.lua, one thread, printed as "name us_per_step" lines.
import sys
import time
import torch
import torch.nn as nn
import torch.optim as optim

from models import SimpleNN, mlp  # scripts/bench/models.py

torch.set_num_threads(1)


def bench(name, model, batch, in_features, classes, steps):
    torch.manual_seed(0)
    x = torch.rand(batch, in_features)
    y = torch.randint(0, classes, (batch,))
    criterion = nn.CrossEntropyLoss()
    opt = optim.SGD(model.parameters(), lr=0.01)

    def step():
        opt.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        opt.step()

    for _ in range(max(10, steps // 10)):
        step()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        best = min(best, (time.perf_counter() - t0) / steps)
    print(f"{name} {best * 1e6:.2f}", flush=True)


which = sys.argv[1] if len(sys.argv) > 1 else "all"
if which in ("all", "seed"):
    bench("seed", SimpleNN(), 32, 10, 2, 2000)
if which in ("all", "mlp"):
    mlp = mlp()
    bench("mlp", mlp, 256, 784, 10, 100)
