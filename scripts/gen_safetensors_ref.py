#!/usr/bin/python3
"""gen_safetensors_ref.py -- safetensors files both ways between PyTorch and
dplua, for tests/lua/test_checkpoint.lua.

Run from the source tree, after `make`, with a Python that has torch (the
committed files were written with Debian's python3-torch 1.13, which
scripts/setup-debian leaves out: `apt-get install python3-torch`):

    /usr/bin/python3 scripts/gen_safetensors_ref.py [--dplua ./dplua] [OUTDIR]
    /usr/bin/python3 scripts/gen_safetensors_ref.py --check-dplua DIR

The first form (OUTDIR defaults to tests/ref) writes, from PyTorch:

  safetensors_torch_model.safetensors   the state dict of a small model,
      torch.manual_seed(0); Sequential(Linear(4, 8), LayerNorm(8), ReLU(),
      Linear(8, 3)), as safetensors.torch.save_file writes it
  safetensors_torch_dtypes.safetensors  one tensor of every dtype dplua
      reads (F32 F64 I64 I32 U8 BOOL BF16) with special values (NaN, the
      infinities, -0.0, subnormals, the int limits), a 0-d tensor, empty
      tensors, a transposed (non-contiguous) one, names with dots and
      non-ASCII characters
  safetensors_ref.lua                    what dplua must read from them: per
      tensor the dtype, shape, values and the raw bytes in hex; the model's
      input and PyTorch's output for it

then runs dplua (`--dplua`, default ./dplua when it exists) as
`dplua tests/lua/test_checkpoint.lua --write-ref OUTDIR`, which loads the
two files above and writes

  safetensors_dplua_model.safetensors   model:state_dict() of the dplua
      model that loaded the PyTorch state dict
  safetensors_dplua_ckpt.safetensors    a whole checkpoint: {model=,
      optimizer= (an Adam-shaped state dict), extra= (the dtypes file's
      tensors), rng=, step=100, ...}

and checks them in PyTorch (the second form does only this, on the files in
DIR): the model file loads with model.load_state_dict(load_file(path))
into the same PyTorch model, strictly, with tensors equal to the original;
every tensor of the checkpoint equals what it should (bit for bit); its
__metadata__ holds format=pt and valid JSON under "dplua". It exits 1 and
says what differed otherwise. test_checkpoint.lua runs the second form on
files it has just written when /usr/bin/python3 has torch, and otherwise
checks that dplua still writes what was checked here.

The `safetensors` Python package is not in Debian, so when it is missing
the format is read and written by the functions
below, from its specification: 8 bytes of little-endian header length, the
JSON header (tensors sorted by dtype then name, as the reference writer
does; "__metadata__" first; padded with spaces to 8 bytes), then the data.
When the package is importable, safetensors.torch's save_file/load_file
are used instead. The hand-written writer gives the same bytes as the
package: run on the GPU machine (PyTorch 2.11, safetensors 0.8.0), the
script wrote two torch files identical to the committed ones, and
`--check-dplua tests/ref` passed there with the package's load_file.
Everything is deterministic: running the script twice writes the same
bytes.
"""
import json
import math
import os
import struct
import subprocess
import sys

import torch

try:
    import safetensors.torch as st_torch
except ImportError:
    st_torch = None

DTYPES = {
    torch.float32: "F32", torch.float64: "F64", torch.int64: "I64", torch.int32: "I32",
    torch.uint8: "U8", torch.bool: "BOOL", torch.bfloat16: "BF16",
}
BY_NAME = {v: k for k, v in DTYPES.items()}
LUA_DTYPE = {
    torch.float32: "float32", torch.float64: "float64", torch.int64: "int64", torch.int32: "int32",
    torch.uint8: "uint8", torch.bool: "bool", torch.bfloat16: "bfloat16",
}
# The reference writer orders tensors by dtype (its enum order, descending), then name.
RUST_ORDER = ["BOOL", "U8", "I8", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "F64", "I64", "U64"]

# ---------------------------------------------------------------- the format


