--[==[
test_torchfile.lua -- torch.save / torch.load in PyTorch's own checkpoint
format (the zip archive of torch.save), both ways, and malformed files.

    ./dplua tests/lua/test_torchfile.lua
    ./dplua tests/lua/test_torchfile.lua --write-ref DIR   (writes torchfile_dplua_values.pt)
    ./dplua tests/lua/test_torchfile.lua --malformed N SEED   (the malformed files alone)

PyTorch's files (tests/ref/torchfile_torch_*.pt, written by
scripts/gen_torchfile_ref.py with torch 1.13) must load with the dtypes,
shapes and bytes of tests/ref/torchfile_ref.lua. The MNIST-sized state
dict is not committed (4.8 MB): when /usr/bin/python3 has torch, the
generator writes it here and its checksums and the model's output are
compared; otherwise that test is skipped.

dplua's files must load in PyTorch: when /usr/bin/python3 has torch,
`gen_torchfile_ref.py --check-dplua` loads the files written now (every
value, a Net and Adam strictly, the Net's output against dplua's);
otherwise the values file written now must equal, byte for byte,
tests/ref/torchfile_dplua_values.pt, which that check accepted.

Malformed files (hand-made archives and pickles, then truncations and
byte flips of valid files) must load or fail with a Lua error naming the
file; when a dplua-asan is built, they run once more under it.
--]==]
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local ffi = require("ffi")
local bit = require("bit")
local nn, F, optim = torch.nn, torch.nn.functional, torch.optim

local test_dir = T.test_dir()
local ref_dir = test_dir .. "/ref"
local tmp = T.temp_dir("torchfile")
local PY = "/usr/bin/python3"
local generator = test_dir .. "/../scripts/gen_torchfile_ref.py"

local function have_torch()
  return os.getenv("DPLUA_TEST_NO_PYTHON") == nil and os.execute(PY .. " -c 'import torch' >/dev/null 2>&1") == 0
end

local function tensor_hex(t)
  local c = t:contiguous()
  local n = c:numel() * c.dtype.itemsize
  if n == 0 then return "" end
  local s = ffi.string(torch.C.dp_tensor_data(c.p), n)
  return (s:gsub(".", function(ch) return ("%02x"):format(ch:byte()) end))
end

local function int64(s)
  local neg = s:sub(1, 1) == "-"
  local r = ffi.new("int64_t", 0)
  for d in s:gmatch("%d") do r = r * 10 - tonumber(d) end   -- negative, so that -2^63 fits
  return neg and r or -r
end

-- Lua values as the reference writes them: int64 cdata compared by value,
-- NaN equal to NaN.
local function same_value(a, b, path)
  if type(b) == "table" and getmetatable(b) == nil then
    if type(a) ~= "table" then return false, path .. ": got " .. tostring(a) .. ", expected a table" end
    for k, v in pairs(b) do
      local ok, why = same_value(a[k], v, path .. "." .. tostring(k))
      if not ok then return ok, why end
    end
    for k in pairs(a) do
      if b[k] == nil then return false, path .. ": an extra key " .. tostring(k) end
    end
    return true
  end
  if type(b) == "cdata" then
    return type(a) == "cdata" and a == b, path .. ": got " .. tostring(a) .. ", expected " .. tostring(b)
  end
  if b ~= b then return a ~= a, path .. ": expected NaN" end
  return a == b, path .. ": got " .. tostring(a) .. ", expected " .. tostring(b)
end

local function at_path(obj, path)
  for _, k in ipairs(path) do obj = obj and obj[k] end
  return obj
end

---------------------------------------------------------------- a zip of our own, for malformed files

local crc_table = {}
for i = 0, 255 do
  local c = i
  for _ = 1, 8 do c = bit.band(c, 1) ~= 0 and bit.bxor(0xEDB88320, bit.rshift(c, 1)) or bit.rshift(c, 1) end
  crc_table[i] = c
end
local function crc32(s)
  local c = 0xFFFFFFFF
  for i = 1, #s do c = bit.bxor(crc_table[bit.band(bit.bxor(c, s:byte(i)), 0xFF)], bit.rshift(c, 8)) end
  return bit.bxor(c, 0xFFFFFFFF)
