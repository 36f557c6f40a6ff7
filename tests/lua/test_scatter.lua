-- test_scatter.lua -- scatter, scatter_add, index_add, index_copy and
-- index_fill (methods, torch functions, in-place forms) against PyTorch's
-- outputs and gradients (tests/ref/scatter.lua, written by
-- scripts/gen_scatter_ref.py) in float64 and float32; the source's
-- gradient where the index covers only part of it by finite differences
-- (PyTorch's backward refuses that case); integer and bool tensors; bad
-- input.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local ref = dofile(here .. "/../ref/scatter.lua")
local i64 = { dtype = torch.int64 }

local TOL = { [torch.float64] = 1e-12, [torch.float32] = 1e-5 }

-- The case's input, index and source, as the generator builds them.
local function operands(c, dtype)
  local x = T.filled(torch, c.shape, function(k) return math.sin(1 + 0.7 * k) end):to(dtype)
  local index = torch.tensor(c.index, i64):reshape(c.index_shape)
  local src = c.value
  if c.src_shape then src = T.filled(torch, c.src_shape, function(k) return math.cos(2 + 1.3 * k) end):to(dtype) end
  return x, index, src
end

local function apply(c, x, index, src, suffix)
  local name = c.op .. (suffix or "")
  if c.op == "index_add" then return x[name](x, c.dim, index, src, c.opts.alpha and { alpha = c.opts.alpha }) end
  if c.op == "scatter" and c.opts.reduce then return x[name](x, c.dim, index, src, { reduce = c.opts.reduce }) end
  return x[name](x, c.dim, index, src)
end

for _, name in ipairs(T.sorted_keys(ref)) do
  local c = ref[name]
  for _, dtype in ipairs({ torch.float64, torch.float32 }) do
    T.run(name .. " " .. dtype.name, function()
      local what = name .. " " .. dtype.name .. ": "
      local x, index, src = operands(c, dtype)
      local differentiable = c.dinput ~= nil
      x:requires_grad_(differentiable)
      if torch.is_tensor(src) and c.dsrc then src:requires_grad_() end
      local y = apply(c, x, index, src)
      local tol = TOL[dtype]
      T.is(y.dtype, dtype, what .. "dtype")
      T.values_close(y:detach():reshape(-1):tolist(), c.y, tol, tol, what .. "output")
      if differentiable then
        local w = torch.arange(0, y:numel(), { dtype = torch.float64 }):cos():reshape(y:size()):to(dtype)
        ;(y * w):sum():backward()
        T.values_close(x.grad:reshape(-1):tolist(), c.dinput, tol, tol, what .. "input gradient")
        if c.dsrc then T.values_close(src.grad:reshape(-1):tolist(), c.dsrc, tol, tol, what .. "source gradient") end
      end
      -- the in-place form writes the same values into its tensor
      local x2, index2, src2 = operands(c, dtype)
      local r = apply(c, x2, index2, src2, "_")
      T.ok(rawequal(r, x2), what .. "the in-place form returns its tensor")
      T.values_close(x2:reshape(-1):tolist(), c.y, tol, tol, what .. "in place")
      -- and torch.<op> is the method
      local x3, index3, src3 = operands(c, dtype)
      T.values_close(torch[c.op](x3, c.dim, index3, src3, c.opts.alpha and { alpha = c.opts.alpha }
                                 or c.opts.reduce and { reduce = c.opts.reduce } or nil):reshape(-1):tolist(),
                     c.y, tol, tol, what .. "torch." .. c.op)
    end)
  end
end

T.run("a source larger than the index: its gradient by finite differences", function()
  local index = torch.tensor({ { 2, 0, 1 }, { 1, 2, 0 } }, i64)      -- (2, 3) of a (3, 4) source
  for _, op in ipairs({ "scatter", "scatter_add" }) do
    local x = torch.randn(3, 5, { dtype = torch.float64 }):requires_grad_()
    local src = torch.randn(3, 4, { dtype = torch.float64 }):requires_grad_()
    local ok, why = torch.autograd.gradcheck(function(a, s) return a[op](a, 0, index, s) end, { x, src },
                                             { raise_exception = false })
    T.ok(ok, op .. ": gradcheck of the input and the whole source", why)
    x[op](x, 0, index, src):sum():backward()
    T.is(src.grad:narrow(0, 2, 1):abs():sum():item(), 0, op .. ": the source's rows past the index get zeros")
  end
end)

T.run("integer and bool tensors", function()
  local t = torch.zeros(2, 4, i64)
  local idx = torch.tensor({ { 3, 1 }, { 0, 0 } }, i64)
  T.is(t:scatter_add(1, idx, torch.tensor({ { 5, 6 }, { 7, 8 } }, i64)):tolist(), { { 0, 6, 0, 5 }, { 15, 0, 0, 0 } },
       "int64 scatter_add adds repeats")
  T.is(t:scatter(1, idx:narrow(1, 0, 1), 9):tolist(), { { 0, 0, 0, 9 }, { 9, 0, 0, 0 } }, "int64 scatter of a value")
  local b = torch.zeros(4, { dtype = torch.bool })
  T.is(b:scatter(0, torch.tensor({ 2 }, i64), true):tolist(), { false, false, true, false }, "bool scatter")
  T.is(torch.zeros(3, 2, i64):index_fill(0, torch.tensor({ 1 }, i64), 4):tolist(), { { 0, 0 }, { 4, 4 }, { 0, 0 } },
       "int64 index_fill")
  -- one_hot through scatter_, as people write it
  local labels = torch.tensor({ 2, 0, 1 }, i64)
  local onehot = torch.zeros(3, 4):scatter_(1, labels:unsqueeze(1), 1)
  T.is(onehot:tolist(), { { 0, 0, 1, 0 }, { 1, 0, 0, 0 }, { 0, 1, 0, 0 } }, "one-hot rows with scatter_")
end)

T.run("bad input names the problem", function()
  local x, src = torch.zeros(3, 5), torch.ones(2, 5)
  local idx = torch.tensor({ { 0, 1, 2, 0, 0 } }, i64)
  T.raises(function() x:scatter(0, torch.tensor({ { 3 } }, i64), src) end,
           "scatter: index 3 is out of bounds for dimension 0 with size 3", "index out of range")
  T.raises(function() x:scatter_add(1, torch.tensor({ { -1 } }, i64), src) end,
           "scatter_add: index %-1 is out of bounds", "a negative index")
  T.raises(function() x:scatter(0, idx:double(), src) end, "scatter: expected an int64 index tensor, got float64",
           "float index")
  T.raises(function() x:scatter(0, idx, src:double()) end, "expected src of the input's dtype float32, got float64",
           "source dtype")
  T.raises(function() x:scatter(0, idx:view(-1), src) end, "index and src must have as many dimensions as the input",
           "index dims")
  T.raises(function() x:scatter(0, torch.zeros(3, 5, i64), src) end, "index %[3, 5%] must not be larger than src %[2, 5%]",
           "index larger than src")
  T.raises(function() x:scatter(2, idx, src) end, "dim", "dim out of range")
  T.raises(function() x:scatter(0, idx, "a") end, "scatter: expected src to be a tensor or a number, got string",
           "source type")
  T.raises(function() x:scatter(0, idx, src, { reduce = "multiply" }) end, 'reduce must be "add"', "reduce")
  T.raises(function() x:index_add(0, torch.tensor({ 0, 1 }, i64), torch.ones(3, 5)) end,
           "index_add: expected source of shape %[2, 5%]", "index_add: source rows")
  T.raises(function() x:index_add(0, torch.tensor({ { 0 } }, i64), torch.ones(1, 5)) end,
           "index_add: index must be 0%-D or 1%-D, got 2D", "index_add: a 2-D index")
  T.raises(function() x:index_add(0, torch.tensor({ 5 }, i64), torch.ones(1, 5)) end, "index 5 is out of bounds",
           "index_add: out of range")
  T.raises(function() x:index_fill(0, torch.tensor({ 0 }, i64), "x") end, "index_fill: expected value to be a number",
           "index_fill: a string")
  T.raises(function() x:index_add(0, torch.tensor({ 0 }, i64), torch.ones(1, 5), { alpha = "2" }) end,
           "expected alpha to be a number", "alpha")
  local leaf = torch.zeros(3, 5):requires_grad_()
  T.raises(function() leaf:scatter_(0, idx, src) end, "scatter_: a tensor that requires grad is being used in an in%-place",
           "scatter_ on a leaf requiring grad")
end)

T.done_testing()
