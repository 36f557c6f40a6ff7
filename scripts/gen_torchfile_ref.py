#!/usr/bin/python3
"""gen_torchfile_ref.py -- PyTorch checkpoints (torch.save's zip format)
both ways between PyTorch and dplua, for tests/lua/test_torchfile.lua.

Run from the source tree with a Python that has torch (the committed files
were written with Debian's python3-torch 1.13):

    /usr/bin/python3 scripts/gen_torchfile_ref.py [OUTDIR]
    /usr/bin/python3 scripts/gen_torchfile_ref.py --mnist OUTDIR
    /usr/bin/python3 scripts/gen_torchfile_ref.py --check-dplua DIR

The first form (OUTDIR defaults to tests/ref) writes

  torchfile_torch_values.pt   torch.save of a dict that holds a tensor of
      every dtype torch.save writes that dplua reads (float32, float64,
      float16, bfloat16, int64, int32, int16, int8, uint8, bool) with
      special values; a 0-d and an empty tensor; views of one storage (a
      transpose, a slice with an offset, a stepped slice, a row, an
      element); a Parameter; Python values (ints up to 2^63-1, floats,
      strings, bytes, None, lists, tuples, dicts with int keys, a dtype, a
      device); a model's state dict (an OrderedDict with _metadata) and an
      Adam optimizer's state dict after two steps
  torchfile_torch_proto4.pt   a small dict saved with pickle_protocol=4
  torchfile_ref.lua           what dplua must read: per tensor its path,
      dtype, shape and bytes (in hex, as dplua holds them: float16 widened
      to float32, int16 and int8 to int32), the Python values as a Lua
      table, and for the MNIST model below each tensor's shape, sum, sum of
      squares and a few elements, and the model's output for a fixed input

The second form writes torchfile_torch_mnist.pt: the state dict of
pytorch/examples' MNIST Net (conv1 32x1x3x3, conv2 64x32x3x3, fc1
128x9216, fc2 10x128; 4.8 MB, so it is not committed) after
torch.manual_seed(0), whose checksums are in torchfile_ref.lua; the test
writes it at test time when PyTorch is there.

The third form checks the files that test_torchfile.lua wrote into DIR
with torch.save's format: torchfile_dplua_values.pt must hold exactly the
values that the test put in (mirrored below), torchfile_dplua_mnist.pt
must load strictly into Net and Adam, and Net must give the output that
dplua computed (saved beside it); torchfile_dplua_state_dict.pt, Net's
state dict alone, must pass torch.load(weights_only=True). It exits 1 and says what differed
otherwise. Everything is deterministic: running the script twice writes
the same bytes.
"""
import collections
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


