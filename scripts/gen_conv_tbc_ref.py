#!/usr/bin/python3
"""Writes tests/ref/conv_tbc.lua: PyTorch's torch.conv_tbc (a 1-D
convolution of (time, batch, channels) input with a (kernel, in, out)
weight) and its gradients, for tests/lua/test_conv1d.lua, in float64, as
gen_conv1d_ref.py writes F.conv1d's.
    cd scripts && /usr/bin/python3 gen_conv_tbc_ref.py > ../tests/ref/conv_tbc.lua
"""
import torch
from reflua import print_conv_cases

torch.set_default_dtype(torch.float64)
cases = {  # name: (input shape, weight shape, options)
    "plain": ((7, 2, 3), (3, 3, 4), {}),
    "pad": ((7, 2, 3), (2, 3, 5), {"pad": 1}),
}
print_conv_cases("gen_conv_tbc_ref.py", torch.conv_tbc, cases, lambda ws, o: ws[2])
