--[[
test_checkpoint.lua -- torch.save / torch.load (safetensors), the RNG state,
and resuming a training run bit-exactly.

    ./dplua tests/lua/test_checkpoint.lua
    ./dplua tests/lua/test_checkpoint.lua --write-ref DIR    (for scripts/gen_safetensors_ref.py)
    ./dplua tests/lua/test_checkpoint.lua --resume CKPT CONFIG FROM TO   (a child run: prints losses)

Cross-checks with PyTorch use the files of tests/ref written by
scripts/gen_safetensors_ref.py: PyTorch's files must load here with equal
values (bit for bit), and dplua must still write the files that PyTorch
was shown to read. When /usr/bin/python3 has torch, files written now are
also checked by PyTorch directly; otherwise that test is skipped.
--]]
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local models = require("models")
local torch = require("dplua")
local ffi = require("ffi")
local nn, F, optim = torch.nn, torch.nn.functional, torch.optim

local test_dir = T.test_dir()
local ref_dir = test_dir .. "/ref"
local dplua_exe = (arg and arg[-1]) or "dplua"

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

local function listdir(d)
  local out = {}
  local p = io.popen("ls -A " .. T.sh_quote(d))
  for line in p:lines() do out[#out + 1] = line end
  p:close()
  table.sort(out)
  return out
end

-- The raw bytes of a tensor (contiguous, CPU) in hex.
local function tensor_hex(t)
  local c = t:contiguous()
  local n = c:numel() * c.dtype.itemsize
  if n == 0 then return "" end
  local s = ffi.string(torch.C.dp_tensor_data(c.p), n)
  return (s:gsub(".", function(ch) return ("%02x"):format(ch:byte()) end))
end

-- A safetensors file's header length, and its data section.
local function header_length(s)
  local n = 0
  for i = 8, 1, -1 do n = n * 256 + s:byte(i) end
  return n
end
local function data_part(s) return s:sub(9 + header_length(s)) end

local function same_tensor(a, b)
  return torch.is_tensor(a) and torch.is_tensor(b) and a.dtype == b.dtype
    and tostring(a:size()) == tostring(b:size()) and tensor_hex(a) == tensor_hex(b)
end

-- PyTorch's model in gen_safetensors_ref.py.
local function make_ref_model()
  return nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 3))
end

---------------------------------------------------------------- the files PyTorch checks

-- Loads PyTorch's two files from src and writes dplua's two files into out
-- (deterministic: nothing but copies and exact products).
local function write_ref_files(src, out)
  local sd = torch.load(src .. "/safetensors_torch_model.safetensors")
  local model = make_ref_model()
  model:load_state_dict(sd)
  torch.save(model:state_dict(), out .. "/safetensors_dplua_model.safetensors")
  local extra = torch.load(src .. "/safetensors_torch_dtypes.safetensors")
  local state, ids, i = {}, {}, 0
  for _, v in model:state_dict():items() do
    state[i] = { step = 2, exp_avg = v * 0.5, exp_avg_sq = v * v }
    ids[#ids + 1] = i
    i = i + 1
  end
  torch.manual_seed(7)
  local ck = {
    model = model:state_dict(),
    optimizer = { state = state, param_groups = { { lr = 1e-3, betas = { 0.9, 0.999 }, eps = 1e-8,
                                                    weight_decay = 0, amsgrad = false, params = ids } } },
    scheduler = { last_epoch = 2, base_lrs = { 1e-3 }, _last_lr = { 5e-4 } },
    extra = extra, rng = torch.get_rng_state(), step = 100, note = "written by dplua",
  }
  torch.save(ck, out .. "/safetensors_dplua_ckpt.safetensors")
end

---------------------------------------------------------------- training runs

-- Two configurations: Adam + StepLR, and SGD (momentum, nesterov, weight
-- decay) + SequentialLR(LinearLR, CosineAnnealingLR); both with dropout, so
-- the RNG state matters.
local CONFIGS = {
  adam = function(model)
    local opt = optim.Adam(model:parameters(), { lr = 0.01, weight_decay = 1e-4 })
    return opt, optim.lr_scheduler.StepLR(opt, 4, 0.5)
  end,
  sgd = function(model)
    local opt = optim.SGD(model:parameters(), { lr = 0.05, momentum = 0.9, nesterov = true, weight_decay = 1e-3 })
    local warm = optim.lr_scheduler.LinearLR(opt, { start_factor = 0.25, total_iters = 3 })
    local cos = optim.lr_scheduler.CosineAnnealingLR(opt, { T_max = 12 })
    return opt, optim.lr_scheduler.SequentialLR(opt, { warm, cos }, { 3 })
  end,
}
local STEPS, SAVE_AT = 16, 7

local function batches()
  torch.manual_seed(1234)
  local xs, ys = {}, {}
  for s = 1, STEPS do
    xs[s] = torch.randn(16, 8)
    ys[s] = torch.randint(0, 4, { 16 })
  end
  return xs, ys
end

local function build(config, seed)
  torch.manual_seed(seed)
  local model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.25), nn.Linear(32, 4))
  local opt, sched = CONFIGS[config](model)
  return model, opt, sched