def tensor_bytes(t):
    t = t.detach().contiguous().reshape(-1)
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def save_file(tensors, path, metadata=None):
    if st_torch is not None:
        st_torch.save_file({k: v.contiguous() for k, v in tensors.items()}, path, metadata)
        return
    order = sorted(tensors, key=lambda k: (-RUST_ORDER.index(DTYPES[tensors[k].dtype]), k))
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for k in order:
        b = tensor_bytes(tensors[k])
        header[k] = {"dtype": DTYPES[tensors[k].dtype], "shape": list(tensors[k].shape),
                     "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_file(path):
    """Tensors (in header order) and metadata, checked as strictly as the reference reader."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: too short")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise ValueError(f"{path}: header length {n} past the end")
    header = json.loads(data[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", None) or {}
    body = data[8 + n:]
    out, spans = {}, []
    for k, info in header.items():
        dt = BY_NAME[info["dtype"]]
        b, e = info["data_offsets"]
        spans.append((b, e))
        numel = math.prod(info["shape"])
        if e - b != numel * torch.empty(0, dtype=dt).element_size():
            raise ValueError(f"{path}: {k}: size mismatch")
        raw = bytearray(body[b:e])
        if numel == 0:
            t = torch.empty(info["shape"], dtype=dt)
        elif dt == torch.bfloat16:
            t = torch.frombuffer(raw, dtype=torch.int16).view(torch.bfloat16).reshape(info["shape"])
        else:
            t = torch.frombuffer(raw, dtype=dt).reshape(info["shape"])
        out[k] = t.clone()
    pos = 0
    for b, e in sorted(spans):
        if b != pos:
            raise ValueError(f"{path}: the tensors do not tile the data (at byte {pos})")
        pos = e
    if pos != len(body):
        raise ValueError(f"{path}: trailing bytes")
    return out, meta


def load_file(path):
    if st_torch is not None:
        return st_torch.load_file(path)
    return read_file(path)[0]


def read_metadata(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n).decode("utf-8")).get("__metadata__", {})

# ---------------------------------------------------------------- the references


def make_model():
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.ReLU(),
                               torch.nn.Linear(8, 3))


def model_input():
    return torch.tensor([[0.5, -1.25, 2.0, 0.75], [-0.5, 0.25, -2.0, 1.5],
                         [1.0, 1.0, -1.0, -1.0], [0.0, 3.0, 0.125, -0.375]])


def reference_model():
    torch.manual_seed(0)
    model = make_model()
    with torch.no_grad():   # make the LayerNorm affine parameters non-trivial
        model[1].weight.copy_(torch.linspace(0.5, 1.5, 8))
        model[1].bias.copy_(torch.linspace(-0.25, 0.25, 8))
    return model


def dtype_tensors():
    f32 = torch.tensor([0.0, -0.0, 1.5, -2.25, float("nan"), float("inf"), float("-inf"),
                        1e-45, 1.17549435e-38, 3.4028234663852886e38, 0.1, -1 / 3], dtype=torch.float32)
    f64 = torch.tensor([math.pi, -0.0, 1e-310, 1.7976931348623157e308, float("nan"), 0.1, -1e100],
                       dtype=torch.float64)
    i64 = torch.tensor([[0, 1, -1], [2 ** 53 - 1, -(2 ** 53) + 1, 2 ** 60], [-(2 ** 62), 123456789, -7]],
                       dtype=torch.int64)
    i32 = torch.tensor([-2 ** 31, 2 ** 31 - 1, 0, 42], dtype=torch.int32)
    u8 = torch.tensor([[0, 1, 127], [128, 254, 255]], dtype=torch.uint8)
    b = torch.tensor([True, False, False, True, True], dtype=torch.bool)
    bf16 = torch.tensor([1.0, -2.5, 3.140625, 0.0078125, -0.0, float("inf"), 1e30, -1e-30],
                        dtype=torch.float32).to(torch.bfloat16)
    return {
        "f32": f32, "f64": f64, "i64": i64, "i32": i32, "u8": u8, "bool": b, "bf16": bf16,
        "scalar": torch.tensor(2.5, dtype=torch.float32),
        "empty": torch.zeros(0, dtype=torch.float32),
        "empty2d": torch.zeros(2, 0, dtype=torch.int64),
        "transposed": torch.arange(12, dtype=torch.float32).reshape(3, 4).t(),
        "layer.0.weight": torch.arange(6, dtype=torch.float64).reshape(2, 3) / 8,
        "naïve.ünïcödé": torch.tensor([7], dtype=torch.int32),
    }

# ---------------------------------------------------------------- Lua output


def lua_string(s):
    out = []
    for ch in s.encode("utf-8"):
        if 32 <= ch < 127 and ch not in (ord('"'), ord("\\")):
            out.append(chr(ch))
        else:
            out.append("\\%03d" % ch)
    return '"' + "".join(out) + '"'


def lua_number(x, dtype):
    if dtype == torch.bool:
        return "true" if x else "false"
    if dtype in (torch.int64, torch.int32, torch.uint8):
        return str(int(x))
    x = float(x)
    if math.isnan(x):
        return "0/0"
    if math.isinf(x):
        return "math.huge" if x > 0 else "-math.huge"
    if x == 0 and math.copysign(1, x) < 0:
        return "-0.0"
    return repr(x)


def lua_values(t):
    def nest(v):
        if isinstance(v, list):
            return "{" + ",".join(nest(x) for x in v) + "}"
        return lua_number(v, t.dtype)
    v = t.tolist()
    return nest(v)


def lua_tensor(name, t):
    return ("    {name=%s, dtype=%s, shape={%s},\n     values=%s,\n     bytes=%s},\n" % (
        lua_string(name), lua_string(LUA_DTYPE[t.dtype]), ",".join(str(s) for s in t.shape),
        lua_values(t), lua_string(tensor_bytes(t).hex())))


def write_lua(path, model, dtypes, x, y):
    with open(path, "w", encoding="utf-8") as f:
        f.write("-- Generated by scripts/gen_safetensors_ref.py with PyTorch %s; do not edit.\n" % torch.__version__)
        f.write("-- What dplua must read from safetensors_torch_model.safetensors and\n")
        f.write("-- safetensors_torch_dtypes.safetensors (in their header order).\n")
        f.write("return {\n  torch_version = %s,\n" % lua_string(torch.__version__))
        f.write("  writer = %s,\n" % lua_string("safetensors " + st_torch.__name__ if st_torch else "by hand"))
        f.write("  model = {\n")
        for k, v in read_file_ordered(model):
            f.write(lua_tensor(k, v))
        f.write("  },\n  dtypes = {\n")
        for k, v in read_file_ordered(dtypes):
            f.write(lua_tensor(k, v))
        f.write("  },\n")
        f.write("  input = %s,\n" % lua_values(x))
        f.write("  output = %s,\n}\n" % lua_values(y))


def read_file_ordered(path):
    return list(read_file(path)[0].items())

# ---------------------------------------------------------------- checking dplua's files


def fail(msg):
    print("gen_safetensors_ref: " + msg, file=sys.stderr)
    sys.exit(1)


def same(a, b):
    """Bit-for-bit equality, shape and dtype included."""
    return a.dtype == b.dtype and a.shape == b.shape and tensor_bytes(a) == tensor_bytes(b)


def check_dplua(d, ref_dir):
    """Checks the files dplua wrote in d against the PyTorch files in ref_dir."""
    model_path = os.path.join(d, "safetensors_dplua_model.safetensors")
    ckpt_path = os.path.join(d, "safetensors_dplua_ckpt.safetensors")
    ref_sd = load_file(os.path.join(ref_dir, "safetensors_torch_model.safetensors"))
    ref_dt = load_file(os.path.join(ref_dir, "safetensors_torch_dtypes.safetensors"))

    # a plain state dict: PyTorch's own load_state_dict takes it (strict)
    model = make_model()
    sd = load_file(model_path)
    model.load_state_dict(sd)
    for k, v in model.state_dict().items():
        if not same(v, ref_sd[k]):
            fail(f"{model_path}: {k} differs from PyTorch's original")
    read_file(model_path)   # strict layout check too

    ck, meta = read_file(ckpt_path)
    if st_torch is not None:
        ck = st_torch.load_file(ckpt_path)
    if meta.get("format") != "pt":
        fail(f"{ckpt_path}: __metadata__ format is {meta.get('format')!r}, expected 'pt'")
    skeleton = json.loads(meta["dplua"])
    if skeleton.get("step") != 100:
        fail(f"{ckpt_path}: the dplua metadata has step {skeleton.get('step')!r}")
    want = {}
    for i, (k, v) in enumerate(model.state_dict().items()):
        want["model." + k] = v
        want["optimizer.state.%d.exp_avg" % i] = v * 0.5
        want["optimizer.state.%d.exp_avg_sq" % i] = v * v
    for k, v in ref_dt.items():
        want["extra." + k] = v
    want["rng"] = torch.tensor(list(struct.pack("<QQ", 7, 0)), dtype=torch.uint8)
    if set(ck) != set(want):
        fail(f"{ckpt_path}: tensor names {sorted(ck)} != expected {sorted(want)}")
    for k, v in want.items():
        if not same(ck[k], v):
            fail(f"{ckpt_path}: tensor {k} differs: {ck[k]} != {v}")
    print(f"gen_safetensors_ref: PyTorch {torch.__version__} read {model_path} and {ckpt_path}: "
          f"{len(sd)} + {len(ck)} tensors equal ({'safetensors' if st_torch else 'hand-written reader'})")

# ---------------------------------------------------------------- main


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    top = os.path.dirname(here)
    ref_dir = os.path.join(top, "tests", "ref")
    if argv[:1] == ["--check-dplua"]:
        check_dplua(argv[1], ref_dir)
        return
    dplua = os.path.join(top, "dplua")
    if argv[:1] == ["--dplua"]:
        dplua, argv = argv[1], argv[2:]
    out = argv[0] if argv else ref_dir
    torch.set_num_threads(1)
    model = reference_model()
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    model_path = os.path.join(out, "safetensors_torch_model.safetensors")
    dtypes_path = os.path.join(out, "safetensors_torch_dtypes.safetensors")
    save_file(sd, model_path, {"format": "pt"})
    save_file(dtype_tensors(), dtypes_path, {"format": "pt", "note": "written by gen_safetensors_ref.py"})
    x = model_input()
    with torch.no_grad():
        y = model(x)
    write_lua(os.path.join(out, "safetensors_ref.lua"), model_path, dtypes_path, x, y)
    if not os.path.exists(dplua):
        print(f"gen_safetensors_ref: no dplua at {dplua}: skipped writing and checking dplua's files")
        return
    subprocess.run([dplua, os.path.join(top, "tests", "lua", "test_checkpoint.lua"), "--write-ref", out],
                   check=True, env=dict(os.environ, DPLUA_TEST_DIR=os.path.join(top, "tests")))
    check_dplua(out, out)


if __name__ == "__main__":
    main(sys.argv[1:])
