#!/usr/bin/python3
"""Writes tests/ref/conv_transpose.lua: PyTorch's F.conv_transpose2d (and,
for the cases of a 3-D input, F.conv_transpose1d) outputs
and the gradients of the input, weight and bias (of the output weighted by
cos of its flat index) for tests/lua/test_conv_transpose.lua, in float64.
Inputs are sin(1 + 0.3 k), weights cos(2 + 0.7 k) and biases sin(3 + k)
over flat indices k (rebuilt in the test).
    /usr/bin/python3 scripts/gen_conv_transpose_ref.py > tests/ref/conv_transpose.lua
"""
import torch.nn.functional as F
from reflua import print_conv_cases

cases = {  # name: (input shape, weight shape, options)
    "plain": ((2, 3, 4, 5), (3, 2, 3, 3), {}),
    "stride2_pad1_out1": ((2, 3, 4, 4), (3, 4, 3, 3), {"stride": 2, "padding": 1, "output_padding": 1}),
    "stride23_pad01": ((1, 2, 3, 4), (2, 3, 2, 3), {"stride": (2, 3), "padding": (0, 1)}),
    "groups_dilation": ((2, 4, 3, 3), (4, 3, 3, 2), {"stride": 2, "groups": 2, "dilation": 2}),
    "crop": ((1, 2, 5, 5), (2, 2, 2, 2), {"padding": 2}),
    "no_bias": ((2, 2, 3, 3), (2, 1, 2, 2), {"bias": False, "stride": 3}),
    "transpose1d_plain": ((2, 3, 6), (3, 2, 3), {}),
    "transpose1d_stride2_pad1_out1": ((2, 3, 5), (3, 4, 3), {"stride": 2, "padding": 1, "output_padding": 1}),
    "transpose1d_groups_dilation_no_bias": ((1, 4, 4), (4, 3, 2), {"stride": 3, "groups": 2, "dilation": 2, "bias": False}),
}


def conv_transpose(x, w, b, **o):
    return (F.conv_transpose1d if x.dim() == 3 else F.conv_transpose2d)(x, w, b, **o)


print_conv_cases('gen_conv_transpose_ref.py', conv_transpose, cases, lambda ws, o: ws[1] * o.get("groups", 1))
