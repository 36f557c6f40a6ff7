# PyTorch's side of scripts/bench/cnn_steps: the same rows as
# cnn_steps.lua, one thread, the process's CPU time, "name ms" lines.

import torch
import torch.nn.functional as F

from models import MnistCNN  # scripts/bench/models.py
from timing import cpu_ms as ms  # scripts/bench/timing.py

torch.set_num_threads(1)


def row(name, f, n):
    print(f"{name} {ms(f, n):.3f}", flush=True)


torch.manual_seed(0)
model = MnistCNN()
x, y = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
crit, opt = torch.nn.CrossEntropyLoss(), torch.optim.Adam(model.parameters(), lr=1e-3)


def step():
    opt.zero_grad()
    crit(model(x), y).backward()
    opt.step()


row("step", step, 5)


def conv_rows(name, C, O, H, input_grad):
    xi = torch.randn(64, C, H, H, requires_grad=input_grad)
    w = torch.randn(O, C, 3, 3, requires_grad=True)
    b = torch.randn(O, requires_grad=True)
    g = torch.randn(64, O, H - 2, H - 2)
    n = 20 if C == 1 else 3

    def fwdbwd():
        F.conv2d(xi, w, b).backward(g)
        w.grad = b.grad = xi.grad = None

    row(name + "_fwd", lambda: F.conv2d(xi, w, b), n)
    row(name + "_fwdbwd", fwdbwd, n)


conv_rows("conv1", 1, 32, 28, False)
conv_rows("conv2", 32, 64, 26, True)
