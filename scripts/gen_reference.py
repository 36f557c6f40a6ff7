#!/usr/bin/python3
"""gen_reference.py -- write tests/ref/ops.lua, PyTorch's answers for dplua's Lua tests.

Run from the source tree with a Python that has torch (the committed files
were written with Debian's python3-torch 1.13, which scripts/setup-debian
leaves out: `apt-get install python3-torch`):

    /usr/bin/python3 scripts/gen_reference.py [OUTDIR]      (default tests/ref)

The output is a Lua chunk that returns

    { torch_version = "...",
      inputs = { NAME = {dtype=, shape={...}, values=<nested>}, ... },
      cases  = { {group=, name=, expr=, inputs={NAME, ...}, kind=, dtype=,
                  shape=, expected=<nested>, stride=, contiguous=}, ... } }

Each case's `expr` is Lua source evaluated as `local torch, a, b, c, d = ...`
with the named inputs bound to a, b, c, d (fresh tensors for every case, so
in-place ops may mutate them). `kind` is "tensor" (default), "multi" (several
tensors returned, `expected` a list of {dtype=, shape=, values=}), "value"
(a Lua number, boolean or nested table, compared with the tolerance of
`dtype`) or "string" (compared exactly).

Inputs are drawn from torch generators seeded per input name (so adding an
input does not change the others), rounded to a few decimals and written out,
so the Lua tests feed dplua exactly what PyTorch saw. Everything here is
deterministic: running it twice writes the same bytes.
"""

import math
import re
import os
import struct
import sys
import zlib

import torch
import torch.nn.functional as F

DTYPES = {
    "float32": torch.float32, "float64": torch.float64, "int64": torch.int64,
    "int32": torch.int32, "uint8": torch.uint8, "bool": torch.bool,
    "bfloat16": torch.bfloat16,
}
DTNAME = {v: k for k, v in DTYPES.items()}
SHORT = {"float32": "f32", "float64": "f64", "int64": "i64", "int32": "i32",
         "uint8": "u8", "bool": "b", "bfloat16": "bf16"}
MAIN6 = ["float32", "float64", "int64", "int32", "uint8", "bool"]

INPUTS = {}    # name -> torch tensor
CASES = []     # dicts, serialised in order
SKIPPED = []   # (name, reason): PyTorch refused the op
NAMES = set()


# ---------------------------------------------------------------- inputs

def _gen(name):
    return torch.Generator().manual_seed(zlib.crc32(name.encode()))


def shape_tag(shape):
    return "x".join(str(s) for s in shape) if shape else "s"


