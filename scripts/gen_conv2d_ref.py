#!/usr/bin/python3
"""Writes tests/ref/conv2d.lua: PyTorch's F.conv2d outputs and the gradients
of the input, weight and bias (of the output weighted by cos of its flat
index) for tests/lua/test_conv2d.lua, in float64. Inputs are sin(1 + 0.3 k),
weights cos(2 + 0.7 k) and biases sin(3 + k) over flat indices k (rebuilt
in the test). The cases cover the CPU kernels' paths: the 3x3 of the
MNIST CNN, odd sizes, padding, stride, dilation, groups, 1x1 (read in
place), a batch of one, channels of odd counts and images whose columns
span several tiles; for the direct float32 path (src/cpu/conv_direct.c)
partial blocks of 16 channels in and out, several output blocks at once
(up to 4, and the rest), rows longer than a kernel's pixels, one input
channel, strides of 2 along rows or columns only, a 5x5 at stride 2 (the
input gradient's phases of 3 and 2 taps), padding past the kernel, a 1x1
at stride 2 on odd sizes (the rows and columns taken), and a batch large
enough to be shared among threads (kept as sums).
    /usr/bin/python3 scripts/gen_conv2d_ref.py > tests/ref/conv2d.lua
"""
import torch.nn.functional as F
from reflua import print_conv_cases

cases = {  # name: (input shape, weight shape, options)
    "plain": ((2, 3, 9, 9), (4, 3, 3, 3), {}),
    "odd_sizes": ((3, 5, 7, 11), (7, 5, 3, 2), {}),
    "padding": ((2, 3, 6, 5), (2, 3, 3, 3), {"padding": (2, 1)}),
    "stride2": ((2, 3, 11, 10), (5, 3, 3, 3), {"stride": 2, "padding": 1}),
    "stride_rect": ((1, 2, 9, 12), (3, 2, 2, 4), {"stride": (3, 2), "padding": (0, 3)}),
    "dilation": ((2, 2, 13, 12), (3, 2, 3, 3), {"dilation": (2, 3), "padding": 2}),
    "groups": ((2, 6, 8, 7), (9, 2, 3, 3), {"groups": 3, "padding": 1}),
    "depthwise": ((2, 4, 7, 7), (4, 1, 3, 3), {"groups": 4, "padding": 1, "stride": 2}),
    "one_by_one": ((2, 5, 6, 7), (3, 5, 1, 1), {}),
    "one_by_one_stride": ((2, 5, 7, 7), (3, 5, 1, 1), {"stride": 2}),
    "batch1": ((1, 3, 10, 8), (6, 3, 3, 3), {"padding": 1}),
    "no_bias": ((2, 3, 8, 8), (2, 3, 2, 2), {"bias": False}),
    "big_padding": ((1, 1, 3, 3), (2, 1, 3, 3), {"padding": 3}),
    "tiles": ((1, 30, 16, 16), (2, 30, 3, 3), {"padding": 1}),  # 15 of 16 output rows in a tile
    "blocks_wide": ((1, 17, 2, 30), (18, 17, 3, 1), {"padding": (1, 0)}),
    "out_blocks_s2": ((1, 3, 5, 9), (40, 3, 3, 3), {"stride": 2, "padding": 1}),
    "many_out": ((1, 2, 2, 9), (70, 2, 1, 1), {}),
    "many_in": ((1, 66, 2, 5), (2, 66, 1, 3), {"padding": (0, 1)}),
    "one_channel_s2": ((2, 1, 9, 8), (5, 1, 3, 3), {"stride": 2, "padding": 1, "bias": False}),
    "rows_stride": ((1, 4, 7, 8), (5, 4, 3, 2), {"stride": (2, 1), "padding": (1, 0)}),
    "cols_stride": ((1, 4, 6, 9), (3, 4, 2, 3), {"stride": (1, 2), "padding": (0, 1)}),
    "k5_s2": ((1, 3, 7, 9), (18, 3, 5, 5), {"stride": 2, "padding": 2}),
    "pad_past_kernel": ((1, 2, 4, 5), (3, 2, 3, 3), {"stride": 2, "padding": 3}),
    "one_by_one_s2_odd": ((1, 18, 3, 33), (17, 18, 1, 1), {"stride": 2, "bias": False}),
    "one_by_one_s2_even": ((1, 2, 3, 32), (3, 2, 1, 1), {"stride": 2}),
    "threads": ((4, 16, 24, 24), (32, 16, 3, 3), {"padding": 1, "sums": True}),
}

print_conv_cases('gen_conv2d_ref.py', F.conv2d, cases, lambda ws, o: ws[0])