end

-- Steps from..to on batches xs[s], ys[s]: losses[s] for each.
local function train(model, opt, sched, xs, ys, from, to, losses)
  model:train()
  for s = from, to do
    losses[s] = models.step(model, opt, F.cross_entropy, xs[s], ys[s]):item()
    sched:step()
  end
  return losses
end

local function checkpoint(model, opt, sched, step)
  return { model = model:state_dict(), optimizer = opt:state_dict(), scheduler = sched:state_dict(),
           rng = torch.get_rng_state(), step = step }
end

local function resume(path, config, restore_rng)
  local model, opt, sched = build(config, 999)   -- another init: only the checkpoint can make it right
  local ck = torch.load(path)
  model:load_state_dict(ck.model)
  opt:load_state_dict(ck.optimizer)
  sched:load_state_dict(ck.scheduler)
  if restore_rng ~= false then torch.set_rng_state(ck.rng) end
  return model, opt, sched, ck.step
end

---------------------------------------------------------------- modes

if arg and arg[1] == "--write-ref" then
  write_ref_files(arg[2], arg[2])
  os.exit(0)
end

if arg and arg[1] == "--resume" then
  local path, config, to = arg[2], arg[3], tonumber(arg[4])
  local xs, ys = batches()
  local model, opt, sched, step = resume(path, config)
  local losses = train(model, opt, sched, xs, ys, step + 1, to, {})
  for s = step + 1, to do io.write(("%d %a\n"):format(s, losses[s])) end
  os.exit(0)
end

-- Under the launcher (dplua --nproc_per_node=N ... --ddp DIR): rank 0
-- saves, every rank loads after a barrier, and a resumed DDP run (every
-- rank restoring its own RNG state, gathered into the checkpoint) repeats
-- the uninterrupted one. Each rank prints "rank R ok NAME" or "rank R not
-- ok NAME"; the parent turns them into TAP.
if arg and arg[1] == "--ddp" then
  local dist = torch.distributed
  local dir = arg[2]
  dist.init_process_group("gloo")
  local rank, world = dist.get_rank(), dist.get_world_size()
  local function report(cond, name) io.write(("rank %d %s %s\n"):format(rank, cond and "ok" or "not ok", name)) end
  local path = dir .. "/ddp.safetensors"
  -- each rank its half of every batch
  local xs, ys = batches()
  for s = 1, STEPS do
    xs[s], ys[s] = xs[s]:narrow(0, rank * 8 % 16, 8), ys[s]:narrow(0, rank * 8 % 16, 8)
  end
  local function make(seed)
    local model, opt, sched = build("adam", seed)
    local ddp = nn.parallel.DistributedDataParallel(model)
    local o, s = CONFIGS.adam(ddp.module)
    return ddp, o, s
  end
  local ddp, opt, sched = make(1)
  torch.manual_seed(50 + rank)   -- each rank its own dropout stream
  local full = train(ddp, opt, sched, xs, ys, 1, SAVE_AT, {})
  -- every rank's RNG state, gathered: rank 0 saves them all
  local states = torch.empty(world * 16, { dtype = torch.uint8 })
  dist.all_gather_into_tensor(states, torch.get_rng_state())
  if rank == 0 then
    torch.save({ model = ddp.module:state_dict(), optimizer = opt:state_dict(), scheduler = sched:state_dict(),
                 rng = states:view(world, 16), step = SAVE_AT }, path)
  end
  dist.barrier()
  train(ddp, opt, sched, xs, ys, SAVE_AT + 1, STEPS, full)

  local ck = torch.load(path)   -- every rank loads
  local ddp2, opt2, sched2 = make(2)
  ddp2.module:load_state_dict(ck.model)
  opt2:load_state_dict(ck.optimizer)
  sched2:load_state_dict(ck.scheduler)
  torch.set_rng_state(ck.rng[rank])
  report(ck.step == SAVE_AT, "the step")
  local resumed = train(ddp2, opt2, sched2, xs, ys, ck.step + 1, STEPS, {})
  local same = true
  for s = SAVE_AT + 1, STEPS do same = same and resumed[s] == full[s] end
  report(same, "losses after resume == the uninterrupted DDP run's")
  local psame = true
  local final = ddp.module:state_dict()
  for k, v in ddp2.module:state_dict():items() do psame = psame and same_tensor(v, final[k]) end
  report(psame, "final parameters are bit-identical")
  dist.barrier()
  dist.destroy_process_group()
  os.exit(0)
