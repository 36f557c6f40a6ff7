-- test_data.lua: torch.utils.data — TensorDataset, Dataset subclasses,
-- samplers, DataLoader batching, shuffling, collation and argument errors.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local data = torch.utils.data

local function shape(t) return T.shape(t) end

-- x[i] = {i, 10 + i} as float32, y[i] = i as int64: a sample's value says
-- which index it came from.
local function make(n)
  local x = torch.stack({ torch.arange(n), torch.arange(n) + 10 }, 1):float()
  local y = torch.arange(n)
  return x, y, data.TensorDataset(x, y)
end

-- The labels of every batch of one pass, flattened, and the batch sizes.
local function pass(loader)
  local seen, sizes = {}, {}
  for _, yb in loader:iter() do
    sizes[#sizes + 1] = yb:size(0)
    for _, v in ipairs(yb:tolist()) do seen[#seen + 1] = v end
  end
  return seen, sizes
end

local function is_permutation(list, n)
  if #list ~= n then return false end
  local hit = {}
  for _, v in ipairs(list) do
    if type(v) ~= "number" or v < 0 or v >= n or hit[v] then return false end
    hit[v] = true
  end
  return true
end

local function range(a, b)
  local r = {}
  for i = a, b do r[#r + 1] = i end
  return r
end

---------------------------------------------------------------- TensorDataset

T.run("TensorDataset", function()
  local _, y, ds = make(5)
  T.is(#ds, 5, "len(ds) is the number of samples")
  T.is(ds:__len(), 5, "ds:__len()")
  local a, b = ds:__getitem(2)
  T.is(a:tolist(), { 2, 12 }, "__getitem(2): first tensor's row")
  T.is(b:item(), 2, "__getitem(2): second tensor's element")
  local s = ds[3]
  T.is({ s[1]:tolist(), s[2]:item() }, { { 3, 13 }, 3 }, "ds[3] is the sample as a list of its values")
  T.is(ds:__getitem(-1):tolist(), { 4, 14 }, "negative indices count from the end")
  local one = data.TensorDataset(y)
  T.is(one[4]:item(), 4, "a one-tensor dataset's ds[i] is the value itself")
  T.ok(tostring(ds):find("TensorDataset%(%[5, 2%] float32, %[5%] int64%)") ~= nil, "tostring", tostring(ds))
  T.is(#ds.tensors, 2, "ds.tensors")
end)

T.raises(function() data.TensorDataset() end, "TensorDataset: expected at least one tensor", "TensorDataset() without tensors")
T.raises(function() data.TensorDataset(torch.zeros(3, 2), torch.zeros(4)) end,
         { "size mismatch", "3 samples", "#2 has 4" }, "TensorDataset size mismatch names both sizes")
T.raises(function() data.TensorDataset(torch.zeros(3), { 1, 2, 3 }) end, "argument #2 is a table, expected a tensor",
         "TensorDataset of a table")
T.raises(function() data.TensorDataset(torch.tensor(1)) end, "0%-d tensor", "TensorDataset of a 0-d tensor")
T.raises(function() local _, _, ds = make(5); return ds:__getitem(5) end, { "index 5 is out of range", "5 samples" },
         "TensorDataset index out of range")
T.raises(function() local _, _, ds = make(5); return ds:__getitem(1.5) end, "expected an integer index",
         "TensorDataset non-integer index")

---------------------------------------------------------------- DataLoader: batching

T.run("sequential batches", function()
  local _, _, ds = make(10)
  local loader = data.DataLoader(ds, { batch_size = 3 })
  T.is(#loader, 4, "len(loader): 10 samples in batches of 3 is 4 batches")
  T.is(loader:__len(), 4, "loader:__len()")
  local xs, ys, n = {}, {}, 0
  for xb, yb in loader:iter() do
    n = n + 1
    xs[n], ys[n] = xb, yb
  end
  T.is(n, 4, "one pass gives len(loader) batches")
  T.is(shape(xs[1]), { 3, 2 }, "x batch shape")
  T.is(shape(ys[1]), { 3 }, "y batch shape")
  T.is(shape(xs[4]), { 1, 2 }, "the last batch holds the remainder")
  T.is(tostring(xs[1].dtype), "torch.float32", "x keeps its dtype")
  T.is(tostring(ys[1].dtype), "torch.int64", "y keeps its dtype")
  T.is(xs[2]:tolist(), { { 3, 13 }, { 4, 14 }, { 5, 15 } }, "batch 2 values, in order")
  T.is(ys[4]:tolist(), { 9 }, "last batch values")
  T.ok(xs[1]:is_contiguous(), "batches are contiguous")
  local seen = pass(loader)
  T.is(seen, range(0, 9), "a second pass gives the same order")
end)

T.run("drop_last and batch_size", function()
  local _, _, ds = make(10)
  local loader = data.DataLoader(ds, { batch_size = 3, drop_last = true })
  T.is(#loader, 3, "len(loader) with drop_last")
  local seen, sizes = pass(loader)
  T.is(sizes, { 3, 3, 3 }, "drop_last drops the short batch")
  T.is(seen, range(0, 8), "drop_last: the first 9 samples")
  T.is(#data.DataLoader(ds, { batch_size = 5, drop_last = true }), 2, "drop_last with an exact division")
  T.is(#data.DataLoader(ds, { batch_size = 20, drop_last = true }), 0, "drop_last, batch larger than the data")
  T.is(select(2, pass(data.DataLoader(ds, { batch_size = 20, drop_last = true }))), {}, "... gives no batch")
  T.is(select(2, pass(data.DataLoader(ds, { batch_size = 20 }))), { 10 }, "one batch holds everything")
  local def = data.DataLoader(ds)
  T.is(#def, 10, "default batch_size is 1")
  local xb = def:iter()()
  T.is(shape(xb), { 1, 2 }, "batch_size 1 still has a batch dim")
  local empty = data.DataLoader(data.TensorDataset(torch.zeros(0, 3)), { batch_size = 4 })
  T.is(#empty, 0, "an empty dataset has no batches")
  T.is(empty:iter()(), nil, "... and its iterator ends at once")
end)

T.run("enumerate", function()
  local _, _, ds = make(5)
  local got = {}
  for i, xb, yb in data.DataLoader(ds, { batch_size = 2 }):enumerate() do
    got[#got + 1] = { i, xb:size(0), yb:tolist() }
  end
  T.is(got, { { 0, 2, { 0, 1 } }, { 1, 2, { 2, 3 } }, { 2, 1, { 4 } } }, "enumerate counts batches from 0")
end)

T.run("batches are copies", function()
  local x, _, ds = make(4)
  local xb = data.DataLoader(ds, { batch_size = 4 }):iter()()
  xb:mul_(0)
  T.is(x[1]:tolist(), { 1, 11 }, "changing a batch in place leaves the dataset alone")
end)

---------------------------------------------------------------- shuffling

T.run("shuffle with a seed", function()
  local _, _, ds = make(100)
  local a = data.DataLoader(ds, { batch_size = 7, shuffle = true, seed = 42 })
  local b = data.DataLoader(ds, { batch_size = 7, shuffle = true, generator = 42 })
  local a1, sizes = pass(a)
  local a2 = pass(a)
  local b1, b2 = pass(b), pass(b)
  T.ok(is_permutation(a1, 100), "an epoch visits every index once", T.fmt(a1))
  T.ok(is_permutation(a2, 100), "so does the next epoch")
  T.is(sizes[#sizes], 2, "the last shuffled batch holds the remainder")
  T.is(#sizes, 15, "15 batches")
  T.ok(not T.compare_values(a1, range(0, 99), 0, 0), "the order is shuffled")
  T.ok(not T.compare_values(a1, a2, 0, 0), "each epoch has a new order")
  T.is(b1, a1, "the same seed gives the same first epoch")
  T.is(b2, a2, "and the same second epoch")
  local c1 = pass(data.DataLoader(ds, { batch_size = 7, shuffle = true, seed = 43 }))
  T.ok(not T.compare_values(c1, a1, 0, 0), "another seed gives another order")
  -- the shuffled batches hold the samples of their labels
  for xb, yb in data.DataLoader(ds, { batch_size = 30, shuffle = true, seed = 1 }):iter() do
    T.ok(T.compare_values(xb:select(1, 0), yb:float(), 0, 0), "x and y are shuffled together")
    break
  end
end)

T.run("shuffle without a seed follows torch.manual_seed", function()
  local _, _, ds = make(50)
  local loader = data.DataLoader(ds, { batch_size = 8, shuffle = true })
  torch.manual_seed(7)
  local a1, a2 = pass(loader), pass(loader)
  torch.manual_seed(7)
  local b1, b2 = pass(loader), pass(loader)
  T.ok(is_permutation(a1, 50), "a permutation")
  T.is(b1, a1, "manual_seed reproduces the first epoch")
  T.is(b2, a2, "and the second")
  T.ok(not T.compare_values(a1, a2, 0, 0), "epochs differ")
end)

T.run("samplers", function()
  local _, _, ds = make(10)
  local seq = data.SequentialSampler(ds)
  T.is(#seq, 10, "len(SequentialSampler)")
  local got = {}
  for i in seq:iter() do got[#got + 1] = i end
  T.is(got, range(0, 9), "SequentialSampler yields 0..n-1")
  local rs = data.RandomSampler(ds, { generator = 5 })
  got = {}
  for i in rs:iter() do got[#got + 1] = i end
  T.ok(is_permutation(got, 10), "RandomSampler yields a permutation", T.fmt(got))
  local rep = data.RandomSampler(ds, { replacement = true, num_samples = 1000, generator = 1 })
  T.is(#rep, 1000, "len(RandomSampler) with num_samples")
  local counts, n = {}, 0
  for i in rep:iter() do counts[i] = (counts[i] or 0) + 1; n = n + 1 end
  local lo, hi = math.huge, 0
  for k = 0, 9 do lo, hi = math.min(lo, counts[k] or 0), math.max(hi, counts[k] or 0) end
  T.ok(n == 1000 and lo > 60 and hi < 140, "replacement draws are uniform-ish", ("n %d min %d max %d"):format(n, lo, hi))
  local more = data.RandomSampler(ds, { num_samples = 25, generator = 2 })
  got = {}
  for i in more:iter() do got[#got + 1] = i end
  T.ok(#got == 25 and is_permutation({ unpack(got, 1, 10) }, 10), "num_samples > n without replacement: whole permutations")
  local bs = data.BatchSampler(seq, 4, false)
  T.is(#bs, 3, "len(BatchSampler)")
  got = {}
  for b in bs:iter() do got[#got + 1] = b end
  T.is(got, { { 0, 1, 2, 3 }, { 4, 5, 6, 7 }, { 8, 9 } }, "BatchSampler yields lists of indices")
  T.is(#data.BatchSampler(seq, 4, true), 2, "len(BatchSampler) with drop_last")
  T.is(#data.BatchSampler({ 5, 3, 1 }, 2), 2, "a plain list is a sampler")
end)

T.run("sampler and batch_sampler options", function()
  local _, _, ds = make(10)
  local seen = pass(data.DataLoader(ds, { batch_size = 2, sampler = { 9, 7, 5, 3, 1 } }))
  T.is(seen, { 9, 7, 5, 3, 1 }, "sampler = a list of indices")
  local Odd = data.Sampler:extend("Odd")
  function Odd:__init(n) self.n = n end
  function Odd:__len() return math.floor(self.n / 2) end
  function Odd:iter()
    local i = -1
    return function() i = i + 2; if i < self.n then return i end end
  end
  local loader = data.DataLoader(ds, { batch_size = 2, sampler = Odd(10) })
  T.is(#loader, 3, "len(loader) with a custom sampler")
  T.is(pass(loader), { 1, 3, 5, 7, 9 }, "a Sampler subclass")
  local bl = data.DataLoader(ds, { batch_sampler = { { 0, 1 }, { 5 }, { 2, 3, 4 } } })
  T.is(#bl, 3, "len(loader) with a batch_sampler list")
  local _, sizes = pass(bl)
  T.is({ pass(bl), sizes }, { { 0, 1, 5, 2, 3, 4 }, { 2, 1, 3 } }, "batch_sampler = a list of index lists")
  local bs = data.DataLoader(ds, { batch_sampler = data.BatchSampler(data.SequentialSampler(ds), 4, true) })
  T.is(select(2, pass(bs)), { 4, 4 }, "batch_sampler = BatchSampler")
end)

---------------------------------------------------------------- collation

T.run("default collate", function()
  local list = { { 1, 2.5, true, "a" }, { 2, 3.5, false, "b" }, { 3, 4, true, "c" } }
  local ints, floats, bools, strs = data.DataLoader(list, { batch_size = 3 }):iter()()
  T.is(tostring(ints.dtype), "torch.int64", "integer numbers become int64")
  T.is(ints:tolist(), { 1, 2, 3 }, "int values")
  T.is(tostring(floats.dtype), "torch.float64", "other numbers become float64")
  T.is(floats:tolist(), { 2.5, 3.5, 4 }, "float values")
  T.is(tostring(bools.dtype), "torch.bool", "booleans become bool")
  T.is(bools:tolist(), { true, false, true }, "bool values")
  T.is(strs, { "a", "b", "c" }, "strings stay a list")
  local c = data.default_collate({ { x = torch.ones(2), y = 1 }, { x = torch.zeros(2), y = 2 } })
  T.is({ c.x:tolist(), c.y:tolist() }, { { { 1, 1 }, { 0, 0 } }, { 1, 2 } }, "tables are collated field by field")
  local nested = data.default_collate({ { torch.ones(1), { 1, 2 } }, { torch.zeros(1), { 3, 4 } } })
  T.is({ nested[1]:tolist(), nested[2][1]:tolist(), nested[2][2]:tolist() },
       { { { 1 }, { 0 } }, { 1, 3 }, { 2, 4 } }, "nested lists")
  local single = data.DataLoader({ 5, 6, 7 }, { batch_size = 2 })
  T.is(single:iter()():tolist(), { 5, 6 }, "a list of numbers is a dataset of one value per sample")
end)

T.run("Dataset subclasses", function()
  local Squares = data.Dataset:extend("Squares")
  function Squares:__init(n) self.n = n end
  function Squares:__len() return self.n end
  function Squares:__getitem(i) return torch.full({ 2 }, i), i * i end
  local ds = Squares(300)
  T.is(#ds, 300, "len(ds) calls __len")
  T.is(ds[3][2], 9, "ds[i] calls __getitem")
  T.is(tostring(Squares), "<class Squares>", "tostring of the class")
  local loader = data.DataLoader(ds, { batch_size = 260 })
  T.is(#loader, 2, "len(loader)")
  local xb, yb = loader:iter()()
  T.is(shape(xb), { 260, 2 }, "more than 256 samples are stacked")
  T.is(xb[259]:tolist(), { 259, 259 }, "stacked in order")
  T.is(yb:narrow(0, 0, 4):tolist(), { 0, 1, 4, 9 }, "numbers collated")
  -- the same batches through the per-sample path and the index_select path
  local _, _, tds = make(23)
  local Wrap = data.Dataset:extend("Wrap")
  function Wrap:__init(inner) self.inner = inner end
  function Wrap:__len() return #self.inner end
  function Wrap:__getitem(i) return self.inner:__getitem(i) end
  local fast = data.DataLoader(tds, { batch_size = 5, shuffle = true, seed = 9 })
  local slow = data.DataLoader(Wrap(tds), { batch_size = 5, shuffle = true, seed = 9 })
  local fi, si = fast:iter(), slow:iter()
  local same = true
  for _ = 1, #fast do
    local fx, fy = fi()
    local sx, sy = si()
    same = same and T.compare_values(fx, sx, 0, 0) and T.compare_values(fy, sy, 0, 0)
      and tostring(fx.dtype) == tostring(sx.dtype)
  end
  T.ok(same, "the index_select path and the per-sample path give the same batches")
end)

T.run("collate_fn", function()
  local _, _, ds = make(6)
  local got
  local loader = data.DataLoader(ds, { batch_size = 4, collate_fn = function(batch)
    got = batch
    return #batch, "extra"
  end })
  local n, extra = loader:iter()()
  T.is({ n, extra }, { 4, "extra" }, "collate_fn's return values are the batch")
  T.is({ #got, got[2][1]:tolist(), got[2][2]:item() }, { 4, { 1, 11 }, 1 }, "collate_fn gets the samples as lists")
  local one = data.DataLoader(data.TensorDataset(torch.arange(4)), { batch_size = 2, collate_fn = function(b) return b end })
  T.is(#one:iter()(), 2, "one-value samples are passed as the values themselves")
  T.ok(T.is_tensor(one:iter()()[1]), "... tensors")
end)

T.run("Subset and random_split", function()
  local _, _, ds = make(10)
  local sub = data.Subset(ds, { 8, 2, 5 })
  T.is(#sub, 3, "len(Subset)")
  T.is(sub:__getitem(1):tolist(), { 2, 12 }, "Subset maps indices")
  T.is(pass(data.DataLoader(sub, { batch_size = 2 })), { 8, 2, 5 }, "a loader over a Subset")
  local parts = data.random_split(ds, { 7, 3 }, 4)
  T.is({ #parts[1], #parts[2] }, { 7, 3 }, "random_split sizes")
  local all = pass(data.DataLoader(parts[1], { batch_size = 10 }))
  for _, v in ipairs(pass(data.DataLoader(parts[2], { batch_size = 10 }))) do all[#all + 1] = v end
  T.ok(is_permutation(all, 10), "the parts are disjoint and cover the dataset", T.fmt(all))
  local g1, g2 = torch.Generator():manual_seed(42), torch.Generator():manual_seed(42)
  local p1, p2 = data.random_split(ds, { 7, 3 }, g1), data.random_split(ds, { 0.7, 0.3 }, { generator = g2 })
  local function first(part) return part[0][1]:tolist() end
  T.is({ first(p1[1]), first(p1[2]) }, { first(p2[1]), first(p2[2]) },
       "random_split with a torch.Generator: seeded alike, split alike")
  local l1 = data.DataLoader(ds, { batch_size = 10, shuffle = true, generator = torch.Generator():manual_seed(3) })
  local l2 = data.DataLoader(ds, { batch_size = 10, shuffle = true, generator = torch.Generator():manual_seed(3) })
  T.ok(torch.equal(l1:iter()(), l2:iter()()), "a DataLoader with a torch.Generator shuffles as one seeded alike")
  T.raises(function() data.random_split(ds, { 7, 3 }, "x") end, "a torch.Generator or a non%-negative integer seed", "a bad generator")
  local again = data.random_split(ds, { 7, 3 }, 4)
  T.is(pass(data.DataLoader(again[2], { batch_size = 10 })), pass(data.DataLoader(parts[2], { batch_size = 10 })),
       "the same seed gives the same split")
  local frac = data.random_split(ds, { 0.5, 0.3, 0.2 }, 1)
  T.is({ #frac[1], #frac[2], #frac[3] }, { 5, 3, 2 }, "fractions")
  T.raises(function() data.random_split(ds, { 4, 4 }) end, "sum to 8 but the dataset has 10", "random_split: bad lengths")
end)

---------------------------------------------------------------- errors

local _, _, ds = make(10)
local function loader_error(opts, pattern, name)
  T.raises(function() return data.DataLoader(ds, opts) end, pattern, name)
end
T.raises(function() data.DataLoader(nil) end, "DataLoader: expected a dataset", "DataLoader(nil)")
T.raises(function() data.DataLoader(torch.zeros(3)) end, "expected a dataset .* got Tensor", "DataLoader(tensor)")
loader_error({ batch_size = 0 }, "batch_size to be a positive integer, got number 0", "batch_size = 0")
loader_error({ batch_size = -2 }, "batch_size to be a positive integer", "batch_size < 0")
loader_error({ batch_size = 2.5 }, "batch_size to be a positive integer, got number 2.5", "fractional batch_size")
loader_error({ batch_size = "8" }, "batch_size to be a positive integer, got string", "batch_size as a string")
loader_error({ batchsize = 8 }, { "unknown option 'batchsize'", "batch_size" }, "a misspelt option")
loader_error({ shuffle = "yes" }, "shuffle to be a boolean", "shuffle not a boolean")
loader_error({ drop_last = 1 }, "drop_last to be a boolean", "drop_last not a boolean")
loader_error({ shuffle = true, sampler = { 1, 2 } }, "sampler option is mutually exclusive with shuffle", "sampler and shuffle")
loader_error({ batch_sampler = { { 0 } }, batch_size = 2 }, "mutually exclusive", "batch_sampler and batch_size")
loader_error({ collate_fn = 3 }, "collate_fn to be a function", "collate_fn not a function")
loader_error({ shuffle = true, seed = -1 }, "a non%-negative integer seed, got number %-1", "a negative seed")
loader_error({ sampler = 5 }, "expected a sampler", "a number as sampler")
loader_error(5, "expected an options table", "options not a table")
T.raises(function() data.RandomSampler(ds, { replacment = true }) end, "unknown option 'replacment'", "RandomSampler misspelt option")
T.raises(function() data.BatchSampler(data.SequentialSampler(ds), 0) end, "BatchSampler: expected batch_size", "BatchSampler batch_size 0")
T.raises(function() data.SequentialSampler(5) end, "has no __len", "SequentialSampler of a number")

local NoItem = data.Dataset:extend("NoItem")
function NoItem:__len() return 3 end
T.raises(function() for _ in data.DataLoader(NoItem()):iter() do end end,
         "NoItem: a Dataset subclass must define __getitem", "a Dataset without __getitem")
T.raises(function() return #data.Dataset:extend("NoLen")() end, "NoLen: a Dataset subclass must define __len",
         "a Dataset without __len")
local Ragged = data.Dataset:extend("Ragged")
function Ragged:__len() return 2 end
function Ragged:__getitem(i) return torch.zeros(i + 1) end
T.raises(function() return data.DataLoader(Ragged(), { batch_size = 2 }):iter()() end,
         { "default_collate: cannot stack", "stack" }, "samples of different shapes")
local Mixed = data.Dataset:extend("Mixed")
function Mixed:__len() return 2 end
function Mixed:__getitem(i) if i == 0 then return 1 end return "a" end
T.raises(function() return data.DataLoader(Mixed(), { batch_size = 2 }):iter()() end,
         "sample 2 is a string but sample 1 is a number", "samples of different types")
T.raises(function() data.Dataset.extend(data.Dataset) end, "expected a class name", "extend without a name")
T.raises(function() return data.DataLoader(ds, { batch_sampler = { { 0, 99 } } }):iter()() end, "99",
         "an index past the end of a TensorDataset")

-- SubsetRandomSampler, WeightedRandomSampler, ConcatDataset
do
  local sub = data.SubsetRandomSampler({ 5, 7, 9, 11 }, { generator = 3 })
  local seen = {}
  for i in sub:iter() do seen[#seen + 1] = i end
  table.sort(seen)
  T.is(seen, { 5, 7, 9, 11 }, "SubsetRandomSampler: each given index once an epoch")
  T.is(#sub, 4, "SubsetRandomSampler's length")
  local again = data.SubsetRandomSampler({ 5, 7, 9, 11 }, { generator = 3 })
  T.is(again:index_tensor():tolist(), data.SubsetRandomSampler({ 5, 7, 9, 11 }, { generator = 3 }):index_tensor():tolist(),
       "SubsetRandomSampler: a seed repeats its order")
  local w = data.WeightedRandomSampler({ 0.1, 0, 0.9 }, 4000)
  local idx = w:index_tensor()
  T.is(idx:numel(), 4000, "WeightedRandomSampler: num_samples indices")
  T.is(idx:eq(1):sum():item(), 0, "a weight of 0 is never drawn")
  T.close(idx:eq(2):double():mean():item(), 0.9, 0, 0.03, "drawn in proportion to the weights")
  local distinct = data.WeightedRandomSampler(torch.tensor({ 1, 2, 3, 4 }), 4, false, { generator = 7 }):index_tensor()
  T.is(distinct:sort():tolist(), { 0, 1, 2, 3 }, "without replacement: distinct indices")
  T.raises(function() data.WeightedRandomSampler({ 1, 0 }, 2, false) end,
           "cannot draw 2 samples without replacement from 1 of non%-zero weight", "too many without replacement")
  T.raises(function() data.WeightedRandomSampler({ -1, 2 }, 2) end, "expected non%-negative weights", "a negative weight")
  local c = data.ConcatDataset({ data.TensorDataset(torch.arange(3)), { "a", "b" }, data.TensorDataset(torch.arange(10, 12)) })
  T.is(#c, 7, "ConcatDataset's length is the sum")
  T.is(c:__getitem(3), "a", "an index in the second dataset")
  T.is(c:__getitem(6):item(), 11, "the last sample")
  T.is(c:__getitem(-7):item(), 0, "negative indices from the end")
  T.raises(function() c:__getitem(7) end, "index 7 is out of range for 7 samples", "past the end")
  local loader = data.DataLoader(data.ConcatDataset({ data.TensorDataset(torch.arange(3)), data.TensorDataset(torch.arange(3, 6)) }),
                                 { batch_size = 4, sampler = data.SubsetRandomSampler({ 0, 4, 5 }) })
  local total = 0
  for b in loader:iter() do total = total + b:sum():item() end
  T.is(total, 0 + 4 + 5, "a DataLoader over a ConcatDataset with a SubsetRandomSampler")
end

T.run("IterableDataset, ChainDataset, StackDataset", function()
  local Stream = data.IterableDataset:extend("Stream")
  function Stream:__init(n, sized) self.n, self.sized = n, sized end
  function Stream:__iter()
    local n = self.n
    return coroutine.wrap(function() for i = 1, n do coroutine.yield(torch.tensor({ i, -i }), i * 10) end end)
  end
  function Stream:__len()
    if not self.sized then error("Stream: no length") end
    return self.n
  end
  local got = {}
  for x, y in data.DataLoader(Stream(5), { batch_size = 2 }):iter() do got[#got + 1] = { T.shape(x), y:tolist() } end
  T.is(got, { { { 2, 2 }, { 10, 20 } }, { { 2, 2 }, { 30, 40 } }, { { 1, 2 }, { 50 } } },
       "batches of consecutive samples, the last one shorter")
  local n = 0
  for _ in data.DataLoader(Stream(5), { batch_size = 2, drop_last = true }):iter() do n = n + 1 end
  T.is(n, 2, "drop_last drops the short one")
  T.is(#data.DataLoader(Stream(5, true), { batch_size = 2 }), 3, "#loader from the dataset's __len")
  local firsts = {}
  for x in data.DataLoader(data.ChainDataset({ Stream(2), Stream(3) }), { batch_size = 1 }):iter() do
    firsts[#firsts + 1] = x[0][0]:item()
  end
  T.is(firsts, { 1, 2, 1, 2, 3 }, "ChainDataset: one stream after the other")
  T.is(#data.ChainDataset({ Stream(2, true), Stream(3, true) }), 5, "ChainDataset's length")
  local with_collate = data.DataLoader(Stream(3), { batch_size = 3, collate_fn = function(s) return #s end })
  T.is(with_collate:iter()(), 3, "collate_fn gets the samples")
  local st = data.StackDataset(data.TensorDataset(torch.arange(3)), data.TensorDataset(torch.arange(3) * 2))
  T.is(#st, 3, "StackDataset's length")
  local a, b = st:__getitem(2)
  T.is({ a:item(), b:item() }, { 2, 4 }, "StackDataset: each dataset's sample")
  local named = data.StackDataset({ x = data.TensorDataset(torch.arange(3)), y = data.TensorDataset(torch.arange(3) + 5) })
  T.is(named:__getitem(1).y:item(), 6, "StackDataset by name")
  T.is(data.get_worker_info(), nil, "get_worker_info: the main process")
  T.raises(function() data.DataLoader(Stream(3), { shuffle = true }) end,
           "with an IterableDataset, expected unspecified shuffle option", "shuffle refused")
  T.raises(function() data.DataLoader(Stream(3), { sampler = { 0, 1 } }) end, "unspecified sampler option", "a sampler refused")
  T.raises(function() local _ = #data.DataLoader(Stream(3)) end, "no length", "the length of an unsized stream")
  T.raises(function() data.StackDataset(data.TensorDataset(torch.arange(3)), data.TensorDataset(torch.arange(4))) end,
           "size mismatch between datasets", "StackDataset of two lengths")
  T.raises(function() data.ChainDataset({ data.TensorDataset(torch.arange(3)) }) end, "dataset 1 to be iterable",
           "ChainDataset of a map-style dataset")
  local Bare = data.IterableDataset:extend("Bare")
  T.raises(function() data.DataLoader(Bare()):iter() end, "must define __iter", "no __iter")
end)

T.run("DataLoader pin_memory without a GPU", function()
  local X = torch.randn(6, 2)
  local loader = data.DataLoader(data.TensorDataset(X), { batch_size = 3, pin_memory = true })
  local x = loader:iter()()
  T.ok(torch.equal(x, X:narrow(0, 0, 3)), "the batch as without it")
  if not torch.cuda.is_available() then T.ok(not x:is_pinned(), "nothing to pin for: not pinned, as PyTorch") end
  T.raises(function() data.DataLoader(data.TensorDataset(X), { pin_memory = "yes" }) end,
           "expected pin_memory to be a boolean", "pin_memory not a boolean")
end)

T.run("worker processes: the same batches, errors named, never a hang", function()
  -- a dataset whose samples say which worker read them
  local Probe = data.Dataset:extend("Probe")
  function Probe:__init(n) self.n = n end
  function Probe:__len() return self.n end
  function Probe:__getitem(i)
    local info = data.get_worker_info()
    self.reads = (self.reads or 0) + 1   -- (each worker process its own count)
    return torch.tensor({ i, i * i }, { dtype = torch.float64 }), i, info and info.id or -1,
           { seed = info and info.seed or -1, reads = self.reads, name = "s" .. i, flag = i % 2 == 0 }
  end
  local function batches(loader)
    local out = {}
    for x, i, w, meta in loader:iter() do out[#out + 1] = { x = x, i = i:tolist(), w = w:tolist(), meta = meta } end
    return out
  end
  local plain = batches(data.DataLoader(Probe(23), { batch_size = 4 }))
  local three = batches(data.DataLoader(Probe(23), { batch_size = 4, num_workers = 3 }))
  T.is(#three, #plain, "as many batches as without workers")
  local same = true
  for k = 1, #plain do same = same and torch.equal(plain[k].x, three[k].x) and table.concat(plain[k].i, ",") == table.concat(three[k].i, ",") end
  T.ok(same, "the same batches, in the sampler's order")
  T.is({ three[1].w[1], three[2].w[1], three[3].w[1], three[4].w[1] }, { 0, 1, 2, 0 }, "batch k from worker k mod 3")
  T.is(plain[1].w, { -1, -1, -1, -1 }, "get_worker_info() is nil in the main process")
  local m1, m2 = three[1].meta, three[2].meta
  T.ok(m1.name[2] == "s1" and m1.flag:tolist()[1] == true and m1.flag.dtype == torch.bool
       and m2.seed:tolist()[1] == m1.seed:tolist()[1] + 1,
       "tables, strings and boolean tensors come back; worker k's seed is the base seed plus k")
  -- shuffled, with persistent workers over two epochs
  local shuffled = data.DataLoader(Probe(20), { batch_size = 5, shuffle = true, seed = 4 })
  local pw = data.DataLoader(Probe(20), { batch_size = 5, shuffle = true, seed = 4, num_workers = 2, persistent_workers = true })
  local a1, b1, a2, b2 = batches(shuffled), batches(pw), batches(shuffled), batches(pw)
  local ok = true
  for k = 1, #a1 do ok = ok and table.concat(a1[k].i, ",") == table.concat(b1[k].i, ",") and table.concat(a2[k].i, ",") == table.concat(b2[k].i, ",") end
  T.ok(ok, "shuffled with a seed: the same order with workers, epoch after epoch")
  T.ok(b2[1].meta.reads:tolist()[1] > 5, "persistent_workers: the second epoch runs in the same worker processes")
  -- a TensorDataset (batched by __getitems) through workers
  local x, y, tds = make(10)
  local got = {}
  for xb, yb in data.DataLoader(tds, { batch_size = 3, num_workers = 2 }):iter() do got[#got + 1] = yb:tolist() end
  T.is(got, { { 0, 1, 2 }, { 3, 4, 5 }, { 6, 7, 8 }, { 9 } }, "a TensorDataset's batches")
  -- worker_init_fn
  local Seeded = data.Dataset:extend("Seeded")
  function Seeded:__len() return 4 end
  function Seeded:__getitem(i) return torch.tensor({ _G.worker_tag or -1 }) end
  local tags = {}
  for t in data.DataLoader(Seeded(), { batch_size = 1, num_workers = 2, worker_init_fn = function(w) _G.worker_tag = 100 + w end }):iter() do
    tags[#tags + 1] = t:item()
  end
  T.is(tags, { 100, 101, 100, 101 }, "worker_init_fn(id) runs in each worker before its first batch")
  -- failures
  local Bad = data.Dataset:extend("Bad")
  function Bad:__len() return 8 end
  function Bad:__getitem(i)
    if i == 5 and self.broken then error("sample 5 is broken") end
    if i == 6 and self.die then os.exit(3) end
    if i == 6 and self.sleep then local t = os.clock() while os.clock() - t < 5 do end end
    return torch.tensor({ i })
  end
  local broken = Bad()
  broken.broken = true
  T.raises(function() for _ in data.DataLoader(broken, { batch_size = 2, num_workers = 2 }):iter() do end end,
           "DataLoader: worker 0: sample 5 is broken", "a dataset's error, with the worker that met it")
  local dies = Bad()
  dies.die = true
  T.raises(function() for _ in data.DataLoader(dies, { batch_size = 3, num_workers = 2 }):iter() do end end,
           "worker 0 %(pid %d+%) exited unexpectedly %(exit status 3%)", "a worker that exits: named, no hang")
  local slow = Bad()
  slow.sleep = true
  T.raises(function() for _ in data.DataLoader(slow, { batch_size = 3, num_workers = 2, timeout = 0.5 }):iter() do end end,
           "worker 0 %(pid %d+%) gave no batch within the timeout of 0.5 s", "timeout")
  T.raises(function() for _ in data.DataLoader(Seeded(), { num_workers = 1, worker_init_fn = function() error("no init") end }):iter() do end end,
           "worker 0: worker_init_fn: .*no init", "a failing worker_init_fn")
  -- the worker has ended before the batches are sent to it: the send must
  -- not end this process (SIGPIPE), and the error is still the worker's
  local clean = 0
  for _ = 1, 10 do
    local ok, err = pcall(function()
      for _ in data.DataLoader(Seeded(), { batch_size = 1, num_workers = 2, prefetch_factor = 8,
                                           worker_init_fn = function() error("no init") end }):iter() do end
    end)
    if not ok and tostring(err):match("worker_init_fn: .*no init") then clean = clean + 1 end
  end
  T.is(clean, 10, "batches sent to a worker that has ended: its own error, every time")
  local Gpuish = data.Dataset:extend("Fn")
  function Gpuish:__len() return 2 end
  function Gpuish:__getitem(i) return function() end end
  T.raises(function() for _ in data.DataLoader(Gpuish(), { num_workers = 1, collate_fn = function(s) return s end }):iter() do end end,
           "a batch value of type function cannot be sent from a worker", "a batch that cannot travel")
  T.raises(function() data.DataLoader(tds, { prefetch_factor = 2 }) end, "only be specified in multiprocessing",
           "prefetch_factor without workers")
  T.raises(function() data.DataLoader(tds, { num_workers = 1, timeout = -1 }) end, "non%-negative number", "a negative timeout")
end)

T.run("worker processes and an IterableDataset: each worker its part of the stream, PyTorch's order", function()
  -- range(0, end_), split as PyTorch's IterableDataset documentation does
  local Range = data.IterableDataset:extend("Range")
  function Range:__init(n) self.n = n end
  function Range:__iter()
    local info = data.get_worker_info()
    local lo, hi = 0, self.n
    if info ~= nil then
      local per = math.ceil(self.n / info.num_workers)
      lo = info.id * per
      hi = math.min(lo + per, self.n)
    end
    local i = lo - 1
    return function()
      i = i + 1
      if i < hi then return i end
    end
  end
  local ref = dofile(here .. "/../ref/iterable_workers.lua")
  for _, c in ipairs(ref) do
    local loader = data.DataLoader(Range(c.end_), { batch_size = c.batch_size, num_workers = c.num_workers,
                                                   drop_last = c.drop_last, prefetch_factor = c.prefetch_factor })
    local got = {}
    for b in loader:iter() do got[#got + 1] = b:tolist() end
    T.is(got, c.batches, string.format("%d workers, batch %d, drop_last %s, prefetch %d: PyTorch's batches",
                                       c.num_workers, c.batch_size, tostring(c.drop_last), c.prefetch_factor))
  end
  -- persistent workers: each pass a fresh stream in the same workers
  local pw = data.DataLoader(Range(7), { batch_size = 2, num_workers = 3, persistent_workers = true })
  local passes = {}
  for p = 1, 2 do
    passes[p] = {}
    for b in pw:iter() do passes[p][#passes[p] + 1] = b:tolist() end
  end
  T.is(passes, { ref[1].batches, ref[1].batches }, "persistent_workers: two passes, the same batches")
  -- a stream that breaks in one worker
  local Broken = Range:extend("Broken")
  function Broken:__iter()
    local info = data.get_worker_info()
    if info and info.id == 1 then error("worker 1's shard is missing") end
    return Range.__iter(self)
  end
  T.raises(function() for _ in data.DataLoader(Broken(8), { batch_size = 2, num_workers = 2 }):iter() do end end,
           "DataLoader: worker 1: worker 1's shard is missing", "a stream's error, with its worker")
end)

T.done_testing()
