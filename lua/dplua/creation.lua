-- dplua.creation: the functions that make tensors: torch.zeros, ones,
-- empty, rand, randn, full, arange, linspace, eye, randint, randperm,
-- tensor, the *_like ones and the Tensor's new_* ones, and
-- torch.manual_seed.
local B = require("dplua.base")
local ffi, C, torch = B.ffi, B.C, B.torch
local raise, check, new, with_grad = B.raise, B.check, B.new, B.with_grad
local is_tensor, typename = B.is_tensor, B.typename
local check_int, check_number, parse_shape = B.check_int, B.check_number, B.parse_shape
local is_options, split_options, creation_opts = B.is_options, B.split_options, B.creation_opts
local dtypes_by_id, device_obj, shape_buf, outp, DP_CPU = B.dtypes_by_id, B.device_obj, B.shape_buf, B.outp, B.DP_CPU

local function sized(fn, maker)
  torch[fn] = function(...)
    local opts, n = split_options(...)
    if n == 0 then raise(fn .. ": expected a shape (sizes or a table of sizes)") end
    if n > 1 and type((...)) == "table" then raise(fn .. ": expected sizes as numbers or one table, not both") end
    local sizes = (...)
    if type(sizes) ~= "table" then sizes = { ... }; sizes[n + 1] = nil end
    local ndim = parse_shape(fn, sizes)
    local dt, dev = creation_opts(opts, fn)
    return with_grad(maker(ndim, dt, dev, opts), opts)
  end
end

sized("zeros", function(nd, dt, dev) return new(C.dp_full(outp, nd, shape_buf, 0, dt, dev)) end)
sized("ones", function(nd, dt, dev) return new(C.dp_full(outp, nd, shape_buf, 1, dt, dev)) end)
sized("empty", function(nd, dt, dev) return new(C.dp_empty(outp, nd, shape_buf, dt, dev)) end)
sized("rand", function(nd, dt, dev) return new(C.dp_rand(outp, nd, shape_buf, dt, dev)) end)
sized("randn", function(nd, dt, dev) return new(C.dp_randn(outp, nd, shape_buf, dt, dev)) end)

function torch.full(shape, value, opts)
  if type(shape) ~= "table" then raise("full: expected the shape as a table, got " .. typename(shape)) end
  local nd = parse_shape("full", shape)
  if type(value) == "boolean" then
    local dt, dev = creation_opts(opts, "full", torch.bool)
    return new(C.dp_full(outp, nd, shape_buf, value and 1 or 0, dt, dev))
  end
  check_number(value, "full", "the fill value")
  local default = value % 1 == 0 and torch.int64 or nil
  local dt, dev = creation_opts(opts, "full", default)
  return with_grad(new(C.dp_full(outp, nd, shape_buf, value, dt, dev)), opts)
end

function torch.arange(a, b, c, d)
  local opts
  if is_options(b) then opts, b = b, nil elseif is_options(c) then opts, c = c, nil elseif is_options(d) then opts = d end
  local start, stop, step = 0, a, 1
  if b ~= nil then start, stop = a, b end
  if c ~= nil then step = c end
  check_number(start, "arange", "start"); check_number(stop, "arange", "end"); check_number(step, "arange", "step")
  local integral = start % 1 == 0 and stop % 1 == 0 and step % 1 == 0
  local dt, dev = creation_opts(opts, "arange", integral and torch.int64 or nil)
  return new(C.dp_arange(outp, start, stop, step, dt, dev))
end

function torch.linspace(start, stop, steps, opts)
  check_number(start, "linspace", "start"); check_number(stop, "linspace", "end")
  check_int(steps, "linspace", "steps")
  local dt, dev = creation_opts(opts, "linspace")
  return new(C.dp_linspace(outp, start, stop, steps, dt, dev))
end

function torch.eye(n, m, opts)
  if is_options(m) then opts, m = m, nil end
  check_int(n, "eye", "n")
  if m ~= nil then check_int(m, "eye", "m") end
  if n < 0 or (m or 0) < 0 then raise("eye: sizes must be non-negative, got " .. n .. (m and (", " .. m) or "")) end
  local dt, dev = creation_opts(opts, "eye")
  return new(C.dp_eye(outp, n, m or -1, dt, dev))
