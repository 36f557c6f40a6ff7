-- CPU-vs-CUDA parity (make check-gpu): every op computed on the CPU (the
-- reference, itself checked against PyTorch in tests/lua) and on cuda:0
-- must agree, per dtype, forward and backward; then the seed model and an
-- MLP train to the same losses on both devices.
local dir = os.getenv("DPLUA_TEST_DIR") or (debug.getinfo(1, "S").source:match("^@(.*)/gpu/") or "tests")
package.path = dir .. "/lua/?.lua;" .. package.path
local T = require("tap")
local models = require("models")
local torch = require("dplua")
if not torch.cuda.is_available() then T.skip_all("no CUDA device") end

local dev = "cuda:0"
local function tol(dt) return (dt == torch.float64) and 1e-10 or (dt == torch.bfloat16 and 2e-2 or 2e-5) end

-- compares f(cpu inputs) with f(cuda inputs)
local function same(name, f, inputs, rtol)
  local ok, err = pcall(function()
    local cpu = f(unpack(inputs))
    local gin = {}
    for i, x in ipairs(inputs) do gin[i] = torch.is_tensor(x) and x:to(dev) or x end
    local gpu = f(unpack(gin))
    if type(cpu) ~= "table" or torch.is_tensor(cpu) then cpu, gpu = { cpu }, { gpu } end
    for i = 1, #cpu do
      local c, g = cpu[i], gpu[i]
      T.is(tostring(g.device), dev, name .. " [" .. i .. "] stays on " .. dev)
      T.is(tostring(g.dtype), tostring(c.dtype), name .. " [" .. i .. "] dtype")
      local gc = g:cpu()
      if c.dtype.is_floating_point then
        T.tensor_close(gc:double(), c:double(), rtol or tol(c.dtype), rtol or tol(c.dtype), name .. " [" .. i .. "] values")
      else
        T.is(table.concat(gc:reshape(-1):long():tolist(), ","), table.concat(c:reshape(-1):long():tolist(), ","),
             name .. " [" .. i .. "] values")
      end
    end
  end)
  if not ok then T.ok(false, name .. " raised: " .. tostring(err)) end
end

torch.manual_seed(0)
local dtypes = { torch.float32, torch.float64, torch.int64, torch.int32, torch.uint8, torch.bool, torch.bfloat16 }
local floats = { torch.float32, torch.float64, torch.bfloat16 }

local function input(dt, ...)
  local x = torch.randn(...) * 3
  if dt == torch.bool then return x:gt(0) end
  if dt == torch.uint8 then return x:abs():to(dt) end
  return x:to(dt)
end

-- copies and casts across devices
for _, dt in ipairs(dtypes) do
  local x = input(dt, 3, 4)
  same("round trip " .. dt.name, function(a) return a end, { x })
  for _, dt2 in ipairs(dtypes) do
    same("cast " .. dt.name .. " -> " .. dt2.name, function(a) return a:to(dt2) end, { x })
  end
  same("strided copy " .. dt.name, function(a) return a:t():contiguous() end, { x })
end

-- The elementwise launcher's vector path (cuda/elementwise.cu's
-- ew_vec_kernel: operands contiguous, of one element size, aligned to 16
-- bytes, 16 bytes a thread) with its tail of fewer elements, a broadcast
-- 0-dim value, in place, and views at an odd offset (the element path).
for _, dt in ipairs({ torch.float32, torch.float64, torch.bfloat16, torch.int32, torch.uint8 }) do
  for _, n in ipairs({ 1, 7, 8, 9, 17, 1001 }) do
    same(("vector path: add, mul by a 0-dim value, sub_ in place, views at offset 1, %d elements %s"):format(n, dt.name),
         function(a, b, v)
      local e = a:clone()
      e:sub_(b)
      local off = n > 1 and a:narrow(0, 1, n - 1) + b:narrow(0, 0, n - 1) or a + b
      return { a + b, a * v, e, off, a:relu(), a:to(torch.float32), a:gt(b), torch.where(a:gt(b), a, b),
               a:clone():fill_(3) }
    end, { input(dt, n), input(dt, n), torch.tensor(2.5):to(dt) })
  end
end
-- one-byte results: logical_not, a cast between bool and uint8
same("vector path: logical_not and casts of 1001 bools", function(a)
  return { a:logical_not(), a:to(torch.uint8), a:to(torch.uint8):to(torch.bool) }
end, { input(torch.bool, 1001) })

-- unary
for _, op in ipairs({ "neg", "abs", "exp", "log", "sqrt", "tanh", "sigmoid", "relu", "gelu", "sin", "cos", "sign",
                      "floor", "ceil", "round", "reciprocal", "square", "erf" }) do
  for _, dt in ipairs(floats) do
    local x = input(dt, 4, 5)
    if op == "log" or op == "sqrt" then x = x:abs() + 0.5 end
    same(op .. " " .. dt.name, function(a) return a[op](a) end, { x })
  end
end
for _, dt in ipairs({ torch.int64, torch.int32 }) do
  for _, op in ipairs({ "neg", "abs", "relu", "sign", "square" }) do
    same(op .. " " .. dt.name, function(a) return a[op](a) end, { input(dt, 4, 5) })
  end
end
same("logical_not bool", function(a) return a:logical_not() end, { input(torch.bool, 6) })

-- binary with broadcasting
for _, op in ipairs({ "add", "sub", "mul", "div", "maximum", "minimum", "eq", "lt", "ge", "remainder", "pow" }) do
  for _, dt in ipairs({ torch.float32, torch.float64, torch.int64, torch.int32 }) do
    local a, b = input(dt, 3, 1, 4), input(dt, 5, 1)
    if op == "pow" then a = a:abs() + 1; b = b:abs():clamp(0, 3) end
    if op == "remainder" or op == "div" then b = b:abs() + 1 end
    same(op .. " " .. dt.name .. " broadcast", function(x, y) return x[op](x, y) end, { a, b })
  end
end
same("add scalar", function(x) return x + 2.5 end, { input(torch.float32, 7) })
same("where", function(c, x, y) return torch.where(c, x, y) end, { input(torch.bool, 3, 4), input(torch.float32, 3, 4), input(torch.float32, 4) })
same("where with number branches", function(c, x)
  return { torch.where(c, x, 0), torch.where(c, 1.5, x), torch.where(c, 2, -1) }
end, { input(torch.bool, 3, 4), input(torch.float32, 3, 4) })
same("clamp", function(x) return x:clamp(-1, 0.5) end, { input(torch.float32, 10) })