def rnd(dtype, shape, variant="a"):
    """A named random input: floats ~ 2*N(0,1) rounded to 3 decimals;
    ints in [-9, 9] (variant "nz": nonzero, "pos": 1..9, "small": 0..3);
    uint8 in [0, 9]; bool a coin flip."""
    name = "%s_%s_%s" % (SHORT[dtype], shape_tag(shape), variant)
    if name in INPUTS:
        return name
    g = _gen(name)
    dt = DTYPES[dtype]
    if dtype in ("float32", "float64", "bfloat16"):
        v = torch.randn(shape, generator=g, dtype=torch.float64) * 2
        v = torch.round(v * 1000) / 1000
        if variant == "pos":
            v = v.abs() + 0.5
        t = v.to(dt)
    elif dtype == "bool":
        t = torch.randint(0, 2, shape, generator=g).to(torch.bool)
    else:
        lo, hi = (0, 10) if dtype == "uint8" else (-9, 10)
        if variant == "pos" or (variant == "nz" and dtype == "uint8"):
            lo, hi = 1, 10
        if variant == "small":
            lo, hi = (0, 4)
        v = torch.randint(lo, hi, shape, generator=g)
        if variant == "nz" and dtype != "uint8":
            v = torch.randint(1, 10, shape, generator=g) * \
                (torch.randint(0, 2, shape, generator=g) * 2 - 1)
        if variant == "perm":   # distinct values, so argmax has no ties
            n = 1
            for s in shape:
                n *= s
            v = (torch.randperm(n, generator=g) - n // 2).reshape(shape)
        t = v.to(dt)
    INPUTS[name] = t
    return name


def lit(name, values, dtype):
    """A named input with explicit values."""
    t = torch.tensor(values, dtype=DTYPES[dtype])
    assert name not in INPUTS or torch.equal(INPUTS[name], t), name
    INPUTS[name] = t
    return name


def arange_in(dtype, shape):
    name = "%s_%s_seq" % (SHORT[dtype], shape_tag(shape))
    n = 1
    for s in shape:
        n *= s
    INPUTS[name] = torch.arange(n, dtype=torch.float64).reshape(shape).to(DTYPES[dtype])
    return name


# ---------------------------------------------------------------- cases

def case(group, name, expr, py, inputs=(), **extra):
    """Run py on fresh copies of the inputs and record what PyTorch gives.
    A case PyTorch refuses is skipped (listed on stderr), unless the caller
    passes expect_error=True."""
    args = [INPUTS[k].clone() for k in inputs]
    try:
        res = py(*args)
    except Exception as e:  # PyTorch refuses: not a case for dplua
        SKIPPED.append((group, name, str(e).split("\n")[0][:90]))
        return
    base, k = name, 2
    while (group, name) in NAMES:
        name, k = "%s (%d)" % (base, k), k + 1
    NAMES.add((group, name))
    check_names(name, expr, inputs)
    c = {"group": group, "name": name, "expr": expr, "inputs": list(inputs)}
    if isinstance(res, torch.Tensor):
        c.update(tensor_fields(res, extra.pop("check_stride", False)))
    elif isinstance(res, tuple) and all(isinstance(r, torch.Tensor) for r in res):
        c["kind"] = "multi"
        c["expected"] = [tensor_fields(r) for r in res]
    elif isinstance(res, str):
        c["kind"] = "string"
        c["expected"] = res
    else:
        c["kind"] = "value"
        c["expected"] = res
        c["dtype"] = extra.pop("value_dtype")
    c.update(extra)
    CASES.append(c)


def check_names(name, expr, inputs):
    """The Lua expr must use exactly the names its inputs are bound to."""
    code = re.sub(r'"[^"]*"', '""', expr)
    used = set(re.findall(r'(?<![\w.:])([abcd])(?!\w)', code))
    want = set("abcd"[:len(inputs)])
    assert used == want, "%s: expr %r uses %s but has inputs %s" % (name, expr, sorted(used), list(inputs))


def tensor_fields(t, with_stride=False):
    d = {"dtype": DTNAME[t.dtype], "shape": list(t.shape),
         "values": t.tolist()}
    if with_stride:
        d["stride"] = list(t.stride())
        d["contiguous"] = t.is_contiguous()
    return d


def setitem(t, idx, v):
    t[idx] = v
    return t


def inplace(t, fn):
    fn(t)
    return t


# ---------------------------------------------------------------- Lua output

def f32_repr(x):
    """The shortest decimal that reads back as the same float32."""
    for p in range(6, 10):
        s = "%.*g" % (p, x)
        if struct.unpack("f", struct.pack("f", float(s)))[0] == x:
            return s
    return repr(x)


def lua_num(x, dtype):
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, int):
        return str(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if dtype == "float32":
        return f32_repr(x)
    return repr(x)


def lua_str(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def lua_val(v, dtype):
    if isinstance(v, (list, tuple)):
        return "{" + ",".join(lua_val(x, dtype) for x in v) + "}"
    if isinstance(v, str):
        return lua_str(v)
    if v is None:
        return "nil"
    return lua_num(v, dtype)


def lua_tensor(d):
    parts = ["dtype=%s" % lua_str(d["dtype"]),
             "shape=%s" % lua_val(d["shape"], "int64"),
             "values=%s" % lua_val(d["values"], d["dtype"])]
    if "stride" in d:
        parts.append("stride=%s" % lua_val(d["stride"], "int64"))
        parts.append("contiguous=%s" % lua_num(d["contiguous"], None))
    return ", ".join(parts)


def lua_case(c):
    parts = ["name=%s" % lua_str(c["name"]), "expr=%s" % lua_str(c["expr"])]
    if c["inputs"]:
        parts.append("inputs=%s" % lua_val(c["inputs"], None))
    kind = c.get("kind", "tensor")
    if kind == "tensor":
        parts.append(lua_tensor(c))
    elif kind == "multi":
        parts.append('kind="multi"')
        parts.append("expected={%s}" % ", ".join("{%s}" % lua_tensor(r) for r in c["expected"]))
    elif kind == "string":
        parts.append('kind="string"')
        parts.append("expected=%s" % lua_str(c["expected"]))
    else:
        parts.append('kind="value"')
        parts.append("dtype=%s" % lua_str(c["dtype"]))
        parts.append("expected=%s" % lua_val(c["expected"], c["dtype"]))
    for k in ("rtol", "atol"):
        if k in c:
            parts.append("%s=%r" % (k, c[k]))
    return "{" + ", ".join(parts) + "}"


def write(outdir):
    os.makedirs(outdir, exist_ok=True)
    path = os.path.join(outdir, "ops.lua")
    out = ["-- tests/ref/ops.lua: generated by scripts/gen_reference.py with torch %s; do not edit."
           % torch.__version__,
           "-- Regenerate with: /usr/bin/python3 scripts/gen_reference.py",
           "local nan, inf = 0/0, math.huge",
           "local inputs, cases = {}, {}",
           "local function adder(g) cases[g] = cases[g] or {}; local l = cases[g];"
           " return function(c) c.group = g; l[#l+1] = c end end"]
    for name in sorted(INPUTS):
        t = INPUTS[name]
        out.append("inputs[%s] = {%s}" % (lua_str(name), lua_tensor(tensor_fields(t))))
    # One statement per case, and a function per 200 of them, keep every
    # Lua function well under LuaJIT's limits on constants.
    groups = []
    for c in CASES:
        if c["group"] not in groups:
            groups.append(c["group"])
    for g in groups:
        cs = [c for c in CASES if c["group"] == g]
        for i in range(0, len(cs), 200):
            out.append("do local C = adder(%s); (function()" % lua_str(g))
            for c in cs[i:i + 200]:
                out.append("C{%s}" % lua_case(c)[1:-1])
            out.append("end)() end")
    out.append("return {torch_version=%s, inputs=inputs, cases=cases}" % lua_str(torch.__version__))
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
    return path


# ================================================================ creation

def gen_creation():
    G = "creation"
    f32, f64 = torch.float32, torch.float64
    C = [
        ("arange(5)", "torch.arange(5)", lambda: torch.arange(5)),
        ("arange(2, 7)", "torch.arange(2, 7)", lambda: torch.arange(2, 7)),
        ("arange(10, 0, -3)", "torch.arange(10, 0, -3)", lambda: torch.arange(10, 0, -3)),
        ("arange(0, 1, 0.25)", "torch.arange(0, 1, 0.25)", lambda: torch.arange(0, 1, 0.25)),
        ("arange(0, 1, 0.1)", "torch.arange(0, 1, 0.1)", lambda: torch.arange(0, 1, 0.1)),
        ("arange(-1.5, 1.5, 0.5)", "torch.arange(-1.5, 1.5, 0.5)", lambda: torch.arange(-1.5, 1.5, 0.5)),
        ("arange(1, 2.5, 0.5)", "torch.arange(1, 2.5, 0.5)", lambda: torch.arange(1, 2.5, 0.5)),
        ("arange(0, 5, {dtype=float64})", "torch.arange(0, 5, {dtype=torch.float64})",
         lambda: torch.arange(0, 5, dtype=f64)),
        ("arange(0, 3, 1, {dtype=int32})", 'torch.arange(0, 3, 1, {dtype="int32"})',
         lambda: torch.arange(0, 3, 1, dtype=torch.int32)),
        ("arange(0.5, 3) float", "torch.arange(0.5, 3)", lambda: torch.arange(0.5, 3)),
        ("linspace(0, 1, 5)", "torch.linspace(0, 1, 5)", lambda: torch.linspace(0, 1, 5)),
        ("linspace(-1, 1, 7, float64)", "torch.linspace(-1, 1, 7, {dtype=torch.float64})",
         lambda: torch.linspace(-1, 1, 7, dtype=f64)),
        ("linspace(5, -5, 6)", "torch.linspace(5, -5, 6)", lambda: torch.linspace(5, -5, 6)),
        ("linspace(0, 10, 1)", "torch.linspace(0, 10, 1)", lambda: torch.linspace(0, 10, 1)),
        ("linspace(2, 3, 0) empty", "torch.linspace(2, 3, 0)", lambda: torch.linspace(2, 3, 0)),
        ("linspace(0, 1, 11)", "torch.linspace(0, 1, 11)", lambda: torch.linspace(0, 1, 11)),
        ("eye(3)", "torch.eye(3)", lambda: torch.eye(3)),
        ("eye(2, 4)", "torch.eye(2, 4)", lambda: torch.eye(2, 4)),
        ("eye(4, 2)", "torch.eye(4, 2)", lambda: torch.eye(4, 2)),
        ("eye(3, int64)", "torch.eye(3, {dtype=torch.int64})", lambda: torch.eye(3, dtype=torch.int64)),
        ("eye(2, 3, bool)", "torch.eye(2, 3, {dtype=torch.bool})", lambda: torch.eye(2, 3, dtype=torch.bool)),
        ("full({2,3}, 7) int value gives int64", "torch.full({2, 3}, 7)", lambda: torch.full((2, 3), 7)),
        ("full({2,2}, 2.5)", "torch.full({2, 2}, 2.5)", lambda: torch.full((2, 2), 2.5)),
        ("full({3}, true) bool", "torch.full({3}, true)", lambda: torch.full((3,), True)),
        ("full({2,3}, 7, float64)", "torch.full({2, 3}, 7, {dtype=torch.float64})",
         lambda: torch.full((2, 3), 7, dtype=f64)),
        ("full({}, 3.5) 0-d", "torch.full({}, 3.5)", lambda: torch.full((), 3.5)),
        ("full({2}, -1.5, int32)", "torch.full({2}, -1.5, {dtype=torch.int32})",
         lambda: torch.full((2,), -1.5, dtype=torch.int32)),
        ("zeros(2, 3)", "torch.zeros(2, 3)", lambda: torch.zeros(2, 3)),
        ("zeros({2, 3})", "torch.zeros({2, 3})", lambda: torch.zeros(2, 3)),
        ("zeros(2, 3, int32)", "torch.zeros(2, 3, {dtype=torch.int32})", lambda: torch.zeros(2, 3, dtype=torch.int32)),
        ("zeros({}) 0-d", "torch.zeros({})", lambda: torch.zeros(())),
        ("zeros(0) empty", "torch.zeros(0)", lambda: torch.zeros(0)),
        ("zeros(2, 0, 3) empty", "torch.zeros(2, 0, 3)", lambda: torch.zeros(2, 0, 3)),
        ("ones(4)", "torch.ones(4)", lambda: torch.ones(4)),
        ("ones({2,1,2}, float64)", "torch.ones({2, 1, 2}, {dtype=torch.float64})", lambda: torch.ones(2, 1, 2, dtype=f64)),
        ('ones(3, "uint8") string dtype', 'torch.ones(3, {dtype="uint8"})', lambda: torch.ones(3, dtype=torch.uint8)),
        ("ones(2, bool)", "torch.ones(2, {dtype=torch.bool})", lambda: torch.ones(2, dtype=torch.bool)),
        ("ones(2, int64) alias torch.long", "torch.ones(2, {dtype=torch.long})", lambda: torch.ones(2, dtype=torch.long)),
        ("ones(2, float64) alias torch.double", "torch.ones(2, {dtype=torch.double})", lambda: torch.ones(2, dtype=torch.double)),
        ("ones(2, bfloat16)", "torch.ones(2, {dtype=torch.bfloat16})", lambda: torch.ones(2, dtype=torch.bfloat16)),
    ]
    for name, expr, py in C:
        case(G, name, expr, py)
    i32 = rnd("int32", [2, 3])
    f64in = rnd("float64", [2, 3])
    f32in = rnd("float32", [2, 3])
    i64in = rnd("int64", [2, 3])
    case(G, "zeros_like int32", "torch.zeros_like(a)", torch.zeros_like, [i32])
    case(G, "ones_like float64", "torch.ones_like(a)", torch.ones_like, [f64in])
    case(G, "zeros_like float32 -> float64", "torch.zeros_like(a, {dtype=torch.float64})",
         lambda a: torch.zeros_like(a, dtype=f64), [f32in])
    case(G, "full_like float32 2.5", "torch.full_like(a, 2.5)", lambda a: torch.full_like(a, 2.5), [f32in])
    case(G, "full_like int64 2.7 truncates", "torch.full_like(a, 2.7)", lambda a: torch.full_like(a, 2.7), [i64in])
    case(G, "tensor float64 option", "torch.tensor({{1, 2}, {3, 4.5}}, {dtype=torch.float64})",
         lambda: torch.tensor([[1, 2], [3, 4.5]], dtype=f64))
    case(G, "tensor int64 option", "torch.tensor({1, 2, 3}, {dtype=torch.int64})",
         lambda: torch.tensor([1, 2, 3]))
    case(G, "tensor bool", "torch.tensor({true, false, true})", lambda: torch.tensor([True, False, True]))
    case(G, "tensor numbers give float32", "torch.tensor({{1, 2}, {3, 4}})",
         lambda: torch.tensor([[1, 2], [3, 4]], dtype=f32))
    case(G, "tensor scalar 0-d", "torch.tensor(3.5)", lambda: torch.tensor(3.5))
    case(G, "tensor 3-d", "torch.tensor({{{1}, {2}}, {{3}, {4}}})",
         lambda: torch.tensor([[[1.], [2.]], [[3.], [4.]]]))


# ================================================================ views

def gen_views():
    G = "views"
    x = arange_in("float32", [2, 3, 4])
    y = arange_in("float32", [3, 4])
    # split and chunk return Lua lists: unpack gives PyTorch's tuple
    five = arange_in("float32", [5, 2])
    case(G, "split(2)", "unpack(a:split(2))", lambda t: t.split(2), [five])
    case(G, "split sizes along dim 1", "unpack(a:split({1, 3}, 1))", lambda t: t.split([1, 3], 1), [y])
    case(G, "split sizes with an empty one", "unpack(torch.split(a, {2, 0, 3}))", lambda t: torch.split(t, [2, 0, 3]),
         [five])
    case(G, "chunk(3)", "unpack(a:chunk(3))", lambda t: t.chunk(3), [five])
    case(G, "chunk(4) of 6 is 3 chunks", "unpack(a:chunk(4, -1))", lambda t: t.chunk(4, -1),
         [arange_in("float32", [2, 6])])
    ten = arange_in("float32", [10])
    case(G, "as_strided windows", "a:as_strided({4, 3}, {2, 1})", lambda t: t.as_strided([4, 3], [2, 1]), [ten],
         check_stride=True)
    case(G, "as_strided with an offset", "torch.as_strided(a, {2, 2}, {1, 3}, 2)",
         lambda t: torch.as_strided(t, [2, 2], [1, 3], 2), [ten], check_stride=True)
    case(G, "as_strided of a view keeps its offset", "a:narrow(0, 3, 5):as_strided({3}, {2})",
         lambda t: t.narrow(0, 3, 5).as_strided([3], [2]), [ten], check_stride=True)
    case(G, "as_strided: a write reaches the base", "a:as_strided({2, 2}, {5, 1}):fill_(-1); return a",
         lambda t: (t.as_strided([2, 2], [5, 1]).fill_(-1), t)[1], [ten])
    case(G, "as_strided_", "a:as_strided_({3, 2}, {2, 3}); return a", lambda t: t.as_strided_([3, 2], [2, 3]), [ten],
         check_stride=True)
    case(G, "storage_offset of a narrow", "a:narrow(0, 3, 5):storage_offset()", lambda t: t.narrow(0, 3, 5).storage_offset(),
         [ten], value_dtype="int64")
    case(G, "resize_ to fewer elements, a view of the front", "a:resize_(2, 3); return a",
         lambda t: t.resize_(2, 3), [ten])
    case(G, "resize_ reads the storage from the offset, C-contiguous", "local v = a:narrow(0, 2, 4); v:resize_(2, 2); return v",
         lambda t: (lambda v: v.resize_(2, 2))(t.narrow(0, 2, 4)), [ten])
    case(G, "resize_ to more elements keeps the old ones in front", "a:resize_(3, 4); return a:reshape(-1):narrow(0, 0, 10)",
         lambda t: t.resize_(3, 4).reshape(-1).narrow(0, 0, 10), [ten])
    case(G, "resize_as_", "a:resize_as_(torch.zeros(5, 2)); return a", lambda t: t.resize_as_(torch.zeros(5, 2)), [ten])
    case(G, "detach_ makes a leaf", "local z = a:double():requires_grad_() * 3; z:detach_(); "
         "return {z.requires_grad, z.is_leaf}",
         lambda t: (lambda z: [z.requires_grad, z.is_leaf])(t.double().requires_grad_().mul(3).detach_()), [ten],
         value_dtype="bool")
    case(G, "empty_strided's strides", "torch.empty_strided({2, 3}, {1, 2}):stride()",
         lambda: list(torch.empty_strided([2, 3], [1, 2]).stride()), value_dtype="int64")
    s = arange_in("float32", [1, 3, 1, 2])
    z = arange_in("float32", [3, 1])
    w = arange_in("float32", [3])
    v6 = arange_in("float32", [6])
    C = [
        ("view(6, 4)", "a:view(6, 4)", lambda a: a.view(6, 4), x),
        ("view({4, -1})", "a:view({4, -1})", lambda a: a.view(4, -1), x),
        ("view(-1)", "a:view(-1)", lambda a: a.view(-1), x),
        ("view(2, -1, 2)", "a:view(2, -1, 2)", lambda a: a.view(2, -1, 2), y),
        ("reshape(4, 6)", "a:reshape(4, 6)", lambda a: a.reshape(4, 6), x),
        ("reshape({2, -1})", "a:reshape({2, -1})", lambda a: a.reshape(2, -1), x),
        ("reshape of transpose copies", "a:transpose(0, 1):reshape(-1)", lambda a: a.transpose(0, 1).reshape(-1), x),
        ("transpose(0, 2)", "a:transpose(0, 2)", lambda a: a.transpose(0, 2), x),
        ("transpose(-1, -2)", "a:transpose(-1, -2)", lambda a: a.transpose(-1, -2), x),
        ("t() 2-d", "a:t()", lambda a: a.t(), y),
        ("t() 1-d", "a:t()", lambda a: a.t(), w),
        ("permute(2, 0, 1)", "a:permute(2, 0, 1)", lambda a: a.permute(2, 0, 1), x),
        ("permute({1, 2, 0}) table", "a:permute({1, 2, 0})", lambda a: a.permute(1, 2, 0), x),
        ("permute(-1, 0, 1)", "a:permute(-1, 0, 1)", lambda a: a.permute(-1, 0, 1), x),
        ("contiguous of transpose", "a:transpose(0, 1):contiguous()", lambda a: a.transpose(0, 1).contiguous(), y),
        ("contiguous of contiguous", "a:contiguous()", lambda a: a.contiguous(), y),
        ("squeeze()", "a:squeeze()", lambda a: a.squeeze(), s),
        ("squeeze(0)", "a:squeeze(0)", lambda a: a.squeeze(0), s),
        ("squeeze(1) not size 1", "a:squeeze(1)", lambda a: a.squeeze(1), s),
        ("squeeze(-2)", "a:squeeze(-2)", lambda a: a.squeeze(-2), s),
        ("unsqueeze(0)", "a:unsqueeze(0)", lambda a: a.unsqueeze(0), y),
        ("unsqueeze(-1)", "a:unsqueeze(-1)", lambda a: a.unsqueeze(-1), y),
        ("unsqueeze(1)", "a:unsqueeze(1)", lambda a: a.unsqueeze(1), y),
        ("unsqueeze(-3)", "a:unsqueeze(-3)", lambda a: a.unsqueeze(-3), y),
        ("expand(3, 4)", "a:expand(3, 4)", lambda a: a.expand(3, 4), z),
        ("expand({2, 3, 4})", "a:expand({2, 3, 4})", lambda a: a.expand(2, 3, 4), z),
        ("expand(-1, 2)", "a:expand(-1, 2)", lambda a: a.expand(-1, 2), z),
        ("expand 1-d to (2, 3)", "a:expand(2, 3)", lambda a: a.expand(2, 3), w),
        ("expand_as", "a:expand_as(b)", lambda a, b: a.expand_as(b), z, y),
        ("narrow(0, 1, 2)", "a:narrow(0, 1, 2)", lambda a: a.narrow(0, 1, 2), y),
        ("narrow(-1, 1, 2)", "a:narrow(-1, 1, 2)", lambda a: a.narrow(-1, 1, 2), x),
        ("narrow(2, 0, 1)", "a:narrow(2, 0, 1)", lambda a: a.narrow(2, 0, 1), x),
        ("select(0, 1)", "a:select(0, 1)", lambda a: a.select(0, 1), x),
        ("select(1, -1)", "a:select(1, -1)", lambda a: a.select(1, -1), x),
        ("select(-1, 2)", "a:select(-1, 2)", lambda a: a.select(-1, 2), x),
        ("select on 1-d gives 0-d", "a:select(0, 2)", lambda a: a.select(0, 2), w),
        ("flatten()", "a:flatten()", lambda a: a.flatten(), x),
        ("flatten(1)", "a:flatten(1)", lambda a: a.flatten(1), x),
        ("flatten(0, 1)", "a:flatten(0, 1)", lambda a: a.flatten(0, 1), x),
        ("flatten(-2, -1)", "a:flatten(-2, -1)", lambda a: a.flatten(-2, -1), x),
        ("chain narrow/transpose/select", "a:narrow(2, 1, 2):transpose(0, 1):select(0, 1)",
         lambda a: a.narrow(2, 1, 2).transpose(0, 1).select(0, 1), x),
        ("t[1]", "a[1]", lambda a: a[1], x),
        ("t[-1]", "a[-1]", lambda a: a[-1], x),
        ("t[{0, 1}]", "a[{0, 1}]", lambda a: a[0, 1], x),
        ("t[{1, 2, 3}] 0-d", "a[{1, 2, 3}]", lambda a: a[1, 2, 3], x),
        ("t[{-1, -1, -1}] 0-d", "a[{-1, -1, -1}]", lambda a: a[-1, -1, -1], x),
        ("t[{{}, {1, 3}}]", "a[{{}, {1, 3}}]", lambda a: a[:, 1:3], y),
        ("t[{{}, {}, {0, nil, 2}}] step", "a[{{}, {}, {0, nil, 2}}]", lambda a: a[:, :, 0::2], x),
        ("t[{{1, nil}, {0, 4, 3}}]", "a[{{1, nil}, {0, 4, 3}}]", lambda a: a[1:, 0:4:3], y),
        ("t[{{}, -1}]", "a[{{}, -1}]", lambda a: a[:, -1], y),
        ("t[{{-2}}] start only", "a[{{-2}}]", lambda a: a[-2:], y),
        ("t[{{nil, 1}}] stop only", "a[{{nil, 1}}]", lambda a: a[:1], y),
        ("t[{{}, {-3, -1}}]", "a[{{}, {-3, -1}}]", lambda a: a[:, -3:-1], y),
        ("t[{{0, 10}}] stop clamps", "a[{{0, 10}}]", lambda a: a[0:10], y),
        ("t[{1, {}, 2}]", "a[{1, {}, 2}]", lambda a: a[1, :, 2], x),
        ("t[{{1, nil, 2}}] 1-d step", "a[{{1, nil, 2}}]", lambda a: a[1::2], v6),
        ("t[{{0, 6, 4}}] 1-d step", "a[{{0, 6, 4}}]", lambda a: a[0:6:4], v6),
        ("t[{{}, {nil, nil, 2}}] nil start and stop", "a[{{}, {nil, nil, 2}}]", lambda a: a[:, ::2], y),
        ("step then transpose", "a[{{}, {0, nil, 2}}]:t()", lambda a: a[:, 0::2].t(), y),
    ]
    for name, expr, py, *ins in C:
        case(G, name, expr, py, ins, check_stride=True)
    # every method is also torch.NAME(t, ...)
    F = [
        ("torch.reshape", "torch.reshape(a, {4, 6})", lambda a: torch.reshape(a, (4, 6)), x),
        ("torch.transpose", "torch.transpose(a, 0, 2)", lambda a: torch.transpose(a, 0, 2), x),
        ("torch.permute", "torch.permute(a, {2, 0, 1})", lambda a: torch.permute(a, (2, 0, 1)), x),
        ("torch.t", "torch.t(a)", lambda a: torch.t(a), y),
        ("torch.squeeze", "torch.squeeze(a)", lambda a: torch.squeeze(a), s),
        ("torch.squeeze dim", "torch.squeeze(a, 0)", lambda a: torch.squeeze(a, 0), s),
        ("torch.unsqueeze", "torch.unsqueeze(a, 1)", lambda a: torch.unsqueeze(a, 1), y),
        ("torch.narrow", "torch.narrow(a, 1, 1, 2)", lambda a: torch.narrow(a, 1, 1, 2), y),
        ("torch.select", "torch.select(a, 1, 2)", lambda a: torch.select(a, 1, 2), y),
        ("torch.flatten", "torch.flatten(a, 1)", lambda a: torch.flatten(a, 1), x),
    ]
    for name, expr, py, *ins in F:
        case(G, name, expr, py, ins, check_stride=True)
    # ops on views compute on the viewed values
    case(G, "sum of transposed view", "a:transpose(0, 1):sum(1)", lambda a: a.transpose(0, 1).sum(1), [x])
    case(G, "add of stepped views", "a[{{}, {0, nil, 2}}] + a[{{}, {1, nil, 2}}]",
         lambda a: a[:, 0::2] + a[:, 1::2], [y])
    case(G, "expanded view times tensor", "a:expand(3, 4) * b", lambda a, b: a.expand(3, 4) * b, [z, y])
    case(G, "clone of view is contiguous", "a:t():clone()", lambda a: a.t().clone(), [y], check_stride=False)


# ================================================================ index

def gen_index():
    G = "index"
    x = arange_in("float32", [2, 3, 4])
    y = arange_in("float32", [3, 4])
    y2 = rnd("float32", [2, 4])
    y3 = rnd("float32", [3, 2])
    p = rnd("float32", [3], "p")
    q = rnd("float32", [3], "q")
    pi = rnd("int64", [2, 3], "p")
    qi = rnd("int64", [2, 3], "q")
    lit("idx_2_0", [2, 0], "int64")
    lit("idx_3_1_1", [3, 1, 1], "int64")
    lit("idx_0", [0], "int64")
    lit("gidx_3x2", [[0, 0], [1, 0], [3, 2]], "int64")
    lit("gidx_1x4", [[0, 1, 2, 0]], "int64")
    lit("gidx_2x4", [[2, 1, 0, 0], [1, 1, 2, 2]], "int64")
    lit("gidx_2x3x1", [[[0], [3], [1]], [[2], [2], [0]]], "int64")
    C = [
        ("index_select(0, {2, 0})", "a:index_select(0, b)", lambda a, b: a.index_select(0, b), y, "idx_2_0"),
        ("index_select(1, {3, 1, 1})", "a:index_select(1, b)", lambda a, b: a.index_select(1, b), y, "idx_3_1_1"),
        ("index_select(-1, {0}) 3-d", "a:index_select(-1, b)", lambda a, b: a.index_select(-1, b), x, "idx_0"),
        ("torch.index_select", "torch.index_select(a, 1, b)", lambda a, b: torch.index_select(a, 1, b), x, "idx_2_0"),
        ("index_select of transposed", "a:t():index_select(0, b)", lambda a, b: a.t().index_select(0, b), y, "idx_3_1_1"),
        ("gather(1) [3,2]", "a:gather(1, b)", lambda a, b: a.gather(1, b), y, "gidx_3x2"),
        ("gather(0) [1,4]", "a:gather(0, b)", lambda a, b: a.gather(0, b), y, "gidx_1x4"),
        ("gather(0) [2,4]", "a:gather(0, b)", lambda a, b: a.gather(0, b), y, "gidx_2x4"),
        ("gather(-1) 3-d", "a:gather(-1, b)", lambda a, b: a.gather(-1, b), x, "gidx_2x3x1"),
        ("torch.gather", "torch.gather(a, 1, b)", lambda a, b: torch.gather(a, 1, b), y, "gidx_3x2"),
        ("cat dim 0", "torch.cat({a, b}, 0)", lambda a, b: torch.cat([a, b], 0), y, y2),
        ("cat default dim", "torch.cat({a, b})", lambda a, b: torch.cat([a, b]), y, y2),
        ("cat dim 1", "torch.cat({a, b}, 1)", lambda a, b: torch.cat([a, b], 1), y, y3),
        ("cat dim -1", "torch.cat({a, b}, -1)", lambda a, b: torch.cat([a, b], -1), y, y3),
        ("cat three 1-d", "torch.cat({a, b, a})", lambda a, b: torch.cat([a, b, a]), p, q),
        ("cat one", "torch.cat({a}, 0)", lambda a: torch.cat([a], 0), y),
        ("cat int64", "torch.cat({a, b}, 1)", lambda a, b: torch.cat([a, b], 1), pi, qi),
        ("cat transposed views", "torch.cat({a:t(), b:t()}, 1)", lambda a, b: torch.cat([a.t(), b.t()], 1), y, y2),
        ("stack default", "torch.stack({a, b})", lambda a, b: torch.stack([a, b]), p, q),
        ("stack dim 1", "torch.stack({a, b}, 1)", lambda a, b: torch.stack([a, b], 1), p, q),
        ("stack dim -1 2-d", "torch.stack({a, b}, -1)", lambda a, b: torch.stack([a, b], -1), pi, qi),
        ("stack dim 1 2-d", "torch.stack({a, b, a}, 1)", lambda a, b: torch.stack([a, b, a], 1), pi, qi),
        # assignment
        ("t[1] = 5", "a[1] = 5; return a", lambda a: setitem(a, 1, 5), y),
        ("t[-1] = 2.5", "a[-1] = 2.5; return a", lambda a: setitem(a, -1, 2.5), y),
        ("t[{0, 1}] = -1", "a[{0, 1}] = -1; return a", lambda a: setitem(a, (0, 1), -1), x),
        ("t[{1, 2, 3}] = 7", "a[{1, 2, 3}] = 7; return a", lambda a: setitem(a, (1, 2, 3), 7), x),
        ("t[{{}, {1, 3}}] = 0", "a[{{}, {1, 3}}] = 0; return a", lambda a: setitem(a, (slice(None), slice(1, 3)), 0), y),
        ("t[{{}, {0, nil, 2}}] = 9", "a[{{}, {0, nil, 2}}] = 9; return a",
         lambda a: setitem(a, (slice(None), slice(0, None, 2)), 9), y),
        ("t[0] = tensor row", "a[0] = torch.tensor({9, 8, 7, 6}); return a",
         lambda a: setitem(a, 0, torch.tensor([9., 8, 7, 6])), y),
        ("t[{{}, 1}] = tensor column", "a[{{}, 1}] = torch.tensor({1, 2, 3}); return a",
         lambda a: setitem(a, (slice(None), 1), torch.tensor([1., 2, 3])), y),
        ("t[{{}, 0}] = broadcast", "a[{{}, 0}] = torch.tensor({-1, -2, -3, -4}); return a",
         lambda a: setitem(a, (slice(None), 0), torch.tensor([-1., -2, -3, -4])), x),
        ("t[1] = tensor broadcast [1] -> [4]", "a[1] = torch.tensor({5.5}); return a",
         lambda a: setitem(a, 1, torch.tensor([5.5])), y),
        ("int t[0] = 2.7 truncates", "a[0] = 2.7; return a", lambda a: setitem(a, 0, 2.7), pi),
        ("assign through view changes base", "local v = a:view(12); v[{{2, 5}}] = 0; return a",
         lambda a: (a.view(12).__setitem__(slice(2, 5), 0), a)[1], y),
        ("select view fill_ changes base", "a:select(1, 2):fill_(-3); return a",
         lambda a: (a.select(1, 2).fill_(-3), a)[1], y),
        ("transpose view mul_ changes base", "a:t()[1]:mul_(10); return a",
         lambda a: (a.t()[1].mul_(10), a)[1], y),
    ]
    for name, expr, py, *ins in C:
        case(G, name, expr, py, ins)


# ================================================================ elementwise

BINOPS = ["add", "sub", "mul", "div", "pow", "maximum", "minimum", "remainder", "atan2",
          "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or"]


def second_variant(op, dtype):
    """Inputs for b that keep PyTorch well-defined: no integer division or
    remainder by zero, no negative integer exponents, no uint8 overflow."""
    if op in ("pow",) and dtype not in ("float32", "float64"):
        return "small"
    if op in ("remainder", "div") and dtype not in ("float32", "float64", "bool"):
        return "nz"
    if op == "pow":
        return "b"
    return "b"


def first_variant(op, dtype):
    if op == "pow" and dtype not in ("float32", "float64"):
        return "small"
    if op == "pow":
        return "pos"
    return "a"


def binop(G, op, da, sa, db, sb, tag=""):
    a = rnd(da, sa, first_variant(op, da))
    b = rnd(db, sb, second_variant(op, db))
    name = "%s %s%s %s%s%s" % (op, SHORT[da], sa, SHORT[db], sb, tag)
    case(G, name, "a:%s(b)" % op, lambda x, y: getattr(torch, op)(x, y), [a, b])


def gen_binary():
    G = "elementwise"
    # every op, every dtype, [2,3] with [3]
    for op in BINOPS:
        for dt in MAIN6:
            binop(G, op, dt, [2, 3], dt, [3])
    # broadcasting shapes in float32 (and float64 for the arithmetic ones)
    shapes = [([4, 1], [1, 5]), ([2, 1, 3], [4, 1]), ([3], [2, 3]), ([2, 3], [2, 3]),
              ([2, 3], []), ([], [2, 3]), ([], [])]
    for op in BINOPS:
        for sa, sb in shapes:
            if op not in ("add", "mul", "div", "lt") and (sa == [] or sb == []) and sa != sb:
                continue
            binop(G, op, "float32", sa, "float32", sb)
    for op in ["add", "sub", "mul", "div", "pow", "atan2", "remainder"]:
        binop(G, op, "float64", [4, 1], "float64", [1, 5])
    # type promotion: every ordered pair of distinct dtypes for some ops,
    # every unordered pair for the rest
    mixed = ["add", "div", "sub", "mul", "pow", "maximum", "remainder", "atan2", "lt", "eq",
             "logical_and"]
    for op in mixed:
        for i, da in enumerate(MAIN6):
            for j, db in enumerate(MAIN6):
                if da == db:
                    continue
                if op not in ("add", "div") and j < i:
                    continue
                binop(G, op, da, [3], db, [3])
    # 0-d tensors do not promote dimensioned tensors of the same category
    zd = [("float32", [2, 3], "float64", []), ("int64", [3], "float32", []),
          ("int32", [3], "int64", []), ("uint8", [3], "int64", []),
          ("float32", [], "float64", []), ("int32", [], "float32", [2]),
          ("bool", [3], "int64", [])]
    for da, sa, db, sb in zd:
        binop(G, "add", da, sa, db, sb, " (0-d promotion)")
        binop(G, "mul", db, sb, da, sa, " (0-d promotion)")
    # operators
    a32, b32 = rnd("float32", [2, 3]), rnd("float32", [3], "b")
    ai, bi = rnd("int64", [2, 3]), rnd("int64", [3], "nz")
    for sym, fn in [("+", lambda x, y: x + y), ("-", lambda x, y: x - y), ("*", lambda x, y: x * y),
                    ("/", lambda x, y: x / y)]:
        case(G, "operator %s f32" % sym, "a %s b" % sym, fn, [a32, b32])
        case(G, "operator %s i64" % sym, "a %s b" % sym, fn, [ai, bi])
    ap = rnd("float32", [2, 3], "pos")
    case(G, "operator ^ f32", "a ^ b", lambda x, y: x ** y, [ap, b32])
    case(G, "operator unary minus", "-a", lambda x: -x, [a32])
    case(G, "operator unary minus i64", "-a", lambda x: -x, [ai])
    case(G, "add with alpha", "a:add(b, 2)", lambda x, y: torch.add(x, y, alpha=2), [a32, b32])
    case(G, "sub with alpha", "a:sub(b, 0.5)", lambda x, y: torch.sub(x, y, alpha=0.5), [a32, b32])
    case(G, "torch.add function", "torch.add(a, b)", torch.add, [a32, b32])
    case(G, "torch.mul function", "torch.mul(a, b)", torch.mul, [a32, b32])
    case(G, "add transposed input", "a:t() + b", lambda x, y: x.t() + y,
         [rnd("float32", [3, 2]), rnd("float32", [3], "b")])
    case(G, "add two transposed", "a:t() * b:t()", lambda x, y: x.t() * y.t(),
         [rnd("float32", [3, 2]), rnd("float32", [3, 2], "b")])
    case(G, "add expanded", "a:expand(3, 4) + b", lambda x, y: x.expand(3, 4) + y,
         [rnd("float32", [3, 1]), rnd("float32", [3, 4], "b")])
    # every method is also torch.NAME(t, ...)
    for op in ["sub", "div", "pow", "maximum", "minimum", "remainder", "atan2", "eq", "ge",
               "logical_and", "logical_or"]:
        case(G, "torch.%s function" % op, "torch.%s(a, b)" % op, getattr(torch, op), [ap, b32])
    case(G, "torch.add function with scalar", "torch.add(a, 2.5)", lambda x: torch.add(x, 2.5), [a32])
    # bfloat16
    abf, bbf = rnd("bfloat16", [2, 3]), rnd("bfloat16", [3], "b")
    for op in ["add", "sub", "mul", "div", "maximum", "lt"]:
        case(G, "%s bf16" % op, "a:%s(b)" % op, getattr(torch, op), [abf, bbf])
    case(G, "add bf16 f32", "a:add(b)", torch.add, [abf, b32])
    case(G, "add bf16 i64", "a:add(b)", torch.add, [abf, bi])
    # specials
    sp = lit("f32_special", [0.0, -0.0, 1.0, -1.0, math.inf, -math.inf, math.nan], "float32")
    sq = lit("f32_special2", [0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 1.0], "float32")
    for op in ["add", "mul", "div", "maximum", "minimum", "eq", "lt"]:
        case(G, "%s special values" % op, "a:%s(b)" % op, getattr(torch, op), [sp, sq])
    case(G, "div special values reversed", "a:div(b)", torch.div, [sq, sp])
    un = lit("u8_wrap", [0, 1, 250], "uint8")
    un2 = lit("u8_wrap2", [1, 2, 10], "uint8")
    case(G, "uint8 sub wraps", "a - b", lambda x, y: x - y, [un, un2])
    case(G, "uint8 add wraps", "a + b", lambda x, y: x + y, [un, un2])
    case(G, "remainder negative (sign of divisor) f32", "a:remainder(b)", torch.remainder,
         [lit("f32_rem_a", [5.5, -5.5, 5.5, -5.5, 3.0], "float32"),
          lit("f32_rem_b", [2.0, 2.0, -2.0, -2.0, 1.5], "float32")])
    case(G, "remainder negative (sign of divisor) i64", "a:remainder(b)", torch.remainder,
         [lit("i64_rem_a", [7, -7, 7, -7, 6], "int64"), lit("i64_rem_b", [3, 3, -3, -3, 3], "int64")])
    case(G, "int div gives float, negatives", "a / b", lambda x, y: x / y,
         [lit("i64_div_a", [7, -7, 1, 0], "int64"), lit("i64_div_b", [2, 2, 3, 5], "int64")])
    case(G, "int div by zero gives inf/nan", "a / b", lambda x, y: x / y,
         [lit("i64_dz_a", [1, -1, 0], "int64"), lit("i64_dz_b", [0, 0, 0], "int64")])


def gen_scalar():
    G = "elementwise"
    for dt in MAIN6:
        t = rnd(dt, [2, 3], "pos" if dt != "bool" else "a")
        for s in ["2", "2.5", "-3"]:
            sv = int(s) if "." not in s else float(s)
            for op in ["add", "sub", "mul", "div", "pow", "remainder", "lt"]:
                if dt == "uint8" and sv < 0:
                    continue
                case(G, "%s %s[2,3] scalar %s" % (op, SHORT[dt], s), "a:%s(%s)" % (op, s),
                     lambda x, op=op, sv=sv: getattr(torch, op)(x, sv), [t])
        for sym, fn in [("+", lambda x: 3 + x), ("-", lambda x: 3 - x), ("*", lambda x: 3 * x),
                        ("/", lambda x: 3 / x), ("^", lambda x: 2 ** x)]:
            case(G, "scalar 3 %s %s tensor" % (sym, SHORT[dt]), "%s %s a" % ("2" if sym == "^" else "3", sym),
                 fn, [t])
        for sym, fn in [("+", lambda x: x + 1.5), ("*", lambda x: x * 2), ("^", lambda x: x ** 2),
                        ("/", lambda x: x / 2)]:
            s = {"+": "1.5", "*": "2", "^": "2", "/": "2"}[sym]
            case(G, "%s tensor %s %s" % (SHORT[dt], sym, s), "a %s %s" % (sym, s), fn, [t])
    # a Lua number with an integer value counts as an integer scalar
    case(G, "int64 + 2.0 stays int64 (integer-valued number)", "a + 2.0", lambda x: x + 2,
         [rnd("int64", [2, 3], "pos")])
    case(G, "int32 * 2.0 stays int32", "a * 2.0", lambda x: x * 2, [rnd("int32", [2, 3], "pos")])
    case(G, "bool + 2 gives int64", "a + 2", lambda x: x + 2, [rnd("bool", [2, 3])])
    case(G, "bool * 1.5 gives float32", "a * 1.5", lambda x: x * 1.5, [rnd("bool", [2, 3])])
    case(G, "float64 * 1.5 stays float64", "a * 1.5", lambda x: x * 1.5, [rnd("float64", [2, 3])])
    case(G, "maximum with 0-d", "a:maximum(b)", torch.maximum, [rnd("float32", [2, 3]), rnd("float32", [], "b")])


UNOPS = ["abs", "neg", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "gelu", "sin",
         "cos", "sign", "floor", "ceil", "round", "reciprocal", "log1p", "expm1", "square",
         "logical_not", "erf"]


def unary_py(op):
    if op == "gelu":
        return F.gelu
    if op == "relu":
        return torch.relu
    return getattr(torch, op)


def gen_unary():
    G = "elementwise"
    base = [-2.5, -1.0, -0.5, 0.0, 0.5, 1.0, 2.5, 3.7]
    lit("f32_unary", base, "float32")
    lit("f64_unary", base, "float64")
    lit("f32_wide", [-100.0, -20.0, -3.3, 0.001, 7.25, 20.0, 88.0, 100.0], "float32")
    lit("f64_wide", [-100.0, -20.0, -3.3, 0.001, 7.25, 20.0, 88.0, 100.0], "float64")
    lit("i64_unary", [-3, -1, 0, 1, 2, 5], "int64")
    lit("i32_unary", [-3, -1, 0, 1, 2, 5], "int32")
    lit("u8_unary", [0, 1, 2, 5, 200], "uint8")
    lit("b_unary", [True, False, True], "bool")
    lit("f32_round", [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, 2.6], "float32")
    lit("f32_positive", [0.01, 0.5, 1.0, 2.0, 9.0, 100.0], "float32")
    for op in UNOPS:
        for inp in ["f32_unary", "f64_unary", "f32_wide", "f64_wide", "i64_unary", "i32_unary",
                    "u8_unary", "b_unary"]:
            if op == "neg" and inp == "u8_unary":
                continue    # wraps, not worth pinning down
            if op in ("square",) and inp == "u8_unary":
                continue    # overflows
            py = unary_py(op)
            case(G, "%s %s" % (op, inp), "a:%s()" % op, py, [inp])
        case(G, "torch.%s function" % op, "torch.%s(a)" % op, unary_py(op), ["f32_unary"])
    for op in ["sqrt", "rsqrt", "log", "reciprocal", "log1p"]:
        case(G, "%s positive" % op, "a:%s()" % op, unary_py(op), ["f32_positive"])
    for op in ["round", "floor", "ceil"]:
        case(G, "%s halves" % op, "a:%s()" % op, unary_py(op), ["f32_round"])
    case(G, "gelu('tanh') f32", 'a:gelu("tanh")', lambda x: F.gelu(x, approximate="tanh"), ["f32_unary"])
    case(G, "gelu('tanh') f64", 'a:gelu("tanh")', lambda x: F.gelu(x, approximate="tanh"), ["f64_wide"])
    case(G, "gelu('none') f32", 'a:gelu("none")', lambda x: F.gelu(x, approximate="none"), ["f32_unary"])
    # special values where PyTorch is well defined
    lit("f32_spec_log", [0.0, -1.0, 1.0, math.inf, math.nan, -0.0], "float32")
    lit("f32_spec_inf", [-math.inf, math.inf, 0.0, -0.0, 1000.0, -1000.0], "float32")
    lit("f64_spec_log", [0.0, -1.0, 1.0, math.inf, math.nan, -0.0], "float64")
    for op in ["log", "sqrt", "rsqrt", "reciprocal", "log1p", "abs", "neg", "exp", "square"]:
        case(G, "%s special" % op, "a:%s()" % op, unary_py(op), ["f32_spec_log"])
        case(G, "%s special f64" % op, "a:%s()" % op, unary_py(op), ["f64_spec_log"])
    lit("f32_log1p_spec", [-1.0, -2.0, 1e-10, -0.5], "float32")
    case(G, "log1p(-1) = -inf", "a:log1p()", torch.log1p, ["f32_log1p_spec"])
    for op in ["exp", "tanh", "sigmoid", "relu", "expm1", "sign", "abs", "floor", "gelu", "erf"]:
        case(G, "%s of infinities" % op, "a:%s()" % op, unary_py(op), ["f32_spec_inf"])
    for op in ["exp", "tanh", "sigmoid", "sqrt", "relu", "erf"]:
        case(G, "%s bf16" % op, "a:%s()" % op, unary_py(op), [rnd("bfloat16", [6], "pos")])
    case(G, "abs of transposed", "a:t():abs()", lambda x: x.t().abs(), [rnd("float32", [3, 2])])


def gen_where_clamp():
    G = "elementwise"
    # isclose/allclose: near and far values, NaN, infinities, 0 beside a tiny number
    near_a = lit("f32_close_a", [1.0, 1.00001, 1.001, math.nan, math.inf, -math.inf, 0.0, 1e-9, 2.0], "float32")
    near_b = lit("f32_close_b", [1.0, 1.0, 1.0, math.nan, math.inf, math.inf, 1e-9, 0.0, -2.0], "float32")
    case(G, "isclose defaults", "a:isclose(b)", lambda x, y: torch.isclose(x, y), [near_a, near_b])
    case(G, "isclose rtol 1e-3", "a:isclose(b, 1e-3)", lambda x, y: torch.isclose(x, y, 1e-3), [near_a, near_b])
    case(G, "isclose atol in a table", "a:isclose(b, {atol = 1e-2})", lambda x, y: torch.isclose(x, y, atol=1e-2),
         [near_a, near_b])
    case(G, "isclose equal_nan", "torch.isclose(a, b, {equal_nan = true})",
         lambda x, y: torch.isclose(x, y, equal_nan=True), [near_a, near_b])
    case(G, "isclose broadcast float64", "a:isclose(b, 0.1, 0.1)", lambda x, y: torch.isclose(x, y, 0.1, 0.1),
         [rnd("float64", [2, 3]), rnd("float64", [3], "b")])
    for op in ["isnan", "isinf", "isfinite"]:
        for inp in ["f32_spec_log", "f64_spec_log", "f32_spec_inf"]:
            case(G, "%s %s" % (op, inp), "a:%s()" % op, getattr(torch, op), [inp])
        case(G, "%s int64" % op, "torch.%s(a)" % op, getattr(torch, op), [rnd("int64", [2, 3])])
    tri = rnd("float32", [3, 4])
    for fn in ["tril", "triu"]:
        for k in [0, 1, -1]:
            case(G, "%s(%d)" % (fn, k), "a:%s(%d)" % (fn, k), lambda x, fn=fn, k=k: getattr(x, fn)(k), [tri])
        case(G, "%s batched" % fn, "torch.%s(a)" % fn, getattr(torch, fn), [rnd("float64", [2, 3, 3])])
    fill_mask = lit("b_fill_mask", [True, False, True], "bool")
    case(G, "masked_fill a number", "a:masked_fill(b, 7.5)", lambda x, m: x.masked_fill(m, 7.5),
         [rnd("float32", [2, 3]), fill_mask])
    case(G, "masked_fill int64 with a fraction", "a:masked_fill(b, 1.5)", lambda x, m: x.masked_fill(m, 1.5),
         [rnd("int64", [2, 3]), fill_mask])
    case(G, "masked_fill a 0-d tensor", "a:masked_fill(b, c)", lambda x, m, v: x.masked_fill(m, v),
         [rnd("float64", [2, 3]), fill_mask, lit("f64_fill_value", -2.25, "float64")])
    case(G, "masked_fill broadcasts the tensor to the mask", "torch.masked_fill(a, b, 3)",
         lambda x, m: torch.masked_fill(x, m, 3), [rnd("float32", [3]), rnd("bool", [2, 3], "c")])
    case(G, "masked_fill_ in place", "a:masked_fill_(b, 0)", lambda x, m: x.masked_fill_(m, 0),
         [rnd("float32", [2, 3]), fill_mask])
    case(G, "isclose bool", "a:isclose(b)", lambda x, y: torch.isclose(x, y),
         [lit("b_close_a", [True, False, True, False], "bool"), lit("b_close_b", [True, True, False, False], "bool")])
    case(G, "allclose false", "a:allclose(b)", lambda x, y: torch.allclose(x, y), [near_a, near_b],
         value_dtype="bool")
    case(G, "allclose true", "a:allclose(b, 1e-3, 1e-2, true)",
         lambda x, y: torch.allclose(x, y, 1e-3, 1e-2, True), [lit("f32_close_c", [1.0, 1.00001, 1.001, math.nan], "float32"),
                                                                       lit("f32_close_d", [1.0, 1.0, 1.0, math.nan], "float32")],
         value_dtype="bool")
    cond = rnd("bool", [2, 3], "c")
    cond3 = rnd("bool", [3], "c")
    a, b = rnd("float32", [2, 3]), rnd("float32", [2, 3], "b")
    case(G, "where same shapes", "torch.where(c, a, b)", lambda x, y, c: torch.where(c, x, y), [a, b, cond])
    case(G, "where broadcast cond [3]", "torch.where(c, a, b)", lambda x, y, c: torch.where(c, x, y), [a, b, cond3])
    case(G, "where broadcast b [3]", "torch.where(c, a, b)", lambda x, y, c: torch.where(c, x, y),
         [a, rnd("float32", [3], "b"), cond])
    case(G, "where int64 and float32", "torch.where(c, a, b)", lambda x, y, c: torch.where(c, x, y),
         [rnd("int64", [2, 3]), b, cond])
    case(G, "where float64 and float32", "torch.where(c, a, b)", lambda x, y, c: torch.where(c, x, y),
         [rnd("float64", [2, 3]), b, cond])
    case(G, "where scalar other", "torch.where(b, a, 0.0)", lambda x, c: torch.where(c, x, 0.0), [a, cond])
    # (1.0 would be an integer scalar in Lua, so use fractions)
    case(G, "where scalar both", "torch.where(a, 1.5, -1.5)", lambda c: torch.where(c, 1.5, -1.5), [cond])
    case(G, "where integer scalars give int64", "torch.where(a, 1, -1)", lambda c: torch.where(c, 1, -1), [cond])
    case(G, "where cond from comparison", "torch.where(a:gt(0), a, b)",
         lambda x, y: torch.where(x > 0, x, y), [a, b])
    case(G, "where method form", "a:where(c, b)", lambda x, y, c: x.where(c, y), [a, b, cond])
    u = "f32_unary"
    for dt in ["float32", "float64"]:
        t = rnd(dt, [2, 4])
        case(G, "clamp(-1, 1) %s" % dt, "a:clamp(-1, 1)", lambda x: x.clamp(-1, 1), [t])
        case(G, "clamp(-0.5) min only %s" % dt, "a:clamp(-0.5)", lambda x: x.clamp(-0.5), [t])
        case(G, "clamp(-0.5, nil) min only %s" % dt, "a:clamp(-0.5, nil)", lambda x: x.clamp(-0.5, None), [t])
        case(G, "clamp(nil, 0.25) max only %s" % dt, "a:clamp(nil, 0.25)", lambda x: x.clamp(None, 0.25), [t])
        case(G, "clamp_min(0) %s" % dt, "a:clamp_min(0)", lambda x: x.clamp_min(0), [t])
        case(G, "clamp_max(0.5) %s" % dt, "a:clamp_max(0.5)", lambda x: x.clamp_max(0.5), [t])
        case(G, "clamp(2, 1) min > max %s" % dt, "a:clamp(2, 1)", lambda x: x.clamp(2, 1), [t])
    case(G, "torch.clamp function", "torch.clamp(a, -1, 1)", lambda x: torch.clamp(x, -1, 1), [u])
    case(G, "clamp keeps nan", "a:clamp(-1, 1)", lambda x: x.clamp(-1, 1), ["f32_spec_log"])
    case(G, "clamp int64", "a:clamp(-1, 3)", lambda x: x.clamp(-1, 3), [rnd("int64", [2, 4])])
    case(G, "clamp int64 float bounds", "a:clamp(-1.5, 2.5)", lambda x: x.clamp(-1.5, 2.5), [rnd("int64", [2, 4])])
    case(G, "clamp uint8", "a:clamp(2, 6)", lambda x: x.clamp(2, 6), [rnd("uint8", [2, 4])])


def gen_inplace():
    G = "elementwise"
    a, b = rnd("float32", [2, 3]), rnd("float32", [3], "b")
    a64 = rnd("float64", [2, 3])
    ai = rnd("int64", [2, 3])
    C = [
        ("add_ tensor", "a:add_(b); return a", lambda x, y: x.add_(y), a, b),
        ("add_ returns self", "return a:add_(b)", lambda x, y: x.add_(y), a, b),
        ("add_ with alpha", "a:add_(b, 2.5); return a", lambda x, y: x.add_(y, alpha=2.5), a, b),
        ("add_ scalar", "a:add_(1.5); return a", lambda x: x.add_(1.5), a),
        ("sub_ with alpha", "a:sub_(b, 2); return a", lambda x, y: x.sub_(y, alpha=2), a, b),
        ("mul_ tensor broadcast", "a:mul_(b); return a", lambda x, y: x.mul_(y), a, b),
        ("mul_ scalar", "a:mul_(-2); return a", lambda x: x.mul_(-2), a),
        ("div_ tensor", "a:div_(b); return a", lambda x, y: x.div_(y), a, b),
        ("div_ scalar float64", "a:div_(4); return a", lambda x: x.div_(4), a64),
        ("add_ float64 from float32", "a:add_(b); return a", lambda x, y: x.add_(y), a64, b),
        ("add_ int64 int scalar", "a:add_(3); return a", lambda x: x.add_(3), ai),
        ("mul_ int64 by int64", "a:mul_(b); return a", lambda x, y: x.mul_(y), ai, rnd("int64", [3], "b")),
        ("zero_", "a:zero_(); return a", lambda x: x.zero_(), a),
        ("fill_ 3.5", "a:fill_(3.5); return a", lambda x: x.fill_(3.5), a),
        ("fill_ int64 with 2.7 truncates", "a:fill_(2.7); return a", lambda x: x.fill_(2.7), ai),
        ("fill_ bool", "a:fill_(true); return a", lambda x: x.fill_(True), rnd("bool", [2, 3])),
        ("copy_ same shape", "a:copy_(b); return a", lambda x, y: x.copy_(y), a, rnd("float32", [2, 3], "b")),
        ("copy_ broadcast [3] -> [2,3]", "a:copy_(b); return a", lambda x, y: x.copy_(y), a, b),
        ("copy_ float32 -> int64 truncates", "a:copy_(b); return a", lambda x, y: x.copy_(y), ai,
         rnd("float32", [2, 3], "b")),
        ("copy_ int64 -> float64", "a:copy_(b); return a", lambda x, y: x.copy_(y), a64, ai),
        ("copy_ bool -> float32", "a:copy_(b); return a", lambda x, y: x.copy_(y), a, rnd("bool", [2, 3])),
        ("copy_ into transposed view", "a:t():copy_(b); return a", lambda x, y: (x.t().copy_(y), x)[1], a,
         rnd("float32", [3, 2])),
        ("clamp_", "a:clamp_(-1, 1); return a", lambda x: x.clamp_(-1, 1), a),
        ("clamp_ max only", "a:clamp_(nil, 0); return a", lambda x: x.clamp_(None, 0), a),
        ("exp_", "a:exp_(); return a", lambda x: x.exp_(), a),
        ("relu_", "a:relu_(); return a", lambda x: x.relu_(), a),
        ("neg_", "a:neg_(); return a", lambda x: x.neg_(), a),
        ("abs_", "a:abs_(); return a", lambda x: x.abs_(), a),
        ("sigmoid_", "a:sigmoid_(); return a", lambda x: x.sigmoid_(), a),
        ("tanh_ float64", "a:tanh_(); return a", lambda x: x.tanh_(), a64),
        ("add_ self aliasing", "a:add_(a); return a", lambda x: x.add_(x), a),
        ("mul_ on a view", "a[{{}, {0, nil, 2}}]:mul_(10); return a",
         lambda x: (x[:, 0::2].mul_(10), x)[1], a),
        ("cumsum_", "a:cumsum_(1); return a", lambda x: x.cumsum_(1), a),
        ("cumprod_ int64", "a:cumprod_(0); return a", lambda x: x.cumprod_(0), ai),
        ("divide_ floor", "a:divide_(b, {rounding_mode=\"floor\"}); return a",
         lambda x, y: x.divide_(y, rounding_mode="floor"), a, b),
        ("true_divide_", "a:true_divide_(b); return a", lambda x, y: x.true_divide_(y), a, b),
        ("floor_divide_", "a:floor_divide_(b); return a", lambda x, y: x.floor_divide_(y), a, b),
        ("multiply_", "a:multiply_(b); return a", lambda x, y: x.multiply_(y), a, b),
        ("subtract_ with alpha", "a:subtract_(b, {alpha=2}); return a", lambda x, y: x.subtract_(y, alpha=2), a, b),
        ("greater_ keeps the dtype", "a:greater_(b); return a", lambda x, y: x.greater_(y), a, b),
        ("less_equal_", "a:less_equal_(0); return a", lambda x: x.less_equal_(0), a),
        ("not_equal_ int64", "a:not_equal_(0); return a", lambda x: x.not_equal_(0), ai),
        ("logical_xor_", "a:logical_xor_(b); return a", lambda x, y: x.logical_xor_(y), a, b),
        ("bitwise_and_", "a:bitwise_and_(b); return a", lambda x, y: x.bitwise_and_(y), ai,
         rnd("int64", [3], "b")),
        ("bitwise_not_", "a:bitwise_not_(); return a", lambda x: x.bitwise_not_(), ai),
        ("sgn_", "a:sgn_(); return a", lambda x: x.sgn_(), a),
        ("absolute_", "a:absolute_(); return a", lambda x: x.absolute_(), a),
        ("addr_", "a:addr_(b, c); return a", lambda x, y, z: x.addr_(y, z), rnd("float32", [2, 3]),
         rnd("float32", [2], "b"), rnd("float32", [3], "c")),
        ("baddbmm_", "a:baddbmm_(b, c, {beta=0.5, alpha=2}); return a",
         lambda x, y, z: x.baddbmm_(y, z, beta=0.5, alpha=2), rnd("float32", [2, 2, 3]),
         rnd("float32", [2, 2, 4], "b"), rnd("float32", [2, 4, 3], "c")),
        ("polygamma_", "a:polygamma_(1); return a", lambda x: x.polygamma_(1), rnd("float32", [2, 3], "pos")),
        ("hardshrink method", "return a:hardshrink(0.3)", lambda x: x.hardshrink(0.3), a),
        ("split_with_sizes", "return unpack(torch.split_with_sizes(a, {1, 2}, 1))",
         lambda x: torch.split_with_sizes(x, [1, 2], 1), a),
        ("unsafe_chunk", "return unpack(a:unsafe_chunk(2, 0))", lambda x: x.unsafe_chunk(2, 0), a),
    ]
    for name, expr, py, *ins in C:
        case(G, name, expr, py, ins)


# ================================================================ reductions

def red_case(G, t, label, op, dims):
    pyop = getattr(torch, op)
    case(G, "%s() %s" % (op, label), "a:%s()" % op, lambda x: pyop(x), [t])
    for d in dims:
        for keep in [False, True]:
            k = "true" if keep else "false"
            case(G, "%s(%d, %s) %s" % (op, d, k, label), "a:%s(%d, %s)" % (op, d, k),
                 lambda x, d=d, keep=keep: pyop(x, d, keepdim=keep), [t])
    case(G, "%s(%d) %s" % (op, dims[1], label), "a:%s(%d)" % (op, dims[1]),
         lambda x: pyop(x, dims[1]), [t])


def gen_reduce():
    G = "reduce"

    nx = rnd("float32", [3, 4])
    case(G, "norm", "a:norm()", lambda x: x.norm(), [nx])
    case(G, "norm fro", 'a:norm("fro")', lambda x: x.norm("fro"), [nx])
    for p, lua_p in [(1, "1"), (3, "3"), (0, "0"), (float("inf"), "math.huge"), (float("-inf"), "-math.huge"), (0.5, "0.5")]:
        case(G, "norm p=%s" % lua_p, "a:norm(%s)" % lua_p, lambda x, p=p: x.norm(p), [nx])
    case(G, "norm dim 1", "a:norm(2, 1)", lambda x: x.norm(2, 1), [nx])
    case(G, "norm p=1 dim 0 keepdim", "torch.norm(a, 1, 0, true)", lambda x: torch.norm(x, 1, 0, True), [nx])
    case(G, "norm float64 dim -1", "a:norm(2, -1)", lambda x: x.norm(2, -1), [rnd("float64", [2, 3, 2])])
    t3 = rnd("float32", [2, 3, 4])
    t2 = rnd("float64", [3, 4])
    dims3 = [0, 1, 2, -1]
    dims2 = [0, 1, -1]
    for op in ["sum", "mean", "prod", "max", "min", "argmax", "argmin"]:
        red_case(G, t3, "f32[2,3,4]", op, dims3)
        red_case(G, t2, "f64[3,4]", op, dims2)
    for op in ["var", "std"]:
        for t, label, dims in [(t3, "f32[2,3,4]", dims3), (t2, "f64[3,4]", dims2)]:
            py = getattr(torch, op)
            case(G, "%s() %s" % (op, label), "a:%s()" % op, lambda x, py=py: py(x), [t])
            for corr in [0, 1]:
                case(G, "%s(nil, correction=%d) %s" % (op, corr, label),
                     "a:%s(nil, {correction=%d})" % (op, corr),
                     lambda x, py=py, corr=corr: py(x, None, correction=corr), [t])
            case(G, "%s(1) %s" % (op, label), "a:%s(1)" % op, lambda x, py=py: py(x, 1), [t])
            for d in dims:
                for corr in [0, 1]:
                    for keep in [False, True]:
                        k = "true" if keep else "false"
                        case(G, "%s(%d, correction=%d, keepdim=%s) %s" % (op, d, corr, k, label),
                             "a:%s(%d, {correction=%d, keepdim=%s})" % (op, d, corr, k),
                             lambda x, py=py, d=d, corr=corr, keep=keep: py(x, d, correction=corr, keepdim=keep),
                             [t])
    # integers: sum and prod give int64, max keeps the dtype
    for dt in ["int64", "int32", "uint8", "bool"]:
        t = rnd(dt, [3, 4], "small" if dt != "bool" else "a")
        for op in ["sum", "prod", "max", "min"]:
            if dt == "bool" and op in ("max", "min", "prod"):
                continue
            case(G, "%s() %s" % (op, dt), "a:%s()" % op, getattr(torch, op), [t])
            if op in ("sum", "prod"):
                case(G, "%s(1) %s" % (op, dt), "a:%s(1)" % op, lambda x, op=op: getattr(torch, op)(x, 1), [t])
                case(G, "%s(0, true) %s" % (op, dt), "a:%s(0, true)" % op,
                     lambda x, op=op: getattr(torch, op)(x, 0, keepdim=True), [t])
    tp = rnd("int64", [3, 4], "perm")
    for op in ["max", "min", "argmax", "argmin"]:
        case(G, "%s(1) int64 distinct" % op, "a:%s(1)" % op, lambda x, op=op: getattr(torch, op)(x, 1), [tp])
        case(G, "%s() int64 distinct" % op, "a:%s()" % op, lambda x, op=op: getattr(torch, op)(x), [tp])
    # all / any
    for dt, v in [("bool", "a"), ("bool", "b"), ("float32", "a")]:
        t = rnd(dt, [3, 4], v)
        for op in ["all", "any"]:
            case(G, "%s() %s_%s" % (op, dt, v), "a:%s()" % op, getattr(torch, op), [t])
            for d in [0, 1, -1]:
                case(G, "%s(%d) %s_%s" % (op, d, dt, v), "a:%s(%d)" % (op, d),
                     lambda x, op=op, d=d: getattr(torch, op)(x, d), [t])
            case(G, "%s(1, true) %s_%s" % (op, dt, v), "a:%s(1, true)" % op,
                 lambda x, op=op: getattr(torch, op)(x, 1, keepdim=True), [t])
    lit("b_all_true", [True, True, True], "bool")
    lit("b_all_false", [False, False, False], "bool")
    for n in ["b_all_true", "b_all_false"]:
        for op in ["all", "any"]:
            case(G, "%s() %s" % (op, n), "a:%s()" % op, getattr(torch, op), [n])
    # reductions of views and functions
    case(G, "sum(0) of transposed", "a:t():sum(0)", lambda x: x.t().sum(0), [t2])
    case(G, "mean(-1) of narrowed", "a:narrow(1, 1, 2):mean(-1)", lambda x: x.narrow(1, 1, 2).mean(-1), [t3])
    case(G, "torch.sum function", "torch.sum(a, 1)", lambda x: torch.sum(x, 1), [t2])
    case(G, "torch.mean function all", "torch.mean(a)", torch.mean, [t2])
    case(G, "torch.max function dim", "torch.max(a, 1)", lambda x: torch.max(x, 1), [t2])
    case(G, "torch.min function all", "torch.min(a)", torch.min, [t2])
    case(G, "torch.argmax function", "torch.argmax(a, 0)", lambda x: torch.argmax(x, 0), [t2])
    case(G, "torch.prod function", "torch.prod(a, 1, true)", lambda x: torch.prod(x, 1, keepdim=True), [t2])
    case(G, "torch.var function", "torch.var(a, 1, {correction=0})", lambda x: torch.var(x, 1, correction=0), [t2])
    case(G, "torch.std function", "torch.std(a)", torch.std, [t2])
    case(G, "torch.all function", "torch.all(a)", torch.all, [rnd("bool", [3, 4], "a")])
    case(G, "torch.any function dim", "torch.any(a, 1)", lambda x: torch.any(x, 1), [rnd("bool", [3, 4], "a")])
    case(G, "sum bf16", "a:sum()", torch.sum, [rnd("bfloat16", [8])])
    case(G, "mean bf16 dim", "a:mean(1)", lambda x: x.mean(1), [rnd("bfloat16", [2, 4])])
    case(G, "sum 0-d", "a:sum()", torch.sum, [rnd("float32", [])])
    case(G, "sum of empty is 0", "torch.zeros(0):sum()", lambda: torch.zeros(0).sum())
    case(G, "max of nan propagates", "a:max()", torch.max, ["f32_special"])
    case(G, "sum large f32 (1000 ones)", "torch.ones(1000):sum()", lambda: torch.ones(1000).sum())
    # softmax / log_softmax
    for op in ["softmax", "log_softmax"]:
        pyop = getattr(torch, op)
        for t, label, dims in [(t3, "f32[2,3,4]", [0, 1, 2, -1]), (t2, "f64[3,4]", [0, 1, -1, -2]),
                               (rnd("float32", [5]), "f32[5]", [0, -1])]:
            for d in dims:
                case(G, "%s(%d) %s" % (op, d, label), "a:%s(%d)" % (op, d), lambda x, d=d: pyop(x, d), [t])
        for vals, label in [([1000.0, 1001.0], "large"), ([-1000.0, 1000.0], "spread"),
                            ([0.0, -math.inf, 1.0], "-inf mask"), ([5.0, 5.0, 5.0, 5.0], "equal")]:
            for dt in ["float32", "float64"]:
                n = lit("%s_sm_%s" % (SHORT[dt], label.replace(" ", "_").replace("-", "m")), vals, dt)
                case(G, "%s %s %s" % (op, label, dt), "a:%s(0)" % op, lambda x: pyop(x, 0), [n])
        n = lit("f32_sm_large2d", [[1000.0, 1001.0, 1002.0], [-5.0, 0.0, 5.0]], "float32")
        case(G, "%s large rows f32" % op, "a:%s(1)" % op, lambda x: pyop(x, 1), [n])
        case(G, "%s large cols f32" % op, "a:%s(0)" % op, lambda x: pyop(x, 0), [n])
        case(G, "torch.%s function" % op, "torch.%s(a, 1)" % op, lambda x: pyop(x, 1), [t2])
        case(G, "%s of transposed" % op, "a:t():%s(1)" % op, lambda x: pyop(x.t(), 1), [t2])


# ================================================================ matmul

def gen_matmul():
    G = "matmul"
    for dt in ["float32", "float64"]:
        s = SHORT[dt]
        C = [
            ("1-D . 1-D", [4], [4]),
            ("2-D . 1-D", [3, 4], [4]),
            ("1-D . 2-D", [4], [4, 3]),
            ("2-D . 2-D", [3, 4], [4, 2]),
            ("3-D . 2-D", [2, 3, 4], [4, 5]),
            ("2-D . 3-D", [3, 4], [2, 4, 5]),
            ("3-D . 3-D", [2, 3, 4], [2, 4, 2]),
            ("4-D . 3-D broadcast", [2, 1, 3, 4], [5, 4, 2]),
            ("3-D . 3-D broadcast batch 1", [1, 3, 4], [3, 4, 2]),
            ("1-D . 3-D", [4], [2, 4, 3]),
            ("3-D . 1-D", [2, 3, 4], [4]),
            ("2-D . 2-D 1x1", [1, 1], [1, 1]),
            ("2-D . 2-D wide", [2, 7], [7, 9]),
        ]
        for name, sa, sb in C:
            a, b = rnd(dt, sa), rnd(dt, sb, "b")
            case(G, "matmul %s %s" % (name, s), "a:matmul(b)", torch.matmul, [a, b])
        a, b = rnd(dt, [3, 4]), rnd(dt, [4, 2], "b")
        case(G, "torch.matmul %s" % s, "torch.matmul(a, b)", torch.matmul, [a, b])
        case(G, "mm %s" % s, "a:mm(b)", torch.mm, [a, b])
        case(G, "torch.mm %s" % s, "torch.mm(a, b)", torch.mm, [a, b])
        bt = rnd(dt, [2, 4], "b")
        at = rnd(dt, [4, 3])
        case(G, "mm transposed b %s" % s, "a:mm(b:t())", lambda x, y: x.mm(y.t()), [a, bt])
        case(G, "mm transposed a %s" % s, "a:t():mm(b)", lambda x, y: x.t().mm(y), [at, b])
        case(G, "mm both transposed %s" % s, "a:t():mm(b:t())", lambda x, y: x.t().mm(y.t()), [at, bt])
        case(G, "matmul of sliced %s" % s, "a[{{}, {0, nil, 2}}]:matmul(b)", lambda x, y: x[:, 0::2].matmul(y),
             [rnd(dt, [3, 8]), b])
        ba, bb = rnd(dt, [2, 3, 4]), rnd(dt, [2, 4, 5], "b")
        case(G, "bmm %s" % s, "a:bmm(b)", torch.bmm, [ba, bb])
        case(G, "torch.bmm %s" % s, "torch.bmm(a, b)", torch.bmm, [ba, bb])
        case(G, "bmm transposed %s" % s, "a:bmm(b:transpose(1, 2))", lambda x, y: x.bmm(y.transpose(1, 2)),
             [ba, rnd(dt, [2, 5, 4], "b")])
        case(G, "mm bigger %s" % s, "a:mm(b)", torch.mm, [rnd(dt, [6, 5]), rnd(dt, [5, 7], "b")])
    case(G, "mm 0-size inner", "torch.zeros(2, 0):mm(torch.zeros(0, 3))", lambda: torch.zeros(2, 0).mm(torch.zeros(0, 3)))


# ================================================================ conversion

def gen_convert():
    G = "convert"
    lit("f32_cast", [-2.7, -0.5, -0.0, 0.0, 0.5, 2.7, 100.9, -100.9], "float32")
    lit("f32_cast_pos", [0.0, 0.5, 1.9, 2.5, 254.9, 7.0], "float32")
    lit("f32_cast_bool", [0.0, -0.0, 0.1, -2.0, math.nan, math.inf], "float32")
    lit("f32_bf16", [1.00390625, 1.01171875, 3.14159, -2.5, 65504.0, 1e10, 3.4028234663852886e38,
                     -1.1754943508222875e-38, 0.1, 1e-3, math.inf, math.nan], "float32")
    lit("f64_bf16", [1.00390625, 1.0039062500001, 3.14159, 0.1, -300.7], "float64")
    lit("i64_cast", [-3, 0, 1, 7, 255, 1000], "int64")
    lit("b_cast", [True, False, True], "bool")
    C = [
        ("float32 -> int64 truncates toward zero", "a:to(torch.int64)", lambda x: x.to(torch.int64), "f32_cast"),
        ("float32 -> int32 truncates", "a:to(torch.int32)", lambda x: x.to(torch.int32), "f32_cast"),
        ("float32 -> int64 via long()", "a:long()", lambda x: x.long(), "f32_cast"),
        ("float32 -> int32 via int()", "a:int()", lambda x: x.int(), "f32_cast"),
        ("float32 -> uint8", "a:to(torch.uint8)", lambda x: x.to(torch.uint8), "f32_cast_pos"),
        ("float32 -> bool", "a:to(torch.bool)", lambda x: x.to(torch.bool), "f32_cast_bool"),
        ("float32 -> bool via bool()", "a:bool()", lambda x: x.bool(), "f32_cast_bool"),
        ("float32 -> float64", "a:to(torch.float64)", lambda x: x.to(torch.float64), "f32_cast"),
        ("float32 -> float64 via double()", "a:double()", lambda x: x.double(), "f32_cast"),
        ('float32 -> "float64" string', 'a:to("float64")', lambda x: x.to(torch.float64), "f32_cast"),
        ("float32 -> float32 same", "a:to(torch.float32)", lambda x: x.to(torch.float32), "f32_cast"),
        ("float32 -> bfloat16 rounds to nearest even", "a:to(torch.bfloat16)", lambda x: x.to(torch.bfloat16), "f32_bf16"),
        ("float64 -> bfloat16", "a:to(torch.bfloat16)", lambda x: x.to(torch.bfloat16), "f64_bf16"),
        ("bfloat16 -> float32 exact", "a:to(torch.bfloat16):float()", lambda x: x.to(torch.bfloat16).float(), "f32_bf16"),
        ("float64 -> float32", "a:float()", lambda x: x.float(), "f64_bf16"),
        ("int64 -> float32", "a:float()", lambda x: x.float(), "i64_cast"),
        ("int64 -> int32", "a:int()", lambda x: x.int(), "i64_cast"),
        ("int64 -> bool", "a:bool()", lambda x: x.bool(), "i64_cast"),
        ("int64 -> bfloat16", "a:to(torch.bfloat16)", lambda x: x.to(torch.bfloat16), "i64_cast"),
        ("bool -> float32", "a:float()", lambda x: x.float(), "b_cast"),
        ("bool -> int64", "a:long()", lambda x: x.long(), "b_cast"),
        ("bool -> uint8", "a:to(torch.uint8)", lambda x: x.to(torch.uint8), "b_cast"),
        ('to("cpu", torch.float64)', 'a:to("cpu", torch.float64)', lambda x: x.to("cpu", torch.float64), "i64_cast"),
        ('to("cpu")', 'a:to("cpu")', lambda x: x.to("cpu"), "f32_cast"),
        ("cpu()", "a:cpu()", lambda x: x.cpu(), "f32_cast"),
        ("clone()", "a:clone()", lambda x: x.clone(), "f32_cast"),
        ("detach()", "a:detach()", lambda x: x.detach(), "f32_cast"),
        ("transposed -> int64", "a:t():long()", lambda x: x.t().long(), rnd("float32", [2, 3])),
    ]
    for name, expr, py, inp in C:
        case(G, name, expr, py, [inp])
    # item and tolist
    V = [
        ("item float32 0-d", "a:item()", lambda x: x.item(), lit("f32_0d", 3.25, "float32"), "float32"),
        ("item float32 [1]", "a:item()", lambda x: x.item(), lit("f32_1", [-1.5], "float32"), "float32"),
        ("item float32 [1,1]", "a:item()", lambda x: x.item(), lit("f32_1x1", [[0.1]], "float32"), "float32"),
        ("item float64 0-d", "a:item()", lambda x: x.item(), lit("f64_0d", 0.1, "float64"), "float64"),
        ("item int64", "a:item()", lambda x: x.item(), lit("i64_0d", -42, "int64"), "int64"),
        ("item int64 large", "a:item()", lambda x: x.item(), lit("i64_0d_big", 2 ** 40 + 3, "int64"), "int64"),
        ("item bool true", "a:item()", lambda x: x.item(), lit("b_0d", True, "bool"), "bool"),
        ("item bool false", "a:item()", lambda x: x.item(), lit("b_1_false", [False], "bool"), "bool"),
        ("item bfloat16", "a:item()", lambda x: x.item(), lit("bf16_0d", 3.140625, "bfloat16"), "bfloat16"),
        ("item of sum", "a:sum():item()", lambda x: x.sum().item(), rnd("float64", [2, 3]), "float64"),
        ("item of select", "a[{1, 2}]:item()", lambda x: x[1, 2].item(), rnd("float64", [2, 3]), "float64"),
        ("tolist float32 2-d", "a:tolist()", lambda x: x.tolist(), rnd("float32", [2, 3]), "float32"),
        ("tolist float64 1-d", "a:tolist()", lambda x: x.tolist(), rnd("float64", [4]), "float64"),
        ("tolist int64 3-d", "a:tolist()", lambda x: x.tolist(), rnd("int64", [2, 2, 2]), "int64"),
        ("tolist bool", "a:tolist()", lambda x: x.tolist(), "b_cast", "bool"),
        ("tolist 0-d gives number", "a:tolist()", lambda x: x.tolist(), "f64_0d", "float64"),
        ("tolist of transposed", "a:t():tolist()", lambda x: x.t().tolist(), rnd("int64", [2, 3]), "int64"),
        ("tolist uint8", "a:tolist()", lambda x: x.tolist(), rnd("uint8", [4]), "uint8"),
        ("tolist bfloat16", "a:to(torch.bfloat16):tolist()", lambda x: x.to(torch.bfloat16).tolist(), "f32_bf16",
         "bfloat16"),
    ]
    for name, expr, py, inp, vdt in V:
        case(G, name, expr, py, [inp], value_dtype=vdt)


# ================================================================ printing

def gen_print():
    G = "print"
    P = [
        ("float32 [[1,2],[3,4]]", lit("p_f32_int", [[1, 2], [3, 4]], "float32")),
        ("float32 decimals", lit("p_f32_dec", [0.1234, -1.5, 100.25], "float32")),
        ("float32 random 2-d", rnd("float32", [3, 4], "p")),
        ("float32 negatives aligned", lit("p_f32_neg", [[-1.0, 2.5], [3.0, -40.125]], "float32")),
        ("float32 sci small", lit("p_f32_sci", [1e-5, 1.0], "float32")),
        ("float32 sci large", lit("p_f32_big", [1e10, 1.0, -2.5], "float32")),
        ("float32 nan inf", lit("p_f32_nan", [math.nan, math.inf, -math.inf, 1.0], "float32")),
        ("float32 nan inf decimals", lit("p_f32_nan2", [math.nan, 1.5, -math.inf], "float32")),
        ("float32 3-d", lit("p_f32_3d", [[[1, -2], [3, 4]], [[5, 6], [7, 8.5]]], "float32")),
        ("float32 line wrap (20 elements)", lit("p_f32_wrap", [i / 3 for i in range(20)], "float32")),
        ("float32 zeros", lit("p_f32_zero", [0.0, 0.0], "float32")),
        ("float32 negative zero", lit("p_f32_nzero", [-0.0, 1.0], "float32")),
        ("float32 one element", lit("p_f32_one", [2.0], "float32")),
        ("float32 0-d", lit("p_f32_0d", 3.5, "float32")),
        ("float32 0-d integer value", lit("p_f32_0d_int", 3.0, "float32")),
        ("float64 shows dtype", lit("p_f64", [1.5, 2.25], "float64")),
        ("float64 0-d", lit("p_f64_0d", 0.1, "float64")),
        ("int64 2-d", lit("p_i64", [[0, 1, 2], [3, 4, 5]], "int64")),
        ("int64 negatives", lit("p_i64_neg", [-10, 5, 300], "int64")),
        ("int64 0-d", lit("p_i64_0d", 7, "int64")),
        ("int32 shows dtype", lit("p_i32", [[1, 2], [3, 4]], "int32")),
        ("uint8 shows dtype", lit("p_u8", [0, 255, 7], "uint8")),
        ("bool", lit("p_b", [True, False, True], "bool")),
        ("bool 2-d", lit("p_b2", [[True, False], [False, True]], "bool")),
        ("bool 0-d", lit("p_b_0d", True, "bool")),
        ("bfloat16 shows dtype", lit("p_bf16", [1.5, 2.25, -3.0], "bfloat16")),
    ]
    for name, inp in P:
        case(G, name, "tostring(a)", lambda x: str(x), [inp])
    E = [
        ("empty 1-d", "tostring(torch.zeros(0))", lambda: str(torch.zeros(0))),
        ("empty 2-d shows size", "tostring(torch.zeros(2, 0))", lambda: str(torch.zeros(2, 0))),
        ("empty int64", "tostring(torch.zeros(0, {dtype=torch.int64}))", lambda: str(torch.zeros(0, dtype=torch.int64))),
        ("empty float64", "tostring(torch.zeros(0, {dtype=torch.float64}))", lambda: str(torch.zeros(0, dtype=torch.float64))),
        ("2000 floats abbreviated", "tostring(torch.arange(2000):float())", lambda: str(torch.arange(2000).float())),
        ("2000 int64 abbreviated", "tostring(torch.arange(2000))", lambda: str(torch.arange(2000))),
        ("50x40 int64 abbreviated", "tostring(torch.arange(2000):reshape(50, 40))",
         lambda: str(torch.arange(2000).reshape(50, 40))),
        ("50x40 float32 abbreviated", "tostring(torch.arange(2000):reshape(50, 40):float() / 7)",
         lambda: str(torch.arange(2000).reshape(50, 40).float() / 7)),
        ("1000 elements not abbreviated", "tostring(torch.arange(1000):reshape(100, 10))",
         lambda: str(torch.arange(1000).reshape(100, 10))),
        ("1001 elements abbreviated", "tostring(torch.ones(1001))", lambda: str(torch.ones(1001))),
        ("2x3x400 abbreviated", "tostring(torch.arange(2400):reshape(2, 3, 400))",
         lambda: str(torch.arange(2400).reshape(2, 3, 400))),
        ("eye(3)", "tostring(torch.eye(3))", lambda: str(torch.eye(3))),
        ("transposed view", "tostring(torch.arange(6):reshape(2, 3):t())", lambda: str(torch.arange(6).reshape(2, 3).t())),
        ("linspace", "tostring(torch.linspace(0, 1, 5))", lambda: str(torch.linspace(0, 1, 5))),
        ("float64 2-d", "tostring(torch.ones(2, 2, {dtype=torch.float64}))", lambda: str(torch.ones(2, 2, dtype=torch.float64))),
    ]
    # set_printoptions, put back to the default after each
    def printed(opts, make):
        torch.set_printoptions(**opts)
        try:
            return str(make())
        finally:
            torch.set_printoptions(profile="default")
    for name, lua_opts, opts, lua_make, make in [
        ("precision 2", "{precision = 2}", {"precision": 2}, "torch.tensor({1.123456, 2.5, 100})",
         lambda: torch.tensor([1.123456, 2.5, 100])),
        ("sci_mode", "{sci_mode = true}", {"sci_mode": True}, "torch.tensor({1.5, 2.5})", lambda: torch.tensor([1.5, 2.5])),
        ("sci_mode off keeps the width", "{sci_mode = false}", {"sci_mode": False}, "torch.tensor({1e-6, 1})",
         lambda: torch.tensor([1e-6, 1.0])),
        ("threshold and edgeitems", "{threshold = 5, edgeitems = 2}", {"threshold": 5, "edgeitems": 2},
         "torch.arange(10)", lambda: torch.arange(10)),
        ("linewidth", "{linewidth = 30}", {"linewidth": 30}, "torch.arange(20):float() / 3",
         lambda: torch.arange(20).float() / 3),
        ("profile short", '{profile = "short"}', {"profile": "short"}, "torch.arange(2000):float() / 7",
         lambda: torch.arange(2000).float() / 7),
        ("profile full", '{profile = "full"}', {"profile": "full"}, "torch.arange(1100)", lambda: torch.arange(1100)),
    ]:
        E.append(("set_printoptions " + name,
                  "return (function() torch.set_printoptions(%s); local s = tostring(%s); "
                  "torch.set_printoptions({profile = \"default\"}); return s end)()" % (lua_opts, lua_make),
                  lambda opts=opts, make=make: printed(opts, make)))
    E += [
        ("bool comparison result", "tostring(torch.arange(4):gt(1))", lambda: str(torch.arange(4) > 1)),
    ]
    for name, expr, py in E:
        case(G, name, expr, py)


# ================================================================ main

# ================================================================ compositions

def gen_composite():
    """lua/dplua/composite.lua and einsum.lua against PyTorch."""
    G = "composite"
    gf = lit("f64_gradient_field", [[1.0, 2, 4, 8, 10], [3, 1, 0, 2, 5], [0.5, -1, 2.5, 7, 1]], "float64")
    gx = lit("f64_gradient_coords", [0.0, 0.5, 1.5, 3, 3.5], "float64")
    case(G, "gradient: every dim", "unpack(torch.gradient(a))", lambda f: torch.gradient(f), [gf])
    case(G, "gradient: dim 1, spacing 2, second-order edges", "unpack(torch.gradient(a, {dim = 1, spacing = 2.0, edge_order = 2}))",
         lambda f: torch.gradient(f, dim=1, spacing=2.0, edge_order=2), [gf])
    case(G, "gradient: spacing per dim", "unpack(torch.gradient(a, {spacing = {0.5, 3}}))",
         lambda f: torch.gradient(f, spacing=[0.5, 3.0]), [gf])
    case(G, "gradient: coordinates", "unpack(torch.gradient(a, {dim = 1, spacing = {b}}))",
         lambda f, x: torch.gradient(f, dim=1, spacing=[x]), [gf, gx])
    case(G, "gradient: coordinates, second-order edges", "unpack(torch.gradient(a, {dim = {1}, spacing = {b}, edge_order = 2}))",
         lambda f, x: torch.gradient(f, dim=[1], spacing=[x], edge_order=2), [gf, gx])
    case(G, "gradient: dim 0 of three rows, second order", "unpack(torch.gradient(a, {dim = 0, edge_order = 2}))",
         lambda f: torch.gradient(f, dim=0, edge_order=2), [gf])
    inf, nan = float("inf"), float("nan")
    na = lit("f64_nextafter_x", [1.0, 1.0, 0, 0, 2.0, -2.0, 1e-310, inf, 5, nan, -0.75, 1e300], "float64")
    nb = lit("f64_nextafter_y", [2.0, 0, 1, -1, 0, -3, 0, 0, 5, 1, 1, inf], "float64")
    case(G, "nextafter float64: one unit in the last place, exactly", "a:nextafter(b)", lambda x, y: x.nextafter(y),
         [na, nb], rtol=0, atol=0)
    fa = lit("f32_nextafter_x", [1.0, 1.0, 0, 2.0, 1e-40, -3.5, 1e38], "float32")
    fb = lit("f32_nextafter_y", [2.0, 0, 1, 0, 0, 0, inf], "float32")
    pts = lit("f64_histdd_points", [[0.1, 0.2], [0.5, 0.9], [0.9, 0.1], [0.3, 0.3], [1.0, 1.0], [1.2, -0.5]], "float64")
    case(G, "histogramdd: counts per coordinate", "local h, e = torch.histogramdd(a, {2, 3}); return h, unpack(e)",
         lambda p: (lambda r: (r.hist, *r.bin_edges))(torch.histogramdd(p, [2, 3])), [pts])
    case(G, "histogramdd: range, weight, density",
         "local h, e = torch.histogramdd(a, 2, {range = {0, 1, 0, 2}, weight = torch.arange(1, 7):double(), density = true}); "
         "return h, unpack(e)",
         lambda p: (lambda r: (r.hist, *r.bin_edges))(torch.histogramdd(p, 2, range=[0., 1., 0., 2.],
                                                                         weight=torch.arange(1, 7).double(), density=True)),
         [pts])
    case(G, "histogramdd: edges as tensors", "local h = torch.histogramdd(a, {torch.tensor({0, 0.5, 2}, {dtype = torch.float64}), "
         "torch.tensor({-1, 0, 1}, {dtype = torch.float64})}); return h",
         lambda p: torch.histogramdd(p, [torch.tensor([0, 0.5, 2], dtype=torch.float64),
                                         torch.tensor([-1., 0, 1], dtype=torch.float64)]).hist, [pts])
    case(G, "range includes its end", "torch.range(0, 1, 0.25)", lambda: torch.range(0, 1, 0.25))
    case(G, "frobenius_norm", "torch.frobenius_norm(a)", lambda t: torch.frobenius_norm(t, dim=(-2, -1)),
         [rnd("float64", [3, 4])])
    case(G, "nuclear_norm", "torch.nuclear_norm(a)", lambda t: torch.nuclear_norm(t), [rnd("float64", [3, 4])])
    case(G, "nextafter float32, subnormals too (read as float64)", "torch.nextafter(a, b):double()",
         lambda x, y: torch.nextafter(x, y).double(), [fa, fb], rtol=0, atol=0)
    x = rnd("float64", [3, 4])
    y = rnd("float64", [3, 4], "b")
    v = rnd("float64", [4])
    w = rnd("float64", [3], "b")
    c3 = rnd("float64", [2, 3, 4])
    sq = rnd("float64", [4, 4])
    f32 = rnd("float32", [3, 4])
    i64 = rnd("int64", [3, 4])
    unit = lit("f64_unit", [-0.99, -0.5, -0.1, 0.0, 0.3, 0.75, 0.98], "float64")
    big = lit("f64_big", [1.5, 2.0, 10.0, 100.0, 3.25], "float64")
    prob = lit("f64_prob", [0.001, 0.2, 0.5, 0.8, 0.999], "float64")
    special = lit("f64_special", [float("nan"), float("inf"), -float("inf"), 1.5, -2.0, float("nan")], "float64")
    inf_rows = lit("f64_inf_rows", [[-float("inf"), -float("inf")], [1.0, -float("inf")], [800.0, 801.0]], "float64")
    # log-sum-exp
    case(G, "logsumexp dim 1", "a:logsumexp(1)", lambda a: a.logsumexp(1), [x])
    case(G, "logsumexp dims keepdim", "a:logsumexp({0, 2}, true)", lambda a: a.logsumexp((0, 2), True), [c3])
    case(G, "logsumexp of infinite rows", "torch.logsumexp(a, 1)", lambda a: torch.logsumexp(a, 1), [inf_rows])
    case(G, "logsumexp f32", "a:logsumexp(-1)", lambda a: a.logsumexp(-1), [f32])
    case(G, "logaddexp", "a:logaddexp(b)", lambda a, b: a.logaddexp(b), [x, y])
    case(G, "logaddexp broadcast", "torch.logaddexp(a, b)", torch.logaddexp, [x, v])
    # elementwise
    for op in ["log2", "log10", "exp2", "tan", "sinh", "cosh", "atan", "asinh", "trunc", "frac"]:
        case(G, op, "a:%s()" % op, lambda a, op=op: getattr(a, op)(), [x])
    for op in ["asin", "acos", "atanh"]:
        case(G, op, "a:%s()" % op, lambda a, op=op: getattr(a, op)(), [unit])
    case(G, "acosh", "a:acosh()", lambda a: a.acosh(), [big])
    case(G, "log2 f32", "a:log2()", lambda a: a.log2(), [rnd("float32", [5], "pos")])
    case(G, "hypot", "a:hypot(b)", lambda a, b: a.hypot(b), [x, y])
    case(G, "xlogy", "a:xlogy(b)", lambda a, b: a.xlogy(b), [lit("f64_xlogy_x", [0.0, 0.0, 1.5, 2.0], "float64"),
                                                             lit("f64_xlogy_y", [0.0, 3.0, 2.0, 0.5], "float64")])
    case(G, "logit", "a:logit()", lambda a: a.logit(), [prob])
    case(G, "logit eps", "a:logit(0.01)", lambda a: a.logit(0.01), [prob])
    case(G, "nan_to_num", "a:nan_to_num()", lambda a: a.nan_to_num(), [special])
    case(G, "nan_to_num values", "a:nan_to_num({nan = 1, posinf = 2, neginf = -3})",
         lambda a: a.nan_to_num(1.0, 2.0, -3.0), [special])
    case(G, "nan_to_num f32", "a:float():nan_to_num()", lambda a: a.float().nan_to_num(), [special])
    # rearranging
    case(G, "flip", "a:flip({0, 2})", lambda a: a.flip((0, 2)), [c3])
    case(G, "flip one dim", "a:flip(1)", lambda a: a.flip(1), [x])
    case(G, "fliplr", "a:fliplr()", lambda a: a.fliplr(), [x])
    case(G, "flipud", "a:flipud()", lambda a: a.flipud(), [x])
    case(G, "roll flat", "a:roll(5)", lambda a: a.roll(5), [x])
    case(G, "roll dims", "a:roll({1, -2}, {0, 2})", lambda a: a.roll((1, -2), (0, 2)), [c3])
    case(G, "roll negative", "torch.roll(a, -1, 1)", lambda a: torch.roll(a, -1, 1), [x])
    for k in [1, 2, 3, -1]:
        case(G, "rot90 k=%d" % k, "a:rot90(%d, {1, 2})" % k, lambda a, k=k: a.rot90(k, (1, 2)), [c3])
    case(G, "unbind", "unpack(a:unbind(1))", lambda a: a.unbind(1), [x])
    case(G, "movedim", "a:movedim(0, 2)", lambda a: a.movedim(0, 2), [c3])
    case(G, "movedim lists", "a:movedim({0, 1}, {2, 0})", lambda a: a.movedim((0, 1), (2, 0)), [c3])
    case(G, "swapaxes", "a:swapaxes(0, 2)", lambda a: a.swapaxes(0, 2), [c3])
    case(G, "repeat", 'a["repeat"](a, 2, 1, 3)', lambda a: a.repeat(2, 1, 3), [x])
    case(G, "tile", "a:tile({2})", lambda a: a.tile((2,)), [x])
    case(G, "tile more dims", "a:tile({2, 1, 2})", lambda a: a.tile((2, 1, 2)), [x])
    case(G, "repeat_interleave", "a:repeat_interleave(2)", lambda a: a.repeat_interleave(2), [x])
    case(G, "repeat_interleave dim", "a:repeat_interleave(torch.tensor({1, 0, 3}, {dtype = torch.int64}), 0)",
         lambda a: a.repeat_interleave(torch.tensor([1, 0, 3]), 0), [x])
    case(G, "repeat_interleave counts", "torch.repeat_interleave(torch.tensor({2, 0, 1}, {dtype = torch.int64}))",
         lambda: torch.repeat_interleave(torch.tensor([2, 0, 1])))
    case(G, "repeat_interleave int64", "a:repeat_interleave(2, 1)", lambda a: a.repeat_interleave(2, 1), [i64])
    # diagonals
    for off in [0, 1, -2, 5]:
        case(G, "diagonal offset %d" % off, "a:diagonal(%d)" % off, lambda a, off=off: a.diagonal(off), [x])
    case(G, "diagonal dims", "a:diagonal({offset = 1, dim1 = 2, dim2 = 0})",
         lambda a: a.diagonal(offset=1, dim1=2, dim2=0), [c3])
    case(G, "diag of a vector", "a:diag()", lambda a: a.diag(), [v])
    case(G, "diag of a vector, k=-1", "a:diag(-1)", lambda a: a.diag(-1), [v])
    case(G, "diag of a matrix, k=1", "torch.diag(a, 1)", lambda a: torch.diag(a, 1), [x])
    case(G, "trace", "a:trace()", lambda a: a.trace(), [x])
    case(G, "outer", "a:outer(b)", lambda a, b: a.outer(b), [v, w])
    # products with a sum
    case(G, "addmm", "a:addmm(b, c)", lambda a, b, c: a.addmm(b, c), [x, rnd("float64", [3, 2]), rnd("float64", [2, 4])])
    case(G, "addmm beta alpha", "torch.addmm(a, b, c, {beta = 0.5, alpha = -2})",
         lambda a, b, c: torch.addmm(a, b, c, beta=0.5, alpha=-2), [v, rnd("float64", [3, 2]), rnd("float64", [2, 4])])
    case(G, "baddbmm", "a:baddbmm(b, c, {beta = 0})", lambda a, b, c: a.baddbmm(b, c, beta=0),
         [rnd("float64", [2, 3, 5]), c3, rnd("float64", [2, 4, 5])])
    case(G, "addmv", "a:addmv(b, c)", lambda a, b, c: a.addmv(b, c), [w, x, v])
    case(G, "addr", "a:addr(b, c, {alpha = 3})", lambda a, b, c: a.addr(b, c, alpha=3), [x, w, v])
    case(G, "tensordot 1", "a:tensordot(b, 1)", lambda a, b: torch.tensordot(a, b, 1), [c3, rnd("float64", [4, 3])])
    case(G, "tensordot lists", "torch.tensordot(a, b, {{0, 2}, {1, 0}})",
         lambda a, b: torch.tensordot(a, b, ([0, 2], [1, 0])), [c3, rnd("float64", [4, 2, 5])])
    # scans and order statistics
    case(G, "cumprod", "a:cumprod(1)", lambda a: a.cumprod(1), [x])
    case(G, "cumprod with a zero", "a:cumprod(0)", lambda a: a.cumprod(0),
         [lit("f64_cumprod", [2.0, -1.5, 0.0, 3.0, -2.0], "float64")])
    case(G, "cumprod int64", "a:cumprod(0)", lambda a: a.cumprod(0), [i64])
    case(G, "median", "a:median()", lambda a: a.median(), [x])
    case(G, "median dim", "a:median(1)", lambda a: tuple(a.median(1)), [x])
    case(G, "median dim keepdim", "a:median(0, true)", lambda a: tuple(a.median(0, True)), [x])
    case(G, "quantile", "a:quantile(0.3)", lambda a: a.quantile(0.3), [x])
    case(G, "quantile dim list", "a:quantile({0.1, 0.5, 1}, 1)", lambda a: a.quantile(torch.tensor([0.1, 0.5, 1.0], dtype=torch.float64), 1), [x])
    case(G, "quantile keepdim", "a:quantile(0.75, {dim = 0, keepdim = true})", lambda a: a.quantile(0.75, 0, True), [x])
    case(G, "nansum", "a:nansum()", lambda a: a.nansum(), [lit("f64_nan", [1.0, float("nan"), 2.5, -1.0], "float64")])
    case(G, "nanmean dim", "a:nanmean(1)", lambda a: a.nanmean(1),
         [lit("f64_nan2", [[1.0, float("nan"), 2.5], [float("nan"), -1.0, 3.0]], "float64")])
    case(G, "var_mean", "a:var_mean(1)", lambda a: torch.var_mean(a, 1), [x])
    case(G, "std_mean", "a:std_mean(0, {correction = 0, keepdim = true})",
         lambda a: torch.std_mean(a, 0, unbiased=False, keepdim=True), [x])
    case(G, "var_mean all", "a:var_mean()", lambda a: torch.var_mean(a), [x])
    # selection
    m = rnd("bool", [3, 4])
    case(G, "masked_select", "a:masked_select(b)", lambda a, b: a.masked_select(b), [x, m])
    case(G, "masked_select broadcast", "a:masked_select(b)", lambda a, b: a.masked_select(b), [v, m])
    idx = lit("i64_take", [[0, 11], [5, 3]], "int64")
    case(G, "take", "a:take(b)", lambda a, b: a.take(b), [x, idx])
    idx2 = lit("i64_along", [[0, 3], [2, 2], [1, 0]], "int64")
    case(G, "take_along_dim", "a:take_along_dim(b, 1)", lambda a, b: a.take_along_dim(b, 1), [x, idx2])
    case(G, "take_along_dim argsort", "a:take_along_dim(a:argsort(1), 1)",
         lambda a: a.take_along_dim(a.argsort(1), 1), [x])
    # several tensors
    case(G, "meshgrid ij", "unpack(torch.meshgrid(a, b, {indexing = 'ij'}))",
         lambda a, b: torch.meshgrid(a, b, indexing="ij"), [v, w])
    case(G, "meshgrid xy", "unpack(torch.meshgrid({a, b}, {indexing = 'xy'}))",
         lambda a, b: torch.meshgrid(a, b, indexing="xy"), [v, w])
    case(G, "broadcast_tensors", "torch.broadcast_tensors(a, b)", lambda a, b: torch.broadcast_tensors(a, b),
         [x, rnd("float64", [3, 1], "c")])
    case(G, "broadcast_shapes", "torch.broadcast_shapes({2, 1, 3}, {4, 1}, {3})",
         lambda: list(torch.broadcast_shapes((2, 1, 3), (4, 1), (3,))), kind="value", value_dtype="int64")
    case(G, "cartesian_prod", "torch.cartesian_prod(a, b)", torch.cartesian_prod, [w, rnd("float64", [2], "c")])
    case(G, "hstack", "torch.hstack({a, b})", lambda a, b: torch.hstack((a, b)), [x, y])
    case(G, "hstack vectors", "torch.hstack(a, b)", lambda a, b: torch.hstack((a, b)), [v, w])
    case(G, "vstack", "torch.vstack({a, b})", lambda a, b: torch.vstack((a, b)), [v, v])
    case(G, "dstack", "torch.dstack({a, b})", lambda a, b: torch.dstack((a, b)), [x, y])
    case(G, "column_stack", "torch.column_stack({a, b})", lambda a, b: torch.column_stack((a, b)), [w, x])
    case(G, "block_diag", "torch.block_diag(a, b, c)", lambda a, b, c: torch.block_diag(a, b, c),
         [x, w, rnd("float64", [2, 2], "c")])
    case(G, "cdist", "torch.cdist(a, b)", lambda a, b: torch.cdist(a, b), [x, rnd("float64", [5, 4], "c")])
    case(G, "cdist p=1", "a:cdist(b, 1)", lambda a, b: torch.cdist(a, b, 1), [c3, rnd("float64", [2, 2, 4], "c")])
    # einsum
    E = [
        ("matmul", "ij,jk->ik", [x, rnd("float64", [4, 2], "c")]),
        ("bmm", "bij,bjk->bik", [c3, rnd("float64", [2, 4, 5], "c")]),
        ("trace", "ii", [sq]),
        ("diagonal", "ii->i", [sq]),
        ("transpose", "ij->ji", [x]),
        ("sum all", "ij->", [x]),
        ("column sums", "ij->j", [x]),
        ("outer", "i,j->ij", [v, w]),
        ("dot", "i,i", [v, v]),
        ("hadamard rows", "ij,ij->i", [x, y]),
        ("implicit", "jk,ij", [rnd("float64", [4, 2], "c"), x]),
        ("ellipsis", "...ij,...jk", [c3, rnd("float64", [4, 5], "c")]),
        ("ellipsis out", "b...,b...->...", [c3, c3]),
        ("attention scores", "bhld,bhsd->bhls", [rnd("float64", [2, 2, 3, 4]), rnd("float64", [2, 2, 5, 4], "c")]),
        ("three operands", "ij,jk,kl->il", [x, rnd("float64", [4, 2], "c"), rnd("float64", [2, 5], "d")]),
        ("broadcast size 1", "bij,bjk->bik", [rnd("float64", [1, 3, 4]), rnd("float64", [2, 4, 2], "c")]),
        ("repeated in one and summed", "iij->j", [rnd("float64", [3, 3, 2])]),
        ("bilinear", "bn,anm,bm->ba", [rnd("float64", [2, 3]), rnd("float64", [4, 3, 5], "c"), rnd("float64", [2, 5], "d")]),
        ("upper labels", "Ab,bC->AC", [x, rnd("float64", [4, 2], "c")]),
    ]
    for name, eq, ins in E:
        letters = "abcd"[:len(ins)]
        case(G, "einsum " + name, 'torch.einsum("%s", %s)' % (eq, ", ".join(letters)),
             lambda *t, eq=eq: torch.einsum(eq, *t), ins)
    case(G, "einsum list of operands", 'torch.einsum("ij,jk", {a, b})', lambda a, b: torch.einsum("ij,jk", [a, b]),
         [x, rnd("float64", [4, 2], "c")])
    case(G, "einsum f32", 'torch.einsum("ij,kj->ik", a, b)', lambda a, b: torch.einsum("ij,kj->ik", a, b),
         [f32, rnd("float32", [5, 4], "b")])
    # running maxima, k-th values, products, splitting
    ties = lit("f64_ties", [[1.0, 3.0, 3.0, 2.0, 5.0], [float("nan"), 1.0, 0.0, 4.0, 4.0]], "float64")
    case(G, "cummax", "a:cummax(1)", lambda a: tuple(a.cummax(1)), [ties])
    case(G, "cummin", "a:cummin(0)", lambda a: tuple(a.cummin(0)), [x])
    case(G, "logcumsumexp", "a:logcumsumexp(1)", lambda a: a.logcumsumexp(1), [x])
    case(G, "kthvalue", "a:kthvalue(2, 1)", lambda a: tuple(a.kthvalue(2, 1)), [x])
    case(G, "kthvalue keepdim", "a:kthvalue(3, 0, true)", lambda a: tuple(a.kthvalue(3, 0, True)), [x])
    v3a, v3b = rnd("float64", [4, 3]), rnd("float64", [4, 3], "b")
    case(G, "cross", "a:cross(b, 1)", lambda a, b: torch.cross(a, b, dim=1), [v3a, v3b])
    case(G, "cross first dim of size 3", "torch.cross(a, b)", lambda a, b: torch.cross(a, b), [v3a, v3b])
    case(G, "kron", "a:kron(b)", lambda a, b: torch.kron(a, b), [rnd("float64", [2, 3]), rnd("float64", [3, 2], "b")])
    case(G, "kron of a vector and a matrix", "torch.kron(a, b)", torch.kron, [w, rnd("float64", [2, 2], "b")])
    case(G, "dist", "a:dist(b, 3)", lambda a, b: a.dist(b, 3), [x, y])
    case(G, "type_as", "a:type_as(b)", lambda a, b: a.type_as(b), [i64, f32])
    case(G, "tensor_split sections", "unpack(a:tensor_split(3, 1))", lambda a: a.tensor_split(3, 1),
         [rnd("float64", [2, 7])])
    case(G, "tensor_split indices", "unpack(a:tensor_split({1, 3}, 0))", lambda a: a.tensor_split((1, 3), 0),
         [rnd("float64", [5, 2])])
    case(G, "hsplit", "unpack(a:hsplit(2))", lambda a: a.hsplit(2), [x])
    case(G, "vsplit", "unpack(torch.vsplit(a, {1}))", lambda a: torch.vsplit(a, [1]), [x])
    # logical and bitwise
    b1, b2 = rnd("bool", [3, 4]), rnd("bool", [3, 4], "b")
    case(G, "logical_xor", "a:logical_xor(b)", lambda a, b: a.logical_xor(b), [b1, b2])
    case(G, "logical_xor of numbers", "a:logical_xor(b)", lambda a, b: a.logical_xor(b), [x, i64])
    case(G, "bitwise_and bool", "a:bitwise_and(b)", lambda a, b: a.bitwise_and(b), [b1, b2])
    case(G, "bitwise_or int64", "a:bitwise_or(b)", lambda a, b: a.bitwise_or(b), [i64, rnd("int64", [3, 4], "b")])
    case(G, "bitwise_xor int64 number", "a:bitwise_xor(5)", lambda a: a.bitwise_xor(5), [i64])
    case(G, "bitwise_not int64", "a:bitwise_not()", lambda a: a.bitwise_not(), [i64])
    case(G, "bitwise_not bool", "a:bitwise_not()", lambda a: a.bitwise_not(), [b1])
    # counting
    ints = lit("i64_unique", [3, 1, 3, 2, 1, 7, 3], "int64")
    case(G, "unique", "a:unique()", lambda a: a.unique(), [ints])
    case(G, "unique inverse counts", "a:unique({return_inverse = true, return_counts = true})",
         lambda a: a.unique(return_inverse=True, return_counts=True), [ints])
    case(G, "unique float 2-D inverse", "a:unique(true, true)", lambda a: torch.unique(a, True, True),
         [lit("f64_unique2", [[0.5, -1.0, 0.5], [2.0, -1.0, 0.25]], "float64")])
    case(G, "unique dim 0", "a:unique({dim = 0, return_counts = true})", lambda a: torch.unique(a, dim=0, return_counts=True),
         [lit("i64_rows", [[1, 2], [0, 5], [1, 2], [0, 4]], "int64")])
    case(G, "unique bool", "a:unique()", lambda a: a.unique(), [b1])
    case(G, "bincount", "a:bincount()", lambda a: a.bincount(), [lit("i64_bins", [1, 4, 1, 0, 4, 4], "int64")])
    case(G, "bincount weights minlength", "a:bincount(b, 7)", lambda a, b: a.bincount(b, 7),
         [lit("i64_bins", [1, 4, 1, 0, 4, 4], "int64"), lit("f64_bin_w", [0.5, 1.0, 2.0, 0.25, 3.0, 1.5], "float64")])
    case(G, "histc", "a:histc(4, -2, 2)", lambda a: a.histc(4, -2, 2), [x])
    case(G, "histc own range", "a:histc(5)", lambda a: a.histc(5), [x])
    sseq = lit("f64_sorted", [1.0, 3.0, 3.0, 5.0, 7.0], "float64")
    svals = lit("f64_search", [[3.0, 0.5], [6.0, 9.0]], "float64")
    case(G, "searchsorted", "torch.searchsorted(a, b)", torch.searchsorted, [sseq, svals])
    case(G, "searchsorted right", "torch.searchsorted(a, b, {right = true})",
         lambda a, b: torch.searchsorted(a, b, right=True), [sseq, svals])
    case(G, "searchsorted rows", "torch.searchsorted(a, b)", torch.searchsorted,
         [lit("f64_sorted_rows", [[1.0, 2.0, 4.0], [0.0, 5.0, 6.0]], "float64"), svals])
    case(G, "bucketize", "a:bucketize(b, true)", lambda a, b: torch.bucketize(a, b, right=True), [svals, sseq])
    case(G, "tril_indices", "torch.tril_indices(3, 4)", lambda: torch.tril_indices(3, 4))
    case(G, "triu_indices offset", "torch.triu_indices(4, 3, 1)", lambda: torch.triu_indices(4, 3, 1))
    case(G, "tril_indices negative offset", "torch.tril_indices(4, 4, -1)", lambda: torch.tril_indices(4, 4, -1))
    case(G, "diag_embed", "a:diag_embed()", lambda a: torch.diag_embed(a), [x])
    case(G, "diag_embed offset", "a:diag_embed(-1)", lambda a: torch.diag_embed(a, -1), [w])
    # more of the small operations
    case(G, "broadcast_to", "a:broadcast_to({2, 3, 4})", lambda a: a.broadcast_to((2, 3, 4)), [x])
    case(G, "diff", "a:diff()", lambda a: a.diff(), [x])
    case(G, "diff n=2 dim 0", "a:diff(2, 0)", lambda a: a.diff(2, 0), [c3])
    case(G, "diff prepend append", "a:diff({dim = 0, prepend = b, append = c})",
         lambda a, b, c: a.diff(dim=0, prepend=b, append=c), [x, rnd("float64", [1, 4], "c"), rnd("float64", [2, 4], "d")])
    case(G, "diff bool", "a:diff()", lambda a: a.diff(), [b1])
    case(G, "diff int64", "a:diff(1, 0)", lambda a: a.diff(1, 0), [i64])
    case(G, "isin", "torch.isin(a, b)", torch.isin, [i64, lit("i64_isin", [0, 3, -5, 9], "int64")])
    case(G, "isin invert", "a:isin(b, {invert = true})", lambda a, b: torch.isin(a, b, invert=True),
         [i64, lit("i64_isin", [0, 3, -5, 9], "int64")])
    case(G, "aminmax", "a:aminmax()", lambda a: tuple(torch.aminmax(a)), [x])
    case(G, "aminmax dim keepdim", "a:aminmax({dim = 1, keepdim = true})",
         lambda a: tuple(torch.aminmax(a, dim=1, keepdim=True)), [x])
    case(G, "fmod", "a:fmod(b)", lambda a, b: a.fmod(b), [x, rnd("float64", [3, 4], "nz")])
    case(G, "fmod number", "a:fmod(-1.5)", lambda a: a.fmod(-1.5), [x])
    case(G, "fmod int64", "a:fmod(b)", lambda a, b: a.fmod(b), [i64, rnd("int64", [3, 4], "nz")])
    case(G, "heaviside", "a:heaviside(b)", lambda a, b: a.heaviside(b),
         [lit("f64_heavi", [-1.5, 0.0, 2.0, 0.0], "float64"), lit("f64_heavi_v", [0.5, 0.25, 3.0, -1.0], "float64")])
    case(G, "float_power", "a:float_power(b)", lambda a, b: a.float_power(b), [rnd("float32", [5], "pos"), rnd("float64", [5], "b")])
    case(G, "float_power int number", "a:float_power(2)", lambda a: a.float_power(2), [i64])
    case(G, "logspace", "torch.logspace(-1, 2, 7)", lambda: torch.logspace(-1, 2, 7))
    case(G, "logspace base 2 float64", "torch.logspace(0, 5, 6, 2, {dtype = torch.float64})",
         lambda: torch.logspace(0, 5, 6, 2, dtype=torch.float64))
    case(G, "mode", "a:mode()", lambda a: tuple(a.mode()),
         [lit("i64_mode", [[1, 3, 3, 2, 1, 3], [4, 4, 0, 0, 5, 5]], "int64")])
    case(G, "mode dim 0 keepdim", "a:mode(0, true)", lambda a: tuple(a.mode(0, True)),
         [lit("f64_mode", [[1.5, 2.0, 2.0], [1.5, -1.0, 2.0], [0.5, -1.0, 3.0]], "float64")])
    case(G, "combinations", "torch.combinations(a)", torch.combinations, [v])
    case(G, "combinations r=3", "torch.combinations(a, 3)", lambda a: torch.combinations(a, 3), [v])
    case(G, "combinations with replacement", "a:combinations({r = 2, with_replacement = true})",
         lambda a: torch.combinations(a, 2, with_replacement=True), [w])
    case(G, "trapezoid", "torch.trapezoid(a)", torch.trapezoid, [x])
    case(G, "trapz dx dim", "torch.trapz(a, {dx = 0.5, dim = 0})", lambda a: torch.trapz(a, dx=0.5, dim=0), [x])
    case(G, "trapezoid x", "torch.trapezoid(a, b)", torch.trapezoid, [x, lit("f64_trap_x", [0.0, 0.5, 2.0, 2.25], "float64")])
    case(G, "vander", "torch.vander(a)", torch.vander, [w])
    case(G, "vander N increasing", "torch.vander(a, {N = 4, increasing = true})",
         lambda a: torch.vander(a, N=4, increasing=True), [w])
    case(G, "histogram", "torch.histogram(a, 5)", lambda a: tuple(torch.histogram(a, 5)), [x])
    case(G, "histogram range weight density", "torch.histogram(a, 4, {range = {-2, 2}, weight = b, density = true})",
         lambda a, b: tuple(torch.histogram(a, 4, range=(-2.0, 2.0), weight=b, density=True)), [x, rnd("float64", [3, 4], "pos")])
    case(G, "histogram edges", "torch.histogram(a, b)", lambda a, b: tuple(torch.histogram(a, b)),
         [x, lit("f64_edges", [-3.0, -1.0, 0.0, 0.5, 4.0], "float64")])
    # tensor methods programs call
    case(G, "div floor", 'a:div(b, {rounding_mode = "floor"})', lambda a, b: a.div(b, rounding_mode="floor"),
         [x, rnd("float64", [3, 4], "nz")])
    case(G, "div trunc", 'torch.div(a, b, "trunc")', lambda a, b: torch.div(a, b, rounding_mode="trunc"),
         [x, rnd("float64", [3, 4], "nz")])
    case(G, "div floor int64", 'a:div(b, "floor")', lambda a, b: a.div(b, rounding_mode="floor"),
         [i64, rnd("int64", [3, 4], "nz")])
    case(G, "div trunc int64 number", 'a:div(-4, "trunc")', lambda a: a.div(-4, rounding_mode="trunc"), [i64])
    case(G, "floor_divide", "a:floor_divide(b)", lambda a, b: torch.floor_divide(a, b), [i64, rnd("int64", [3, 4], "nz")])
    case(G, "unfold", "a:unfold(1, 2, 1)", lambda a: a.unfold(1, 2, 1), [x])
    case(G, "unfold step", "a:unfold(2, 2, 2)", lambda a: a.unfold(2, 2, 2), [c3])
    case(G, "unfold dim 0", "a:unfold(0, 2, 1)", lambda a: a.unfold(0, 2, 1), [c3])
    case(G, "ravel", "a:t():ravel()", lambda a: a.t().ravel(), [x])
    case(G, "unflatten", "a:unflatten(1, {2, -1})", lambda a: a.unflatten(1, (2, -1)), [x])
    case(G, "sum_to_size", "a:sum_to_size({3, 1})", lambda a: a.sum_to_size((3, 1)), [x])
    case(G, "sum_to_size leading", "a:sum_to_size(3, 4)", lambda a: a.sum_to_size(3, 4), [rnd("float64", [2, 3, 4], "b")])
    case(G, "signbit", "a:signbit()", lambda a: a.signbit(), [lit("f64_signed_zero", [-0.0, 0.0, -2.5, 3.0, -float("inf")], "float64")])
    case(G, "copysign", "a:copysign(b)", lambda a, b: a.copysign(b),
         [x, lit("f64_signs", [-0.0, 0.0, -1.0, 2.0], "float64")])
    case(G, "copysign number", "a:copysign(-2)", lambda a: a.copysign(-2), [i64])
    case(G, "deg2rad", "a:deg2rad()", lambda a: a.deg2rad(), [x])
    case(G, "rad2deg", "a:rad2deg()", lambda a: a.rad2deg(), [x])
    case(G, "ldexp", "a:ldexp(b)", lambda a, b: a.ldexp(b), [x, rnd("int64", [3, 4], "small")])
    case(G, "angle", "a:angle()", lambda a: a.angle(), [lit("f64_angle", [-1.5, 0.0, 2.0, float("nan")], "float64")])
    case(G, "gcd", "a:gcd(b)", lambda a, b: a.gcd(b), [lit("i64_gcd_a", [12, -18, 0, 7, 0], "int64"),
                                                     lit("i64_gcd_b", [8, 27, 5, 0, 0], "int64")])
    case(G, "lcm", "a:lcm(b)", lambda a, b: a.lcm(b), [lit("i64_gcd_a", [12, -18, 0, 7, 0], "int64"),
                                                     lit("i64_gcd_b", [8, 27, 5, 0, 0], "int64")])
    case(G, "msort", "a:msort()", lambda a: a.msort(), [x])
    case(G, "renorm", "a:renorm(2, 0, 1.5)", lambda a: a.renorm(2, 0, 1.5), [x])
    case(G, "renorm p1 dim 1", "a:renorm(1, 1, 2)", lambda a: a.renorm(1, 1, 2), [c3])
    case(G, "fill_diagonal_", "a:clone():fill_diagonal_(7)", lambda a: a.clone().fill_diagonal_(7), [x])
    case(G, "fill_diagonal_ wrap", "torch.zeros(7, 3):fill_diagonal_(1, true)", lambda: torch.zeros(7, 3).fill_diagonal_(1, wrap=True))
    case(G, "fill_diagonal_ cube", "torch.zeros(3, 3, 3):fill_diagonal_(2)", lambda: torch.zeros(3, 3, 3).fill_diagonal_(2))
    case(G, "masked_scatter", "a:masked_scatter(b, c)", lambda a, b, c: a.masked_scatter(b, c), [x, rnd("bool", [3, 4]), rnd("float64", [12], "c")])
    case(G, "masked_scatter broadcast", "a:masked_scatter(b, c)", lambda a, b, c: a.masked_scatter(b, c),
         [x, lit("b_row", [True, False, True, True], "bool"), rnd("float64", [12], "c")])
    case(G, "select_scatter", "a:select_scatter(b, 1, -1)", lambda a, b: a.select_scatter(b, 1, -1), [x, w])
    case(G, "slice_scatter", "a:slice_scatter(b, 1, 1, 4, 2)", lambda a, b: a.slice_scatter(b, 1, 1, 4, 2), [x, rnd("float64", [3, 2], "c")])
    case(G, "slice_scatter start", "a:slice_scatter(b, {start = 2})", lambda a, b: a.slice_scatter(b, start=2), [x, rnd("float64", [1, 4], "c")])
    # other names and small functions
    case(G, "arccos", "a:arccos()", lambda a: a.arccos(), [unit])
    case(G, "arctan2", "torch.arctan2(a, b)", torch.arctan2, [x, y])
    case(G, "greater_equal", "a:greater_equal(b)", lambda a, b: a.greater_equal(b), [x, y])
    case(G, "asin_", "a:clone():asin_()", lambda a: a.clone().asin_(), [unit])
    case(G, "rsub", "torch.rsub(a, b, 2)", lambda a, b: torch.rsub(a, b, alpha=2), [x, y])
    case(G, "inner", "a:inner(b)", lambda a, b: a.inner(b), [c3, rnd("float64", [5, 4], "c")])
    case(G, "inner vectors", "torch.inner(a, b)", torch.inner, [v, v])
    case(G, "vdot", "torch.vdot(a, b)", torch.vdot, [v, rnd("float64", [4], "c")])
    case(G, "chain_matmul", "torch.chain_matmul(a, b, c)", torch.chain_matmul,
         [x, rnd("float64", [4, 2], "c"), rnd("float64", [2, 3], "d")])
    case(G, "diagflat", "a:diagflat(1)", lambda a: a.diagflat(1), [rnd("float64", [2, 2])])
    case(G, "logaddexp2", "a:logaddexp2(b)", lambda a, b: a.logaddexp2(b), [x, y])
    nans = lit("f64_fnan", [float("nan"), 1.0, -2.0, float("nan")], "float64")
    nans2 = lit("f64_fnan2", [0.5, float("nan"), -3.0, float("nan")], "float64")
    case(G, "fmax", "a:fmax(b)", lambda a, b: a.fmax(b), [nans, nans2])
    case(G, "fmin", "torch.fmin(a, b)", torch.fmin, [nans, nans2])
    case(G, "isposinf", "a:isposinf()", lambda a: a.isposinf(), [special])
    case(G, "isneginf", "a:isneginf()", lambda a: a.isneginf(), [special])
    nan_rows = lit("f64_nan_rows", [[1.0, float("nan"), 3.0, -1.0], [float("nan"), float("nan"), 2.0, 0.5],
                                   [float("nan"), float("nan"), float("nan"), float("nan")]], "float64")
    case(G, "nanmedian", "a:nanmedian()", lambda a: a.nanmedian(), [nan_rows])
    # (no row all NaN: PyTorch's index for one follows its selection algorithm)
    case(G, "nanmedian dim", "a:nanmedian(1)", lambda a: tuple(a.nanmedian(1)),
         [lit("f64_nan_rows2", [[1.0, float("nan"), 3.0, -1.0], [float("nan"), float("nan"), 2.0, 0.5]], "float64")])
    case(G, "nanquantile", "a:nanquantile({0.25, 0.5}, 1)",
         lambda a: a.nanquantile(torch.tensor([0.25, 0.5], dtype=torch.float64), 1), [nan_rows])
    case(G, "nanquantile all", "a:nanquantile(0.3)", lambda a: a.nanquantile(0.3), [nan_rows])
    case(G, "cov", "a:cov()", lambda a: a.cov(), [x])
    case(G, "cov correction 0", "torch.cov(a, {correction = 0})", lambda a: torch.cov(a, correction=0), [x])
    case(G, "cov fweights aweights", "a:cov({fweights = b, aweights = c})",
         lambda a, b, c: a.cov(fweights=b, aweights=c), [x, lit("i64_fw", [1, 2, 1, 3], "int64"),
                                                         lit("f64_aw", [0.5, 1.0, 2.0, 0.25], "float64")])
    case(G, "cov vector", "a:cov()", lambda a: a.cov(), [v])
    case(G, "corrcoef", "a:corrcoef()", lambda a: a.corrcoef(), [x])
    case(G, "cumulative_trapezoid", "torch.cumulative_trapezoid(a)", torch.cumulative_trapezoid, [x])
    case(G, "cumulative_trapezoid x dim", "torch.cumulative_trapezoid(a, b, {dim = 0})",
         lambda a, b: torch.cumulative_trapezoid(a, b, dim=0), [x, lit("f64_ctx", [0.0, 0.5, 2.0], "float64")])
    runs = lit("i64_runs", [1, 1, 2, 2, 2, 3, 1, 1], "int64")
    case(G, "unique_consecutive", "a:unique_consecutive({return_inverse = true, return_counts = true})",
         lambda a: torch.unique_consecutive(a, return_inverse=True, return_counts=True), [runs])
    case(G, "unique_consecutive dim", "a:unique_consecutive({dim = 0, return_counts = true})",
         lambda a: torch.unique_consecutive(a, dim=0, return_counts=True),
         [lit("i64_rows2", [[1, 2], [1, 2], [3, 4], [1, 2]], "int64")])
    case(G, "hann_window", "torch.hann_window(6, {dtype = torch.float64})", lambda: torch.hann_window(6, dtype=torch.float64))
    case(G, "hann_window symmetric", "torch.hann_window(5, false, {dtype = torch.float64})",
         lambda: torch.hann_window(5, False, dtype=torch.float64))
    case(G, "hamming_window", "torch.hamming_window(7, {dtype = torch.float64})", lambda: torch.hamming_window(7, dtype=torch.float64))
    case(G, "blackman_window", "torch.blackman_window(6, false, {dtype = torch.float64})",
         lambda: torch.blackman_window(6, False, dtype=torch.float64))
    case(G, "bartlett_window", "torch.bartlett_window(7)", lambda: torch.bartlett_window(7))
    case(G, "kaiser_window", "torch.kaiser_window(8, true, 5, {dtype = torch.float64})",
         lambda: torch.kaiser_window(8, True, 5.0, dtype=torch.float64))
    case(G, "i0", "a:i0()", lambda a: a.i0(), [lit("f64_i0", [0.0, 0.5, -2.0, 7.5, 14.9, 15.1, 30.0, 100.0], "float64")])
    case(G, "i0 f32", "a:float():i0()", lambda a: a.float().i0(), [x])
    case(G, "result_type", "tostring(torch.result_type(a, 2.5))", lambda a: str(torch.result_type(a, 2.5)), [i64])
    case(G, "result_type int", "tostring(torch.result_type(a, b))", lambda a, b: str(torch.result_type(a, b)),
         [rnd("int32", [3]), i64])
    case(G, "promote_types", "tostring(torch.promote_types(torch.int32, torch.float64))",
         lambda: str(torch.promote_types(torch.int32, torch.float64)))
    case(G, "promote_types bfloat16", "tostring(torch.promote_types(torch.bfloat16, torch.int64))",
         lambda: str(torch.promote_types(torch.bfloat16, torch.int64)))
    sidx = lit("i64_sidx", [[0, 1, 0, 2], [2, 2, 1, 0]], "int64")
    case(G, "scatter_reduce sum", 'a:scatter_reduce(0, b, c, "sum")', lambda a, b, c: a.scatter_reduce(0, b, c, "sum"),
         [x, sidx, rnd("float64", [2, 4], "c")])
    case(G, "scatter_reduce sum exclude self", 'a:scatter_reduce(0, b, c, "sum", {include_self = false})',
         lambda a, b, c: a.scatter_reduce(0, b, c, "sum", include_self=False), [x, sidx, rnd("float64", [2, 4], "c")])
    case(G, "scatter_reduce mean", 'a:scatter_reduce(0, b, c, "mean")', lambda a, b, c: a.scatter_reduce(0, b, c, "mean"),
         [x, sidx, rnd("float64", [2, 4], "c")])
    case(G, "scatter_reduce mean exclude self", 'a:scatter_reduce(0, b, c, "mean", {include_self = false})',
         lambda a, b, c: a.scatter_reduce(0, b, c, "mean", include_self=False), [x, sidx, rnd("float64", [2, 4], "c")])
    case(G, "scatter_reduce mean int64", 'a:scatter_reduce(0, b, c, "mean")', lambda a, b, c: a.scatter_reduce(0, b, c, "mean"),
         [i64, sidx, rnd("int64", [2, 4], "b")])
    # diagonal_scatter, narrow_copy, frexp, the shifts
    case(G, "diagonal_scatter", "a:diagonal_scatter(b)", lambda a, b: a.diagonal_scatter(b), [x, w])
    case(G, "diagonal_scatter offset 1", "a:diagonal_scatter(b, 1)", lambda a, b: a.diagonal_scatter(b, 1), [x, w])
    case(G, "diagonal_scatter offset -1 dims", "torch.diagonal_scatter(a, b, -1, 2, 1)",
         lambda a, b: torch.diagonal_scatter(a, b, -1, 2, 1), [c3, rnd("float64", [2, 3], "c")])
    case(G, "narrow_copy", "a:narrow_copy(1, 1, 2)", lambda a: a.narrow_copy(1, 1, 2), [x])
    frexp_in = lit("f64_frexp", [0.0, 1.0, -2.5, 8.0, 0.1, 1e-300, float("inf"), -float("inf"), float("nan"), 1024.0,
                                 3.0, -0.75, 5e-324, 1.7976931348623157e308, 2.2250738585072014e-308], "float64")
    case(G, "frexp", "torch.frexp(a)", torch.frexp, [frexp_in])
    case(G, "frexp f32", "a:frexp()", lambda a: a.frexp(), [f32])
    shifted = lit("i64_shifted", [1, -8, 5, -1, 100, 0, -7, 123456789], "int64")
    bits = lit("i64_bits", [0, 1, 2, 3, 10, 40, 63, 5], "int64")
    case(G, "bitwise_left_shift", "a:bitwise_left_shift(2)", lambda a: a.bitwise_left_shift(2), [shifted])
    case(G, "bitwise_right_shift", "a:bitwise_right_shift(1)", lambda a: a.bitwise_right_shift(1), [shifted])
    case(G, "bitwise_right_shift by a tensor", "torch.bitwise_right_shift(a, b)", torch.bitwise_right_shift, [shifted, bits])
    case(G, "bitwise_left_shift by a tensor", "a:bitwise_left_shift(b)", lambda a, b: a.bitwise_left_shift(b), [shifted, bits])
    for r in ["prod", "amax", "amin"]:
        case(G, "scatter_reduce " + r, 'a:scatter_reduce(0, b, c, "%s")' % r,
             lambda a, b, c, r=r: a.scatter_reduce(0, b, c, r), [x, sidx, rnd("float64", [2, 4], "c")])
        case(G, "scatter_reduce %s exclude self" % r, 'a:scatter_reduce(1, b, c, "%s", {include_self = false})' % r,
             lambda a, b, c, r=r: a.scatter_reduce(1, b, c, r, include_self=False),
             [x, lit("i64_reduce_idx", [[0, 0, 3], [2, 2, 2], [1, 0, 1]], "int64"), rnd("float64", [3, 4], "b")])
        case(G, "index_reduce " + r, 'a:index_reduce(0, b, c, "%s")' % r,
             lambda a, b, c, r=r: a.index_reduce(0, b, c, r), [x, lit("i64_reduce_rows", [2, 0, 2, 2], "int64"),
                                                                 rnd("float64", [4, 4], "c")])
    case(G, "scatter_reduce amax int64", 'a:scatter_reduce(0, b, c, "amax")',
         lambda a, b, c: a.scatter_reduce(0, b, c, "amax"), [i64, sidx, rnd("int64", [2, 4], "b")])
    case(G, "scatter_reduce amin with nan", 'a:scatter_reduce(0, b, c, "amin", {include_self = false})',
         lambda a, b, c: a.scatter_reduce(0, b, c, "amin", include_self=False),
         [x, lit("i64_reduce_nan_idx", [[0, 0, 1, 1]], "int64"), lit("f64_reduce_nan_src", [[1.0, float("nan"), -2.0, 3.0]], "float64")])
    case(G, "index_reduce mean exclude self", 'a:index_reduce(1, b, c, "mean", {include_self = false})',
         lambda a, b, c: a.index_reduce(1, b, c, "mean", include_self=False),
         [x, lit("i64_reduce_cols", [3, 3, 0], "int64"), rnd("float64", [3, 3], "c")])
    large = lit("i64_large", [123456789, -987654321, 2 ** 40 + 3, -(2 ** 45) - 1, 7, -7], "int64")
    case(G, "div floor of large int64", 'a:div(7, {rounding_mode = "floor"})', lambda a: a.div(7, rounding_mode="floor"), [large])
    case(G, "div trunc of large int64", 'a:div(-7, "trunc")', lambda a: a.div(-7, rounding_mode="trunc"), [large])


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "ref")
    torch.set_printoptions(profile="default")
    gen_creation()
    gen_views()
    gen_index()
    gen_binary()
    gen_scalar()
    gen_unary()
    gen_where_clamp()
    gen_inplace()
    gen_reduce()
    gen_matmul()
    gen_composite()
    gen_convert()
    gen_print()
    path = write(outdir)
    groups = {}
    for c in CASES:
        groups[c["group"]] = groups.get(c["group"], 0) + 1
    sys.stderr.write("wrote %s: %d cases (%s), %d inputs, %d bytes; %d skipped (PyTorch refuses)\n" % (
        os.path.normpath(path), len(CASES), ", ".join("%s %d" % kv for kv in sorted(groups.items())),
        len(INPUTS), os.path.getsize(path), len(SKIPPED)))
    if os.environ.get("VERBOSE"):
        for g, n, why in SKIPPED:
            sys.stderr.write("  skipped %s: %s: %s\n" % (g, n, why))


if __name__ == "__main__":
    main()