end

local tmp = T.temp_dir("ckpt")

---------------------------------------------------------------- PyTorch's files

T.run("PyTorch's files load with equal values", function()
  local ref = dofile(ref_dir .. "/safetensors_ref.lua")
  for _, which in ipairs({ "model", "dtypes" }) do
    local path = ref_dir .. "/safetensors_torch_" .. which .. ".safetensors"
    local sd, meta = torch.load(path)
    T.is(meta.format, "pt", which .. ": __metadata__ format")
    local names = {}
    for _, e in ipairs(ref[which]) do names[#names + 1] = e.name end
    T.is(sd:keys(), names, which .. ": the names, in the file's order")
    for _, e in ipairs(ref[which]) do
      local t = sd[e.name]
      local ok, why = T.check_tensor(t, e, 0, 0)
      T.ok(ok, which .. ": " .. e.name .. " dtype, shape and values", why)
      T.is(t and tensor_hex(t), e.bytes, which .. ": " .. e.name .. " bytes")
    end
  end
  -- PyTorch's state dict drives a dplua model to PyTorch's output
  local model = make_ref_model()
  model:load_state_dict(torch.load(ref_dir .. "/safetensors_torch_model.safetensors"))
  model:eval()
  local y = torch.no_grad(function() return model(torch.tensor(ref.input)) end)
  T.tensor_close(y, ref.output, 1e-5, 1e-6, "the model loaded from PyTorch's file gives PyTorch's output")
end)

T.run("dplua writes the files that PyTorch read", function()
  local out = tmp .. "/ref"
  os.execute("mkdir -p " .. T.sh_quote(out))
  write_ref_files(ref_dir, out)
  for _, which in ipairs({ "model", "ckpt" }) do
    local name = "safetensors_dplua_" .. which .. ".safetensors"
    local got, gmeta = torch.load(out .. "/" .. name)
    local want, wmeta = torch.load(ref_dir .. "/" .. name)
    gmeta.dplua_version, wmeta.dplua_version = nil, nil
    T.is(gmeta, wmeta, which .. ": the same metadata (the version aside)")
    T.ok(got ~= nil and want ~= nil, which .. ": both load")
    -- the same tensors, bit for bit, in the same order: the same data section
    T.ok(data_part(T.read_file(out .. "/" .. name)) == data_part(T.read_file(ref_dir .. "/" .. name)),
         which .. ": the same data bytes")
  end
  -- the current files go to PyTorch itself when it is here
  local py = "/usr/bin/python3"
  local have = os.getenv("DPLUA_TEST_NO_PYTHON") == nil
    and os.execute(py .. " -c 'import torch' >/dev/null 2>&1") == 0
  if not have then
    T.skip("no /usr/bin/python3 with torch (the committed files were checked by it)", "PyTorch reads the files written now")
  else
    local script = test_dir .. "/../scripts/gen_safetensors_ref.py"
    local p = io.popen(py .. " " .. T.sh_quote(script) .. " --check-dplua " .. T.sh_quote(out) .. " 2>&1; echo rc=$?")
    local text = p:read("*a")
    p:close()
    T.ok(text:find("rc=0\n$") ~= nil, "PyTorch reads the files written now: model.load_state_dict(load_file()) and every tensor equal", text)
  end
end)

---------------------------------------------------------------- values round-trip

T.run("plain values and tables round-trip", function()
  local path = tmp .. "/values.safetensors"
  local big = ffi.new("int64_t", 1) * 2 ^ 62 + 3
  local obj = {
    int = 42, neg = -7, float = 0.1, third = 1 / 3, tiny = 5e-324, huge = 1.7976931348623157e308,
    nan = 0 / 0, inf = math.huge, ninf = -math.huge, zero = 0,
    yes = true, no = false, str = "hello \"world\"\n\t\\", utf8 = "naïve ünïcödé ✓",
    bytes = "\0\1\255\128binary", empty = {}, list = { 1, 2, 3, "x", { true } },
    holes = { [1] = "a", [3] = "c" }, numkeys = { [0] = "zero", [1] = "one", [-2] = "m", [2.5] = "f" },
    infkeys = { [math.huge] = "inf", [-math.huge] = "-inf" }, bytekeys = { ["\255\0"] = 1, ["a\0b"] = 2 },
    mixed = { "first", key = "v" }, reserved = { __tensor__ = "not a tensor", __x = 1 },
    dt = torch.float64, dev = torch.device("cpu"), i64 = big,
    nested = { a = { b = { c = { d = { e = "deep" } } } } },
    ["dotted.key"] = 1, [""] = "empty key",
  }
  torch.save(obj, path)
  local got = torch.load(path)
  for k, v in pairs(obj) do
    if k ~= "i64" and k ~= "dt" and k ~= "dev" then T.is(got[k], v, "value " .. k) end
  end
  T.ok(got.dt == torch.float64, "a dtype comes back as the dtype object")
  T.ok(got.dev == torch.device("cpu"), "a device comes back as the device object")
  T.ok(ffi.istype("int64_t", got.i64) and got.i64 == big, "an int64 beyond 2^53 comes back exactly", tostring(got.i64))
  T.ok(1 / got.zero > 0, "0 stays +0")
  torch.save({ negzero = -0.0 }, path)
  T.ok(1 / torch.load(path).negzero < 0, "-0.0 stays -0.0")
  -- an int64 in the file past the type's range is refused, not wrapped
  -- around (the digits are replaced by as many, so the header's length holds)
  torch.save({ i64 = big }, path)
  local f = assert(io.open(path, "rb"))
  local bytes = f:read("*a")
  f:close()
  for _, case in ipairs({ { "9999999999999999999", "out of range" }, { "9223372036854775807", nil } }) do
    local edited = bytes:gsub(tostring(big):gsub("LL$", ""), case[1])
    f = assert(io.open(path, "wb"))
    f:write(edited)
    f:close()
    if case[2] then
      T.raises(function() torch.load(path) end, { "__int64__", case[2], case[1] }, "an __int64__ of " .. case[1])
    else
      T.is(tostring(torch.load(path).i64), case[1] .. "LL", "the largest int64, " .. case[1])
    end
  end
end)

T.run("tensors round-trip under dotted keys", function()
  local path = tmp .. "/tensors.safetensors"
  local base = torch.arange(24):float():view(2, 3, 4)
  local t = {
    f32 = torch.randn(3, 5), f64 = torch.randn(4):double(), i64 = torch.tensor({ { 1, -2 }, { 3, 4 } }, { dtype = torch.int64 }),
    i32 = torch.tensor({ 7, -8 }, { dtype = torch.int32 }), u8 = torch.tensor({ 0, 200, 255 }, { dtype = torch.uint8 }),
    b = torch.tensor({ true, false, true }), bf16 = torch.tensor({ 1.5, -3, 1e-3 }):bfloat16(),
    scalar = torch.tensor(3.25), empty = torch.zeros(0, 3),
    strided = base:permute(2, 0, 1), sliced = base[{ {}, { 1, 3 }, { 0, 4, 2 } }],
    expanded = torch.tensor({ 1, 2, 3 }):expand(4, 3),
  }
  t.requires = torch.ones(2, 2, { requires_grad = true }) * 3
  local obj = { group = t, list = { torch.ones(2), torch.zeros(3) }, numbered = { [0] = torch.full({ 2 }, 9.0) } }
  torch.save(obj, path)
  local got, meta = torch.load(path)
  for k, v in pairs(t) do
    T.ok(same_tensor(got.group[k], v:detach():contiguous()), "tensor " .. k .. " comes back bit for bit")
  end
  T.ok(not got.group.requires.requires_grad, "a loaded tensor does not require grad")
  T.ok(same_tensor(got.list[2], torch.zeros(3)), "tensors in lists")
  T.ok(same_tensor(got.numbered[0], torch.full({ 2 }, 9.0)), "tensors under number keys")
  local raw = torch.load(path) -- the file's tensor names are the dotted paths
  local f = io.open(path, "rb")
  local s = f:read("*a")
  f:close()
  for _, key in ipairs({ "group.f32", "group.strided", "list.1", "list.2", "numbered.0" }) do
    T.ok(s:find('"' .. key:gsub("%.", "%%.") .. '":{"dtype"') ~= nil, "stored under the dotted key " .. key)
  end
  T.ok(raw ~= nil and meta.dplua ~= nil, "the skeleton is in __metadata__.dplua")
end)

T.run("a model state dict alone: its own keys, its order, load_state_dict", function()
  local path = tmp .. "/model.safetensors"
  torch.manual_seed(3)
  local model = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))
  torch.save(model:state_dict(), path)
  local sd = torch.load(path)
  T.is(sd:keys(), { "0.weight", "0.bias", "2.weight", "2.bias" }, "the state dict's order is kept")
  local s = T.read_file(path)
  T.ok(s:find('"0.weight":{"dtype":"F32","shape":[5,3]', 1, true) ~= nil, "tensors are stored under the state dict's own names")
  local other = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))
  other:load_state_dict(sd)
  local ok = true
  for k, v in model:state_dict():items() do ok = ok and same_tensor(other:state_dict()[k], v) end
  T.ok(ok, "load_state_dict(torch.load(path)) restores every parameter")
  T.is((8 + header_length(s)) % 8, 0, "the data starts 8-byte aligned")