end

function torch.randint(low, high, shape, opts)
  if type(high) == "table" then low, high, shape, opts = 0, low, high, shape end
  check_int(low, "randint", "low"); check_int(high, "randint", "high")
  if type(shape) ~= "table" then raise("randint: expected the shape as a table, got " .. typename(shape)) end
  local nd = parse_shape("randint", shape)
  local dt, dev = creation_opts(opts, "randint", torch.int64)
  return new(C.dp_randint(outp, low, high, nd, shape_buf, dt, dev))
end

-- randperm(n, {dtype=torch.int64, device=}): a random permutation of
-- 0 .. n-1 from torch's random stream: the order that sorts n uniform
-- float64 draws.
function torch.randperm(n, opts)
  check_int(n, "randperm", "n")
  if n < 0 then raise("randperm: expected n >= 0, got " .. n) end
  local dt, dev = creation_opts(opts, "randperm", torch.int64)
  local keys = torch.rand({ n }, { dtype = torch.float64, device = device_obj(dev) })
  local _, perm = keys:sort()
  return perm:to(dtypes_by_id[dt])
end

-- A seed as the 64-bit value of the stream (as PyTorch: a negative seed is
-- its 64-bit two's complement).
local function seed_value(seed, fn)
  if type(seed) ~= "number" or seed % 1 ~= 0 or seed < -2 ^ 63 or seed >= 2 ^ 64 then
    raise(fn .. ": expected an integer seed in [-2^63, 2^64), got " .. typename(seed) .. " " .. tostring(seed))
  end
  return seed < 0 and ffi.cast("uint64_t", ffi.cast("int64_t", seed)) or ffi.cast("uint64_t", seed)
end

---------------------------------------------------------------- torch.Generator

-- torch.Generator([device]): a random stream of its own, a seed and an
-- offset as torch's. A draw given {generator = g} (rand, randn, randint,
-- randperm, normal, multinomial, poisson; the samplers, DataLoader and
-- random_split take their seed from it) runs on g's stream, which moves
-- on, and leaves torch's as it was. One stream serves every device, as
-- torch's does, so the device is recorded and changes nothing.
-- torch.default_generator is torch's own stream as a Generator (what
-- torch.manual_seed returns, as in PyTorch).
local Generator = { __name = "Generator" }
Generator.__index = Generator
local generator_mt = Generator
local DEFAULT_SEED = 67280421310721ULL     -- PyTorch's default_rng_seed_val

function torch.Generator(device)
  local self = setmetatable({ _seed = DEFAULT_SEED, _offset = 0ULL }, Generator)
  self.device = torch.device(device or "cpu")
  return self
end
torch.default_generator = setmetatable({ _default = true, device = torch.device("cpu") }, Generator)
function torch.is_generator(g) return getmetatable(g) == generator_mt end

-- a generator's seed and offset, and setting them (torch's own for the default)
local pair = ffi.new("uint64_t[2]")
local function read_state(g)
  if not g._default then return g._seed, g._offset end
  C.dp_rng_get_state(pair, pair + 1)
  return pair[0], pair[1]
end
local function write_state(g, seed, offset)
  if g._default then C.dp_rng_set_state(seed, offset) else g._seed, g._offset = seed, offset end
end

function torch.manual_seed(seed)
  C.dp_manual_seed(seed_value(seed, "manual_seed"))
  return torch.default_generator
end
function Generator:manual_seed(seed)
  local s = seed_value(seed, "Generator.manual_seed")
  if self._default then C.dp_manual_seed(s) else write_state(self, s, 0ULL) end
  return self
end
function Generator:initial_seed() return tonumber((read_state(self))) end
-- seed(): a seed from the time and the clock, set and returned
function Generator:seed()
  local s = (os.time() * 1000003 + math.floor(os.clock() * 1e6)) % 2 ^ 53
  self:manual_seed(s)
  return s