end
local function le(v, n)
  local out = {}
  for i = 1, n do out[i] = string.char(bit.band(bit.rshift(v, 8 * (i - 1)), 0xFF)) end
  return table.concat(out)
end

-- A zip archive of stored entries {name, bytes[, method]}.
local function make_zip(entries)
  local out, central, pos = {}, {}, 0
  for _, e in ipairs(entries) do
    local name, data, method = e[1], e[2], e[3] or 0
    local crc = crc32(data)
    local h = "PK\3\4" .. le(20, 2) .. le(0, 2) .. le(method, 2) .. le(0, 4) .. le(crc, 4) .. le(#data, 4)
      .. le(#data, 4) .. le(#name, 2) .. le(0, 2) .. name
    central[#central + 1] = "PK\1\2" .. le(20, 2) .. le(20, 2) .. le(0, 2) .. le(method, 2) .. le(0, 4)
      .. le(crc, 4) .. le(#data, 4) .. le(#data, 4) .. le(#name, 2) .. le(0, 2) .. le(0, 2) .. le(0, 2)
      .. le(0, 2) .. le(0, 4) .. le(pos, 4) .. name
    out[#out + 1] = h .. data
    pos = pos + #h + #data
  end
  local cd = table.concat(central)
  return table.concat(out) .. cd .. "PK\5\6" .. le(0, 4) .. le(#entries, 2) .. le(#entries, 2) .. le(#cd, 4)
    .. le(pos, 4) .. le(0, 2)
end

-- A pickle's string argument: BINUNICODE.
local function X(s) return "X" .. le(#s, 4) .. s end
-- A tensor of n float32 over storage key, with sizes and strides (protocol 2).
local function tensor_pickle(key, numel, offset, size, stride)
  local function tuple(t)
    local s = "("
    for _, v in ipairs(t) do s = s .. "K" .. string.char(v) end
    return s .. "t"
  end
  return "ctorch._utils\n_rebuild_tensor_v2\n((" .. X("storage") .. "ctorch\nFloatStorage\n" .. X(key) .. X("cpu")
    .. "K" .. string.char(numel) .. "tQK" .. string.char(offset) .. tuple(size) .. tuple(stride)
    .. "\137ccollections\nOrderedDict\n)RtR"
end
local function checkpoint(pickle, storages)
  local entries = { { "archive/data.pkl", "\128\2" .. pickle } }
  for k, v in pairs(storages or {}) do entries[#entries + 1] = { "archive/data/" .. k, v } end
  entries[#entries + 1] = { "archive/version", "3\n" }
  return make_zip(entries)
end
local floats = ffi.string(ffi.new("float[6]", { 1, 2, 3, 4, 5, 6 }), 24)

---------------------------------------------------------------- malformed files

-- Each must fail with an error naming the file and these words.
local MALFORMED = {
  { "an unknown global is refused by name", checkpoint("cos\nsystem\n" .. X("ls") .. "\133R."),
    { "os%.system", "does not load" } },
  { "a builtin that makes objects is refused", checkpoint("cbuiltins\neval\n" .. X("1") .. "\133R."),
    { "builtins%.eval" } },
  { "a storage that is not in the archive", checkpoint(tensor_pickle("7", 6, 0, { 6 }, { 1 }) .. ".", { ["0"] = floats }),
    { "storage '7'", "no entry", "archive/data/7" } },
  { "a storage shorter than its length", checkpoint(tensor_pickle("0", 6, 0, { 6 }, { 1 }) .. ".", { ["0"] = floats:sub(1, 20) }),
    { "storage '0'", "6 elements", "20 bytes" } },
  { "a view past its storage", checkpoint(tensor_pickle("0", 6, 2, { 2, 3 }, { 3, 1 }) .. ".", { ["0"] = floats }),
    { "reaches past", "6 elements" } },
  { "an expanded view (stride 0)", checkpoint(tensor_pickle("0", 6, 0, { 200, 200 }, { 0, 0 }) .. ".", { ["0"] = floats }),
    { "40000 elements", "expanded" } },
  { "a pickle without STOP", checkpoint("]"), { "without its STOP" } },
  { "an opcode on an empty stack", checkpoint("a."), { "APPENDS with no list" } },
  { "a value popped past its MARK", checkpoint("(0."), { "stack is empty" } },
  { "a memo index never stored", checkpoint("h\5."), { "memo index 5" } },
  { "an object opcode", checkpoint("cbuiltins\nobject\n)\129."), { "builtins%.object" } },
  { "an unknown opcode", checkpoint("\255."), { "opcode 0xff" } },
  { "a string past the end", checkpoint("X\255\255\0\0ab."), { "past the end of the pickle" } },
  { "an integer over 64 bits", checkpoint("\138\9" .. ("\1"):rep(9) .. "."), { "9 bytes" } },
  { "no data.pkl", make_zip({ { "archive/other", "x" } }), { "without archive/data.pkl" } },
  { "a TorchScript archive", make_zip({ { "m/constants.pkl", "\128\2)." }, { "m/code/x.py", "" } }), { "TorchScript" } },
  { "a compressed entry", make_zip({ { "archive/data.pkl", "\128\2N.", 8 } }), { "compressed", "method 8" } },
  { "a big-endian checkpoint", make_zip({ { "archive/data.pkl", "\128\2N." }, { "archive/byteorder", "big" } }),
    { "big%-endian" } },
  { "a damaged data.pkl", (make_zip({ { "archive/data.pkl", "\128\2K\1." } }):gsub("K\1%.", "K\2.")), { "CRC" } },
  { "PyTorch's legacy format", "\128\2\138\10l\252\156F\249 j\168P\25.\128\2M\233\3.", { "legacy", "re%-save" } },
  { "an empty zip archive", make_zip({}), { "empty zip archive" } },
  { "a truncated archive", make_zip({ { "archive/data.pkl", "\128\2N." } }):sub(1, 40), { "end%-of%-central%-directory" } },
  { "a dict key that is a tuple", checkpoint("}(K\1K\2\134K\3u."), { "key is a tuple" } },
  { "nesting deeper than 1000", checkpoint(("]"):rep(1200) .. ("a"):rep(1199) .. "."), { "more than 1000 deep" } },
  { "a bool storage holding 2", checkpoint("ctorch._utils\n_rebuild_tensor_v2\n((" .. X("storage") .. "ctorch\nBoolStorage\n"
      .. X("0") .. X("cpu") .. "K\2tQK\0(K\2t(K\1t\137ccollections\nOrderedDict\n)RtR.", { ["0"] = "\1\2" }),
    { "bool storage", "0x02" } },
}

-- Loads path; returns "ok", or "error" with the message, or "bad" with
-- why the failure was not a proper one.
local function try_load(path)
  local ok, err = pcall(torch.load, path)
  if ok then return "ok" end
  if type(err) ~= "string" then return "bad", "an error that is not a string: " .. tostring(err) end
  if not err:find(path, 1, true) then return "bad", "the error does not name the file: " .. err end
  return "error", err
end

-- The entries of a zip archive of stored entries, from its local headers.
local function zip_entries(z)
  local out, pos = {}, 1
  local function u(at, n)
    local v = 0
    for i = n, 1, -1 do v = v * 256 + z:byte(pos + at + i - 1) end
    return v
  end
  while z:sub(pos, pos + 3) == "PK\3\4" do
    local size, nlen, xlen = u(18, 4), u(26, 2), u(28, 2)
    local name = z:sub(pos + 30, pos + 29 + nlen)
    local data_at = pos + 30 + nlen + xlen
    out[#out + 1] = { name, z:sub(data_at, data_at + size - 1) }
    pos = data_at + size
  end
  return out
end

-- Random damage: truncations and byte flips of whole files (mostly caught
-- by the zip's records and CRCs), and the same of data.pkl alone, in an
-- archive with its CRC right, for the unpickler.
local function random_cases(n, seed)
  math.randomseed(seed)
  local sources = { T.read_file(ref_dir .. "/torchfile_torch_values.pt"), T.read_file(ref_dir .. "/torchfile_torch_proto4.pt") }
  local path = tmp .. "/random.pt"
  local bad = {}
  local counts = { ok = 0, error = 0 }
  local function damage(s)
    local how = math.random(3)
    if how == 1 then return s:sub(1, math.random(0, #s - 1)) end
    for _ = 1, math.random(1, 8) do
      local at = math.random(#s)
      s = s:sub(1, at - 1) .. string.char(math.random(0, 255)) .. s:sub(at + 1)
    end
    if how == 3 then s = s:sub(1, math.random(#s)) .. s end   -- a shifted copy in front
    return s
  end
  for i = 1, n do
    local s = sources[math.random(#sources)]
    if i % 2 == 0 then
      local entries = zip_entries(s)
      entries[1][2] = damage(entries[1][2])   -- data.pkl comes first
      s = make_zip(entries)
    else
      s = damage(s)
    end
    os.remove(path)
    T.write_file(path, s)
    local r, why = try_load(path)
    if r == "bad" then bad[#bad + 1] = ("case %d: %s"):format(i, why) else counts[r] = counts[r] + 1 end
  end
  return bad, counts
end

-- The hand-made files: each must fail with its words.
local function malformed_cases()
  local path = tmp .. "/bad.pt"
  for _, case in ipairs(MALFORMED) do
    os.remove(path)
    T.write_file(path, case[2])
    local r, err = try_load(path)
    local ok = r == "error"
    for _, w in ipairs(case[3]) do ok = ok and err:find(w) ~= nil end
    T.ok(ok, case[1], r .. ": " .. tostring(err))
  end
end

if arg and arg[1] == "--malformed" then
  malformed_cases()
  local bad, counts = random_cases(tonumber(arg[2]) or 500, tonumber(arg[3]) or 1)
  T.is(bad, {}, ("%d damaged files under this binary: %d load, %d refused, none crashes"):format(
    counts.ok + counts.error + #bad, counts.ok, counts.error))
  os.execute("rm -rf " .. T.sh_quote(tmp))
  T.done_testing()
  return
end

---------------------------------------------------------------- dplua's files

local function int64_tensor(decimals)
  local t = torch.zeros(#decimals, { dtype = torch.int64 })
  local p = ffi.cast("int64_t *", torch.C.dp_tensor_data(t.p))
  for i, s in ipairs(decimals) do p[i - 1] = int64(s) end
  return t
end

-- What gen_torchfile_ref.py's expected_dplua_values() mirrors.
local function dplua_values()
  local x = torch.arange(12, { dtype = torch.float32 }):view(3, 4) / 4
  return {
    float32 = x,
    again = x,
    float64 = torch.arange(6, { dtype = torch.float64 }):view(2, 3) / 3,
    int64 = int64_tensor({ "-9223372036854775808", "-1", "0", "4611686018427387904" }),
    int32 = torch.tensor({ -2147483648, 7, 2147483647 }, { dtype = torch.int32 }),
    uint8 = torch.tensor({ 0, 200, 255 }, { dtype = torch.uint8 }),
    bool = torch.tensor({ true, false }),
    bfloat16 = torch.tensor({ 1.5, -2.25, 2 ^ 100 }, { dtype = torch.bfloat16 }),
    transposed = x:t(),
    scalar = torch.tensor(2.5),
    empty = torch.zeros(0, 2),
    nested = { list = { 1, 2.5, "three", true }, dict = { a = 1, [3] = "x" }, text = "h\195\169llo",
               big = int64("4611686018427387905"), negzero = -0.0, inf = math.huge, dtype = torch.bfloat16,
               device = torch.device("cpu") },
  }
end

-- pytorch/examples mnist/main.py's Net.
local Net = nn.Module:extend("Net")
function Net:__init()
  self.conv1 = nn.Conv2d(1, 32, 3, 1)
  self.conv2 = nn.Conv2d(32, 64, 3, 1)
  self.dropout1 = nn.Dropout(0.25)
  self.dropout2 = nn.Dropout(0.5)
  self.fc1 = nn.Linear(9216, 128)
  self.fc2 = nn.Linear(128, 10)
end
function Net:forward(x)
  x = F.relu(self.conv1(x))
  x = F.relu(self.conv2(x))
  x = F.max_pool2d(x, 2)
  x = self.dropout1(x)
  x = torch.flatten(x, 1)
  x = F.relu(self.fc1(x))
  x = self.dropout2(x)
  return F.log_softmax(self.fc2(x), 1)
end

local function mnist_input()
  local v = {}
  for k = 0, 2 * 28 * 28 - 1 do v[k + 1] = ((37 * k) % 101) / 101 - 0.5 end
  return torch.tensor(v, { dtype = torch.float64 }):float():view(2, 1, 28, 28)
end

local function write_dplua_files(dir)
  torch.save(dplua_values(), dir .. "/torchfile_dplua_values.pt")
  torch.manual_seed(0)
  local net = Net()
  net:eval()
  local opt = optim.Adam(net:parameters(), { lr = 0.01 })
  local loss = net(mnist_input()):sum()
  loss:backward()
  opt:step()
  local out = torch.no_grad(function() return net(mnist_input()) end)
  torch.save({ model = net:state_dict(), optimizer = opt:state_dict(), lr = 0.01, output = out },
             dir .. "/torchfile_dplua_mnist.pt")
  torch.save(net:state_dict(), dir .. "/torchfile_dplua_state_dict.pt")
end

if arg and arg[1] == "--write-ref" then
  torch.save(dplua_values(), arg[2] .. "/torchfile_dplua_values.pt")
  os.exit(0)
end

---------------------------------------------------------------- PyTorch's files

T.run("PyTorch's tensors load with their dtypes, shapes and bytes", function()
  local ref = dofile(ref_dir .. "/torchfile_ref.lua")(int64, torch)
  local ck = torch.load(ref_dir .. "/torchfile_torch_values.pt")
  for _, e in ipairs(ref.tensors) do
    local name = table.concat(e.path, ".")
    local t = at_path(ck, e.path)
    T.ok(torch.is_tensor(t), name .. " is a tensor")
    if torch.is_tensor(t) then
      T.is({ t.dtype.name, T.shape(t) }, { e.dtype, e.shape }, name .. ": dtype and shape")
      T.is(tensor_hex(t), e.hex, name .. ": bytes")
    end
  end
  T.ok(same_value(ck.values, ref.values, "values"))
  local ok, why = same_value(ck.optimizer.param_groups, ref.param_groups, "param_groups")
  T.ok(ok, "the optimizer's param_groups", why)
  -- the loaded state dicts drive dplua's modules and optimizers
  local lin = nn.Linear(3, 2)
  lin:load_state_dict(ck.model)
  T.is(tensor_hex(lin.weight), tensor_hex(ck.model.weight), "Linear.load_state_dict of PyTorch's state dict")
  T.is(ck.model:keys(), { "weight", "bias" }, "a state dict keeps its order")
  local opt = optim.Adam(lin:parameters(), { lr = 0.01 })
  T.lives(function() opt:load_state_dict(ck.optimizer) end, "Adam.load_state_dict of PyTorch's optimizer state dict")
end)

T.run("a pickle of protocol 4 loads too", function()
  local ck = torch.load(ref_dir .. "/torchfile_torch_proto4.pt")
  T.is(tensor_hex(ck.w), tensor_hex(torch.arange(6, { dtype = torch.float32 }):view(2, 3):t()), "a transposed tensor")
  T.is({ ck.n, ck.s, ck.l[2] }, { 3, "four", 0.5 }, "its plain values")
  T.is(tensor_hex(ck.l[1]), tensor_hex(torch.ones(2, { dtype = torch.int64 })), "a tensor in a list")
end)

T.run("map_location", function()
  local p = ref_dir .. "/torchfile_torch_proto4.pt"
  for _, how in ipairs({ "cpu", torch.device("cpu") }) do
    T.is(torch.load(p, how).w.device, torch.device("cpu"), "positional " .. tostring(how))
    T.is(torch.load(p, { map_location = how }).w.device, torch.device("cpu"), "{map_location=" .. tostring(how) .. "}")
  end
  T.raises(function() torch.load(p, { map_location = true }) end, { "torch.load", "map_location", "boolean" },
           "a map_location that is not a device")
  if not torch.cuda.is_available() then
    T.raises(function() torch.load(p, "cuda") end, { "cuda" }, "map_location cuda without a GPU is an error")
  else
    T.is(torch.load(p, "cuda").w.device.type, "cuda", "map_location cuda moves the tensors there")
  end
end)

T.run("pytorch/examples' MNIST Net from PyTorch", function()
  if not have_torch() then
    T.skip("no /usr/bin/python3 with torch to write the 4.8 MB file", "the MNIST state dict's checksums")
    return
  end
  local ref = dofile(ref_dir .. "/torchfile_ref.lua")(int64, torch)
  local rc = os.execute(PY .. " " .. T.sh_quote(generator) .. " --mnist " .. T.sh_quote(tmp))
  T.is(rc, 0, "the generator wrote the MNIST state dict")
  local sd = torch.load(tmp .. "/torchfile_torch_mnist.pt")
  for _, e in ipairs(ref.mnist) do
    local t = sd[e.name]
    T.is(T.shape(t), e.shape, e.name .. ": shape")
    local flat = t:double():view(-1)
    T.close(flat:sum():item(), e.sum, 1e-9, 1e-9, e.name .. ": sum")
    T.close((flat * flat):sum():item(), e.sumsq, 1e-9, 1e-9, e.name .. ": sum of squares")
    local got = {}
    for i, k in ipairs(e.at) do got[i] = flat[k]:item() end
    T.is(got, e.values, e.name .. ": elements")
  end
  local net = Net()
  net:load_state_dict(sd)
  net:eval()
  local y = torch.no_grad(function() return net(mnist_input()) end)
  T.tensor_close(y:view(-1), ref.mnist_output, 1e-5, 1e-5, "Net with PyTorch's weights gives PyTorch's output")
end)

---------------------------------------------------------------- dplua's files in PyTorch

T.run("dplua's files load in PyTorch", function()
  write_dplua_files(tmp)
  local values = T.read_file(tmp .. "/torchfile_dplua_values.pt")
  T.ok(values == T.read_file(ref_dir .. "/torchfile_dplua_values.pt"),
       "the values file is byte for byte the one PyTorch was shown to read")
  -- and dplua reads its own files back
  local back = torch.load(tmp .. "/torchfile_dplua_values.pt")
  local want = dplua_values()
  for _, k in ipairs({ "float32", "again", "float64", "int64", "int32", "uint8", "bool", "bfloat16", "transposed",
                       "scalar", "empty" }) do
    T.is(tensor_hex(back[k]), tensor_hex(want[k]), "read back: " .. k)
  end
  T.ok(same_value(back.nested, want.nested, "nested"))
  T.ok(1 / back.nested.negzero < 0, "-0.0 stays -0.0")
  if not have_torch() then
    T.skip("no /usr/bin/python3 with torch (the committed values file was checked by it)", "PyTorch reads dplua's files")
    return
  end
  local p = io.popen(PY .. " " .. T.sh_quote(generator) .. " --check-dplua " .. T.sh_quote(tmp) .. " 2>&1; echo rc=$?")
  local text = p:read("*a")
  p:close()
  T.ok(text:find("rc=0\n$") ~= nil, "PyTorch loads the values and the MNIST Net + Adam checkpoint", text)
end)

T.run("the format follows the name unless asked", function()
  local t = { w = torch.ones(2) }
  local function head(path) return T.read_file(path):sub(1, 4) end
  torch.save(t, tmp .. "/a.pt")
  torch.save(t, tmp .. "/a.PTH")
  torch.save(t, tmp .. "/a.safetensors")
  torch.save(t, tmp .. "/a.ckpt")
  torch.save(t, tmp .. "/b.safetensors", { format = "torch" })
  torch.save(t, tmp .. "/b.pt", { format = "safetensors" })
  T.is({ head(tmp .. "/a.pt"), head(tmp .. "/a.PTH"), head(tmp .. "/b.safetensors") }, { "PK\3\4", "PK\3\4", "PK\3\4" },
       ".pt and .pth, or format=\"torch\": PyTorch's zip")
  T.ok(head(tmp .. "/a.safetensors") ~= "PK\3\4" and head(tmp .. "/a.ckpt") ~= "PK\3\4" and head(tmp .. "/b.pt") ~= "PK\3\4",
       "other names, or format=\"safetensors\": safetensors")
  for _, f in ipairs({ "a.pt", "a.safetensors", "b.safetensors", "b.pt" }) do
    T.is(tensor_hex(torch.load(tmp .. "/" .. f).w), tensor_hex(torch.ones(2)), "torch.load reads " .. f .. " by its content")
  end
  T.raises(function() torch.save(t, tmp .. "/c.pt", { format = "pickle" }) end, { "torch.save", "unknown format", "pickle" },
           "an unknown format")
  T.raises(function() torch.save(t, tmp .. "/c.pt", "torch") end, { "torch.save", "options as a table" },
           "options that are not a table")
  T.raises(function() torch.save({ s = "\255" }, tmp .. "/c.pt") end, { "torch.save", "'s'", "UTF%-8" },
           "a string that is not UTF-8")
  T.raises(function() torch.save({ f = print }, tmp .. "/c.pt") end, { "torch.save", "function", "'f'" },
           "a function cannot be saved")
  local cyc = {}
  cyc.self = cyc
  T.raises(function() torch.save({ c = cyc }, tmp .. "/c.pt") end, { "torch.save", "cycle" }, "a cycle is refused")
  T.raises(function() torch.save({ m = nn.Linear(2, 2) }, tmp .. "/c.pt") end, { "torch.save", "'m'", "state_dict" },
           "a module is refused")
end)

---------------------------------------------------------------- malformed files

T.run("malformed files give clear errors", function()
  local path = tmp .. "/bad.pt"
  malformed_cases()
  -- a list that holds itself loads as a table that holds itself
  T.write_file(path, checkpoint("]q\0h\0a."))
  local got = torch.load(path)
  T.ok(got[1] == got, "a self-referencing list")
  local bad, counts = random_cases(400, 7)
  T.is(bad, {}, ("400 damaged files: %d load, %d refused, none crashes"):format(counts.ok, counts.error))
end)

local function asan_binary()
  local candidates = {}
  local bd = os.getenv("top_builddir")
  if bd and bd ~= "" then candidates[#candidates + 1] = bd .. "/dplua-asan" end
  local exe = arg and arg[-1]
  if exe then candidates[#candidates + 1] = (exe:match("^(.*)/[^/]*$") or ".") .. "/dplua-asan" end
  for _, c in ipairs(candidates) do
    local f = io.open(c, "rb")
    if f then f:close(); return c end
  end
end

T.run("malformed files under AddressSanitizer", function()
  local asan = asan_binary()
  if not asan then
    T.skip("no dplua-asan built (make dplua-asan)", "the damaged files under AddressSanitizer")
    return
  end
  local env = "ASAN_OPTIONS=detect_leaks=0:abort_on_error=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 "
    .. "DPLUA_TEST_DIR=" .. T.sh_quote(test_dir) .. " "
  local p = io.popen(("%s%s %s --malformed 1500 11 2>&1; echo \"exit=$?\""):format(env, T.sh_quote(asan),
    T.sh_quote(here .. "/test_torchfile.lua")))
  local out = p:read("*a")
  p:close()
  local report = out:match("(ERROR: AddressSanitizer[^\n]*)") or out:match("([^\n]*runtime error:[^\n]*)")
  local good = out:find("\nexit=0\n?$") ~= nil and not out:find("not ok") and report == nil
  T.ok(good, "the hand-made files and 1500 damaged ones under dplua-asan: no over-read, no undefined behaviour",
       not good and ((report and report .. "\n" or "") .. out:sub(-4000)) or nil)
end)

os.execute("rm -rf " .. T.sh_quote(tmp))
T.done_testing()