end)

T.run("names that collide and tensors saved twice", function()
  local path = tmp .. "/collide.safetensors"
  local a, b = torch.ones(1), torch.zeros(1)
  local shared = torch.full({ 2 }, 5.0)
  torch.save({ a = { ["b.c"] = a }, ["a.b"] = { c = b }, x = shared, y = shared, tensor = torch.ones(3) }, path)
  local got = torch.load(path)
  T.ok(same_tensor(got.a["b.c"], a) and same_tensor(got["a.b"].c, b), "both tensors of a colliding dotted name come back")
  T.ok(rawequal(got.x, got.y), "one tensor saved under two keys comes back as one tensor")
  local s = T.read_file(path)
  T.ok(s:find('"a.b.c~2"', 1, true) ~= nil, "the second colliding name gets a suffix")
  torch.save({ ["a\0b"] = torch.ones(1), ["\255"] = torch.zeros(1) }, path)
  got = torch.load(path)
  T.ok(same_tensor(got["a\0b"], torch.ones(1)) and same_tensor(got["\255"], torch.zeros(1)),
       "tensors under keys with NULs and invalid UTF-8 (stored as \\x00, \\xff)")
  torch.save(torch.arange(4), path)
  T.ok(same_tensor(torch.load(path), torch.arange(4)), "a lone tensor round-trips")
  torch.save(17, path)
  T.is(torch.load(path), 17, "a lone number round-trips")
  torch.save({}, path)
  T.is(torch.load(path), {}, "an empty table round-trips")
end)

