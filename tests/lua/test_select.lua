-- test_select.lua -- sort, argsort, topk, cumsum (with their gradients),
-- one_hot, nonzero and advanced indexing (reads, writes through put_)
-- against PyTorch (tests/ref/select.lua, scripts/gen_select_ref.py);
-- multinomial and randperm by their distributions (chi-square bounds over
-- many draws); new_*, put_ and the refusals of bad input.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local dir = os.getenv("DPLUA_TEST_DIR") or (here .. "/..")
package.path = dir .. "/lua/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local F = torch.nn.functional
local ffi = require("ffi")
local R = dofile(dir .. "/ref/select.lua")

-- a tensor from a reference entry (int64 literals beyond 2^53 are cdata)
local function ref(r)
  local n, exact = #r, false
  for i = 1, n do if type(r[i]) == "cdata" then exact = true end end
  local t
  if exact then
    t = torch.zeros({ n }, { dtype = torch.int64 })
    local p = ffi.cast("int64_t *", t:data_ptr())
    for i = 1, n do p[i - 1] = r[i] end
  elseif n == 0 then
    t = torch.zeros({ 0 }, { dtype = torch[r.dtype] })
  else
    local flat = {}
    for i = 1, n do flat[i] = r[i] end
    t = torch.tensor(flat, { dtype = torch[r.dtype] })
  end
  return t:reshape(r.shape)
end

-- equal shapes, dtypes and elements (NaN equal to NaN)
local function same(got, want, name)
  local ok = got.dtype == want.dtype and tostring(got.shape) == tostring(want.shape)
  if ok and got:numel() > 0 then
    ok = got:eq(want):logical_or(got:ne(got):logical_and(want:ne(want))):all():item()
  end
  T.ok(ok, name, not ok and ("got " .. tostring(got) .. "\nwant " .. tostring(want)) or nil)
end

-- values exact, and the indices point at elements equal to them (ties)
local function points_at(x, dim, values, indices, name)
  same(x:gather(dim, indices), values, name .. ": the indices point at the values")
end

T.run("sort with ties: stable indices exactly, both directions, both dims", function()
  local c = R.ties
  local x = ref(c.x)
  for _, dim in ipairs({ -1, 0 }) do
    for _, dir_ in ipairs({ "asc", "desc" }) do
      local want = c[string.format("sort_%d_%s", dim + 1, dir_)]
      local v, i = x:sort({ dim = dim, descending = dir_ == "desc", stable = true })
      same(v, ref(want[1]), "values dim " .. dim .. " " .. dir_)
      same(i, ref(want[2]), "stable indices dim " .. dim .. " " .. dir_)
      local v2, i2 = torch.sort(x, dim, dir_ == "desc")
      same(v2, ref(want[1]), "torch.sort positional values")
      points_at(x, dim, v2, i2, "torch.sort positional")
      same(torch.argsort(x, dim, dir_ == "desc"), i2, "argsort is sort's indices")
    end
  end
end)

T.run("sort: NaN above every number, -inf, int64 beyond 2^53", function()
  local x = ref(R.nan.x)
  for _, dir_ in ipairs({ "asc", "desc" }) do
    local v, i = x:sort(-1, dir_ == "desc", { stable = true })
    same(v, ref(R.nan["sort_" .. dir_][1]), "values " .. dir_)
    same(i, ref(R.nan["sort_" .. dir_][2]), "indices " .. dir_)
  end
  local b = ref(R.int64.x)
  local v, i = b:sort()
  same(v, ref(R.int64.sort_asc[1]), "int64 values exactly")
  same(i, ref(R.int64.sort_asc[2]), "int64 indices")
  local d = b:argsort({ descending = true })
  T.is(d:tolist(), { 0, 3, 1, 4, 2, 5 }, "argsort descending: the ties of 2^62 + 1 in their order")
  same(b:gather(0, d), ref(R.int64.x):sort({ descending = true }), "argsort descending orders the values")
  local z = torch.tensor(5.0)
  local zv, zi = z:sort()
  T.is({ zv:item(), zi:item(), zi:dim() }, { 5, 0, 0 }, "a 0-d tensor sorts to itself")
  local e = torch.zeros(3, 0)
  T.is(e:sort(1):size(), { 3, 0 }, "an empty dim sorts to nothing")
end)