end
-- torch.initial_seed() and torch.seed(): the default generator's
function torch.initial_seed() return torch.default_generator:initial_seed() end
function torch.seed() return torch.default_generator:seed() end
-- get_state() / set_state(state): the 16-byte uint8 tensor of
-- torch.get_rng_state's format (the seed, then the offset)
function Generator:get_state()
  pair[0], pair[1] = read_state(self)
  local t = torch.empty(16, { dtype = torch.uint8 })
  ffi.copy(C.dp_tensor_data(t.p), pair, 16)
  return t
end
function Generator:set_state(state)
  if not is_tensor(state) or state.dtype ~= torch.uint8 or state:numel() ~= 16 then
    raise("Generator.set_state: expected the uint8 tensor of 16 bytes that get_state returns, got " .. typename(state))
  end
  ffi.copy(pair, C.dp_tensor_data(state:cpu():contiguous().p), 16)
  write_state(self, pair[0], pair[1])
  return self
end
function Generator:__tostring() return "<torch.Generator object>" end

-- drawn(fn, g, f, ...): f(...) run on g's stream (torch's when g is nil);
-- fn names the caller in the error for a g that is not a Generator
local saved = ffi.new("uint64_t[2]")
local function drawn(fn, g, f, ...)
  if g == nil then return f(...) end
  if getmetatable(g) ~= generator_mt then
    raise(fn .. ": expected generator to be a torch.Generator, got " .. typename(g))
  end
  if g._default then return f(...) end
  C.dp_rng_get_state(saved, saved + 1)
  local outer_seed, outer_offset = saved[0], saved[1]
  C.dp_rng_set_state(g._seed, g._offset)
  return B.finally(function()
    C.dp_rng_get_state(saved, saved + 1)
    g._seed, g._offset = saved[0], saved[1]
    C.dp_rng_set_state(outer_seed, outer_offset)
  end, nil, pcall(f, ...))
end
torch._drawn = drawn

-- a random creation function that honours {generator = g} in its options
local function with_generator(name)
  local f = torch[name]
  torch[name] = function(...)
    local opts = split_options(...)
    if opts == nil or opts.generator == nil then return f(...) end
    return drawn(name, opts.generator, f, ...)
  end
end
for _, name in ipairs({ "rand", "randn", "randint", "randperm" }) do with_generator(name) end

