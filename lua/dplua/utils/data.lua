-- dplua.utils.data: torch.utils.data — datasets, samplers, DataLoader, and
-- the IDX reader; GPT2Tokenizer and TokenShards come from tokens.lua.
--
--   local data = torch.utils.data
--   local ds = data.TensorDataset(x, y)              -- x: (N, ...), y: (N)
--   local loader = data.DataLoader(ds, {batch_size = 128, shuffle = true, seed = 1})
--   for epoch = 1, 5 do
--     for xb, yb in loader:iter() do ... end         -- one batch per step
--   end
--   print(#loader)                                   -- batches per epoch
--
-- Indices are 0-based, like tensor indices. A dataset's __getitem(i) returns
-- a sample as one or several values (Lua's answer to Python's tuples); a
-- batch comes back the same way, each value collated across the batch.
--
-- Datasets, samplers and loaders are userdata proxies rather than tables so
-- that `#obj` calls their __len (LuaJIT, like Lua 5.1, ignores __len on
-- tables); their fields and methods read and write like a table's.
--
-- TensorDataset (and any dataset with a __getitems(index_tensor) method) is
-- batched with one index_select per tensor instead of a Lua loop over
-- samples, so that loading is not the bottleneck of a training step.
local ffi = require("ffi")
local torch = require("dplua")
local C = torch.C
local raise = torch._raise
local is_tensor = torch.is_tensor

local data = {}

local function typename(x)
  if is_tensor(x) then return "Tensor" end
  return type(x)
end

local function is_int(v) return type(v) == "number" and v % 1 == 0 and v == v and v ~= math.huge and v ~= -math.huge end

---------------------------------------------------------------- classes

-- A class is a table of methods; Class(...) makes an instance (a proxy
-- whose fields live in a Lua table) and runs Class.__init(self, ...).
-- Class:extend("Name") makes a subclass. Numbers index through
-- __getitem: ds[i] is the sample (a list when __getitem returns several
-- values).

local class_of = setmetatable({}, { __mode = "k" })   -- instance -> class

local function pack_sample(...)
  if select("#", ...) == 1 then return (...) end
  return { ... }
end

local construct

local function instance_mt(cls, fields, self)
  local mt = getmetatable(self)
  mt.__index = function(_, k)
    local v = fields[k]
    if v ~= nil then return v end
    v = cls[k]
    if v ~= nil then return v end
    if type(k) == "number" and cls.__getitem then return pack_sample(cls.__getitem(self, k)) end
    return nil
  end
  mt.__newindex = fields
  mt.__len = function() return self:__len() end
  mt.__tostring = function() return cls.__repr and cls.__repr(self) or (cls.__name .. "()") end
  mt.__metatable = false
end

function construct(cls, ...)
  local self = newproxy(true)
  instance_mt(cls, {}, self)
  class_of[self] = cls
  local init = cls.__init
  if init then init(self, ...) end
  return self
end

local function class_tostring(cls) return "<class " .. rawget(cls, "__name") .. ">" end

local function new_class(name, parent)
  local cls = setmetatable({}, { __index = parent, __call = construct, __tostring = class_tostring })
  rawset(cls, "__name", name)
  rawset(cls, "__super", parent)
  return cls
end

local function extend(parent, name)
  if type(parent) ~= "table" or rawget(parent, "__name") == nil then
    raise("extend: call it as Dataset:extend(\"Name\") (with a colon)")
  end
  if type(name) ~= "string" or name == "" then
    raise("extend: expected a class name string, e.g. Dataset:extend(\"MyData\"), got " .. typename(name))
  end
  return new_class(name, parent)
end

-- The class of an instance made here, or nil.
local function class(x) return class_of[x] end

-- obj's method `name`, or nil. Reading a field of a cdata or of a strict
-- object may raise: that counts as no method.
local function method_of(obj, name)
  local ok, m = pcall(function() return obj[name] end)
  if ok and type(m) == "function" then return m end
  return nil
end

-- obj itself when it has the method `name`; else "fn: expected what, got ...".
local function with_method(obj, name, fn, what)
  if not method_of(obj, name) then raise(string.format("%s: expected %s, got %s", fn, what, typename(obj))) end
  return obj
end

-- Calls obj:__len() (an instance of ours, or any table with __len).
local function length(obj, what, fn)
  local f = method_of(obj, "__len")
  if not f then
    raise(string.format("%s: %s has no __len method (got %s)", fn, what, typename(obj)))
  end
  local n = f(obj)
  if not is_int(n) or n < 0 then
    raise(string.format("%s: %s's __len returned %s, expected a non-negative integer", fn, what, tostring(n)))
  end
  return n
end
data._length = length

-- Rejects option keys that are not in `known`: a typo must not be ignored.
local function check_options(fn, opts, known)
  if opts == nil then return {} end
  if type(opts) ~= "table" or is_tensor(opts) then
    raise(string.format("%s: expected an options table, got %s", fn, typename(opts)))
  end
  for k in pairs(opts) do
    if not known[k] then
      local names = {}
      for n in pairs(known) do names[#names + 1] = n end
      table.sort(names)
      raise(string.format("%s: unknown option '%s' (expected one of: %s)", fn, tostring(k), table.concat(names, ", ")))
    end
  end
  return opts
end

---------------------------------------------------------------- random numbers

-- A splitmix64 stream: samplers shuffle with it so that a seed gives the
-- same order on every platform and torch's own streams are not disturbed.
local Random = {}
Random.__index = Random
local GOLDEN = 0x9E3779B97F4A7C15ULL
local M1, M2 = 0xBF58476D1CE4E5B9ULL, 0x94D049BB133111EBULL
local bxor, rshift = bit.bxor, bit.rshift
local u64 = ffi.typeof("uint64_t")
local TWO32 = 4294967296

local function new_random(seed) return setmetatable({ state = u64(seed) }, Random) end
data._new_random = new_random

function Random:next32()
  local s = self.state + GOLDEN
  self.state = s
  local z = s
  z = bxor(z, rshift(z, 30)) * M1
  z = bxor(z, rshift(z, 27)) * M2
  z = bxor(z, rshift(z, 31))
  return tonumber(rshift(z, 32))
end

-- Uniform in [0, bound), without modulo bias.
function Random:below(bound)
  local lim = TWO32 - TWO32 % bound
  local r = self:next32()
  while r >= lim do r = self:next32() end
  return r % bound
end

-- A seed for one epoch drawn from torch's generator, so that
-- torch.manual_seed(s) makes unseeded shuffling reproducible.
local function seed_from_torch()
  local r = torch.randint(0, 2147483647, { 2 }):tolist()
  return u64(r[1]) * 2147483648ULL + r[2]
end

-- A seed option: a non-negative integer, or a torch.Generator, which gives
-- one drawn from its stream (so a Generator seeded alike shuffles alike).
local function check_seed(v, fn)
  if v == nil then return nil end
  if torch.is_generator(v) then return torch._drawn(fn, v, seed_from_torch) end
  if ffi.istype("uint64_t", v) then return v end   -- one drawn before
  if not is_int(v) or v < 0 then
    raise(string.format("%s: expected the generator to be a torch.Generator or a non-negative integer seed, got %s %s",
                        fn, typename(v), tostring(v)))
  end
  return v
end

-- An int64 tensor of n indices, and a pointer to write them.
local function index_buffer(n)
  local t = torch.empty(n, { dtype = torch.int64 })
  return t, ffi.cast("int64_t *", t:data_ptr())
end

---------------------------------------------------------------- datasets

local Dataset = new_class("Dataset", nil)
data.Dataset = Dataset
Dataset.extend = extend

function Dataset:__getitem(_)
  raise(class(self).__name .. ": a Dataset subclass must define __getitem(i)")
end
function Dataset:__len()
  raise(class(self).__name .. ": a Dataset subclass must define __len()")
end

-- TensorDataset(t1, t2, ...): sample i is t1[i], t2[i], ...
local TensorDataset = new_class("TensorDataset", Dataset)
data.TensorDataset = TensorDataset

function TensorDataset:__init(...)
  local n = select("#", ...)
  if n == 0 then raise("TensorDataset: expected at least one tensor") end
  local tensors = { ... }
  local size
  for i = 1, n do
    local t = tensors[i]
    if not is_tensor(t) then raise(string.format("TensorDataset: argument #%d is a %s, expected a tensor", i, typename(t))) end
    if t:dim() == 0 then raise(string.format("TensorDataset: argument #%d is a 0-d tensor; tensors need a first dim to index", i)) end
    local s = t:size(0)
    if size == nil then size = s
    elseif s ~= size then
      raise(string.format("TensorDataset: size mismatch between tensors: argument #1 has %d samples (dim 0) but argument #%d has %d",
                          size, i, s))
    end
  end
  self.tensors, self.n = tensors, size
end

function TensorDataset:__len() return self.n end

function TensorDataset:__getitem(i)
  local n = self.n
  if not is_int(i) then raise("TensorDataset: expected an integer index, got " .. typename(i) .. " " .. tostring(i)) end
  if i < -n or i >= n then
    raise(string.format("TensorDataset: index %d is out of range for a dataset of %d samples (indices are 0-based)", i, n))
  end
  local ts = self.tensors
  if #ts == 1 then return ts[1]:select(0, i) end
  local out = {}
  for k = 1, #ts do out[k] = ts[k]:select(0, i) end
  return unpack(out, 1, #ts)
end

-- A batch at once: index is an int64 tensor of sample indices.
function TensorDataset:__getitems(index)
  local ts = self.tensors
  if #ts == 1 then return ts[1]:index_select(0, index) end
  if #ts == 2 then return ts[1]:index_select(0, index), ts[2]:index_select(0, index) end
  local out = {}
  for k = 1, #ts do out[k] = ts[k]:index_select(0, index) end
  return unpack(out, 1, #ts)
end

function TensorDataset:__repr()
  local parts = {}
  for k, t in ipairs(self.tensors) do
    parts[k] = "[" .. table.concat(t:size(), ", ") .. "] " .. t.dtype.name
  end
  return "TensorDataset(" .. table.concat(parts, ", ") .. ")"
end

-- Subset(dataset, indices): the samples of dataset at indices (a Lua list
-- of 0-based indices, or an int64 tensor).
local Subset = new_class("Subset", Dataset)
data.Subset = Subset

local function to_index_tensor(list, fn, n)
  if is_tensor(list) then
    if list:dim() ~= 1 then raise(fn .. ": expected a 1-D index tensor") end
    return list:to(torch.int64):contiguous()
  end
  if type(list) ~= "table" then raise(string.format("%s: expected a list of indices, got %s", fn, typename(list))) end
  local t, p = index_buffer(#list)
  for k = 1, #list do
    local v = list[k]
    if not is_int(v) or (n and (v < 0 or v >= n)) then
      raise(string.format("%s: index %s at position %d is not an integer in [0, %s)", fn, tostring(v), k, tostring(n)))
    end
    p[k - 1] = v
  end
  return t
end

function Subset:__init(dataset, indices)
  if dataset == nil then raise("Subset: expected a dataset and a list of indices") end
  self.dataset = dataset
  self.indices = to_index_tensor(indices, "Subset", nil)
  self.n = self.indices:numel()
  self.ptr = ffi.cast("int64_t *", self.indices:data_ptr())
  local getitems = dataset.__getitems
  if getitems then
    self.__getitems = function(s, index) return getitems(s.dataset, s.indices:index_select(0, index)) end
  end
end

function Subset:__len() return self.n end
function Subset:__getitem(i)
  if not is_int(i) or i < -self.n or i >= self.n then
    raise(string.format("Subset: index %s is out of range for a subset of %d samples", tostring(i), self.n))
  end
  if i < 0 then i = i + self.n end
  return self.dataset:__getitem(tonumber(self.ptr[i]))
end

-- random_split(dataset, lengths [, generator]): disjoint Subsets of the
-- given lengths (numbers of samples, or fractions that sum to 1), in an
-- order drawn from generator (a torch.Generator or a seed, also as
-- {generator =}), else from torch's stream.
function data.random_split(dataset, lengths, seed)
  if type(seed) == "table" and getmetatable(seed) == nil then seed = seed.generator end
  local n = length(dataset, "the dataset", "random_split")
  if type(lengths) ~= "table" or #lengths == 0 then raise("random_split: expected a list of lengths") end
  local sizes, total = {}, 0
  local fractions = true
  for _, l in ipairs(lengths) do if not (type(l) == "number" and l >= 0 and l <= 1) then fractions = false end end
  if fractions then
    local s = 0
    for _, l in ipairs(lengths) do s = s + l end
    fractions = math.abs(s - 1) < 1e-9 and not (#lengths == 1 and n == 1)
  end
  for k, l in ipairs(lengths) do
    if fractions then l = math.floor(n * l) end
    if not is_int(l) or l < 0 then raise(string.format("random_split: length %s at position %d is not a non-negative integer", tostring(l), k)) end
    sizes[k], total = l, total + l
  end
  if fractions then
    -- hand the remainder out round-robin, as PyTorch does
    local k = 1
    while total < n do sizes[k], total, k = sizes[k] + 1, total + 1, k % #sizes + 1 end
  end
  if total ~= n then
    raise(string.format("random_split: the lengths sum to %d but the dataset has %d samples", total, n))
  end
  local perm = data.RandomSampler(dataset, { generator = check_seed(seed, "random_split") }):index_tensor()
  local out, start = {}, 0
  for k, l in ipairs(sizes) do
    out[k] = Subset(dataset, perm:narrow(0, start, l):clone())
    start = start + l
  end
  return out
end

-- A plain Lua list used as a dataset: element k is sample k - 1; an element
-- that is a list of values ({x, y}) is a sample of several values.
local ListDataset = new_class("ListDataset", Dataset)
function ListDataset:__init(list) self.list = list end
function ListDataset:__len() return #self.list end
function ListDataset:__getitem(i)
  local v = self.list[i + 1]
  if v == nil then raise(string.format("dataset: index %s is out of range for a list of %d samples", tostring(i), #self.list)) end
  if type(v) == "table" and getmetatable(v) == nil and v[1] ~= nil then return unpack(v, 1, #v) end
  return v
end

local function as_dataset(ds, fn)
  if type(ds) == "table" and not is_tensor(ds) and getmetatable(ds) == nil and rawget(ds, "__getitem") == nil then
    return ListDataset(ds)
  end
  return with_method(ds, "__getitem", fn, "a dataset (an object with __getitem and __len, or a Lua list)")
end

-- ConcatDataset(datasets): the datasets one after another; sample i is
-- the dataset's holding it, at i less the samples before that dataset.
local ConcatDataset = new_class("ConcatDataset", Dataset)
data.ConcatDataset = ConcatDataset

function ConcatDataset:__init(datasets)
  local fn = "ConcatDataset"
  if type(datasets) ~= "table" or #datasets == 0 then raise(fn .. ": expected a non-empty list of datasets") end
  self.datasets, self.cumulative_sizes = {}, {}
  local total = 0
  for i, d in ipairs(datasets) do
    local ds = as_dataset(d, fn)
    self.datasets[i] = ds
    total = total + length(ds, "dataset " .. i, fn)
    self.cumulative_sizes[i] = total
  end
  self.n = total
end
function ConcatDataset:__len() return self.n end
function ConcatDataset:__getitem(i)
  if not is_int(i) or i < -self.n or i >= self.n then
    raise(string.format("ConcatDataset: index %s is out of range for %d samples", tostring(i), self.n))
  end
  if i < 0 then i = i + self.n end
  local sizes = self.cumulative_sizes
  local lo, hi = 1, #sizes   -- the first dataset whose cumulative size exceeds i
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if sizes[mid] > i then hi = mid else lo = mid + 1 end
  end
  return self.datasets[lo]:__getitem(i - (lo > 1 and sizes[lo - 1] or 0))
end

-- IterableDataset: a stream of samples rather than an indexable set. A
-- subclass defines __iter(), which returns an iterator function giving one
-- sample (one value or several) a call and nil at the end (a
-- coroutine.wrap'd function does); __len() is optional.
--   local Stream = data.IterableDataset:extend("Stream")
--   function Stream:__iter() return coroutine.wrap(function() for i = 1, 10 do coroutine.yield(torch.tensor(i)) end end) end
local IterableDataset = new_class("IterableDataset", nil)
data.IterableDataset = IterableDataset
IterableDataset.extend = extend
function IterableDataset:__iter()
  raise(class(self).__name .. ": an IterableDataset subclass must define __iter()")
end

-- ChainDataset(datasets): the iterable datasets one after another.
local ChainDataset = new_class("ChainDataset", IterableDataset)
data.ChainDataset = ChainDataset
function ChainDataset:__init(datasets)
  if type(datasets) ~= "table" or #datasets == 0 then raise("ChainDataset: expected a non-empty list of datasets") end
  for i, d in ipairs(datasets) do
    with_method(d, "__iter", "ChainDataset", string.format("dataset %d to be iterable (with __iter)", i))
  end
  self.datasets = datasets
end
function ChainDataset:__iter()
  local datasets, k, it = self.datasets, 0, nil
  return function()
    while true do
      if it == nil then
        k = k + 1
        if datasets[k] == nil then return nil end
        it = datasets[k]:__iter()
      end
      local vals = { n = 0, it() }
      if vals[1] ~= nil then return unpack(vals) end
      it = nil
    end
  end
end
function ChainDataset:__len()
  local n = 0
  for i, d in ipairs(self.datasets) do n = n + length(d, "dataset " .. i, "ChainDataset") end
  return n
end

-- StackDataset(d1, d2, ...) (or {name = d, ...}): sample i is the samples
-- of every dataset at i, a list (or a table by name); the datasets must
-- have one length.
local StackDataset = new_class("StackDataset", Dataset)
data.StackDataset = StackDataset
function StackDataset:__init(...)
  local fn = "StackDataset"
  local first = ...
  local named = select("#", ...) == 1 and type(first) == "table" and getmetatable(first) == nil and first[1] == nil
  self.datasets = named and first or { ... }
  self.named = named
  local n
  for k, d in pairs(self.datasets) do
    local len = length(as_dataset(d, fn), "dataset " .. tostring(k), fn)
    if n ~= nil and len ~= n then raise(fn .. ": size mismatch between datasets") end
    n = len
  end
  if n == nil then raise(fn .. ": at least one dataset should be passed") end
  self.n = n
end
function StackDataset:__len() return self.n end
function StackDataset:__getitem(i)
  local out = {}
  if self.named then
    for k, d in pairs(self.datasets) do out[k] = d:__getitem(i) end
    return out
  end
  for k, d in ipairs(self.datasets) do
    local vals = { d:__getitem(i) }
    out[k] = #vals == 1 and vals[1] or vals
  end
  return unpack(out)
end

-- get_worker_info(): in a DataLoader worker, {id =, num_workers =, seed =,
-- dataset =}; nil in the main process, as PyTorch's.
function data.get_worker_info() return require("dplua.utils.data_workers").get_worker_info() end

---------------------------------------------------------------- samplers

-- A sampler yields 0-based sample indices: sampler:iter() is an iterator,
-- #sampler their number. The built-in ones also give an epoch's indices
-- at once as an int64 tensor (index_tensor), which DataLoader slices into
-- batches without a Lua loop.
local Sampler = new_class("Sampler", nil)
data.Sampler = Sampler
Sampler.extend = extend

function Sampler:iter()
  local idx = self:index_tensor()
  local p, n, i = ffi.cast("int64_t *", idx:data_ptr()), idx:numel(), -1
  return function()
    i = i + 1
    if i < n then return tonumber(p[i]) end
  end
end
function Sampler:index_tensor()
  local list = {}
  for i in self:iter() do list[#list + 1] = i end
  return to_index_tensor(list, "sampler")
end

local SequentialSampler = new_class("SequentialSampler", Sampler)
data.SequentialSampler = SequentialSampler

function SequentialSampler:__init(data_source)
  self.data_source = data_source
  self.n = length(data_source, "the data source", "SequentialSampler")
end
function SequentialSampler:__len() return self.n end
function SequentialSampler:index_tensor() return torch.arange(self.n) end

-- RandomSampler(data_source, {replacement=false, num_samples=, generator=seed}):
-- a fresh permutation each epoch (or num_samples draws with replacement).
-- With a seed, the sequence of epochs is reproducible; without one, each
-- epoch draws its seed from torch's generator (see torch.manual_seed).
local RandomSampler = new_class("RandomSampler", Sampler)
data.RandomSampler = RandomSampler

function RandomSampler:__init(data_source, opts)
  local fn = "RandomSampler"
  opts = check_options(fn, opts, { replacement = true, num_samples = true, generator = true, seed = true })
  self.data_source = data_source
  self.n = length(data_source, "the data source", fn)
  if opts.replacement ~= nil and type(opts.replacement) ~= "boolean" then
    raise("RandomSampler: expected replacement to be a boolean, got " .. typename(opts.replacement))
  end
  self.replacement = opts.replacement or false
  local ns = opts.num_samples
  if ns ~= nil and (not is_int(ns) or ns <= 0) then
    raise("RandomSampler: expected num_samples to be a positive integer, got " .. tostring(ns))
  end
  self.num_samples = ns or self.n
  if self.n >= TWO32 then raise("RandomSampler: at most 2^32 samples are supported") end
  local seed = check_seed(opts.generator or opts.seed, fn)
  self.rng = seed and new_random(seed) or nil
end

function RandomSampler:__len() return self.num_samples end

function RandomSampler:index_tensor()
  local n, m = self.n, self.num_samples
  local rng = self.rng or new_random(seed_from_torch())
  local t, p = index_buffer(m)
  if n == 0 then return t end
  if self.replacement then
    for i = 0, m - 1 do p[i] = rng:below(n) end
    return t
  end
  -- whole permutations (several when num_samples > n), Fisher-Yates
  local perm, pp = index_buffer(n)
  local done = 0
  while done < m do
    for i = 0, n - 1 do pp[i] = i end
    for i = n - 1, 1, -1 do
      local j = rng:below(i + 1)
      pp[i], pp[j] = pp[j], pp[i]
    end
    local take = math.min(n, m - done)
    ffi.copy(p + done, pp, take * 8)
    done = done + take
  end
  return t
end

-- DistributedSampler(dataset, {num_replicas=, rank=, shuffle=true, seed=0,
-- drop_last=false}): this rank's share of the indices, as in PyTorch: the
-- (shuffled) indices are padded by repeating the first ones (or, with
-- drop_last, cut) to a multiple of num_replicas, and rank r takes every
-- num_replicas-th from r. The permutation depends on seed + epoch only, so
-- every rank computes the same one; call set_epoch(e) before each epoch.
-- (The permutation itself is dplua's, not the one PyTorch would draw.)
local DistributedSampler = new_class("DistributedSampler", Sampler)
data.DistributedSampler = DistributedSampler

function DistributedSampler:__init(dataset, opts)
  local fn = "DistributedSampler"
  opts = check_options(fn, opts, { num_replicas = true, rank = true, shuffle = true, seed = true, drop_last = true })
  local dist = torch.distributed
  local replicas, rank = opts.num_replicas, opts.rank
  if replicas == nil or rank == nil then
    if not dist.is_initialized() then
      raise("DistributedSampler: pass num_replicas and rank, or call init_process_group first")
    end
    replicas = replicas or dist.get_world_size()
    rank = rank or dist.get_rank()
  end
  if not is_int(replicas) or replicas < 1 then
    raise("DistributedSampler: expected num_replicas to be a positive integer, got " .. tostring(replicas))
  end
  if not is_int(rank) or rank < 0 or rank >= replicas then
    raise(string.format("DistributedSampler: invalid rank %s, rank should be in the interval [0, %d]",
                        tostring(rank), replicas - 1))
  end
  for _, k in ipairs({ "shuffle", "drop_last" }) do
    if opts[k] ~= nil and type(opts[k]) ~= "boolean" then
      raise("DistributedSampler: expected " .. k .. " to be a boolean, got " .. typename(opts[k]))
    end
  end
  self.dataset, self.num_replicas, self.rank = dataset, replicas, rank
  self.n = length(dataset, "the dataset", fn)
  self.shuffle = opts.shuffle ~= false
  self.drop_last = opts.drop_last == true
  self.seed = check_seed(opts.seed or 0, fn)
  self.epoch = 0
  if self.drop_last and self.n % replicas ~= 0 then
    self.num_samples = math.ceil((self.n - replicas) / replicas)
  else
    self.num_samples = math.ceil(self.n / replicas)
  end
  self.total_size = self.num_samples * replicas
end

function DistributedSampler:__len() return self.num_samples end

function DistributedSampler:set_epoch(epoch)
  if not is_int(epoch) or epoch < 0 then
    raise("DistributedSampler.set_epoch: expected a non-negative integer, got " .. tostring(epoch))
  end
  self.epoch = epoch
end

function DistributedSampler:index_tensor()
  local n, total, replicas = self.n, self.total_size, self.num_replicas
  local all, ap = index_buffer(n)
  for i = 0, n - 1 do ap[i] = i end
  if self.shuffle then
    local rng = new_random(u64(self.seed) + u64(self.epoch))
    for i = n - 1, 1, -1 do
      local j = rng:below(i + 1)
      ap[i], ap[j] = ap[j], ap[i]
    end
  end
  local t, p = index_buffer(self.num_samples)
  local k = 0
  for pos = self.rank, total - 1, replicas do
    -- positions past n wrap around to the first indices (padding)
    p[k] = n > 0 and ap[pos % n] or 0
    k = k + 1
  end
  return t
end

-- SubsetRandomSampler(indices [, {generator=seed}]): the given indices in
-- a fresh random order each epoch (a train/validation split of one dataset).
local SubsetRandomSampler = new_class("SubsetRandomSampler", Sampler)
data.SubsetRandomSampler = SubsetRandomSampler

function SubsetRandomSampler:__init(indices, opts)
  local fn = "SubsetRandomSampler"
  opts = check_options(fn, opts, { generator = true, seed = true })
  self.indices = to_index_tensor(indices, fn, nil)
  local n = self.indices:numel()
  self.order = RandomSampler({ __len = function() return n end }, { generator = opts.generator or opts.seed })
end
function SubsetRandomSampler:__len() return self.indices:numel() end
function SubsetRandomSampler:index_tensor() return self.indices:index_select(0, self.order:index_tensor()) end

-- WeightedRandomSampler(weights, num_samples [, replacement=true,
-- {generator=seed}]): num_samples indices drawn with probabilities
-- proportional to weights (a list or a 1-D tensor, non-negative), through
-- torch.multinomial (torch's stream, or the seed's).
local WeightedRandomSampler = new_class("WeightedRandomSampler", Sampler)
data.WeightedRandomSampler = WeightedRandomSampler

function WeightedRandomSampler:__init(weights, num_samples, replacement, opts)
  local fn = "WeightedRandomSampler"
  if type(replacement) == "table" then replacement, opts = nil, replacement end
  opts = check_options(fn, opts, { replacement = true, generator = true, seed = true })
  if replacement == nil then replacement = opts.replacement end
  if torch.is_tensor(weights) then weights = weights:double():reshape(-1)
  elseif type(weights) == "table" then weights = torch.tensor(weights, { dtype = torch.float64 })
  else raise(fn .. ": expected weights to be a list or a tensor, got " .. typename(weights)) end
  if weights:numel() == 0 or weights:lt(0):any():item() or weights:ne(weights):any():item() then
    raise(fn .. ": expected non-negative weights, at least one")
  end
  if not is_int(num_samples) or num_samples <= 0 then
    raise(fn .. ": expected num_samples to be a positive integer, got " .. tostring(num_samples))
  end
  if replacement ~= nil and type(replacement) ~= "boolean" then
    raise(fn .. ": expected replacement to be a boolean, got " .. typename(replacement))
  end
  self.weights, self.num_samples, self.replacement = weights, num_samples, replacement ~= false
  if not self.replacement and num_samples > weights:ne(0):sum():item() then
    raise(string.format("%s: cannot draw %d samples without replacement from %d of non-zero weight", fn, num_samples,
                        weights:ne(0):sum():item()))
  end
  self.seed = check_seed(opts.generator or opts.seed, fn)
  self.epoch = 0
end
function WeightedRandomSampler:__len() return self.num_samples end
function WeightedRandomSampler:index_tensor()
  if not self.seed then return torch.multinomial(self.weights, self.num_samples, self.replacement) end
  self.epoch = self.epoch + 1   -- a reproducible sequence of epochs
  return torch.multinomial(self.weights, self.num_samples, self.replacement, { generator = self.seed + self.epoch - 1 })
end

-- BatchSampler(sampler, batch_size, drop_last): lists of indices.
local BatchSampler = new_class("BatchSampler", nil)
data.BatchSampler = BatchSampler
BatchSampler.extend = extend

local function check_batch_size(b, fn)
  if not is_int(b) or b <= 0 then
    raise(string.format("%s: expected batch_size to be a positive integer, got %s %s", fn, typename(b), tostring(b)))
  end
  return b
end

local function as_sampler(s, fn)
  if type(s) == "table" and getmetatable(s) == nil and not is_tensor(s) then
    local list = s
    s = Sampler()
    s.iter = function()
      local k = 0
      return function() k = k + 1; return list[k] end
    end
    s.__len = function() return #list end
    return s
  end
  return with_method(s, "iter", fn, "a sampler (an object with iter() and __len) or a list of indices")
end

function BatchSampler:__init(sampler, batch_size, drop_last)
  local fn = "BatchSampler"
  self.sampler = as_sampler(sampler, fn)
  self.batch_size = check_batch_size(batch_size, fn)
  if drop_last ~= nil and type(drop_last) ~= "boolean" then
    raise("BatchSampler: expected drop_last to be a boolean, got " .. typename(drop_last))
  end
  self.drop_last = drop_last or false
end

function BatchSampler:__len()
  local n = length(self.sampler, "the sampler", "BatchSampler")
  if self.drop_last then return math.floor(n / self.batch_size) end
  return math.ceil(n / self.batch_size)
end

-- Batches as int64 index tensors (views of one epoch's index tensor).
function BatchSampler:index_batches()
  local sampler = self.sampler
  local idx = (sampler.index_tensor or Sampler.index_tensor)(sampler)
  local n, b, start = idx:numel(), self.batch_size, 0
  local drop = self.drop_last
  return function()
    local len = math.min(b, n - start)
    if len <= 0 or (drop and len < b) then return nil end
    local v = idx:narrow(0, start, len)
    start = start + len
    return v
  end
end

function BatchSampler:iter()
  local batches = self:index_batches()
  return function()
    local v = batches()
    if v == nil then return nil end
    local p, list = ffi.cast("int64_t *", v:data_ptr()), {}
    for i = 1, v:numel() do list[i] = tonumber(p[i - 1]) end
    return list
  end
end

function BatchSampler:__repr()
  return string.format("BatchSampler(batch_size=%d, drop_last=%s)", self.batch_size, tostring(self.drop_last))
end

---------------------------------------------------------------- collate

-- default_collate(batch): batch is a list of samples; tensors are stacked
-- along a new dim 0, numbers become a tensor (int64 when every one is an
-- integer, else float64, as PyTorch does for Python ints and floats),
-- booleans a bool tensor, strings stay a list, and tables (lists or maps)
-- are collated field by field.
local function collate(batch, path)
  local first = batch[1]
  local ty = typename(first)
  for k = 2, #batch do
    if typename(batch[k]) ~= ty then
      raise(string.format("default_collate: sample %d%s is a %s but sample 1 is a %s", k, path, typename(batch[k]), ty))
    end
  end
  if ty == "Tensor" then
    local ok, r = pcall(torch.stack, batch, 0)
    if not ok then
      raise("default_collate: cannot stack the samples" .. path .. ": " .. tostring(r):gsub("^[^\n:]-:%d+: ", ""))
    end
    return r
  elseif ty == "number" then
    local integral = true
    for k = 1, #batch do if batch[k] % 1 ~= 0 then integral = false; break end end
    return torch.tensor(batch, { dtype = integral and torch.int64 or torch.float64 })
  elseif ty == "boolean" then
    return torch.tensor(batch, { dtype = torch.bool })
  elseif ty == "string" then
    return batch
  elseif ty == "table" then
    local out = {}
    for key in pairs(first) do
      local column = {}
      for k = 1, #batch do
        local v = batch[k][key]
        if v == nil then raise(string.format("default_collate: sample %d%s has no field %s", k, path, tostring(key))) end
        column[k] = v
      end
      out[key] = collate(column, path .. "[" .. tostring(key) .. "]")
    end
    return out
  end
  raise(string.format("default_collate: cannot collate a %s%s (expected tensors, numbers, booleans, strings or tables)",
                      ty, path))
end

function data.default_collate(batch)
  if type(batch) ~= "table" or #batch == 0 then raise("default_collate: expected a non-empty list of samples") end
  return collate(batch, "")
end

---------------------------------------------------------------- DataLoader

-- DataLoader(dataset, {batch_size=1, shuffle=false, sampler=, batch_sampler=,
--            drop_last=false, collate_fn=, generator=seed}).
-- for x, y in loader:iter() do ... end; #loader is the number of batches.
local DataLoader = new_class("DataLoader", nil)
data.DataLoader = DataLoader

local loader_options = {
  batch_size = true, shuffle = true, sampler = true, batch_sampler = true, drop_last = true,
  collate_fn = true, generator = true, seed = true,
  pin_memory = true,
  num_workers = true, persistent_workers = true, prefetch_factor = true, worker_init_fn = true, timeout = true,
}

-- num_workers, prefetch_factor, persistent_workers, worker_init_fn and
-- timeout, checked and kept
local function worker_options(self, opts)
  local nw = opts.num_workers
  if nw ~= nil and (not is_int(nw) or nw < 0) then raise("DataLoader: expected num_workers to be a non-negative integer, got " .. tostring(nw)) end
  self.num_workers = nw or 0
  local pf = opts.prefetch_factor
  if pf ~= nil and (not is_int(pf) or pf < 1) then raise("DataLoader: expected prefetch_factor to be an integer >= 1, got " .. tostring(pf)) end
  if pf ~= nil and self.num_workers == 0 then
    raise("DataLoader: prefetch_factor option could only be specified in multiprocessing (num_workers > 0)")
  end
  self.prefetch_factor = pf or 2
  if opts.persistent_workers ~= nil and type(opts.persistent_workers) ~= "boolean" then
    raise("DataLoader: expected persistent_workers to be a boolean, got " .. typename(opts.persistent_workers))
  end
  if opts.persistent_workers and self.num_workers == 0 then
    raise("DataLoader: persistent_workers option needs num_workers > 0")
  end
  self.persistent_workers = opts.persistent_workers == true
  if opts.worker_init_fn ~= nil and type(opts.worker_init_fn) ~= "function" then
    raise("DataLoader: expected worker_init_fn to be a function, got " .. typename(opts.worker_init_fn))
  end
  self.worker_init_fn = opts.worker_init_fn
  if opts.timeout ~= nil and (type(opts.timeout) ~= "number" or opts.timeout < 0) then
    raise("DataLoader: expected timeout to be a non-negative number of seconds, got " .. tostring(opts.timeout))
  end
  self.timeout = opts.timeout or 0
end

function DataLoader:__init(dataset, opts)
  local fn = "DataLoader"
  opts = check_options(fn, opts, loader_options)
  if opts.pin_memory ~= nil and type(opts.pin_memory) ~= "boolean" then
    raise("DataLoader: expected pin_memory to be a boolean, got " .. typename(opts.pin_memory))
  end
  -- (as PyTorch: without a GPU there is nothing to pin for)
  self.pin_memory = opts.pin_memory == true and torch.cuda.is_available()
  if method_of(dataset, "__iter") and not method_of(dataset, "__getitem") then
    -- an IterableDataset: batches of consecutive samples, no sampler
    for _, k in ipairs({ "shuffle", "sampler", "batch_sampler" }) do
      if opts[k] then
        raise(string.format("DataLoader: with an IterableDataset, expected unspecified %s option, but got %s=%s", k, k,
                            tostring(opts[k])))
      end
    end
    self.dataset, self.iterable = dataset, true
    self.batch_size = check_batch_size(opts.batch_size == nil and 1 or opts.batch_size, fn)
    self.drop_last = opts.drop_last or false
    if opts.collate_fn ~= nil and type(opts.collate_fn) ~= "function" then
      raise("DataLoader: expected collate_fn to be a function, got " .. typename(opts.collate_fn))
    end
    self.collate_fn = opts.collate_fn
    worker_options(self, opts)
    return
  end
  self.dataset = as_dataset(dataset, fn)
  local shuffle = opts.shuffle
  if shuffle ~= nil and type(shuffle) ~= "boolean" then raise("DataLoader: expected shuffle to be a boolean, got " .. typename(shuffle)) end
  local drop_last = opts.drop_last
  if drop_last ~= nil and type(drop_last) ~= "boolean" then raise("DataLoader: expected drop_last to be a boolean, got " .. typename(drop_last)) end
  if opts.collate_fn ~= nil and type(opts.collate_fn) ~= "function" then
    raise("DataLoader: expected collate_fn to be a function, got " .. typename(opts.collate_fn))
  end
  worker_options(self, opts)
  local seed = check_seed(opts.generator or opts.seed, fn)
  if opts.batch_sampler ~= nil then
    if opts.batch_size ~= nil or shuffle or opts.sampler ~= nil or drop_last then
      raise("DataLoader: batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and drop_last")
    end
    self.batch_sampler = as_sampler(opts.batch_sampler, fn)
    self.batch_size = nil
  else
    if opts.sampler ~= nil and shuffle then
      raise("DataLoader: sampler option is mutually exclusive with shuffle")
    end
    local sampler
    if opts.sampler ~= nil then sampler = as_sampler(opts.sampler, fn)
    elseif shuffle then sampler = RandomSampler(self.dataset, { generator = seed })
    else sampler = SequentialSampler(self.dataset) end
    self.sampler = sampler
    self.batch_size = check_batch_size(opts.batch_size == nil and 1 or opts.batch_size, fn)
    self.batch_sampler = BatchSampler(sampler, self.batch_size, drop_last or false)
  end
  self.drop_last = drop_last or false
  self.collate_fn = opts.collate_fn
end

function DataLoader:__len()
  if self.iterable then
    local n = length(self.dataset, "the IterableDataset", "DataLoader")
    return self.drop_last and math.floor(n / self.batch_size) or math.ceil(n / self.batch_size)
  end
  return length(self.batch_sampler, "the batch sampler", "DataLoader")
end

-- collated(self, samples, width): a batch's values from its samples
local function collated(self, samples, width)
  if self.collate_fn then return self.collate_fn(samples) end
  if width == 0 then raise("DataLoader: __getitem returned no value") end
  local batch = collate(samples, "")
  if width == 1 then return batch end
  return unpack(batch, 1, width)
end

-- With pin_memory, a batch's CPU tensors (in plain tables too) are copied
-- to page-locked memory, so that to(device, {non_blocking = true}) copies
-- them without waiting.
local function pinned(v)
  if torch.is_tensor(v) then return v.device.type == "cpu" and v:pin_memory() or v end
  if type(v) == "table" and getmetatable(v) == nil then
    local out = {}
    for k, x in pairs(v) do out[k] = pinned(x) end
    return out
  end
  return v
end
local function pin_values(self, ...)
  if not self.pin_memory then return ... end
  local n, vals = select("#", ...), { ... }
  for i = 1, n do vals[i] = pinned(vals[i]) end
  return unpack(vals, 1, n)
end

-- The batches of an IterableDataset: batch_size consecutive samples each,
-- the last one shorter unless drop_last (not pinned).
local function stream_batches(self)
  local it = self.dataset:__iter()
  if type(it) ~= "function" then
    raise("DataLoader: __iter() must return an iterator function, got " .. typename(it))
  end
  local done = false
  return function()
    if done then return nil end
    local samples, width = {}, nil
    while #samples < self.batch_size do
      local vals = { it() }
      if vals[1] == nil then done = true; break end
      local w = #vals
      width = width or w
      if w ~= width then raise(string.format("DataLoader: the stream gave %d values for a sample but %d for the first", w, width)) end
      samples[#samples + 1] = w == 1 and vals[1] or vals
    end
    if #samples == 0 or (done and self.drop_last and #samples < self.batch_size) then return nil end
    return collated(self, samples, width)
  end
end

-- The epoch's batches as int64 index tensors.
local function index_batches(self)
  local bs = self.batch_sampler
  local ib = bs.index_batches
  if ib then return ib(bs) end
  local it = bs:iter()
  return function()
    local list = it()
    if list == nil then return nil end
    return to_index_tensor(list, "DataLoader (batch_sampler)")
  end
end

-- Reads a batch sample by sample: returns the samples and how many values
-- each has.
local function fetch(ds, idx)
  local p, n = ffi.cast("int64_t *", idx:data_ptr()), idx:numel()
  local get = ds.__getitem
  local samples, width = {}, nil
  for i = 0, n - 1 do
    local vals = { get(ds, tonumber(p[i])) }
    local w = #vals
    width = width or w
    if w ~= width then
      raise(string.format("DataLoader: __getitem returned %d values for sample %d but %d for the first",
                          w, tonumber(p[i]), width))
    end
    samples[i + 1] = w == 1 and vals[1] or vals
  end
  return samples, width or 0
end

-- A batch's values from its index tensor
local function load_batch(self, idx)
  local ds = self.dataset
  local getitems = self.collate_fn == nil and ds.__getitems or nil
  if getitems then return getitems(ds, idx) end
  return collated(self, fetch(ds, idx))
end

-- The loader's worker pool for a pass: started now, or kept from the last
-- pass with persistent_workers (unless that pass was left before its end:
-- its workers may still be sending). The workers load a batch as this
-- process would: a map-style dataset's from its index tensor, a stream's
-- as the next batch of the worker's own copy of the stream (a new one
-- each pass).
local function worker_pool(self)
  local W = require("dplua.utils.data_workers")
  local pool = self._pool
  if pool ~= nil and (not self.persistent_workers or pool.pending > 0) then
    W.stop(pool)
    pool = nil
  end
  if pool == nil then
    local seed = seed_from_torch()
    local load
    if self.iterable then
      local pass, next_batch
      local function ended_or(...) if (...) == nil then return W.END end return ... end
      load = function(_, this_pass)
        if this_pass ~= pass then pass, next_batch = this_pass, stream_batches(self) end
        return ended_or(next_batch())
      end
    else
      load = function(idx) return load_batch(self, idx) end
    end
    pool = W.start({ n = self.num_workers, dataset = self.dataset, base_seed = tonumber(seed % 2147483648ULL),
                     worker_init_fn = self.worker_init_fn, timeout = self.timeout, load = load })
    pool.pending = 0
    self._pool = pool
  end
  return W, pool
end

-- iter() with num_workers > 0: batches are asked of the workers up to
-- prefetch_factor a worker ahead and taken in the order asked; the pool
-- stops at the pass's end (unless persistent_workers). A map-style
-- dataset's batch k (its index tensor) goes to worker k mod N; a stream's
-- asks go to the workers in turn, skipping those whose stream has ended.
local function worker_iter(self)
  local W, pool = worker_pool(self)
  local n = self.num_workers
  local batches = not self.iterable and index_batches(self) or nil
  local pass = (pool.passes or 0) + 1
  pool.passes = pass
  local live, n_live, turn = {}, n, 0   -- (streams: the workers whose stream has not ended)
  for w = 0, n - 1 do live[w] = true end
  local sent, taken, ended = 0, 0, false
  local depth = n * self.prefetch_factor
  return function()
    while true do
      while not ended and sent - taken < depth do
        if batches then
          local idx = batches()
          if idx == nil then ended = true; break end
          sent = sent + 1
          W.submit(pool, sent, idx)
        else
          if n_live == 0 then ended = true; break end
          while not live[turn] do turn = (turn + 1) % n end
          sent = sent + 1
          W.submit(pool, sent, nil, turn, pass)
          turn = (turn + 1) % n
        end
        pool.pending = pool.pending + 1
      end
      if taken >= sent then
        if not self.persistent_workers then W.stop(pool); self._pool = nil end
        return nil
      end
      taken = taken + 1
      local vals, w = W.take(pool, taken)
      pool.pending = pool.pending - 1
      if vals ~= nil then return pin_values(self, unpack(vals, 1, vals.n)) end
      if live[w] then live[w] = false; n_live = n_live - 1 end
    end
  end
end

-- iter(): a fresh pass over the data (reshuffled when shuffling); each call
-- of the iterator returns the next batch's values. With num_workers > 0
-- the batches are loaded by worker processes.
function DataLoader:iter()
  if self.num_workers > 0 then return worker_iter(self) end
  if self.iterable then
    local next_batch = stream_batches(self)
    return function() return pin_values(self, next_batch()) end
  end
  local batches = index_batches(self)
  return function()
    local idx = batches()
    if idx == nil then return nil end
    return pin_values(self, load_batch(self, idx))
  end
end

-- enumerate(): like iter(), with the batch number first, counted from 0
-- as Python's enumerate does: for i, x, y in loader:enumerate() do ... end
function DataLoader:enumerate()
  local it, i = self:iter(), -1
  local function step(...)
    if (...) == nil then return nil end
    return i, ...
  end
  return function()
    i = i + 1
    return step(it())
  end
end

function DataLoader:__repr()
  if self.iterable then
    return string.format("DataLoader(%s, batch_size=%s)", tostring(self.dataset), tostring(self.batch_size))
  end
  return string.format("DataLoader(%s, batch_size=%s, batches=%d)", tostring(self.dataset),
                       tostring(self.batch_size), self:__len())
end

---------------------------------------------------------------- files

local box = ffi.new("dp_tensor*[1]")

-- load_idx(path): an IDX file (MNIST's format), gzip-compressed or plain,
-- as a tensor of its element type (uint8 stays uint8).
function data.load_idx(path)
  if type(path) ~= "string" then raise("load_idx: expected a path string, got " .. typename(path)) end
  if C.dp_load_idx(box, path) ~= 0 then raise(ffi.string(C.dp_last_error())) end
  local t = torch._wrap(box[0])
  box[0] = nil
  return t
end

-- load_npy(path): a NumPy .npy file (format 1.0-3.0) as a tensor of its
-- dtype: little-endian f4, f8, i8, i4, u1, b1 ('<f4', '|u1', ...), C order.
-- Everything is checked against the file's size before a byte is copied.
local npy_dtypes = { f4 = torch.float32, f8 = torch.float64, i8 = torch.int64, i4 = torch.int32,
                     u1 = torch.uint8, b1 = torch.bool }

local function npy_fail(path, msg) raise(string.format("load_npy: %s: %s", path, msg)) end

function data.load_npy(path)
  if type(path) ~= "string" then raise("load_npy: expected a path string, got " .. typename(path)) end
  local f, err = io.open(path, "rb")
  if not f then npy_fail(path, err) end
  local bytes = f:read("*a")
  f:close()
  if #bytes < 10 or bytes:sub(1, 6) ~= "\147NUMPY" then npy_fail(path, "not a .npy file (bad magic)") end
  local major = bytes:byte(7)
  local hlen, hstart
  if major == 1 then
    hlen, hstart = bytes:byte(9) + 256 * bytes:byte(10), 11
  elseif major == 2 or major == 3 then
    if #bytes < 12 then npy_fail(path, "truncated header") end
    hlen = bytes:byte(9) + 256 * bytes:byte(10) + 65536 * bytes:byte(11) + 16777216 * bytes:byte(12)
    hstart = 13
  else
    npy_fail(path, "unsupported format version " .. tostring(major))
  end
  if hstart + hlen - 1 > #bytes then npy_fail(path, "truncated header") end
  local header = bytes:sub(hstart, hstart + hlen - 1)
  local descr = header:match("'descr'%s*:%s*'([^']*)'")
  local fortran = header:match("'fortran_order'%s*:%s*(%a+)")
  local shape_text = header:match("'shape'%s*:%s*%(([^)]*)%)")
  if not descr or not fortran or not shape_text then npy_fail(path, "malformed header " .. header) end
  if fortran ~= "False" then npy_fail(path, "Fortran-order arrays are not supported") end
  local order, kind = descr:sub(1, 1), descr:sub(2)
  local dtype = npy_dtypes[kind]
  if not dtype or (order ~= "<" and order ~= "|" and not (order == "=" and ffi.abi("le"))) then
    npy_fail(path, "unsupported dtype '" .. descr .. "' (expected little-endian f4, f8, i8, i4, u1 or b1)")
  end
  local shape, count = {}, 1
  for dim in shape_text:gmatch("[^,%s]+") do
    local d = tonumber(dim)
    if not d or d < 0 or d % 1 ~= 0 then npy_fail(path, "bad shape (" .. shape_text .. ")") end
    shape[#shape + 1] = d
    count = count * d
  end
  local nbytes = count * dtype.itemsize
  local data_start = hstart + hlen
  if #bytes - data_start + 1 ~= nbytes then
    npy_fail(path, string.format("expected %d data bytes for shape (%s) of %s, the file holds %d",
                                 nbytes, shape_text, descr, #bytes - data_start + 1))
  end
  local t = torch.empty(shape, { dtype = dtype })
  if nbytes > 0 then ffi.copy(t:data_ptr(), ffi.cast("const char *", bytes) + data_start - 1, nbytes) end
  return t
end

-- load_csv(path, {delimiter=",", header=false, dtype=torch.float32}): a
-- (rows, columns) tensor of numbers; with header=true the first line is
-- returned too, as a list of column names. Every row must have the same
-- number of fields and every field must be a number.
function data.load_csv(path, opts)
  if type(path) ~= "string" then raise("load_csv: expected a path string, got " .. typename(path)) end
  opts = check_options("load_csv", opts, { delimiter = true, header = true, dtype = true })
  local delim = opts.delimiter or ","
  if type(delim) ~= "string" or #delim ~= 1 then raise("load_csv: expected delimiter to be one character") end
  local f, err = io.open(path, "r")
  if not f then raise("load_csv: " .. err) end
  local values, names, ncol, row = {}, nil, nil, 0
  local pattern = "([^" .. delim:gsub("%p", "%%%0") .. "]*)"
  for line in f:lines() do
    line = line:gsub("\r$", "")
    if line ~= "" then
      local fields = {}
      for field in (line .. delim):gmatch(pattern .. delim:gsub("%p", "%%%0")) do fields[#fields + 1] = field end
      if opts.header and names == nil then
        names = fields
      else
        row = row + 1
        if ncol == nil then ncol = #fields end
        if #fields ~= ncol then
          f:close()
          raise(string.format("load_csv: %s: line %d has %d fields, expected %d", path, row + (names and 1 or 0), #fields, ncol))
        end
        for c, field in ipairs(fields) do
          local v = tonumber(field)
          if v == nil then
            f:close()
            raise(string.format("load_csv: %s: line %d, column %d: '%s' is not a number", path,
                                row + (names and 1 or 0), c, field))
          end
          values[#values + 1] = v
        end
      end
    end
  end
  f:close()
  local t = torch.empty({ row, ncol or 0 }, { dtype = torch.float64 })
  local p = ffi.cast("double *", t:data_ptr())
  for i = 1, #values do p[i - 1] = values[i] end
  t = t:to(opts.dtype or torch.float32)
  return t, names
end

-- The data of language models (dplua/utils/tokens.lua), loaded on first use.
local token_names = { GPT2Tokenizer = true, TokenShards = true, TokenWriter = true, load_tokens = true }
return setmetatable(data, { __index = function(t, k)
  if not token_names[k] then return nil end
  local v = require("dplua.utils.tokens")[k]
  rawset(t, k, v)
  return v
end })