T.run("topk against PyTorch (indices exactly where values differ)", function()
  local x = ref(R.topk.x)
  for key, want in pairs(R.topk) do
    local k, dim, which = key:match("^k(%d+)_dim(%-?%d+)_(%a+)$")
    if k then
      dim = tonumber(dim) - 1
      local v, i = x:topk(tonumber(k), dim, which == "largest")
      same(v, ref(want[1]), key .. " values")
      same(i, ref(want[2]), key .. " indices")
    end
  end
  local v, i = torch.topk(x, 3, { largest = false, sorted = false })
  same(v, ref(R.topk.k3_dim0_smallest[1]), "options table; sorted=false still sorted")
  local tv, ti = ref(R.ties.x):topk(3)
  same(tv, ref(R.ties.topk3[1]), "ties: values exactly")
  points_at(ref(R.ties.x), 1, tv, ti, "ties")
  T.is(ti.dtype.name, "int64", "indices are int64")
end)

T.run("gradients of topk, sort and cumsum", function()
  local x = ref(R.topk.x):requires_grad_()
  local v = x:topk(4)
  T.is(v.grad_fn.name, "TopkBackward0", "topk's grad_fn")
  v:backward(ref(R.topk.grad_out))
  same(x.grad, ref(R.topk.grad_k4), "topk: the values' gradient goes to their positions")
  x = ref(R.topk.x):requires_grad_()
  v = x:sort(0, true)
  T.is(v.grad_fn.name, "SortBackward0", "sort's grad_fn")
  v:backward(ref(R.topk.sort_grad_out))
  same(x.grad, ref(R.topk.sort_grad_dim0_desc), "sort dim 0 descending")
  local c = R.cumsum
  for _, dim in ipairs({ 0, 1 }) do
    x = ref(c.x):requires_grad_()
    local y = x:cumsum(dim)
    T.tensor_close(y, ref(c["dim" .. dim]), 1e-14, 1e-14, "cumsum dim " .. dim)
    y:backward(ref(c.grad_out))
    T.tensor_close(x.grad, ref(c["grad_dim" .. dim]), 1e-14, 1e-14, "cumsum's gradient, dim " .. dim)
  end
  T.is(x:cumsum(0).grad_fn.name, "CumsumBackward0", "cumsum's grad_fn")
end)

T.run("cumsum dtypes", function()
  local c = R.cumsum
  same(ref(c.ints):cumsum(1), ref(c.ints_dim1), "int64")
  same(ref(c.bools):cumsum(0), ref(c.bools_dim0), "bool sums to int64")
  same(ref(c.ints):int():cumsum(1), ref(c.ints_dim1), "int32 sums to int64")
  local f = torch.tensor({ 1, 2, 3 }):cumsum(0)
  T.is({ f.dtype.name, f:tolist() }, { "float32", { 1, 3, 6 } }, "float32 stays float32")
  local d = torch.tensor({ 1, 2, 3 }, { dtype = torch.int64 }):cumsum(0, { dtype = torch.float64 })
  T.is({ d.dtype.name, d:tolist() }, { "float64", { 1, 3, 6 } }, "dtype= converts first")
  T.is(torch.cumsum(torch.ones(2, 3), -1):tolist(), { { 1, 2, 3 }, { 1, 2, 3 } }, "torch.cumsum, dim -1")
end)

