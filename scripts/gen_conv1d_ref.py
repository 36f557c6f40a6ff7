#!/usr/bin/python3
"""Writes tests/ref/conv1d.lua: PyTorch's F.conv1d outputs and the gradients
of the input, weight and bias (of the output weighted by cos of its flat
index) for tests/lua/test_conv1d.lua, in float64. Inputs are sin(1 + 0.3 k),
weights cos(2 + 0.7 k) and biases sin(3 + k) over flat indices k (rebuilt
in the test).
    /usr/bin/python3 scripts/gen_conv1d_ref.py > tests/ref/conv1d.lua
"""
import torch.nn.functional as F
from reflua import print_conv_cases

cases = {  # name: (input shape, weight shape, options)
    "plain": ((2, 3, 11), (4, 3, 3), {}),
    "stride_pad": ((2, 3, 11), (4, 3, 5), {"stride": 2, "padding": 2}),
    "dilation": ((1, 2, 13), (3, 2, 3), {"dilation": 3, "padding": 1}),
    "groups": ((2, 4, 9), (6, 2, 3), {"groups": 2, "padding": 1}),
    "same": ((2, 3, 10), (2, 3, 3), {"padding": "same"}),
    "no_bias": ((2, 3, 8), (2, 3, 2), {"bias": False}),
}


print_conv_cases('gen_conv1d_ref.py', F.conv1d, cases, lambda ws, o: ws[0])