-- tensor(data): nested tables are flattened row-major after checking that
-- they are rectangular; numbers give the default dtype (int64 if all are
-- integers), booleans give bool.
local function scan(data, depth, shape, flat, fn)
  if type(data) == "table" and not is_tensor(data) then
    local n = #data
    if shape[depth] == nil then
      if #shape >= 8 then raise(fn .. ": more than 8 nested levels") end
      shape[depth] = n
    elseif shape[depth] ~= n then
      raise(string.format("%s: expected a sequence of length %d at dim %d (got %d): nested tables must be rectangular",
                          fn, shape[depth], depth - 1, n))
    end
    for i = 1, n do scan(data[i], depth + 1, shape, flat, fn) end
    if n == 0 and depth == 1 then shape.empty = true end
  else
    if shape.leaf_depth == nil then shape.leaf_depth = depth
    elseif shape.leaf_depth ~= depth then
      raise(fn .. ": nested tables must be rectangular (a number appears where a table was expected)")
    end
    local tv = type(data)
    if tv == "boolean" then shape.has_bool = true
    elseif tv == "number" then if data % 1 ~= 0 then shape.has_float = true end
    elseif is_tensor(data) and data:numel() == 1 then data = data:item(); tv = type(data)
      if tv == "boolean" then shape.has_bool = true elseif data % 1 ~= 0 then shape.has_float = true end
    else
      raise(string.format("%s: expected numbers, booleans or nested tables of them, got %s", fn, typename(data)))
    end
    flat[#flat + 1] = data
  end
end

-- The dtypes whose range torch.tensor checks (dp_dtype_holds, full's rule):
-- the integers; a float past its range becomes an infinity, as in PyTorch.
local checked_range = { int64 = true, int32 = true, uint8 = true }

function torch.tensor(data, opts)
  if opts ~= nil and type(opts) ~= "table" then
    raise("tensor: expected an options table ({dtype=, device=, requires_grad=}), got " .. typename(opts))
  end
  if is_tensor(data) then
    local t = data:clone()
    if opts and (opts.dtype or opts.device) then t = t:to(opts.device or t.device, opts.dtype or t.dtype) end
    return t
  end
  local shape, flat = {}, {}
  scan(data, 1, shape, flat, "tensor")
  -- Lua has one number type, so numbers give the default float dtype
  -- (creation_opts' fallback; PyTorch's ints become int64 only when asked:
  -- {dtype=torch.int64}).
  local dt, dev = creation_opts(opts, "tensor", shape.has_bool and torch.bool or nil)
  local nd = #shape
  for i = 1, nd do shape_buf[i - 1] = shape[i] end
  local t = new(C.dp_empty(outp, nd, shape_buf, dt, DP_CPU))
  -- fill through a float64 staging tensor so every dtype's rounding is the C layer's
  local n = #flat
  if n > 0 then
    shape_buf[0] = n
    local stage = new(C.dp_empty(outp, 1, shape_buf, 1, DP_CPU))
    local p = ffi.cast("double *", C.dp_tensor_data(stage.p))
    local checked = checked_range[dtypes_by_id[dt].name]
    for i = 1, n do
      local v = flat[i]
      if v == true then v = 1 elseif v == false then v = 0 end
      if checked and C.dp_dtype_holds(dt, v) == 0 then
        raise(string.format("tensor: value %s cannot be converted to %s without overflow", tostring(v),
                            dtypes_by_id[dt].name))
      end
      p[i - 1] = v
    end
    for i = 1, nd do shape_buf[i - 1] = shape[i] end
    local view = new(C.dp_view(outp, stage.p, nd, shape_buf))
    check(C.dp_copy_into(t.p, view.p))
  end
  if dev ~= DP_CPU then t = t:to(device_obj(dev)) end
  return with_grad(t, opts)
end

local function like(fn, maker)
  torch[fn] = function(t, ...)
    if not is_tensor(t) then raise(fn .. ": expected a tensor, got " .. typename(t)) end
    local n = select("#", ...)
    local opts = n > 0 and select(n, ...) or nil
    opts = is_options(opts) and opts or {}
    local full = { dtype = opts.dtype or t.dtype, device = opts.device or t.device }
    return maker(t, full, ...)
  end
end
like("zeros_like", function(t, o) return torch.zeros(t:size(), o) end)
like("ones_like", function(t, o) return torch.ones(t:size(), o) end)
like("empty_like", function(t, o) return torch.empty(t:size(), o) end)
like("rand_like", function(t, o) return torch.rand(t:size(), o) end)
like("randn_like", function(t, o) return torch.randn(t:size(), o) end)
like("full_like", function(t, o, v) return torch.full(t:size(), v, o) end)
like("randint_like", function(t, o, low, high)
  if high == nil or is_options(high) then low, high = 0, low end
  return torch.randint(low, high, t:size(), o)
end)

-- t:new_zeros(size), new_ones, new_empty, new_full(size, value) and
-- new_tensor(data): made as torch's, with t's dtype and device unless the
-- options table says otherwise.
local methods = B.methods
local function new_opts(t, opts)
  opts = is_options(opts) and opts or {}
  local o = { dtype = t.dtype, device = t.device }
  for k, v in pairs(opts) do o[k] = v end
  return o
end
local function new_sized(fn, maker)
  methods[fn] = function(t, ...)
    local opts, n = split_options(...)
    if n == 0 then raise(fn .. ": expected a size (sizes or a table of sizes)") end
    local sizes = (...)
    if type(sizes) ~= "table" then sizes = { ... }; sizes[n + 1] = nil end
    return maker(sizes, new_opts(t, opts))
  end
end
new_sized("new_zeros", torch.zeros)
new_sized("new_ones", torch.ones)
new_sized("new_empty", torch.empty)
function methods.new_full(t, size, value, opts)
  if type(size) ~= "table" then raise("new_full: expected the size as a table, got " .. typename(size)) end
  return torch.full(size, value, new_opts(t, opts))
end
function methods.new_tensor(t, data, opts) return torch.tensor(data, new_opts(t, opts)) end
