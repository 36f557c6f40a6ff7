#!/usr/bin/python3
"""Writes tests/ref/layers.lua: PyTorch's outputs and gradients of GLU,
Softmin, Softmax2d, PReLU, RMSNorm, InstanceNorm (with its running
statistics), LocalResponseNorm, LPPool, Bilinear, ChannelShuffle, the
Upsampling modules, EmbeddingBag, pdist, grid_sample and affine_grid, for tests/lua/test_layers.lua,
in float64. Each case builds its module from the generator's arguments
(rebuilt by name in the test), loads `params` into it, and feeds inputs
filled with sin(1 + 0.37 k) * 2 (the i-th input shifted by i); the
gradients are those of sum(output * cos(k)).
    cd scripts && /usr/bin/python3 gen_layers_ref.py > ../tests/ref/layers.lua
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from reflua import filled, lua, print_cases

torch.set_default_dtype(torch.float64)


def inputs(*shapes):
    return [filled(s, lambda k, i=i: math.sin(1 + 0.37 * k + i) * 2).requires_grad_() for i, s in enumerate(shapes)]


class RMSNorm(nn.Module):
    """torch.nn.RMSNorm (PyTorch 2.4; the torch here predates it): its
    documented formula, x / sqrt(mean(x^2 over the normalized dims) + eps) *
    weight, eps None meaning torch.finfo(x.dtype).eps."""

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True):
        super().__init__()
        self.shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(self.shape)) if elementwise_affine else None

    def forward(self, x):
        dims = tuple(range(-len(self.shape), 0))
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
        y = x * torch.rsqrt(x.pow(2).mean(dims, keepdim=True) + eps)
        return y * self.weight if self.weight is not None else y


def fill_params(m):
    with torch.no_grad():
        for i, (_, p) in enumerate(sorted(m.named_parameters())):
            p.copy_(filled(tuple(p.shape), lambda k, i=i: math.cos(2 + 0.7 * k + i)))


CASES = {
    # name: (module, input shapes, extra positional inputs that take no gradient)
    "glu": (nn.GLU(1), [(2, 6, 3)]),
    "glu_last": (nn.GLU(), [(3, 4)]),
    "softmin": (nn.Softmin(1), [(3, 5)]),
    "softmax2d": (nn.Softmax2d(), [(2, 3, 2, 2)]),
    "prelu_one": (nn.PReLU(), [(2, 3, 4)]),
    "prelu_channels": (nn.PReLU(3), [(2, 3, 4)]),
    "rms_norm": (RMSNorm([4]), [(2, 3, 4)]),
    "rms_norm_two_dims_eps": (RMSNorm([3, 4], eps=1e-3), [(2, 3, 4)]),
    "rms_norm_no_affine": (RMSNorm(5, elementwise_affine=False), [(3, 5)]),
    "instance_norm": (nn.InstanceNorm2d(3), [(2, 3, 4, 5)]),
    "instance_norm_affine": (nn.InstanceNorm1d(3, affine=True), [(2, 3, 6)]),
    "instance_norm_running": (nn.InstanceNorm2d(3, track_running_stats=True, momentum=0.3), [(2, 3, 3, 4)]),
    "local_response_norm": (nn.LocalResponseNorm(3), [(2, 5, 3, 4)]),
    "local_response_norm_3d": (nn.LocalResponseNorm(2, alpha=0.01, beta=0.5, k=2.0), [(2, 4, 5)]),
    "lp_pool2d": (nn.LPPool2d(2, 2), [(2, 3, 4, 6)]),
    "lp_pool1d_p4_stride": (nn.LPPool1d(4, 3, stride=2), [(2, 3, 9)]),
    "bilinear": (nn.Bilinear(3, 2, 4), [(5, 3), (5, 2)]),
    "bilinear_no_bias": (nn.Bilinear(2, 3, 2, bias=False), [(2, 3, 2), (2, 3, 3)]),
    "channel_shuffle": (nn.ChannelShuffle(3), [(2, 6, 2, 2)]),
    "upsampling_nearest": (nn.UpsamplingNearest2d(scale_factor=2), [(1, 2, 3, 4)]),
    "upsampling_bilinear": (nn.UpsamplingBilinear2d(size=(5, 7)), [(1, 2, 3, 4)]),
}
BAGS = {
    # name: (mode, input, offsets, per_sample_weights, padding_idx, include_last_offset)
    "bag_mean_offsets": ("mean", [1, 2, 4, 5, 4, 3, 2, 9], [0, 4, 4], None, None, False),
    "bag_sum_2d_weights": ("sum", [[1, 2, 0], [4, 3, 2]], None, [[0.5, 1.0, 2.0], [-1.0, 0.25, 3.0]], None, False),
    "bag_max": ("max", [1, 2, 4, 5, 4, 3, 2, 9], [0, 3, 5, 8], None, None, True),
    "bag_mean_padding": ("mean", [[1, 0, 4], [0, 0, 2]], None, None, 0, False),
}

NO_DERIVATIVE = {"channel_shuffle"}   # this torch has no derivative for it: values only

cases = {}
for name, (m, shapes) in CASES.items():
    fill_params(m)
    m.train()
    xs = inputs(*shapes)
    if name in NO_DERIVATIVE:
        y = m(*[x.detach() for x in xs])
        cases[name] = {"y": y.reshape(-1).tolist(), "shape": list(y.shape)}
        continue
    y = m(*xs)
    w = torch.cos(torch.arange(y.numel(), dtype=torch.float64)).reshape(y.shape)
    (y * w).sum().backward()
    c = {"y": y.detach().reshape(-1).tolist(), "shape": list(y.shape)}
    for i, x in enumerate(xs):
        c["dx%d" % (i + 1)] = x.grad.reshape(-1).tolist()
    for k, p in m.named_parameters():
        c["d_" + k] = p.grad.reshape(-1).tolist()
    for k, b in m.named_buffers():
        if b.dtype == torch.float64:
            c["buffer_" + k] = b.reshape(-1).tolist()
    cases[name] = c

for name, (mode, idx, offsets, psw, padding_idx, last) in BAGS.items():
    m = nn.EmbeddingBag(10, 3, mode=mode, padding_idx=padding_idx, include_last_offset=last)
    fill_params(m)
    if padding_idx is not None:
        with torch.no_grad():
            m.weight[padding_idx].zero_()
    w_in = torch.tensor(psw) if psw is not None else None
    y = m(torch.tensor(idx), torch.tensor(offsets) if offsets is not None else None, per_sample_weights=w_in)
    w = torch.cos(torch.arange(y.numel(), dtype=torch.float64)).reshape(y.shape)
    (y * w).sum().backward()
    cases[name] = {"y": y.detach().reshape(-1).tolist(), "shape": list(y.shape),
                   "d_weight": m.weight.grad.reshape(-1).tolist()}

# grid_sample over a 2x2x3x4 input at a grid reaching past [-1, 1], and
# affine_grid; the gradients of the input, the grid and theta
GRIDS = {
    "grid_bilinear_zeros": ("bilinear", "zeros", False),
    "grid_bilinear_border_align": ("bilinear", "border", True),
    "grid_bilinear_reflection": ("bilinear", "reflection", False),
    "grid_bilinear_reflection_align": ("bilinear", "reflection", True),
    "grid_nearest_zeros": ("nearest", "zeros", False),
    "grid_nearest_border_align": ("nearest", "border", True),
}
for name, (mode, pad, align) in GRIDS.items():
    x, = inputs((2, 2, 3, 4))
    grid = filled((2, 5, 3, 2), lambda k: 1.3 * math.sin(0.7 + 1.9 * k)).requires_grad_()
    y = F.grid_sample(x, grid, mode=mode, padding_mode=pad, align_corners=align)
    (y * torch.cos(torch.arange(y.numel(), dtype=torch.float64)).reshape(y.shape)).sum().backward()
    cases[name] = {"y": y.detach().reshape(-1).tolist(), "shape": list(y.shape), "dx1": x.grad.reshape(-1).tolist(),
                   "dgrid": grid.grad.reshape(-1).tolist()}
for align in (False, True):
    theta = filled((2, 2, 3), lambda k: math.cos(0.3 + 1.1 * k)).requires_grad_()
    g = F.affine_grid(theta, (2, 3, 4, 5), align_corners=align)
    (g * torch.cos(torch.arange(g.numel(), dtype=torch.float64)).reshape(g.shape)).sum().backward()
    cases["affine_grid" + ("_align" if align else "")] = {
        "y": g.detach().reshape(-1).tolist(), "shape": list(g.shape), "dtheta": theta.grad.reshape(-1).tolist()}

x, = inputs((5, 3))
y = F.pdist(x, 1.5)
(y * torch.cos(torch.arange(y.numel(), dtype=torch.float64))).sum().backward()
cases["pdist"] = {"y": y.detach().tolist(), "shape": list(y.shape), "dx1": x.grad.reshape(-1).tolist()}
print_cases("gen_layers_ref.py", cases, lua)