T.run("map_location and metadata", function()
  local path = tmp .. "/ml.safetensors"
  torch.save({ w = torch.ones(2) }, path)
  local got, meta = torch.load(path, { map_location = "cpu" })
  T.ok(same_tensor(got.w, torch.ones(2)), "map_location=cpu")
  T.is(meta.format, "pt", "format=pt for safetensors.torch")
  T.is(meta.dplua_format, "1", "dplua_format")
  T.is(meta.dplua_version, torch.__version__, "dplua_version")
end)

---------------------------------------------------------------- errors

T.run("errors name the file and the problem", function()
  local path = tmp .. "/err.safetensors"
  T.raises(function() torch.save({ f = function() end }, path) end, { "torch.save", "function", "'f'" }, "a function cannot be saved")
  T.raises(function() torch.save({ a = { b = { print } } }, path) end, { "torch.save", "a%.b%.1" }, "the path to the bad value is named")
  T.raises(function() torch.save({ model = nn.Linear(2, 2) }, path) end, { "torch.save", "'model'", "state_dict" },
           "a module is refused: save its state_dict()")
  T.raises(function() torch.save(optim.SGD(nn.Linear(2, 2):parameters(), { lr = 0.1 }), path) end,
           { "torch.save", "the root", "state_dict" }, "an optimizer is refused too")
  local cyc = {}
  cyc.self = cyc
  T.raises(function() torch.save({ c = cyc }, path) end, { "torch.save", "cycle" }, "a cycle is refused")
  T.raises(function() torch.save({ [true] = 1 }, path) end, { "torch.save", "key of type boolean" }, "a boolean key is refused")
  T.raises(function() torch.save({ x = 1 }, 42) end, { "torch.save", "file path" }, "a path that is not a string")
  T.raises(function() torch.save({ x = 1 }) end, { "torch.save", "file path" }, "a missing path")
  T.raises(function() torch.save({ x = 1 }, "") end, { "torch.save", "empty string" }, "an empty path")
  T.raises(function() torch.save(nil, path) end, { "torch.save", "nil" }, "nothing to save")
  T.ok(not exists(path), "no file is left by failed saves")
  T.raises(function() torch.save({ x = torch.ones(1) }, tmp .. "/no/such/dir/x.safetensors") end,
           { "safetensors", "cannot create", "no/such/dir", "No such file" }, "a save into a missing directory")
  T.raises(function() torch.load(tmp .. "/missing.safetensors") end, { "safetensors", "cannot open", "missing%.safetensors", "No such file" }, "a missing file")
  T.raises(function() torch.load(tmp) end, { "safetensors", "directory" }, "a directory")
  os.execute("mkfifo " .. T.sh_quote(tmp .. "/fifo"))
  T.raises(function() torch.load(tmp .. "/fifo") end, { "safetensors", "fifo", "not a regular file" }, "a FIFO (without blocking)")
  os.remove(tmp .. "/fifo")
  T.write_file(path, "")
  T.raises(function() torch.load(path) end, { "err%.safetensors", "too short" }, "an empty file")
  T.write_file(path, "GIF89a this is an image, not safetensors")
  T.raises(function() torch.load(path) end, { "err%.safetensors", "header length", "larger than" }, "a file of another format")
  T.write_file(path, "PK\3\4 a zip signature, then nothing of a zip archive")
  T.raises(function() torch.load(path) end, { "err%.safetensors", "zip archive", "end%-of%-central%-directory" },
           "a file that starts as a zip archive is read as PyTorch's format, whatever its name")
  T.raises(function() torch.load(path, 3) end, { "torch.load", "map_location", "number" }, "bad options")
  T.raises(function() torch.set_rng_state(torch.zeros(3)) end, { "set_rng_state", "16 bytes" }, "a bad RNG state")
  T.raises(function() torch.set_rng_state("x") end, { "set_rng_state" }, "an RNG state that is not a tensor")
end)