class Net(nn.Module):
    """pytorch/examples mnist/main.py's model."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return F.log_softmax(self.fc2(x), dim=1)


def mnist_input():
    """2x1x28x28, element k = ((37 k) mod 101) / 101 - 0.5: exact in Lua too."""
    k = torch.arange(2 * 28 * 28, dtype=torch.float64)
    return (((37 * k) % 101) / 101 - 0.5).float().reshape(2, 1, 28, 28)


def mnist_model():
    torch.manual_seed(0)
    return Net().eval()


def adam_state(model, steps):
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for i in range(steps):
        opt.zero_grad()
        sum((p * (i + 1)).square().sum() for p in model.parameters()).backward()
        opt.step()
    return opt.state_dict()


def values_object():
    torch.manual_seed(0)
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    lin = nn.Linear(3, 2)
    return {
        "float32": torch.randn(3, 4),
        "float64": torch.randn(2, 3, dtype=torch.float64),
        "int64": torch.tensor([-2**63, -1, 0, 1, 2**53 + 1, 2**63 - 1]),
        "int32": torch.tensor([-2**31, -1, 0, 2**31 - 1], dtype=torch.int32),
        "int16": torch.tensor([-32768, -1, 0, 32767], dtype=torch.int16),
        "int8": torch.tensor([-128, -1, 0, 127], dtype=torch.int8),
        "uint8": torch.tensor([0, 1, 128, 255], dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "bfloat16": torch.tensor([1.5, -2.25, 0.0, -0.0, math.inf, math.nan, 1e-40, 3e38], dtype=torch.bfloat16),
        "float16": torch.tensor([1.0, -0.5, 65504.0, 6e-8, -0.0, math.inf, -math.inf, math.nan],
                                dtype=torch.float16),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 3),
        "views": {"base": base, "transposed": base.t(), "slice": base[1:3, 2:5], "stepped": base[:, ::2],
                  "row": base[2], "element": base[3, 5]},
        "parameter": nn.Parameter(torch.full((2, 2), 0.25)),
        "values": {"int": 7, "negative": -300000, "big": 2**62, "int64_max": 2**63 - 1, "float": 0.1,
                   "inf": math.inf, "true": True, "false": False, "none": None, "text": "h\u00e9llo",
                   "bytes": b"\x00\xff", "list": [1, 2.5, "three", [4, [5]]], "tuple": (1, 2),
                   "int_keys": {0: "zero", 3: "three"}, "dtype": torch.float64, "device": torch.device("cpu"),
                   "empty_list": [], "empty_dict": {}},
        "model": lin.state_dict(),
        "optimizer": adam_state(lin, 2),
    }


# ---------------------------------------------------------------- the Lua reference

def lua_string(s):
    if isinstance(s, str):
        s = s.encode("utf-8")
    return '"' + "".join(chr(b) if 32 <= b < 127 and b not in (34, 92) else "\\%d" % b for b in s) + '"'


def lua_value(v):
    """v as a Lua literal as torch.load must give it; tensors as T"path"."""
    if v is None:
        return "nil"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return ('I"%d"' % v) if abs(v) > 2**53 else "%d" % v
    if isinstance(v, float):
        if math.isinf(v):
            return "math.huge" if v > 0 else "-math.huge"
        return "%.17g" % v
    if isinstance(v, (str, bytes)):
        return lua_string(v)
    if isinstance(v, torch.dtype):
        return "torch.%s" % str(v).split(".")[1]
    if isinstance(v, torch.device):
        return 'torch.device("%s")' % v
    if isinstance(v, (list, tuple)):
        return "{" + ", ".join(lua_value(x) for x in v) + "}"
    if isinstance(v, dict):
        return "{" + ", ".join("[%s] = %s" % (lua_value(k), lua_value(x)) for k, x in v.items()
                               if x is not None and not isinstance(x, torch.Tensor)) + "}"
    raise TypeError(type(v))


LOADED_AS = {torch.float16: torch.float32, torch.int16: torch.int32, torch.int8: torch.int32}


def walk_tensors(obj, path, out):
    if isinstance(obj, torch.Tensor):
        out.append((path, obj))
    elif isinstance(obj, dict):
        for k, v in obj.items():
            walk_tensors(v, path + [k], out)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            walk_tensors(v, path + [i + 1], out)


def tensor_entry(path, t):
    t = t.detach().to(LOADED_AS.get(t.dtype, t.dtype)).contiguous()
    raw = t.reshape(-1).view(torch.uint8)
    dtype = str(t.dtype).split(".")[1]
    return "    { path = %s, dtype = %s, shape = %s, hex = %s },\n" % (
        lua_value(path), lua_string(dtype), lua_value(list(t.shape)), lua_string(bytes(raw.tolist()).hex()))


def mnist_checks(sd):
    out = []
    for name, t in sd.items():
        flat = t.reshape(-1).double()
        n = flat.numel()
        picks = [0, 1, n // 2, n - 1]
        out.append("    { name = %s, shape = %s, sum = %.17g, sumsq = %.17g, at = %s, values = %s },\n" % (
            lua_string(name), lua_value(list(t.shape)), flat.sum().item(), flat.square().sum().item(),
            lua_value(picks), lua_value([flat[i].item() for i in picks])))
    return "".join(out)


def write_lua(path, obj, model_sd, output):
    tensors = []
    walk_tensors(obj, [], tensors)
    with open(path, "w") as f:
        f.write("-- generated by scripts/gen_torchfile_ref.py with torch %s\n" % torch.__version__)
        f.write("return function(I, torch)\nreturn {\n  tensors = {\n")
        for p, t in tensors:
            f.write(tensor_entry(p, t))
        f.write("  },\n  values = %s,\n" % lua_value(obj["values"]))
        f.write("  param_groups = %s,\n" % lua_value(obj["optimizer"]["param_groups"]))
        f.write("  mnist = {\n")
        f.write(mnist_checks(model_sd))
        f.write("  },\n  mnist_output = %s,\n" % lua_value(output.reshape(-1).tolist()))
        f.write("}\nend\n")


def write_refs(out):
    obj = values_object()
    torch.save(obj, os.path.join(out, "torchfile_torch_values.pt"))
    small = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3).t(), "n": 3, "s": "four",
             "l": [torch.ones(2, dtype=torch.int64), 0.5]}
    torch.save(small, os.path.join(out, "torchfile_torch_proto4.pt"), pickle_protocol=4)
    model = mnist_model()
    with torch.no_grad():
        output = model(mnist_input())
    write_lua(os.path.join(out, "torchfile_ref.lua"), obj, model.state_dict(), output)


# ---------------------------------------------------------------- checking dplua's files

def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def same(a, b, what):
    if not isinstance(a, torch.Tensor) or a.dtype != b.dtype or a.shape != b.shape:
        fail("%s: got %r, expected %s %s" % (what, a if not isinstance(a, torch.Tensor) else (a.dtype, a.shape),
                                             b.dtype, tuple(b.shape)))
    if not torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8)):
        fail("%s: the values differ:\n%s\nexpected\n%s" % (what, a, b))


def expected_dplua_values():
    """What test_torchfile.lua's dplua_values() saves, as PyTorch builds it."""
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4) / 4
    return {
        "float32": x,
        "again": x,
        "float64": torch.arange(6, dtype=torch.float64).reshape(2, 3) / 3,
        "int64": torch.tensor([-2**63, -1, 0, 2**62]),
        "int32": torch.tensor([-2**31, 7, 2**31 - 1], dtype=torch.int32),
        "uint8": torch.tensor([0, 200, 255], dtype=torch.uint8),
        "bool": torch.tensor([True, False]),
        "bfloat16": torch.tensor([1.5, -2.25, 2.0**100], dtype=torch.bfloat16),
        "transposed": x.t(),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 2),
        "nested": {"list": [1, 2.5, "three", True], "dict": {"a": 1, 3: "x"}, "text": "h\u00e9llo",
                   "big": 2**62 + 1, "negzero": -0.0, "inf": math.inf, "dtype": torch.bfloat16,
                   "device": torch.device("cpu")},
    }