-- the losses and pointwise ops built of other ops (F.binary_cross_entropy,
-- ..., addcmul, addcdiv, lerp): values and the gradients of the first
-- ngrad arguments, float32 and float64
local F = torch.nn.functional
local function composite(name, fn, args, ngrad)
  for _, dt in ipairs({ torch.float32, torch.float64 }) do
    local typed = {}
    for i, a in ipairs(args) do typed[i] = (torch.is_tensor(a) and a.dtype.is_floating_point) and a:to(dt) or a end
    same(name .. " " .. dt.name, function(...)
      local a = { ... }
      for i = 1, ngrad do a[i] = a[i]:detach():requires_grad_() end
      local y = fn(unpack(a, 1, #args))
      local loss = y:dim() == 0 and y or (y * y):sum()
      loss:backward()
      local out = { y }
      for i = 1, ngrad do out[#out + 1] = a[i].grad end
      return out
    end, typed)
  end
end
local probs, signs = torch.rand(4, 5):mul(0.9):add(0.05), torch.randn(4, 5):sign()
local pm1 = torch.tensor({ 1, -1, 1, 0 }, { dtype = torch.int64 })
composite("binary_cross_entropy with weight", function(x, t, w)
  return F.binary_cross_entropy(x, t, { weight = w, reduction = "none" })
end, { probs, torch.rand(4, 5), torch.rand(5) }, 2)
composite("binary_cross_entropy at 0 and 1", function(x, t) return F.binary_cross_entropy(x, t, "sum") end,
          { torch.tensor({ 0, 1, 0, 1, 0.5 }), torch.tensor({ 1, 0, 0, 1, 0.3 }) }, 1)
composite("smooth_l1_loss beta 0.5", function(x, t) return F.smooth_l1_loss(x, t, { beta = 0.5, reduction = "none" }) end,
          { torch.randn(4, 5), torch.randn(4, 5) }, 2)
composite("smooth_l1_loss beta 0", function(x, t) return F.smooth_l1_loss(x, t, { beta = 0 }) end,
          { torch.randn(4, 5), torch.randn(5) }, 2)
composite("huber_loss delta 0.7", function(x, t) return F.huber_loss(x, t, { delta = 0.7, reduction = "sum" }) end,
          { torch.randn(4, 5), torch.randn(4, 5) }, 2)
composite("kl_div batchmean", function(x, t) return F.kl_div(x:log_softmax(1), t, { reduction = "batchmean" }) end,
          { torch.randn(4, 5), torch.randn(4, 5):softmax(1) }, 1)
composite("kl_div log_target", function(x, t)
  return F.kl_div(x:log_softmax(1), t:log_softmax(1), { reduction = "none", log_target = true })
end, { torch.randn(4, 5), torch.randn(4, 5) }, 2)
composite("soft_margin_loss", function(x, t) return F.soft_margin_loss(x, t, "none") end,
          { torch.randn(4, 5) * 10, signs }, 1)
composite("cosine_embedding_loss", function(a, b, y) return F.cosine_embedding_loss(a, b, y, { margin = 0.2 }) end,
          { torch.randn(4, 5), torch.randn(4, 5), pm1 }, 2)
composite("margin_ranking_loss", function(a, b, y) return F.margin_ranking_loss(a, b, y, { margin = 0.3 }) end,
          { torch.randn(4, 5), torch.randn(4, 5), signs }, 2)
composite("hinge_embedding_loss", function(x, y) return F.hinge_embedding_loss(x, y, "none") end,
          { torch.randn(4, 5), signs }, 1)
composite("addcmul broadcast", function(t, a, b) return torch.addcmul(t, a, b, { value = 0.5 }) end,
          { torch.randn(4, 1), torch.randn(1, 5), torch.randn(4, 5) }, 3)
composite("addcdiv", function(t, a, b) return t:addcdiv(a, b, { value = -2 }) end,
          { torch.randn(4, 5), torch.randn(4, 5), torch.rand(4, 5) + 0.5 }, 3)
composite("lerp with numbers", function(a, b) return a:lerp(b, 0.3) + a:lerp(b, 0.9) end,
          { torch.randn(4, 5), torch.randn(5) }, 2)
composite("lerp with a tensor weight", function(a, b, w) return torch.lerp(a, b, w) end,
          { torch.randn(4, 5), torch.randn(4, 5), torch.randn(4, 5) }, 3)
same("addcmul_, addcdiv_, lerp_ in place", function(t, a, b)
  return { t:clone():addcmul_(a, b), t:clone():addcdiv_(a, b:abs() + 0.5, { value = 3 }), t:clone():lerp_(a, b) }
end, { input(torch.float32, 4, 5), input(torch.float32, 4, 5), input(torch.float32, 5) })

-- reductions
for _, op in ipairs({ "sum", "mean", "prod", "amax", "amin", "argmax", "argmin", "var", "std", "all", "any" }) do
  for _, dt in ipairs({ torch.float32, torch.float64 }) do
    local x = input(dt, 4, 5, 6)
    same(op .. " all " .. dt.name, function(a) return a[op](a) end, { x })
    for d = 0, 2 do
      same(op .. " dim " .. d .. " " .. dt.name, function(a) return a[op](a, d, true) end, { x })
    end
  end
end
same("sum int64", function(a) return a:sum(1) end, { input(torch.int64, 4, 5) })
-- few long rows take the split path (slices, then their partials)
local long = 100003
for _, op in ipairs({ "sum", "mean", "amax", "amin", "argmax", "argmin", "all", "any", "var" }) do
  for _, dt in ipairs({ torch.float32, torch.bfloat16 }) do
    local tag = op .. " " .. dt.name .. " of long rows"
    same(tag .. ", all", function(a) return a[op](a) end, { input(dt, long) }, 1e-3)
    same(tag .. ", dim 1", function(a) return a[op](a, 1) end, { input(dt, 3, long) }, 1e-3)
    same(tag .. ", strided dim 0", function(a) return a[op](a, 0) end, { input(dt, long, 2) }, 1e-3)
  end
end
same("prod of a long row", function(a) return a:prod() end, { torch.rand(long) * 0.01 + 0.995 }, 1e-3)
same("sum int64 of long rows", function(a) return a:sum(1) end, { torch.randint(-1000000, 1000000, { 2, long }) })
same("max with indices of long rows", function(a) local v, i = a:max(1); return { v, i } end, { input(torch.float32, 2, long) })
local has_nan = input(torch.float32, long)
has_nan[70000] = 0 / 0
has_nan[90000] = 0 / 0
same("argmax of a long row takes the first NaN", function(a) return a:argmax() end, { has_nan })
same("max with indices", function(a) local v, i = a:max(1); return { v, i } end, { input(torch.float32, 6, 7) })
same("softmax", function(a) return a:softmax(1) end, { input(torch.float32, 5, 9) })
same("log_softmax dim 0", function(a) return a:log_softmax(0) end, { input(torch.float64, 5, 9) })

-- matrix products
for _, dt in ipairs({ torch.float32, torch.float64 }) do
  same("mm " .. dt.name, function(a, b) return a:mm(b) end, { input(dt, 17, 9), input(dt, 9, 13) }, dt == torch.float32 and 1e-4 or nil)
  same("mm transposed " .. dt.name, function(a, b) return a:t():mm(b:t()) end, { input(dt, 9, 17), input(dt, 13, 9) }, dt == torch.float32 and 1e-4 or nil)
  same("bmm " .. dt.name, function(a, b) return a:bmm(b) end, { input(dt, 3, 5, 4), input(dt, 3, 4, 6) }, dt == torch.float32 and 1e-4 or nil)
  same("matmul broadcast " .. dt.name, function(a, b) return a:matmul(b) end, { input(dt, 2, 3, 5, 4), input(dt, 4, 6) }, dt == torch.float32 and 1e-4 or nil)
  same("linear " .. dt.name, function(x, w, b) return torch._linear(x, w, b) end, { input(dt, 8, 5), input(dt, 3, 5), input(dt, 3) }, dt == torch.float32 and 1e-4 or nil)
end

-- Products of up to 16M multiply-adds with k up to 2048 run in the tiled
-- kernel of ours (16, 32 or 64 wide tiles by
-- how many blocks they make): every transpose, batches, a broadcast
-- operand, edges that do not fill a tile. Compared relative to the largest
-- element (float32 and bfloat16 sum in another order than the CPU).
local function unit(t) t = t:float(); return t / t:abs():max() end
-- How a product in dt is compared: its rtol, and rel(f), f with its result
-- made relative to its largest element (a float64 result as it is).
local function compare_in(dt)
  local rtol = dt == torch.bfloat16 and 5e-2 or (dt == torch.float32 and 1e-5 or nil)
  local function rel(f) return function(...) local y = f(...); return dt == torch.float64 and y or unit(y) end end
  return rtol, rel
end
-- Whole numbers, and whole numbers and a half: a first layer fed these has
-- no pre-activation near 0, where the CPU's and the GPU's different
-- summation orders could put a value on either side of a ReLU's kink.
local function whole(dt, ...) return (torch.randn(...) * 3):round():to(dt) end
local function halves(dt, n) return ((torch.randn(n) * 3):round() + 0.5):to(dt) end
for _, dt in ipairs(floats) do
  local rtol, rel = compare_in(dt)
  same("tiled mm 100x70x90 " .. dt.name, rel(function(a, b) return a:mm(b) end), { input(dt, 100, 70), input(dt, 70, 90) }, rtol)
  same("tiled mm A^T " .. dt.name, rel(function(a, b) return a:t():mm(b) end), { input(dt, 70, 100), input(dt, 70, 90) }, rtol)
  same("tiled mm B^T " .. dt.name, rel(function(a, b) return a:mm(b:t()) end), { input(dt, 100, 70), input(dt, 90, 70) }, rtol)
  same("tiled mm A^T B^T " .. dt.name, rel(function(a, b) return a:t():mm(b:t()) end), { input(dt, 70, 100), input(dt, 90, 70) }, rtol)
  same("tiled bmm " .. dt.name, rel(function(a, b) return a:bmm(b) end), { input(dt, 3, 70, 40), input(dt, 3, 40, 90) }, rtol)
  same("tiled matmul, broadcast B " .. dt.name, rel(function(a, b) return a:matmul(b) end), { input(dt, 2, 3, 50, 40), input(dt, 40, 60) }, rtol)
  same("tiled mm 64-wide tiles " .. dt.name, rel(function(a, b) return a:mm(b) end), { input(dt, 700, 16), input(dt, 16, 1200) }, rtol)
  same("tiled mm A^T, 32-wide tiles " .. dt.name, rel(function(a, b) return a:t():mm(b) end), { input(dt, 100, 512), input(dt, 100, 300) }, rtol)
  same("tiled mm B^T, 32-wide tiles " .. dt.name, rel(function(a, b) return a:mm(b:t()) end), { input(dt, 512, 100), input(dt, 300, 100) }, rtol)
end

-- Operands whose rows are aligned are read a vector at a time (gemm.cu's
-- tile_vectors): views whose k, m and n end inside a vector, in 16-, 32-
-- and 64-wide tiles, every transpose. Past k their storage holds NaN, so
-- that reading one element too many along k spoils the product; a view
-- one element in is not aligned and is read element by element.
local function round4(v) return v - v % 4 + 4 end
local function nan_rows(t, keep) t:narrow(0, keep, t.shape[1] - keep):fill_(0 / 0); return t end
local function nan_cols(t, keep) t:narrow(1, keep, t.shape[2] - keep):fill_(0 / 0); return t end
for _, dt in ipairs(floats) do
  local rtol, rel = compare_in(dt)
  for _, s in ipairs({ { 100, 69, 89, "16" }, { 400, 69, 597, "32" }, { 700, 19, 1199, "64" } }) do
    local m, k, n = s[1], s[2], s[3]
    local what = ("%dx%dx%d, %s-wide tiles, vectors to ragged ends %s"):format(m, k, n, s[4], dt.name)
    -- op(A) from A (m, k) or A^T stored (k, m); op(B) from B (k, n) or B^T stored (n, k)
    local a, at = nan_cols(input(dt, m, round4(k)), k), nan_rows(input(dt, k + 3, round4(m)), k)
    local b, bt = nan_rows(input(dt, k + 3, round4(n)), k), nan_cols(input(dt, n, round4(k)), k)
    local function A(x, t) return t and x:narrow(0, 0, k):narrow(1, 0, m):t() or x:narrow(1, 0, k) end
    local function B(x, t) return t and x:narrow(1, 0, k):t() or x:narrow(0, 0, k):narrow(1, 0, n) end
    same("tiled mm " .. what, rel(function(x, y) return A(x, false):mm(B(y, false)) end), { a, b }, rtol)
    same("tiled mm A^T " .. what, rel(function(x, y) return A(x, true):mm(B(y, false)) end), { at, b }, rtol)
    same("tiled mm B^T " .. what, rel(function(x, y) return A(x, false):mm(B(y, true)) end), { a, bt }, rtol)
    same("tiled mm A^T B^T " .. what, rel(function(x, y) return A(x, true):mm(B(y, true)) end), { at, bt }, rtol)
  end
  same("tiled mm of views one element in " .. dt.name, rel(function(a, b) return a:narrow(1, 1, 70):mm(b:narrow(1, 1, 90)) end),
       { input(dt, 100, 72), input(dt, 70, 92) }, rtol)
end

-- Few tiles over a deep k: k is split over a cluster of blocks, which sum
-- their partial tiles (gemm.cu's tile_split_finish). 16-wide tiles in 8
-- shares and 32-wide in 8 (64-wide ones split only past 16M multiply-adds,
-- where cuBLASLt takes the product), transposes, a batch, edges that fill neither a tile nor a
-- share; then a Linear layer's backward with a split k: dw with the bias
-- gradient (the input needs no gradient), and dx alone with a ReLU mask
-- (the layer frozen).
for _, dt in ipairs(floats) do
  local rtol, rel = compare_in(dt)
  local mm = rel(function(a, b) return a:mm(b) end)
  same("split k, 16-wide tiles " .. dt.name, mm, { input(dt, 64, 1024), input(dt, 1024, 64) }, rtol)
  same("split k, 32-wide tiles " .. dt.name, mm, { input(dt, 128, 1024), input(dt, 1024, 128) }, rtol)
  same("split k, ragged " .. dt.name, mm, { input(dt, 61, 1999), input(dt, 1999, 37) }, rtol)
  same("split k A^T B^T " .. dt.name, rel(function(a, b) return a:t():mm(b:t()) end),
       { input(dt, 1024, 64), input(dt, 64, 1024) }, rtol)
  same("split k bmm " .. dt.name, rel(function(a, b) return a:bmm(b) end), { input(dt, 2, 48, 1500), input(dt, 2, 1500, 40) }, rtol)
  same("split k linear dw and db " .. dt.name, function(x, w, b)
    w = w:detach():requires_grad_(); b = b:detach():requires_grad_()
    torch._linear(x, w, b):float():pow(2):sum():backward()
    return { unit(w.grad), unit(b.grad) }
  end, { input(dt, 1024, 64), input(dt, 32, 64), input(dt, 32) }, dt == torch.bfloat16 and 5e-2 or 1e-4)
  same("split k linear dx under a relu mask " .. dt.name, function(x, w1, b1, w2, b2)
    x = x:detach():requires_grad_()
    local h = torch._linear(x, w1, b1):relu()
    torch._linear(h, w2, b2):float():pow(2):sum():backward()
    return unit(x.grad)
  end, { whole(dt, 64, 32), whole(dt, 64, 32), halves(dt, 64), input(dt, 1024, 64), input(dt, 1024) },
       dt == torch.bfloat16 and 5e-2 or 1e-4)
  -- A layer's dx and dw in one launch, k split for the deep one only
  -- (gemm.cu's own_plan): dx from k = 10 beside dw from k = 256 (the MLP's
  -- last layer), k = 128 beside 256 (its second), and a ragged one whose
  -- unsplit dx fills its last cluster with blocks that do nothing.
  for _, shape in ipairs({ { 256, 128, 10 }, { 256, 256, 128 }, { 200, 90, 9 } }) do
    local m, k, n = shape[1], shape[2], shape[3]
    same(string.format("linear dx, dw, db of %dx%d -> %d, one job split " .. dt.name, m, k, n), function(x, w, b)
      x = x:detach():requires_grad_(); w = w:detach():requires_grad_(); b = b:detach():requires_grad_()
      torch._linear(x, w, b):float():pow(2):sum():backward()
      return { unit(x.grad), unit(w.grad), unit(b.grad) }
    end, { input(dt, m, k), input(dt, n, k), input(dt, n) }, dt == torch.bfloat16 and 5e-2 or 1e-4)
  end
end

-- float32 products past 16M multiply-adds (cuBLASLt's): every transpose,
-- edges that fill no tile (past k the storage holds NaN, which must not
-- leak in), a batch, a view one element in, a deep k, a narrow n, and a
-- Linear's forward with each epilogue and its backward.
do
  local dt, rtol = torch.float32, 1e-5
  local mm = function(a, b) return unit(a:mm(b)) end
  for _, s in ipairs({ { 256, 784, 256 }, { 250, 781, 199 }, { 640, 160, 640 }, { 1000, 33, 1001 } }) do
    local m, k, n = s[1], s[2], s[3]
    local what = ("%dx%dx%d"):format(m, k, n)
    local a, at = nan_cols(input(dt, m, round4(k)), k), nan_rows(input(dt, k + 3, round4(m)), k)
    local b, bt = nan_rows(input(dt, k + 3, round4(n)), k), nan_cols(input(dt, n, round4(k)), k)
    local function A(x, t) return t and x:narrow(0, 0, k):narrow(1, 0, m):t() or x:narrow(1, 0, k) end
    local function B(x, t) return t and x:narrow(1, 0, k):t() or x:narrow(0, 0, k):narrow(1, 0, n) end
    same("mm " .. what, function(x, y) return mm(A(x, false), B(y, false)) end, { a, b }, rtol)
    same("mm A^T " .. what, function(x, y) return mm(A(x, true), B(y, false)) end, { at, b }, rtol)
    same("mm B^T " .. what, function(x, y) return mm(A(x, false), B(y, true)) end, { a, bt }, rtol)
    same("mm A^T B^T " .. what, function(x, y) return mm(A(x, true), B(y, true)) end, { at, bt }, rtol)
  end
  local mmt = function(a, b) return unit(a:mm(b:t())) end
  same("bmm B^T 3x200x300x150", function(a, b) return unit(a:bmm(b:transpose(1, 2))) end,
       { input(dt, 3, 200, 300), input(dt, 3, 150, 300) }, rtol)
  same("bmm 3x200x300x150", function(a, b) return unit(a:bmm(b)) end,
       { input(dt, 3, 200, 300), input(dt, 3, 300, 150) }, rtol)
  same("mm B^T of a view one element in", function(a, b) return mmt(a:narrow(1, 1, 784), b) end,
       { input(dt, 256, 788), input(dt, 256, 784) }, rtol)
  same("mm B^T, k 8192", mmt, { input(dt, 64, 8192), input(dt, 64, 8192) }, rtol)
  same("mm B^T 16 columns wide", mmt, { input(dt, 8192, 200), input(dt, 16, 200) }, rtol)
  for _, act in ipairs({ false, "relu", "gelu", "gelu_tanh" }) do
    same("linear" .. (act and "+" .. act or "") .. " 256x784 -> 256, forward and backward", function(x, w, b)
      x = x:detach():requires_grad_(); w = w:detach():requires_grad_(); b = b:detach():requires_grad_()
      local y = act and torch._linear_act(x, w, b, act) or torch._linear(x, w, b)
      y:pow(2):sum():backward()
      return { unit(y), unit(x.grad), unit(w.grad), unit(b.grad) }
    end, { whole(dt, 256, 784), whole(dt, 256, 784), halves(dt, 256) }, 1e-4)
  end
end

-- Products whose operands fit one block's shared memory together run in
-- one block that stages them all at once (gemm.cu's small_gemm_kernel):
-- every transpose, a view whose rows are wider than k, k of 1 and odd,
-- a product at its limits and that product one row larger (2112 elements
-- of C: the tiles again): 2048 elements and 128K multiply-adds in 24 KiB
-- for 4-byte elements, 2048 elements in 31 KiB of the 32 for float64; and
-- a Linear's forward and backward with the bias gradient's row sums
-- beside the products, with and without a bias, under a ReLU.
for _, dt in ipairs(floats) do
  local rtol, rel = compare_in(dt)
  local mm = rel(function(a, b) return a:mm(b) end)
  same("one-block mm " .. dt.name, mm, { input(dt, 33, 7), input(dt, 7, 21) }, rtol)
  same("one-block mm A^T " .. dt.name, rel(function(a, b) return a:t():mm(b) end), { input(dt, 7, 33), input(dt, 7, 21) }, rtol)
  same("one-block mm B^T " .. dt.name, rel(function(a, b) return a:mm(b:t()) end), { input(dt, 33, 7), input(dt, 21, 7) }, rtol)
  same("one-block mm A^T B^T " .. dt.name, rel(function(a, b) return a:t():mm(b:t()) end),
       { input(dt, 7, 33), input(dt, 21, 7) }, rtol)
  same("one-block mm of column views " .. dt.name, rel(function(a, b) return a:narrow(1, 2, 5):mm(b:narrow(1, 1, 9)) end),
       { input(dt, 12, 9), input(dt, 5, 13) }, rtol)
  same("one-block mm, k = 1 " .. dt.name, mm, { input(dt, 40, 1), input(dt, 1, 30) }, rtol)
  local k = dt == torch.float64 and 41 or 64   -- 32 x 41 + 41 x 64 float64 values: 31 KiB
  same("one-block mm at its limit " .. dt.name, mm, { input(dt, 32, k), input(dt, k, 64) }, rtol)
  same("one-block mm past its limit " .. dt.name, mm, { input(dt, 33, k), input(dt, k, 64) }, rtol)
  for _, bias in ipairs({ true, false }) do
    same("one-block linear+relu forward and backward" .. (bias and "" or " without bias") .. " " .. dt.name,
         function(x, w, b)
      x = x:detach():requires_grad_(); w = w:detach():requires_grad_()
      if b then b = b:detach():requires_grad_() end
      local y = torch._linear_act(x, w, b, "relu")
      y:float():pow(2):sum():backward()
      local out = { rel(function(t) return t end)(y), unit(x.grad), unit(w.grad) }
      if b then out[4] = unit(b.grad) end
      return out
    end, { whole(dt, 19, 7), whole(dt, 13, 7), bias and halves(dt, 13) or nil }, dt == torch.bfloat16 and 5e-2 or 1e-4)
  end
end

-- bf16 linear takes the direct (cuBLASLt) path on a GPU, forward and backward.
-- The GPU rounds x w^T + b once, the CPU the product and then the sum; the
-- one-ulp difference that leaves in y is multiplied into the gradients,
-- where a sum that cancels to a small value keeps an error of the size of
-- its terms. The gradients are therefore compared relative to their
-- largest element.
same("linear bfloat16 forward and backward", function(x, w, b)
  x = x:detach():requires_grad_(); w = w:detach():requires_grad_(); b = b:detach():requires_grad_()
  local y = torch._linear(x, w, b)
  y:float():pow(2):sum():backward()
  return { y, unit(x.grad), unit(w.grad), unit(b.grad) }
end, { input(torch.bfloat16, 8, 5), input(torch.bfloat16, 3, 5), input(torch.bfloat16, 3) }, 5e-2)

-- Linear layers past the small-product kernel, M x K in, N out, with their
-- epilogues: the bias, bias+ReLU and bias+GELU in both forms (the fused
-- Linear+activation; GELU writes the product beside its output for the
-- backward) in the forward, the bias gradient beside dw in the backward;
-- with and without a bias. GELU's erf form past 16M is cuBLASLt's product
-- and bias, then our kernel; its tanh form there is cuBLASLt's GELU_AUX.
-- The tiled kernel in 16-, 32- and 64-wide tiles (the backward's dx and dw
-- in one launch); cuBLASLt past 16M multiply-adds, and for k past 2048
-- without a workspace and with one; a backward whose dw (k = M), or dx
-- (k = N), is cuBLASLt's.
local linear_sizes = { { 67, 97, 83 }, { 512, 100, 300 }, { 1030, 30, 520 }, { 520, 512, 300 }, { 8, 2400, 40 },
                       { 64, 2304, 80 }, { 2100, 64, 96 }, { 64, 80, 2100 }, { 256, 784, 256 } }
for _, dt in ipairs({ torch.float32, torch.float64, torch.bfloat16 }) do
  for _, size in ipairs(linear_sizes) do
    for _, act in ipairs({ false, "relu", "gelu", "gelu_tanh" }) do
      for _, bias in ipairs({ true, false }) do
        local name = ("linear%s %dx%dx%d%s %s"):format(act and "+" .. act or "", size[1], size[2], size[3],
                                                      bias and "" or " without bias", dt.name)
        local M, K, N = size[1], size[2], size[3]
        same(name, function(x, w, b)
          x = x:detach():requires_grad_(); w = w:detach():requires_grad_()
          if b then b = b:detach():requires_grad_() end
          local y = act and torch._linear_act(x, w, b, act) or torch._linear(x, w, b)
          y:float():pow(2):sum():backward()
          -- relative to the largest element: bf16 rounds before the bias on
          -- the CPU and after it on the GPU (see above), and float32 sums of
          -- 384 terms of up to ~10 in another order differ by 2e-4 where
          -- they cancel
          local out = { dt == torch.float64 and y or unit(y), unit(x.grad), unit(w.grad) }
          if b then out[4] = unit(b.grad) end
          return out
        end, { input(dt, M, K), input(dt, N, K), bias and input(dt, N) or nil },
             dt == torch.bfloat16 and 5e-2 or (dt == torch.float32 and 1e-4 or nil))
      end
    end
  end
end

-- A first layer's backward (no dx) whose weight gradient is cuBLASLt's:
-- the bias gradient is summed apart (cuda/optim.cu's bias_block_sums, the
-- blocks an optimizer's launch runs first), here alone because the
-- gradient is read; also rows not a multiple of 32 and columns not of 8;
-- past 4096 rows it stays in cuBLASLt's epilogue.
for _, dt in ipairs(floats) do
  for _, size in ipairs({ { 256, 784, 256 }, { 300, 784, 100 }, { 4100, 784, 16 } }) do
    local M, K, N = size[1], size[2], size[3]
    same(("first linear %dx%dx%d, its bias gradient apart %s"):format(M, K, N, dt.name), function(x, w, b)
      w = w:detach():requires_grad_(); b = b:detach():requires_grad_()
      torch._linear(x, w, b):float():pow(2):sum():backward()
      return { unit(w.grad), unit(b.grad) }
    end, { input(dt, M, K), input(dt, N, K), input(dt, N) }, dt == torch.bfloat16 and 5e-2 or (dt == torch.float32 and 1e-4 or nil))
  end
end

-- An empty batch: the first layer's gradients are zeros (cuBLASLt's
-- epilogue path, which the bias gradient apart does not take).
do
  local w, b = torch.randn(256, 784):to(dev):requires_grad_(), torch.randn(256):to(dev):requires_grad_()
  local ok, err = pcall(function()
    torch._linear(torch.randn(0, 784):to(dev), w, b):sum():backward()
    torch.cuda.synchronize()
  end)
  T.ok(ok, "a first layer's backward over an empty batch: no error " .. tostring(err or ""))
  T.is(ok and w.grad:abs():sum():item() + b.grad:abs():sum():item(), 0, "its gradients are zeros")
end

-- The optimizer's launch makes the first layer's bias gradient before its
-- step (gpu_linear.c's bias_in_step): three steps of a 784-128-10 MLP at batch
-- 256, the parameters after them as on the CPU; SGD with momentum,
-- Nesterov and weight decay, Adam, AdamW. The steps after the first
-- (which makes the optimizer's state, launching the bias gradient alone)
-- take it: two launches saved, counted where the head is not.
for _, opt in ipairs({ { "SGD", { lr = 0.05, momentum = 0.9, nesterov = true, weight_decay = 0.01 } },
                       { "Adam", { lr = 0.01 } }, { "AdamW", { lr = 0.01, weight_decay = 0.1 } } }) do
  local taken
  same("784-128-10 MLP, 3 steps of " .. opt[1] .. ", the first layer's bias gradient in its launch",
       function(x, y)
    torch.manual_seed(4)
    local nn = torch.nn
    local m = nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10)):double():to(x.device)
    local o = torch.optim[opt[1]](m:parameters(), opt[2])
    local before = torch.cuda._linear_fusions()
    for _ = 1, 3 do
      o:zero_grad()
      torch.nn.functional.cross_entropy(m(x), y):backward()
      o:step()
    end
    if x.device.type == "cuda" then taken = torch.cuda._linear_fusions() - before end
    local out = {}
    for i, p in ipairs(m:parameters()) do out[i] = p:detach() end
    return out
  end, { input(torch.float64, 256, 784), torch.randint(0, 10, { 256 }) })
  local heads = torch.cuda.get_device_capability() >= 9 and 3 or 0
  T.is(taken and taken - heads, 2, opt[1] .. ": its launches took the bias gradient on steps 2 and 3")
end

-- A ReLU between two Linear layers: the second layer's backward applies the
-- ReLU's mask to dx (in the tiled kernel's epilogue, or
-- after cuBLASLt's product), whether the ReLU is its own op or fused into
-- the first layer. Sizes: M rows, K -> H -> N: the seed's, the MLP's
-- first two layers, one whose second backward runs in 32-wide tiles, and
-- one whose backward is cuBLASLt's (dw's k = M).
-- The first layer's inputs are whole numbers and its bias halves (see whole).
-- A GELU (both forms) between them likewise, on the seed's and the MLP's
-- sizes: fused, the first layer's backward reads the product its epilogue
-- kept.
local between = {
  relu = { { 32, 10, 10, 2 }, { 256, 784, 256, 128 }, { 512, 64, 256, 64 }, { 2100, 48, 40, 24 } },
  gelu = { { 32, 10, 10, 2 }, { 256, 784, 256, 128 } },
  gelu_tanh = { { 32, 10, 10, 2 }, { 256, 784, 256, 128 } },
}
for _, dt in ipairs(floats) do
  for _, act in ipairs({ "relu", "gelu", "gelu_tanh" }) do
    for _, size in ipairs(between[act]) do
      for _, fused in ipairs({ false, true }) do
        local M, K, H, N = size[1], size[2], size[3], size[4]
        local name = ("%s between linears %dx%d->%d->%d%s %s"):format(act, M, K, H, N,
                                                                     fused and " (fused into the first)" or "", dt.name)
        same(name, function(x, w1, b1, w2, b2)
          local p = {}
          for i, t in ipairs({ x, w1, b1, w2, b2 }) do p[i] = t:detach():requires_grad_() end
          local z = not fused and torch._linear(p[1], p[2], p[3])
          local h = fused and torch._linear_act(p[1], p[2], p[3], act)
                    or (act == "relu" and z:relu() or z:gelu(act == "gelu_tanh" and "tanh" or "none"))
          local y = torch._linear(h, p[4], p[5])
          y:float():pow(2):sum():backward()
          local out = { dt == torch.float64 and y or unit(y) }
          for i = 1, 5 do out[#out + 1] = unit(p[i].grad) end
          return out
        end, { whole(dt, M, K), whole(dt, H, K), halves(dt, H), input(dt, N, H), input(dt, N) },
             dt == torch.bfloat16 and 5e-2 or (dt == torch.float32 and 1e-4 or nil))
      end
    end
  end
end

-- indexing
same("index_select", function(a, i) return a:index_select(0, i) end, { input(torch.float32, 6, 3), torch.tensor({ 5, 0, 2, 2 }, { dtype = torch.int64 }) })
same("gather", function(a, i) return a:gather(1, i) end, { input(torch.float32, 3, 4), torch.tensor({ { 0, 3 }, { 1, 1 }, { 2, 0 } }, { dtype = torch.int64 }) })
same("cat", function(a, b) return torch.cat({ a, b }, 1) end, { input(torch.float32, 2, 3), input(torch.float32, 2, 2) })

-- convolution and pooling (unfold and its fold), forward and backward, in
-- every floating dtype (bf16 for autocast; without the pooling there,
-- whose choice among values that bf16 rounds to ties may differ). bf16
-- gradients are compared relative to their largest element: the fold adds
-- rounded products in bf16, and one ulp of a large term stays in a sum
-- that cancels.
for _, dt in ipairs({ torch.float32, torch.float64, torch.bfloat16 }) do
  local pool = dt ~= torch.bfloat16
  local function conv(x, w, b)
    x = x:detach():requires_grad_(); w = w:detach():requires_grad_()
    local F = torch.nn.functional
    local y = F.conv2d(x, w, b, 1, 1)
    if pool then y = F.max_pool2d(y, 2) end
    y:float():sum():backward()
    if dt == torch.bfloat16 then return { y, unit(x.grad), unit(w.grad) } end
    return { y, x.grad, w.grad }
  end
  same((pool and "conv2d and max_pool2d " or "conv2d ") .. dt.name, conv,
       { input(dt, 2, 3, 6, 8), input(dt, 4, 3, 3, 3), input(dt, 4) },
       dt == torch.bfloat16 and 5e-2 or (dt == torch.float32 and 1e-4 or nil))
end

-- the backward of index_select (index_add) and of gather (scatter_add),
-- with repeated indices, in every floating dtype
for _, dt in ipairs({ torch.float32, torch.float64, torch.bfloat16 }) do
  local rows = torch.tensor({ 4, 0, 2, 2, 4 }, { dtype = torch.int64 })
  local cols = torch.tensor({ { 0, 3, 3 }, { 1, 1, 0 }, { 2, 0, 3 }, { 3, 3, 3 }, { 0, 1, 2 } }, { dtype = torch.int64 })
  local function pick(x, r, c)
    x = x:detach():requires_grad_()
    local y = x:index_select(0, r):gather(1, c)
    local loss = (y * y):float():sum()
    loss:backward()
    return { y, x.grad }
  end
  same("index_select and gather backward " .. dt.name, pick, { input(dt, 5, 4), rows, cols },
       dt == torch.bfloat16 and 5e-2 or nil)
end

-- autograd on CUDA: gradients equal the CPU's
local function grads(x, w, b, t)
  x = x:detach():requires_grad_(); w = w:detach():requires_grad_(); b = b:detach():requires_grad_()
  local y = torch._linear(x, w, b):relu()
  local loss = torch._cross_entropy(y, t, nil, -100, 0.1, 1, false) + (y:tanh() * 0.5):sum() / 7
  loss:backward()
  return { loss, x.grad, w.grad, b.grad }
end
same("autograd: linear, relu, cross-entropy, tanh", grads,
     { input(torch.float64, 16, 5), input(torch.float64, 4, 5), input(torch.float64, 4), torch.randint(0, 4, { 16 }) })

-- cross-entropy called straight with backward(): a loss that fits one
-- launch writes its gradient in the forward, which the backward hands
-- over; a second backward (retain_graph) computes its own, as does a loss
-- gradient other than 1. Every option; 5 and 20 classes (2 and 8
-- threads a row), 10 classes over 256 rows (the MLP's: 4 threads a row,
-- 1024 in the block), 20 over 100 rows (800 threads) and 40 classes (a
-- warp a row).
for _, shape in ipairs({ { 12, 5 }, { 12, 20 }, { 256, 10 }, { 100, 20 }, { 8, 40 } }) do
  local N, C = shape[1], shape[2]
  local ce_weight = torch.rand(C):double() + 0.5
  for _, dt in ipairs(floats) do
    for _, o in ipairs({ { "mean", 1 }, { "sum", 2 } }) do
      for _, v in ipairs({ { "", nil, -100, 0, false }, { " weighted", ce_weight, -100, 0, false },
                           { " ignoring 3", nil, 3, 0, false }, { " smoothed", ce_weight, 3, 0.2, false },
                           { " nll", ce_weight, 3, 0, true } }) do
        same("cross-entropy " .. o[1] .. v[1] .. " gradient from the forward, " .. N .. " rows of " .. C .. " classes, " .. dt.name,
             function(x, t, w)
          local x1 = x:detach():requires_grad_()
          local loss = torch._cross_entropy(x1, t, w, v[3], v[4], o[2], v[5])
          loss:backward({ retain_graph = true })
          local g1 = x1.grad:clone()
          loss:backward()
          local x3 = x:detach():requires_grad_()
          local tripled = torch._cross_entropy(x3, t, w, v[3], v[4], o[2], v[5]) * 3
          tripled:backward()
          return { loss, g1, x1.grad, x3.grad }
        end, { input(dt, N, C), torch.randint(0, C, { N }), v[2] }, dt == torch.bfloat16 and 5e-2 or nil)
      end
    end
  end
end

-- The gradient the one-launch loss writes in its forward and the one a
-- second backward computes in its own kernel are the same to the last
-- bit, class weights with label smoothing included (reduce.cu's
-- warp_weight_sum: both add the weights in one order); 40 classes make
-- a lane add more than one weight.
for _, shape in ipairs({ { 12, 5 }, { 256, 10 }, { 8, 40 } }) do
  local N, C = shape[1], shape[2]
  local ce_weight = (torch.rand(C):double() + 0.5):to(dev)
  for _, dt in ipairs(floats) do
    for _, v in ipairs({ { "", nil, 0 }, { " weighted, smoothed", ce_weight, 0.2 } }) do
      local x = input(dt, N, C):to(dev):requires_grad_()
      local t = torch.randint(0, C, { N }):to(dev)
      local loss = torch._cross_entropy(x, t, v[2], -100, v[3], 1, false)
      loss:backward({ retain_graph = true })
      local from_forward = x.grad:clone()
      x.grad = nil
      loss:backward()
      T.is(from_forward:ne(x.grad):sum():item(), 0, "cross-entropy" .. v[1] .. ": the forward's gradient is a second backward's, bit for bit, "
           .. N .. " rows of " .. C .. " classes, " .. dt.name)
    end
  end
end

-- training: the seed model and an MLP reach the same losses
local function train(device, dtype)
  torch.manual_seed(3)
  local nn, optim = torch.nn, torch.optim
  local model = models.SimpleNN():to(dtype):to(device)
  local opt = optim.Adam(model:parameters(), { lr = 0.01 })
  local x = torch.rand(32, 10, { dtype = dtype }):to(device)
  local y = torch.randint(0, 2, { 32 }):to(device)
  return models.train(model, opt, nn.CrossEntropyLoss(), x, y, 20)
end
local c, g = train("cpu", torch.float64), train(dev, torch.float64)
local worst = 0
for i = 1, #c do worst = math.max(worst, math.abs(c[i] - g[i]) / math.abs(c[i])) end
T.ok(worst < 1e-10, string.format("seed model with Adam, 20 steps: CUDA losses equal the CPU's (worst rel %.2e)", worst))
local c32, g32 = train("cpu", torch.float32), train(dev, torch.float32)
worst = 0
for i = 1, #c32 do worst = math.max(worst, math.abs(c32[i] - g32[i]) / math.abs(c32[i])) end
T.ok(worst < 1e-4, string.format("the same in float32 (worst rel %.2e)", worst))

-- The deferred Linear (src/core/gpu_linear.c): a small Linear waits for the next
-- op, and a ReLU or GELU of its output runs in the same launch; the
-- Linear's output is still written. Anything else launches it first, so
-- every value is what the ops in their order give.
do
  local F = torch.nn.functional
  local fusions = torch.cuda._linear_fusions
  local x, w, b = whole(torch.float32, 8, 6), whole(torch.float32, 5, 6), halves(torch.float32, 5)
  local gx, gw, gb = x:to(dev), w:to(dev), b:to(dev)
  local z = F.linear(x, w, b)
  local function near(t, want, name) T.tensor_close(t:cpu():double(), want:double(), 1e-6, 1e-6, name) end
  local function fused(f)   -- f's result and how many fusions it made
    local before = fusions()
    local r = { f() }
    torch.cuda.synchronize()
    return fusions() - before, unpack(r)
  end
  local n, h, r = fused(function() local h = F.linear(gx, gw, gb); return h, F.relu(h) end)
  T.is(n, 1, "F.relu(F.linear(..)): one launch")
  near(r, z:relu(), "its ReLU"); near(h, z, "the Linear's output, also written")
  n, h = fused(function() local h = F.linear(gx, gw, gb); h:relu_(); return h end)
  T.is(n, 1, "relu_ in place on the output: one launch"); near(h, z:relu(), "the output, ReLU'd in place")
  for _, form in ipairs({ "none", "tanh" }) do
    n, h, r = fused(function() local h = F.linear(gx, gw); return h, F.gelu(h, form) end)
    T.is(n, 1, "F.gelu(F.linear(..), '" .. form .. "'): one launch")
    near(r, F.linear(x, w):gelu(form), "its GELU"); near(h, F.linear(x, w), "and the product")
  end
  n, r = fused(function() return F.linear(gx, gw, gb) * 2 end)
  T.is(n, 0, "a mul after the Linear: nothing fused"); near(r, z * 2, "its value")
  n, r = fused(function() local h = F.linear(gx, gw, gb); gx:add_(1); return h:relu() end)
  T.is(n, 0, "its input changed in place before the ReLU: launched first, nothing fused")
  near(r, z:relu(), "the ReLU of the product of the input before the change")
  gx:sub_(1)
  n, r = fused(function() local h = F.linear(gx, gw, gb); return h:t():relu() end)
  T.is(n, 0, "a ReLU of a transposed view: nothing fused"); near(r, z:t():relu(), "its value")
  n, h, r = fused(function() local h = F.linear(gx, gw, gb); local c = h:cpu(); return c, h:relu() end)
  T.is(n, 0, "the output read by the host first: launched for the copy"); near(h, z, "the copy's value")
  near(r, z:relu(), "and the ReLU's after it")
  local s = torch.cuda.Stream()
  n, r = fused(function()
    local h = F.linear(gx, gw, gb)
    local out
    torch.cuda.stream(s, function() out = h:relu() end)
    torch.cuda.current_stream():wait_stream(s)
    return out
  end)
  T.is(n, 0, "the ReLU on another stream: the Linear launched when the stream changed")
  near(r, z:relu(), "its value")
  n = fused(function() F.linear(gx, gw, gb) end)
  T.is(n, 0, "a Linear that nothing reads runs at the synchronisation")
  n, r = fused(function() local h = F.linear(gx, gw, gb); h:data_ptr(); return h:relu() end)
  T.is(n, 0, "data_ptr() of the output: launched for whoever uses the pointer"); near(r, z:relu(), "its value")
  n, r = fused(function() local h = F.linear(gx, gw, gb); torch.cuda.current_stream(); return h:relu() end)
  T.is(n, 0, "torch.cuda.current_stream(): launched for whoever uses the stream"); near(r, z:relu(), "its value")
  -- a classifier's head: the Linear inside the loss's launch, when both
  -- fit one block; the Linear's output still written, the gradients as on
  -- the CPU; with class weights and label smoothing too
  local target = torch.tensor({ 0, 4, 2, 1, 3, 3, 0, 2 }, { dtype = torch.int64 })
  local gtarget = target:to(dev)
  local cw = torch.tensor({ 1.0, 0.5, 2.0, 1.5, 1.0 }, { dtype = torch.float64 })
  for _, opts in ipairs({ {}, { weight = cw, label_smoothing = 0.1 } }) do
    local what = opts.weight and " (weights, smoothing)" or ""
    local q = { x:clone():requires_grad_(), w:clone():requires_grad_(), b:clone():requires_grad_() }
    local p = { gx:clone():requires_grad_(), gw:clone():requires_grad_(), gb:clone():requires_grad_() }
    local gopts = { label_smoothing = opts.label_smoothing, weight = opts.weight and opts.weight:to(dev) }
    local zc = F.linear(q[1], q[2], q[3])
    local lc = F.cross_entropy(zc, target, opts)
    lc:backward()
    local zg, lg
    n = fused(function()
      zg = F.linear(p[1], p[2], p[3])
      lg = F.cross_entropy(zg, gtarget, gopts)
      lg:backward()
    end)
    T.is(n, 1, "F.cross_entropy(F.linear(..)): one launch" .. what)
    near(lg, lc, "the loss" .. what); near(zg, zc, "the Linear's output, also written" .. what)
    for i = 1, 3 do near(p[i].grad, q[i].grad, "gradient " .. i .. " as on the CPU" .. what) end
  end
  -- the Linear inside the loss's launch sums as its own launch does, to
  -- the last bit (dpc_ops.h's DPC_GEMM_UNSPLIT_K): a head of 256 rows from
  -- k = 128, whose tiles alone would otherwise split k over two blocks
  for _, dt in ipairs(floats) do
    local hx, hw, hb = input(dt, 256, 128):to(dev), input(dt, 2, 128):to(dev), input(dt, 2):to(dev)
    local ht = torch.randint(0, 2, { 256 }):to(dev)
    local inside
    n = fused(function() inside = F.linear(hx, hw, hb); F.cross_entropy(inside, ht) end)
    T.is(n, 1, "a 256 x 128 -> 2 head inside the loss's launch " .. dt.name)
    local alone = F.linear(hx, hw, hb):clone()   -- (the copy launches the Linear alone)
    T.is(alone:ne(inside):sum():item(), 0, "its output is its own launch's, bit for bit " .. dt.name)
  end
  -- a head too large for one block (more than DPC_GEMM_UNSPLIT_MACS, so
  -- its own launch splits k over blocks even with k <= 128) runs inside
  -- the loss's launch over a cluster of blocks (sm_90 on), rows of it a
  -- block: the MLP's, 256 x 128 -> 10 (k split in two), 256 x 64 -> 10
  -- (not split), 64 x 200 -> 10 without a bias (in four, the last share
  -- short), 100 x 256 -> 3 (rows not a multiple of a block's), 96 x 128
  -- -> 20 (more outputs than two a thread of a block); its
  -- output bit for bit its own launch's, the
  -- loss and every gradient as on the CPU. One of k = 1200 is too large
  -- to stage: its own launch.
  local clusters = torch.cuda.get_device_capability() >= 9 and 1 or 0
  for _, case in ipairs({ { 256, 128, 10, true }, { 256, 64, 10, true }, { 64, 200, 10, false }, { 100, 256, 3, true },
                        { 96, 128, 20, true } }) do
    for _, dt in ipairs(floats) do
      local rows, k, classes = case[1], case[2], case[3]
      local what = ("%d x %d -> %d %s"):format(rows, k, classes, dt.name)
      local cpu = { input(dt, rows, k), input(dt, classes, k), case[4] and input(dt, classes) or nil }
      local ht = torch.randint(0, classes, { rows })
      local function run(p, target)
        local z = F.linear(p[1], p[2], p[3])
        local loss = F.cross_entropy(z, target)
        loss:backward()
        return z, loss
      end
      local leaves = {}
      for i = 1, #cpu do leaves[i] = cpu[i]:clone():requires_grad_() end
      local zc, lc = run(leaves, ht)
      -- a float64 head's staging (32 rows of x and the classes' of w, each
      -- padded by 16 bytes) past reduce.cu's CE_HEAD_STAGE_BYTES
      local big = dt == torch.float64 and (32 + classes) * (k + 2) * 8 > 44 * 1024
      local p = {}
      for i = 1, #cpu do p[i] = cpu[i]:to(dev):requires_grad_() end
      local zg, lg
      n, zg, lg = fused(function() return run(p, ht:to(dev)) end)
      T.is(n, big and 0 or clusters, "a head inside the loss's launch over a cluster: " .. what)
      local rtol, atol = dt == torch.bfloat16 and 2e-2 or 1e-5, dt == torch.bfloat16 and 1 or dt == torch.float32 and 1e-3 or 1e-9
      T.tensor_close(lg:cpu():double(), lc:double(), rtol, atol, "its loss as on the CPU " .. what)
      for i = 1, #cpu do
        T.tensor_close(p[i].grad:cpu():double(), leaves[i].grad:double(), rtol, atol, "gradient " .. i .. " as on the CPU " .. what)
      end
      local alone = F.linear(p[1]:detach(), p[2]:detach(), p[3] and p[3]:detach()):clone()   -- (launched alone)
      T.is(alone:ne(zg:detach()):sum():item(), 0, "its output is its own launch's, bit for bit " .. what)
    end
  end
  local big_x, big_w = whole(torch.float32, 64, 1200), whole(torch.float32, 10, 1200)
  local big_t = torch.randint(0, 10, { 64 })
  n, r = fused(function() return F.cross_entropy(F.linear(big_x:to(dev), big_w:to(dev)), big_t:to(dev)) end)
  T.is(n, 0, "a head too large to stage: the Linear's own launch")
  near(r, F.cross_entropy(F.linear(big_x, big_w), big_t), "its loss")
  -- a classifier's last two layers (the seed's fc1, its activation, fc2):
  -- both Linears inside the loss's launch when they fit one block; every
  -- output Lua holds still written, the gradients as on the CPU. widths:
  -- in, hidden, classes; act: "relu", "identity" (none), or a GELU form
  local function two_layers(name, dt, act, widths, batch, want)
    local cpu = { whole(dt, batch, widths[1]) / 4, whole(dt, widths[2], widths[1]) / 4, halves(dt, widths[2]),
                  whole(dt, widths[3], widths[2]) / 4, halves(dt, widths[3]) }
    local t = torch.randint(0, widths[3], { batch })
    local function run(p, target)
      local y1 = F.linear(p[1], p[2], p[3])
      local h = act == "relu" and F.relu(y1) or act == "identity" and y1 or F.gelu(y1, act)
      local y2 = F.linear(h, p[4], p[5])
      local loss = F.cross_entropy(y2, target)
      loss:backward()
      return { y1, h, y2, loss }
    end
    local gpu = {}
    for i, v in ipairs(cpu) do gpu[i] = v:to(dev):requires_grad_(); v:requires_grad_() end
    local want_out = run(cpu, t)
    local n, got = fused(function() return run(gpu, t:to(dev)) end)
    T.is(n, want, name .. ": " .. want .. " launches saved")
    local rt = tol(dt)
    local what = { "the first Linear's output", "the activation's", "the logits", "the loss" }
    for i = 1, 4 do
      T.tensor_close(got[i]:detach():cpu():double(), want_out[i]:detach():double(), rt, rt, name .. ": " .. what[i])
    end
    for i = 1, #cpu do
      T.tensor_close(gpu[i].grad:cpu():double(), cpu[i].grad:double(), rt, rt, name .. ": gradient " .. i)
    end
  end
  -- saved: the activation's launch, both Linears', and the chained
  -- backwards (a ReLU's or none; a GELU's backward is an op of its own)
  for _, dt in ipairs(floats) do two_layers("the seed's head " .. dt.name, dt, "relu", { 10, 10, 2 }, 32, 4) end
  two_layers("GELU between", torch.float32, "none", { 10, 10, 2 }, 32, 3)
  two_layers("tanh GELU between", torch.float64, "tanh", { 6, 12, 5 }, 20, 3)
  two_layers("no activation between", torch.float32, "identity", { 10, 10, 2 }, 32, 3)
  -- the hidden layer too wide for the loss's block (64 x 40 outputs): the
  -- first launched with its ReLU, the last still in the loss's launch; the
  -- backwards too large to chain
  two_layers("hidden layer too wide", torch.float32, "relu", { 10, 40, 3 }, 64, 2)
  -- through autograd: the seed model's F.relu(fc1(x)) fused in each step,
  -- gradients as on the CPU
  local p = { gx:clone():requires_grad_(), gw:clone():requires_grad_(), gb:clone():requires_grad_() }
  local w2 = whole(torch.float32, 3, 5):to(dev):requires_grad_()
  n = fused(function() torch._linear(F.relu(F.linear(p[1], p[2], p[3])), w2):pow(2):sum():backward() end)
  T.is(n, 2, "forward fused under autograd, and the two backwards chained")
  local q = { x:clone():requires_grad_(), w:clone():requires_grad_(), b:clone():requires_grad_() }
  local cw2 = w2:detach():cpu():requires_grad_()
  torch._linear(F.relu(F.linear(q[1], q[2], q[3])), cw2):pow(2):sum():backward()
  for i = 1, 3 do near(p[i].grad, q[i].grad, "gradient " .. i .. " as on the CPU") end
  near(w2.grad, cw2.grad, "the second layer's gradient as on the CPU")

  -- Chained backwards: a small Linear's backward that computes dx waits,
  -- and the backward of the layer before it, whose gradient is that dx,
  -- runs in the same launch (one block, the later layer first). Layers of
  -- widths[1] -> widths[2] -> ..., batch 32, ReLUs between unless
  -- o.linear_only, loss sum(out^2); the gradients of every parameter (and
  -- of the input with o.input_grad) against the CPU's, backward run
  -- o.times times without zeroing.
  local function chain(name, dt, widths, o, want)
    torch.manual_seed(3)   -- the same numbers whatever ran before
    local cpu, gpu = {}, {}
    for l = 1, #widths - 1 do
      cpu[#cpu + 1] = whole(dt, widths[l + 1], widths[l]) / 4
      if not o.no_bias then cpu[#cpu + 1] = halves(dt, widths[l + 1]) end
    end
    local x = whole(dt, 32, widths[1]) / 4
    local function run(params, input)
      local h, i = input, 1
      for l = 1, #widths - 1 do
        h = F.linear(h, params[i], not o.no_bias and params[i + 1] or nil)
        i = i + (o.no_bias and 1 or 2)
        if l < #widths - 1 and not o.linear_only then h = F.relu(h) end
      end
      for _ = 1, o.times or 1 do h:pow(2):sum():backward({ retain_graph = true }) end
    end
    for i, t in ipairs(cpu) do gpu[i] = t:to(dev):requires_grad_(); t:requires_grad_() end
    local cx, gx2 = x:clone():requires_grad_(o.input_grad or false), x:to(dev):requires_grad_(o.input_grad or false)
    run(cpu, cx)
    local n = fused(function() run(gpu, gx2) end)
    T.is(n, want, name .. ": " .. want .. " launches saved")
    -- bfloat16: each layer's dx is rounded to it before the next product,
    -- on either side, so a gradient may differ by a few of its ulps
    local rt = dt == torch.bfloat16 and 5e-2 or 1e-6
    for i = 1, #cpu do
      T.tensor_close(gpu[i].grad:cpu():double(), cpu[i].grad:double(), rt, rt, name .. ": gradient " .. i)
    end
    if o.input_grad then T.tensor_close(gx2.grad:cpu():double(), cx.grad:double(), rt, rt, name .. ": the input's") end
  end
  for _, dt in ipairs(floats) do
    chain("the seed's layers " .. dt.name, dt, { 10, 10, 2 }, {}, 2)
  end
  chain("with the input's gradient", torch.float32, { 10, 10, 2 }, { input_grad = true }, 2)
  chain("without biases", torch.float32, { 10, 10, 2 }, { no_bias = true }, 2)
  chain("no ReLU between", torch.float32, { 10, 10, 2 }, { linear_only = true }, 1)
  chain("three layers: the last two chained", torch.float32, { 10, 10, 10, 2 }, {}, 3)
  -- the second backward adds to .grad, which launches the waiting backward first
  chain("twice without zeroing: accumulated", torch.float32, { 10, 10, 2 }, { times = 2 }, 2)
  -- each part two thirds of the block's 32 KiB in 8-byte elements (which a chain is planned for)
  chain("wider layers, still one block", torch.float64, { 40, 40, 10 }, {}, 2)
  chain("layers too large for one block", torch.float32, { 100, 64, 10 }, {}, 1)
end

-- memory: freed tensors are given back, and errors are clear
collectgarbage(); collectgarbage()
local before = torch.cuda.memory_allocated(0)
do local big = torch.empty(1024, 1024):to(dev) end
T.ok(torch.cuda.memory_allocated(0) >= before + 4 * 1024 * 1024, "memory_allocated counts a new 4 MiB tensor")
collectgarbage(); collectgarbage()
T.is(torch.cuda.memory_allocated(0), before, "memory_allocated returns to its level after a collection")
T.raises(function() return torch.ones(2):to("cuda:7") end, "cuda:7", "an absent device is a clear error")
T.raises(function() return torch.ones(2):to(dev) + torch.ones(2) end, "same device", "mixing devices is a clear error")
T.is(tostring(torch.ones(2, 2):to(dev)), "tensor([[1., 1.],\n        [1., 1.]], device='cuda:0')", "printing names the device")
-- dropout: the same state of the stream gives the same mask on both
-- devices (one Philox stream, philox_keeps), bit for bit, forward and back
T.run("dropout: the CPU's mask on the GPU", function()
  for _, dt in ipairs({ torch.float32, torch.bfloat16, torch.float64 }) do
    local x, g = torch.randn(37, 53):to(dt), torch.randn(37, 53):to(dt)
    local state = torch.get_rng_state()
    local function run(device)
      torch.set_rng_state(state)
      local xl = x:detach():to(device):requires_grad_()   -- a leaf of its own (x:to("cpu") is x)
      local y = torch.nn.functional.dropout(xl, 0.2)
      y:backward(g:to(device))
      return y:cpu(), xl.grad:cpu()
    end
    local cy, cg = run("cpu")
    local gy, gg = run(dev)
    T.tensor_close(gy:double(), cy:double(), 0, 0, tostring(dt) .. ": output")
    T.tensor_close(gg:double(), cg:double(), 0, 0, tostring(dt) .. ": gradient")
  end
end)

T.done_testing()