T.run("a failed or repeated save leaves the previous file", function()
  local path = tmp .. "/keep.safetensors"
  torch.save({ v = torch.full({ 3 }, 1.0), n = 1 }, path)
  pcall(torch.save, { v = torch.full({ 3 }, 2.0), bad = coroutine.create(print) }, path)
  local got = torch.load(path)
  T.ok(got.n == 1 and same_tensor(got.v, torch.full({ 3 }, 1.0)), "the previous checkpoint is intact after a failed save")
  for i = 2, 5 do torch.save({ v = torch.full({ 3 }, i * 1.0), n = i }, path) end
  got = torch.load(path)
  T.ok(got.n == 5 and same_tensor(got.v, torch.full({ 3 }, 5.0)), "the last save wins")
  local left = {}
  for _, name in ipairs(listdir(tmp)) do if name:find("%.tmp%.") then left[#left + 1] = name end end
  T.is(left, {}, "no temporary file is left behind")
end)

---------------------------------------------------------------- RNG state

T.run("get_rng_state / set_rng_state", function()
  torch.manual_seed(7)
  local s = torch.get_rng_state()
  T.is(tostring(s.dtype), "torch.uint8", "a uint8 tensor")
  T.is(s:tolist(), { 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 }, "seed then offset, little-endian")
  local a = torch.rand(5)
  local mid = torch.get_rng_state()
  local b = torch.randn(3)
  torch.set_rng_state(mid)
  T.ok(same_tensor(torch.randn(3), b), "restoring the state repeats the stream")
  torch.set_rng_state(s)
  T.ok(same_tensor(torch.rand(5), a), "from the start too")
  local path = tmp .. "/rng.safetensors"
  torch.save({ rng = mid }, path)
  torch.manual_seed(1)
  torch.set_rng_state(torch.load(path).rng)
  T.ok(same_tensor(torch.randn(3), b), "through a checkpoint")
  torch.manual_seed(2 ^ 53 + 2)   -- a seed beyond a double's integers stays exact
  local big = torch.get_rng_state()
  torch.manual_seed(0)
  torch.set_rng_state(big)
  T.ok(same_tensor(torch.get_rng_state(), big), "a large seed survives")
end)

---------------------------------------------------------------- resuming

for _, config in ipairs({ "adam", "sgd" }) do
  T.run("resume is bit-exact: " .. config, function()
    local path = tmp .. "/resume_" .. config .. ".safetensors"
    local xs, ys = batches()
    local model, opt, sched = build(config, 1)
    torch.manual_seed(99)
    local full = train(model, opt, sched, xs, ys, 1, SAVE_AT, {})
    torch.save(checkpoint(model, opt, sched, SAVE_AT), path)
    train(model, opt, sched, xs, ys, SAVE_AT + 1, STEPS, full)
    local final = model:state_dict()

    -- in this process
    local m2, o2, s2, step = resume(path, config)
    T.is(step, SAVE_AT, "the step comes back")
    local resumed = train(m2, o2, s2, xs, ys, step + 1, STEPS, {})
    local same, diff = true, nil
    for s = SAVE_AT + 1, STEPS do
      if resumed[s] ~= full[s] then same = false; diff = diff or ("step %d: %a vs %a"):format(s, resumed[s], full[s]) end
    end
    T.ok(same, "losses after resume == the uninterrupted run's (" .. (STEPS - SAVE_AT) .. " steps)", diff)
    local params_same = true
    for k, v in m2:state_dict():items() do params_same = params_same and same_tensor(v, final[k]) end
    T.ok(params_same, "final parameters are bit-identical")
    T.is(o2.param_groups[1].lr, opt.param_groups[1].lr, "the scheduler's lr agrees")

    -- a fresh process
    local cmd = ("%s %s --resume %s %s %d"):format(T.sh_quote(dplua_exe),
      T.sh_quote(here .. "/test_checkpoint.lua"), T.sh_quote(path), config, STEPS)
    local p = io.popen("DPLUA_TEST_DIR=" .. T.sh_quote(test_dir) .. " " .. cmd .. " 2>&1")
    local out = p:read("*a")
    p:close()
    local want = {}
    for s = SAVE_AT + 1, STEPS do want[#want + 1] = ("%d %a"):format(s, full[s]) end
    T.is(out, table.concat(want, "\n") .. "\n", "a new process resumes to the same losses")

    -- without the RNG state, dropout draws differ: the test can tell
    local m3, o3, s3 = resume(path, config, false)
    torch.manual_seed(12345)
    local other = train(m3, o3, s3, xs, ys, SAVE_AT + 1, STEPS, {})
    T.ok(other[SAVE_AT + 2] ~= full[SAVE_AT + 2], "without restoring the RNG state the losses differ (dropout)")
  end)
end

T.run("under DDP: rank 0 saves, every rank loads, resume is bit-exact", function()
  local world = 2
  local cmd = ("timeout 120 %s --nproc_per_node=%d %s --ddp %s 2>&1; echo \"exit=$?\""):format(
    T.sh_quote(dplua_exe), world, T.sh_quote(here .. "/test_checkpoint.lua"), T.sh_quote(tmp))
  local p = io.popen("DPLUA_TEST_DIR=" .. T.sh_quote(test_dir) .. " " .. cmd)
  local out = p:read("*a")
  p:close()
  if out:find("unknown option") or out:find("nproc_per_node") and out:find("usage") then
    T.skip("this dplua has no launcher", "DDP checkpoint")
    return
  end
  for _, name in ipairs({ "the step", "losses after resume == the uninterrupted DDP run's",
                          "final parameters are bit-identical" }) do
    local all = true
    for r = 0, world - 1 do all = all and out:find(("rank %d ok %s"):format(r, name), 1, true) ~= nil end
    T.ok(all, "DDP, every rank: " .. name, not all and out or nil)
  end
  T.ok(out:find("exit=0", 1, true) ~= nil, "the DDP run exits 0", out)
end)

os.execute("rm -rf " .. T.sh_quote(tmp))
T.done_testing()