T.run("one_hot and nonzero", function()
  local c = R.one_hot
  same(F.one_hot(ref(c.x)), ref(c.default), "num_classes = -1")
  same(F.one_hot(ref(c.x), 5), ref(c.five), "num_classes = 5")
  same(F.one_hot(ref(c.x):view(1, 5), 6), ref(c.two_d), "2-D")
  local n = R.nonzero
  same(ref(n.x):nonzero(), ref(n.result), "nonzero 2-D")
  same(torch.nonzero(ref(n.x3)), ref(n.result3), "nonzero 3-D bool")
  local parts = ref(n.x):nonzero({ as_tuple = true })
  T.is(#parts, 2, "as_tuple: one tensor per dim")
  same(parts[2], ref(n.result):select(1, 1), "as_tuple: the column indices")
  T.is(torch.zeros(2, 2):nonzero():size(), { 0, 2 }, "no non-zeros: (0, ndim)")
  T.is(torch.tensor({ 0 / 0, 0, -0.0, 1 }):nonzero():tolist(), { { 0 }, { 3 } }, "NaN is non-zero, -0 is zero")
end)

T.run("advanced indexing: reads against PyTorch", function()
  local c = R.index
  local t, i1, i2, ia, ib, mask2 = ref(c.t), ref(c.i1), ref(c.i2), ref(c.ia), ref(c.ib), ref(c.mask2)
  same(t[i1], ref(c.r_i1), "t[i1] (negative index)")
  same(t[{ i1 }], ref(c.r_i1), "t[{i1}]")
  same(t[{ {}, i1 + 1 }], ref(c.r_col_i1), "t[{{}, i1 + 1}]")
  same(t[{ {}, {}, i2 }], ref(c.r_i2), "t[{{}, {}, i2}] (2-D index)")
  same(t[{ ia, ib }], ref(c.r_pair), "t[{ia, ib}]")
  same(t[{ {}, ia, ib }], ref(c.r_pair_mid), "t[{{}, ia, ib}]: adjacent, in place")
  same(t[{ ia, {}, ib }], ref(c.r_split), "t[{ia, {}, ib}]: apart, at the front")
  same(t[{ 1, {}, ia }], ref(c.r_int_adv), "t[{1, {}, ia}]: the number selects first, as in PyTorch")
  same(t[mask2], ref(c.r_mask2), "t[mask]")
  same(t[{ { 1, 3 } }][mask2[{ { 1, 3 } }]], ref(c.r_mask_slice), "mask of a slice")
  same(t[mask2:nonzero({ as_tuple = true })], ref(c.r_mask2), "t[mask:nonzero{as_tuple=true}]")
  same(t[i1:int()], ref(c.r_i1), "int32 indices")
  local g = t:clone():requires_grad_()
  g[i1]:backward(ref(c.grad_out_i1))
  same(g.grad, ref(c.grad_i1), "the gradient of a read adds up repeated indices")
end)

T.run("advanced indexing: writes against PyTorch", function()
  local c = R.index
  local t, i1, i2, ia, ib, mask2 = ref(c.t), ref(c.i1), ref(c.i2), ref(c.ia), ref(c.ib), ref(c.mask2)
  local w = t:clone(); w[i1] = -1
  same(w, ref(c.w_i1_scalar), "w[i1] = -1")
  w = t:clone(); w[{ {}, ia, ib }] = torch.tensor({ 100, 200 }, { dtype = torch.float64 })
  same(w, ref(c.w_pair_mid), "w[{{}, ia, ib}] = tensor (broadcast over dim 0)")
  w = t:clone(); w[mask2] = 0.5
  same(w, ref(c.w_mask2), "w[mask] = 0.5 (a mask of the leading dims)")
  local m3 = ref(c.m3)
  w = t:clone(); w[m3] = -torch.arange(m3:sum():item(), { dtype = torch.float64 })
  same(w, ref(c.w_mask3_values), "w[mask] = values, one per true element (masked_fill_ for a number)")
  w = t:clone(); w[{ {}, {}, i2 }] = torch.tensor({ { 7, 8 }, { 9, 10 } }, { dtype = torch.float64 })
  same(w, ref(c.w_i2_broadcast), "w[{{}, {}, i2}] = a broadcast 2x2")
  local s = t:clone()
  local view = s[{ { 1, 3 }, {}, 2 }]   -- a strided view: writes go to s
  view[{ {}, torch.tensor({ 0, 4 }, { dtype = torch.int64 }) }] = 0
  T.is({ s[{ 1, 0, 2 }]:item(), s[{ 2, 4, 2 }]:item(), s[{ 1, 1, 2 }]:item() }, { 0, 0, 38 },
       "writes through a strided view reach its base")
  w = t:clone(); w:index_put_({ ia, ib }, torch.tensor(-3, { dtype = torch.float64 }))
  local w2 = t:clone(); w2[{ ia, ib }] = -3
  same(w, w2, "index_put_({ia, ib}, v) is w[{ia, ib}] = v")
  same(t:index_put({ mask2 }, torch.tensor(0.5, { dtype = torch.float64 })), ref(c.w_mask2), "index_put: a copy")
  local b = torch.zeros(3, { dtype = torch.bool })
  b[torch.tensor({ 2 }, { dtype = torch.int64 })] = true
  T.is(b:tolist(), { false, false, true }, "a boolean value")
end)

T.run("put_", function()
  local t = torch.zeros(2, 3)
  t:put_(torch.tensor({ 1, -1 }, { dtype = torch.int64 }), torch.tensor({ 9, 8 }))
  T.is(t:tolist(), { { 0, 9, 0 }, { 0, 0, 8 } }, "row-major positions, negative from the end")
  local tt = torch.zeros(2, 3):t()
  tt:put_(torch.tensor({ 1 }, { dtype = torch.int64 }), torch.tensor({ 5 }))
  T.is(tt:tolist(), { { 0, 5 }, { 0, 0 }, { 0, 0 } }, "positions of the view's own row-major order")
  T.is(torch.put(torch.zeros(2), torch.tensor({ 0 }, { dtype = torch.int64 }), torch.tensor({ 1 })):tolist(), { 1, 0 },
       "put: a copy")
end)

-- chi-square of counts against probabilities p (those > 0)
local function chi2(counts, p, n)
  local s = 0
  for i = 1, #p do
    if p[i] > 0 then s = s + (counts[i] - n * p[i]) ^ 2 / (n * p[i]) end
  end
  return s
end

local function counts_of(samples, k)
  local c = {}
  for i = 1, k do c[i] = 0 end
  for _, v in ipairs(samples) do c[v + 1] = c[v + 1] + 1 end
  return c
end

T.run("multinomial with replacement: the distribution, seeds, shapes", function()
  local w = torch.tensor({ 1, 2, 3, 4, 0 }, { dtype = torch.float64 })   -- unnormalised weights
  local p = { 0.1, 0.2, 0.3, 0.4, 0 }
  torch.manual_seed(1)
  local N = 40000
  local s = torch.multinomial(w, N, true)
  T.is({ s.dtype.name, s:size() }, { "int64", { N } }, "int64 of num_samples")
  local c = counts_of(s:tolist(), 5)
  T.is(c[5], 0, "a category of weight 0 is never drawn")
  -- 3 degrees of freedom: 30 is far past the 1e-5 quantile (25.9)
  T.ok(chi2(c, p, N) < 30, "chi-square of the counts is within bounds", "chi2 = " .. chi2(c, p, N))
  torch.manual_seed(1)
  same(w:multinomial(N, true), s, "the same seed gives the same draws")
  local rows = torch.tensor({ { 0, 0, 1 }, { 1, 0, 0 } })
  T.is(rows:multinomial(3, true):tolist(), { { 2, 2, 2 }, { 0, 0, 0 } }, "2-D: one row of draws per row")
  local g1 = w:multinomial(5, true, { generator = 7 })
  local g2 = w:multinomial(5, { replacement = true, generator = 7 })
  same(g1, g2, "generator = a seed: the same draws each time")
  torch.manual_seed(3)
  local a = torch.rand(3)
  torch.manual_seed(3)
  local _ = w:multinomial(5, true, { generator = 7 })
  same(torch.rand(3), a, "a generator leaves torch's stream where it was")
end)

T.run("multinomial without replacement: distinct, first draws and inclusion in proportion", function()
  local p = { 0.1, 0.2, 0.3, 0.4, 0 }
  local N = 20000
  torch.manual_seed(2)
  local probs = torch.tensor(p, { dtype = torch.float64 }):view(1, 5):expand(N, 5):contiguous()
  local s = probs:multinomial(2)
  T.is(s:size(), { N, 2 }, "(rows, num_samples)")
  T.ok(s:select(1, 0):ne(s:select(1, 1)):all():item(), "the two draws of a row differ")
  T.ok(s:ne(4):all():item(), "weight 0 is never drawn")
  local first = counts_of(s:select(1, 0):tolist(), 5)
  T.ok(chi2(first, p, N) < 30, "the first draws follow p", "chi2 = " .. chi2(first, p, N))
  -- the second follows p with the first removed: P(second = i) = sum_j p_j p_i / (1 - p_j)
  local q = {}
  for i = 1, 5 do
    q[i] = 0
    for j = 1, 5 do if j ~= i then q[i] = q[i] + p[j] * p[i] / (1 - p[j]) end end
  end
  local second = counts_of(s:select(1, 1):tolist(), 5)
  T.ok(chi2(second, q, N) < 30, "the second draws follow p without the first", "chi2 = " .. chi2(second, q, N))
  local all = torch.ones(6):multinomial(6)
  T.is(all:sort():tolist(), { 0, 1, 2, 3, 4, 5 }, "num_samples = n draws every category once")
end)

T.run("a GPT-2 top-k sampling step, as PyTorch code writes it", function()
  torch.manual_seed(4)
  local logits = torch.randn(2, 50)
  local v = logits:topk(5)
  logits[logits:lt(v[{ {}, { -1 } }])] = -math.huge
  local probs = F.softmax(logits, -1)
  T.is(probs:gt(0):sum(-1):tolist(), { 5, 5 }, "five candidates a row are left")
  local next_ = torch.multinomial(probs, 1)
  T.is(next_:size(), { 2, 1 }, "one draw a row")
  T.ok(probs:gather(-1, next_):gt(0):all():item(), "each draw is one of the row's five")
end)

T.run("randperm", function()
  torch.manual_seed(5)
  local p = torch.randperm(10)
  T.is({ p.dtype.name, p:sort():tolist() }, { "int64", { 0, 1, 2, 3, 4, 5, 6, 7, 8, 9 } }, "a permutation, int64")
  torch.manual_seed(5)
  same(torch.randperm(10), p, "the same seed, the same permutation")
  T.is(torch.randperm(0):size(), { 0 }, "randperm(0) is empty")
  T.is(torch.randperm(3, { dtype = torch.int32 }).dtype.name, "int32", "dtype=")
  local N, c = 6000, { 0, 0, 0, 0, 0, 0 }
  for _ = 1, N do local v = torch.randperm(6)[0]:item(); c[v + 1] = c[v + 1] + 1 end
  local u = { 1 / 6, 1 / 6, 1 / 6, 1 / 6, 1 / 6, 1 / 6 }
  T.ok(chi2(c, u, N) < 35, "the first element is uniform", "chi2 = " .. chi2(c, u, N))
end)

T.run("new_zeros, new_ones, new_full, new_empty, new_tensor", function()
  local t = torch.zeros({ 2 }, { dtype = torch.float64 })
  local z = t:new_zeros(2, 3)
  T.is({ z.dtype.name, z:size(), z:sum():item() }, { "float64", { 2, 3 }, 0 }, "new_zeros takes t's dtype")
  T.is(t:new_ones({ 2 }):tolist(), { 1, 1 }, "new_ones with a table")
  T.is(t:new_ones(2, { dtype = torch.int64 }).dtype.name, "int64", "dtype= overrides")
  local f = t:new_full({ 2, 2 }, 7)
  T.is({ f.dtype.name, f:tolist() }, { "float64", { { 7, 7 }, { 7, 7 } } }, "new_full")
  T.is(t:new_empty(4):size(), { 4 }, "new_empty")
  local n = torch.zeros({ 1 }, { dtype = torch.int64 }):new_tensor({ 3, 4 })
  T.is({ n.dtype.name, n:tolist() }, { "int64", { 3, 4 } }, "new_tensor takes t's dtype")
end)

T.run("bad input is refused with a message", function()
  local x = torch.randn(3, 4)
  T.raises(function() x:topk(5) end, "topk: k %(5%) is out of range for dim 1 of size 4", "k larger than the dim")
  T.raises(function() x:topk(-1) end, "out of range", "a negative k")
  T.raises(function() x:topk() end, "k argument is required", "no k")
  T.raises(function() x:sort(2) end, "dim 2 is out of range", "sort's dim")
  T.raises(function() return x[torch.tensor({ 0, 1 })] end, "must be int64, int32 or bool, got a float32 tensor",
           "a float tensor as indices")
  T.raises(function() return x[torch.tensor({ 3 }, { dtype = torch.int64 })] end,
           "index 3 is out of bounds for dim 0 with size 3", "an index out of bounds")
  T.raises(function() x[torch.ones(2, 2):bool()] = 1 end, "shape of the mask", "a mask of the wrong shape (write)")
  T.raises(function() return x[torch.ones(4):bool()] end, "shape of the mask", "a mask of the wrong shape (read)")
  T.raises(function() x[{ torch.tensor({ 0, 1 }, { dtype = torch.int64 }), torch.tensor({ 0, 1, 2 },
           { dtype = torch.int64 }) }] = 1 end, "could not be broadcast", "index shapes that do not broadcast")
  T.raises(function() x[torch.tensor({ 0 }, { dtype = torch.int64 })] = torch.ones(3) end, "does not broadcast",
           "a value of the wrong shape")
  local w = torch.tensor({ 0.5, 0.5, 0 })
  T.raises(function() w:multinomial(4) end, "cannot draw num_samples=4 > 3 categories without replacement",
           "num_samples > n without replacement")
  T.raises(function() w:multinomial(3) end, "2 categories of non%-zero probability", "too few non-zero categories")
  T.raises(function() torch.tensor({ 0.5, -0.1 }):multinomial(1) end, "finite and non%-negative",
           "a negative probability")
  T.raises(function() torch.tensor({ 0.5, 0 / 0 }):multinomial(1) end, "finite and non%-negative", "NaN")
  T.raises(function() torch.zeros(2):multinomial(1) end, "sum to 0", "all zeros")
  T.raises(function() torch.ones(2, 2, 2):multinomial(1) end, "1 or 2 dims", "3-D probabilities")
  T.raises(function() torch.ones(2, { dtype = torch.int64 }):multinomial(1) end, "floating point", "integers")
  T.raises(function() w:multinomial(0) end, "num_samples > 0", "num_samples 0")
  T.raises(function() w:multinomial(1, true, { generator = "x" }) end, "generator", "a generator that is not a seed")
  T.raises(function() torch.zeros(3):put_(torch.tensor({ 3 }, { dtype = torch.int64 }), torch.ones(1)) end,
           "put_: index 3 is out of bounds for a tensor of 3 elements", "put_ out of bounds")
  T.raises(function() torch.zeros(3):put_(torch.tensor({ 0 }), torch.ones(1)) end, "int64 index", "put_ float index")
  T.raises(function() torch.zeros(3):put_(torch.tensor({ 0 }, { dtype = torch.int64 }), torch.ones(2)) end,
           "as many elements", "put_ sizes")
  T.raises(function() x:index_put_(torch.tensor({ 0 }, { dtype = torch.int64 }), torch.ones(4)) end,
           "Lua list of tensors", "index_put_ of a lone tensor")
  T.raises(function() F.one_hot(torch.tensor({ 1.0 })) end, "int64 tensor", "one_hot of floats")
  T.raises(function() F.one_hot(torch.tensor({ 3 }, { dtype = torch.int64 }), 2) end, "out of range", "one_hot class")
  T.raises(function() F.one_hot(torch.tensor({ -1 }, { dtype = torch.int64 })) end, "non%-negative", "one_hot -1")
  T.raises(function() x:cumsum() end, "dim argument is required", "cumsum without dim")
  T.raises(function() torch.randperm(-1) end, "n >= 0", "randperm(-1)")
  T.raises(function() x:sort(0, "yes") end, "descending to be a boolean", "descending not a boolean")
end)

T.done_testing()
