# PyTorch's side of scripts/bench/resnet_convs: the same rows as
# resnet_convs.lua, one thread, the process's CPU time, "name ms" lines.

import torch
import torch.nn.functional as F

from timing import cpu_ms, row  # scripts/bench/timing.py

torch.set_num_threads(1)

# name, input channels, output channels, input size (square), kernel,
# stride, padding, whether the input needs a gradient, calls per repeat
convs = [
    ("stem", 1, 16, 28, 3, 1, 1, False, 5),
    ("c3_16_16", 16, 16, 28, 3, 1, 1, True, 3),
    ("c3s2_16_32", 16, 32, 28, 3, 2, 1, True, 5),
    ("c1s2_16_32", 16, 32, 28, 1, 2, 0, True, 10),
    ("c3_32_32", 32, 32, 14, 3, 1, 1, True, 5),
    ("c3s2_32_64", 32, 64, 14, 3, 2, 1, True, 5),
    ("c1s2_32_64", 32, 64, 14, 1, 2, 0, True, 10),
    ("c3_64_64", 64, 64, 7, 3, 1, 1, True, 5),
]

torch.manual_seed(0)
for name, C, O, H, k, stride, pad, input_grad, n in convs:
    x = torch.randn(128, C, H, H, requires_grad=input_grad)
    w = torch.randn(O, C, k, k, requires_grad=True)
    g = torch.randn(F.conv2d(x, w, None, stride, pad).shape)
    for _ in range(10):  # as resnet_convs.lua does
        F.conv2d(x, w, None, stride, pad).backward(g)
        w.grad = x.grad = None

    def fwdbwd():
        F.conv2d(x, w, None, stride, pad).backward(g)
        w.grad = x.grad = None

    row(name + "_fwd", lambda: cpu_ms(lambda: F.conv2d(x, w, None, stride, pad), n), 3)
    row(name + "_fwdbwd", lambda: cpu_ms(fwdbwd, n), 3)