def check_value(got, want, what):
    if isinstance(want, torch.Tensor):
        return same(got, want, what)
    if isinstance(want, dict):
        if not isinstance(got, dict) or set(got) != set(want):
            fail("%s: got %r, expected the keys %r" % (what, got, sorted(want, key=str)))
        for k in want:
            check_value(got[k], want[k], "%s.%s" % (what, k))
        return
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            fail("%s: got %r, expected %r" % (what, got, want))
        for i, (g, w) in enumerate(zip(got, want)):
            check_value(g, w, "%s[%d]" % (what, i))
        return
    if type(got) is not type(want) or got != want or (
            isinstance(want, float) and math.copysign(1, got) != math.copysign(1, want)):
        fail("%s: got %r (%s), expected %r (%s)" % (what, got, type(got).__name__, want, type(want).__name__))


def check_dplua(d):
    got = torch.load(os.path.join(d, "torchfile_dplua_values.pt"))
    want = expected_dplua_values()
    check_value(got, want, "torchfile_dplua_values.pt")
    if got["again"].data_ptr() != got["float32"].data_ptr():
        fail("a tensor saved twice loads as two storages, expected one")
    ck = torch.load(os.path.join(d, "torchfile_dplua_mnist.pt"), map_location="cpu")
    if not isinstance(ck["model"], collections.OrderedDict):
        fail("the model's state dict is a %s, expected an OrderedDict" % type(ck["model"]).__name__)
    model = Net().eval()
    model.load_state_dict(ck["model"], strict=True)
    for name, p in model.state_dict().items():
        same(p, ck["model"][name], "model." + name)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    opt.load_state_dict(ck["optimizer"])
    if opt.param_groups[0]["lr"] != ck["lr"]:
        fail("the optimizer's lr is %r, expected %r" % (opt.param_groups[0]["lr"], ck["lr"]))
    if len(opt.state) != len(list(model.parameters())):
        fail("the optimizer holds state for %d parameters, expected %d" % (len(opt.state), len(list(model.parameters()))))
    opt.step()   # the loaded state must be usable
    # a state dict alone passes PyTorch's safe loader (weights_only, default since 2.6)
    sd = torch.load(os.path.join(d, "torchfile_dplua_state_dict.pt"), weights_only=True)
    Net().load_state_dict(sd, strict=True)
    with torch.no_grad():
        y = Net().eval()
        y.load_state_dict(ck["model"])
        out = y(mnist_input())
    if not torch.allclose(out, ck["output"], rtol=1e-4, atol=1e-5):
        fail("PyTorch's output of the loaded MNIST Net differs from dplua's by %g" % (out - ck["output"]).abs().max())
    print("ok: PyTorch loaded dplua's files (%s)" % torch.__version__)


def main(argv):
    if len(argv) == 3 and argv[1] == "--check-dplua":
        check_dplua(argv[2])
    elif len(argv) == 3 and argv[1] == "--mnist":
        torch.save(mnist_model().state_dict(), os.path.join(argv[2], "torchfile_torch_mnist.pt"))
    elif len(argv) <= 2:
        write_refs(argv[1] if len(argv) == 2 else "tests/ref")
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
