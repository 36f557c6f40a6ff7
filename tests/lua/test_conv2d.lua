-- test_conv2d.lua: the CPU's fused F.conv2d (src/cpu/conv.c, and its
-- direct float32 path src/cpu/conv_direct.c) against PyTorch
-- (tests/ref/conv2d.lua, written by scripts/gen_conv2d_ref.py): outputs
-- and input/weight/bias gradients in float64 and float32, over odd sizes,
-- padding, strides, dilation, groups, 1x1 kernels, a batch of one, images
-- of several tiles, and the direct path's blocks of channels, rows,
-- strides and threads; float64 finite differences; only the
-- gradients asked for; non-contiguous inputs; errors of the C op. Then
-- the fused F.max_pool2d likewise (tests/ref/max_pool2d.lua, from
-- scripts/gen_max_pool2d_ref.py), ceil_mode, ties and NaNs included; and
-- torch.set_num_threads, whose threads run the convolutions' GEMMs.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local F = torch.nn.functional
local ref = dofile(here .. "/../ref/conv2d.lua")

local cases = {  -- name: input shape, weight shape, options (as in the generator)
  plain = { { 2, 3, 9, 9 }, { 4, 3, 3, 3 }, {} },
  odd_sizes = { { 3, 5, 7, 11 }, { 7, 5, 3, 2 }, {} },
  padding = { { 2, 3, 6, 5 }, { 2, 3, 3, 3 }, { padding = { 2, 1 } } },
  stride2 = { { 2, 3, 11, 10 }, { 5, 3, 3, 3 }, { stride = 2, padding = 1 } },
  stride_rect = { { 1, 2, 9, 12 }, { 3, 2, 2, 4 }, { stride = { 3, 2 }, padding = { 0, 3 } } },
  dilation = { { 2, 2, 13, 12 }, { 3, 2, 3, 3 }, { dilation = { 2, 3 }, padding = 2 } },
  groups = { { 2, 6, 8, 7 }, { 9, 2, 3, 3 }, { groups = 3, padding = 1 } },
  depthwise = { { 2, 4, 7, 7 }, { 4, 1, 3, 3 }, { groups = 4, padding = 1, stride = 2 } },
  one_by_one = { { 2, 5, 6, 7 }, { 3, 5, 1, 1 }, {} },
  one_by_one_stride = { { 2, 5, 7, 7 }, { 3, 5, 1, 1 }, { stride = 2 } },
  batch1 = { { 1, 3, 10, 8 }, { 6, 3, 3, 3 }, { padding = 1 } },
  no_bias = { { 2, 3, 8, 8 }, { 2, 3, 2, 2 }, { bias = false } },
  big_padding = { { 1, 1, 3, 3 }, { 2, 1, 3, 3 }, { padding = 3 } },
  tiles = { { 1, 30, 16, 16 }, { 2, 30, 3, 3 }, { padding = 1 } },
  blocks_wide = { { 1, 17, 2, 30 }, { 18, 17, 3, 1 }, { padding = { 1, 0 } } },
  out_blocks_s2 = { { 1, 3, 5, 9 }, { 40, 3, 3, 3 }, { stride = 2, padding = 1 } },
  many_out = { { 1, 2, 2, 9 }, { 70, 2, 1, 1 }, {} },
  many_in = { { 1, 66, 2, 5 }, { 2, 66, 1, 3 }, { padding = { 0, 1 } } },
  one_channel_s2 = { { 2, 1, 9, 8 }, { 5, 1, 3, 3 }, { stride = 2, padding = 1, bias = false } },
  rows_stride = { { 1, 4, 7, 8 }, { 5, 4, 3, 2 }, { stride = { 2, 1 }, padding = { 1, 0 } } },
  cols_stride = { { 1, 4, 6, 9 }, { 3, 4, 2, 3 }, { stride = { 1, 2 }, padding = { 0, 1 } } },
  k5_s2 = { { 1, 3, 7, 9 }, { 18, 3, 5, 5 }, { stride = 2, padding = 2 } },
  pad_past_kernel = { { 1, 2, 4, 5 }, { 3, 2, 3, 3 }, { stride = 2, padding = 3 } },
  one_by_one_s2_odd = { { 1, 18, 3, 33 }, { 17, 18, 1, 1 }, { stride = 2, bias = false } },
  one_by_one_s2_even = { { 1, 2, 3, 32 }, { 3, 2, 1, 1 }, { stride = 2 } },
  threads = { { 4, 16, 24, 24 }, { 32, 16, 3, 3 }, { padding = 1, sums = true } },
}

local function filled(shape, f, dtype) return T.filled(torch, shape, f):to(dtype) end

-- conv2d of the case's tensors in dtype, with the gradients of the output
-- weighted by cos of its flat index, as the generator computes them
local function run(c, dtype, out_shape)
  local x = filled(c[1], function(k) return math.sin(1 + 0.3 * k) end, dtype):requires_grad_()
  local w = filled(c[2], function(k) return math.cos(2 + 0.7 * k) end, dtype):requires_grad_()
  local b = c[3].bias ~= false and filled({ c[2][1] }, function(k) return math.sin(3 + k) end, dtype):requires_grad_() or nil
  do  -- blocks of the output's and gradients' sizes filled with NaN for the allocator to hand out again, so
      -- that an element a kernel leaves unwritten shows
    local junk = {}
    for _, shape in ipairs({ out_shape, c[1], c[2], out_shape, c[1], c[2] }) do junk[#junk + 1] = torch.full(shape, 0 / 0, { dtype = dtype }) end
  end
  collectgarbage(); collectgarbage()
  local y = F.conv2d(x, w, b, { stride = c[3].stride, padding = c[3].padding, dilation = c[3].dilation,
                                groups = c[3].groups })
  local wt = torch.arange(0, y:numel(), { dtype = torch.float64 }):cos():reshape(y:size()):to(dtype)
  ;(y * wt):sum():backward()
  return y, x.grad, w.grad, b and b.grad
end

-- the generator's three sums of a tensor's values (for cases kept as sums)
local function sums(t)
  local v = t:to(torch.float64):reshape(-1)
  local k = torch.arange(0, v:numel(), { dtype = torch.float64 })
  return { v:sum():item(), (v * (k * 0.1):cos()):sum():item(), (v * (k * 0.37 + 1):sin()):sum():item() }
end

for _, name in ipairs(T.sorted_keys(cases)) do
  if cases[name][3].sums then goto continue end
  T.run(name .. " against PyTorch", function()
    local c, r = cases[name], ref[name]
    for _, dt in ipairs({ { torch.float64, 1e-12, 1e-12 }, { torch.float32, 1e-4, 1e-4 } }) do
      local y, dx, dw, db = run(c, dt[1], r.shape)
      local what = name .. " " .. tostring(dt[1]) .. ": "
      T.is(y:size(), r.shape, what .. "the shape")
      T.is(y.dtype, dt[1], what .. "the dtype")
      T.values_close(y:reshape(-1):tolist(), r.y, dt[2], dt[3], what .. "output")
      T.values_close(dx:reshape(-1):tolist(), r.dx, dt[2], dt[3], what .. "input gradient")
      T.values_close(dw:reshape(-1):tolist(), r.dw, dt[2], dt[3], what .. "weight gradient")
      if db then T.values_close(db:tolist(), r.db, dt[2], dt[3], what .. "bias gradient") end
    end
  end)
  ::continue::
end

-- A batch of 4 images large enough to be shared among threads (the
-- direct float32 path gives each worker a few million multiply-adds):
-- the same sums as PyTorch's, on one thread and on two.
T.run("threads against PyTorch", function()
  local c, r, before = cases.threads, ref.threads, torch.get_num_threads()
  for _, n in ipairs({ 1, 2 }) do
    torch.set_num_threads(n)
    for _, dt in ipairs({ torch.float64, torch.float32 }) do
      local got = { run(c, dt, r.shape) }
      for i, key in ipairs({ "y", "dx", "dw", "db" }) do
        local scale = got[i]:to(torch.float64):abs():sum():item()
        T.values_close(sums(got[i]), r[key .. "_sums"], 0, (dt == torch.float64 and 1e-13 or 1e-6) * scale,
                       string.format("%s on %d threads: the sums of %s", tostring(dt), n, key))
      end
    end
  end
  torch.set_num_threads(before)
end)

T.run("finite differences (float64)", function()
  local gc = torch.autograd.gradcheck
  local function R(...)
    local shape = { ... }
    return torch.randn(shape, { dtype = torch.float64 }):requires_grad_()
  end
  torch.manual_seed(3)
  T.ok(gc(function(x, w, b) return F.conv2d(x, w, b, { padding = 1 }) end, { R(2, 3, 5, 4), R(2, 3, 3, 3), R(2) }),
       "3x3, padding 1")
  T.ok(gc(function(x, w, b) return F.conv2d(x, w, b) end, { R(2, 3, 3, 4), R(4, 3, 1, 1), R(4) }), "1x1")
  T.ok(gc(function(x, w) return F.conv2d(x, w, nil, { stride = { 2, 1 }, dilation = { 1, 2 }, groups = 2 }) end,
          { R(1, 4, 6, 7), R(4, 2, 2, 3) }), "stride, dilation and groups")
end)

T.run("only the gradients asked for", function()
  local x = torch.randn(2, 3, 6, 6)
  local w = torch.randn(4, 3, 3, 3, { requires_grad = true })
  F.conv2d(x, w):sum():backward()
  T.ok(x.grad == nil, "no input gradient for an input without requires_grad")
  T.is(w.grad:size(), { 4, 3, 3, 3 }, "the weight's gradient")
  local xg = torch.randn(2, 3, 6, 6, { requires_grad = true })
  local y = F.conv2d(xg, torch.randn(4, 3, 3, 3), torch.randn(4))
  T.ok(y.requires_grad, "an output that needs grad through the input alone")
  y:sum():backward()
  T.is(xg.grad:size(), { 2, 3, 6, 6 }, "the input's gradient")
  T.ok(not torch.no_grad(function() return F.conv2d(xg, w) end).requires_grad, "no node under no_grad")
end)

T.run("non-contiguous input and weight", function()
  torch.manual_seed(1)
  local x = torch.randn(2, 6, 7, 3):permute({ 0, 3, 1, 2 })   -- (2, 3, 6, 7), strided
  local w = torch.randn(3, 3, 3, 2):permute({ 3, 2, 0, 1 })   -- (2, 3, 3, 3), strided
  local want = F.conv2d(x:contiguous(), w:contiguous(), nil, { padding = 1 })
  T.values_close(F.conv2d(x, w, nil, { padding = 1 }):reshape(-1):tolist(), want:reshape(-1):tolist(), 0, 0,
                 "the same values as from contiguous copies")
end)

T.run("empty batches and outputs", function()
  local x = torch.randn(0, 3, 5, 5, { requires_grad = true })
  local w = torch.randn(4, 3, 3, 3, { requires_grad = true })
  local y = F.conv2d(x, w, torch.randn(4))
  T.is(y:size(), { 0, 4, 3, 3 }, "a batch of none")
  y:sum():backward()
  T.is(w.grad:abs():sum():item(), 0, "no weight gradient from no images")
  local x2 = torch.randn(2, 3, 5, 5, { requires_grad = true })
  local y2 = F.conv2d(x2, torch.randn(0, 3, 3, 3))
  T.is(y2:size(), { 2, 0, 3, 3 }, "no output channels")
  y2:sum():backward()
  T.is(x2.grad:abs():sum():item(), 0, "and a zero input gradient")
end)

T.run("errors of the C op", function()
  local x, w = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)
  T.raises(function() torch._conv2d(x, w:to(torch.float64), nil, 1, 0, 1, 1) end, "one dtype", "mixed dtypes")
  T.raises(function() torch._conv2d(x, w, torch.randn(2), 1, 0, 1, 1) end, "bias of shape %[3%]", "a bias of the wrong size")
  T.raises(function() torch._conv2d(x, w, nil, 0, 0, 1, 1) end, "stride and dilation must be positive", "stride 0")
  T.raises(function() torch._conv2d(x, w, nil, 1, 0, 1, 2) end, "groups=2", "groups that do not divide")
  T.raises(function() torch._conv2d(x, torch.randn(3, 2, 7, 7), nil, 1, 0, 1, 1) end, "smaller than the kernel span",
           "a kernel larger than the input")
  T.raises(function() torch._conv2d(torch.randn(2, 5, 5), w, nil, 1, 0, 1, 1) end, "4%-D input", "a 3-D input")
  T.raises(function() torch._conv2d(x:to(torch.int64), w:to(torch.int64), nil, 1, 0, 1, 1) end, "float32 or float64",
           "an integer input")
end)

local pool_ref = dofile(here .. "/../ref/max_pool2d.lua")
local pools = {  -- name: input shape, kernel, options (as in the generator)
  mnist = { { 2, 3, 8, 8 }, 2, {} },
  odd = { { 2, 2, 7, 9 }, 2, {} },
  stride_pad = { { 1, 3, 9, 8 }, 3, { stride = 2, padding = 1 } },
  rect = { { 2, 2, 6, 10 }, { 2, 3 }, { stride = { 1, 2 } } },
  dilation = { { 1, 2, 11, 10 }, 3, { dilation = 2, padding = 1 } },
  ties = { { 2, 2, 8, 7 }, 3, { stride = 1, padding = 1 } },
  ceil = { { 2, 2, 7, 9 }, 2, { ceil_mode = true } },
  ceil_stride_pad = { { 1, 3, 10, 8 }, 3, { stride = 2, padding = 1, ceil_mode = true } },
  ceil_dilation = { { 1, 2, 11, 12 }, 3, { stride = 2, dilation = 2, ceil_mode = true } },
}
local function round(v) return v >= 0 and math.floor(v + 0.5) or -math.floor(-v + 0.5) end

for _, name in ipairs(T.sorted_keys(pools)) do
  T.run("max_pool2d " .. name .. " against PyTorch", function()
    local c, r = pools[name], pool_ref[name]
    local f = name == "ties" and function(k) return round(2 * math.sin(k)) end or function(k) return math.sin(1 + 0.3 * k) end
    for _, dt in ipairs({ torch.float64, torch.float32 }) do
      local x = filled(c[1], f, dt):requires_grad_()
      local y = F.max_pool2d(x, c[2], c[3])
      local what, tol = name .. " " .. tostring(dt) .. ": ", dt == torch.float64 and 1e-14 or 1e-6
      T.is(y:size(), r.shape, what .. "the shape")
      T.output_and_grad(torch, y, x, r, tol, what)
    end
  end)
end

T.run("max_pool2d with NaN and -inf", function()
  local x = torch.tensor({ { { { 1, 0 / 0, 3, 4 }, { 5, 6, -math.huge, -math.huge } } } }):requires_grad_()
  local y = F.max_pool2d(x, 2)
  local v = y:reshape(-1):tolist()
  T.ok(v[1] ~= v[1], "a window holding NaN gives NaN")
  T.is(v[2], 4, "the largest of the other window")
  y:sum():backward()
  T.is(x.grad:reshape(-1):tolist(), { 0, 1, 0, 1, 0, 0, 0, 0 }, "the gradient goes to the NaN and to the largest")
  local z = torch.full({ 1, 1, 2, 2 }, -math.huge):requires_grad_()
  F.max_pool2d(z, 2):sum():backward()
  T.is(z.grad:reshape(-1):tolist(), { 1, 0, 0, 0 }, "an all -inf window: the first element, as PyTorch")
  T.ok(torch.autograd.gradcheck(function(a) return F.max_pool2d(a, 3, 2, 1) end,
                                { torch.randn(1, 2, 5, 6, { dtype = torch.float64 }):requires_grad_() }),
       "finite differences")
  T.raises(function() torch._max_pool2d(torch.randn(1, 1, 4, 4), 2, 2, 2, 1) end, "more than half", "too much padding")
  T.is(tostring(torch.nn.MaxPool2d(3, { stride = 2, ceil_mode = true })),
       "MaxPool2d(kernel_size=3, stride=2, padding=0, dilation=1, ceil_mode=True)", "MaxPool2d prints its ceil_mode")
  T.raises(function() torch._max_pool2d(torch.randn(4, 4), 2, 2, 0, 1) end, "4%-D input", "a 2-D input")
end)

T.run("set_num_threads", function()
  local before = torch.get_num_threads()
  T.ok(before >= 1, "get_num_threads is at least 1")
  torch.manual_seed(5)
  local x, w = torch.randn(3, 8, 20, 20, { dtype = torch.float64 }), torch.randn(16, 8, 3, 3, { dtype = torch.float64 })
  torch.set_num_threads(1)
  T.is(torch.get_num_threads(), 1, "set to 1")
  local one = F.conv2d(x, w, nil, { padding = 1 })
  torch.set_num_threads(2)
  T.is(torch.get_num_threads(), 2, "set to 2")
  T.values_close(F.conv2d(x, w, nil, { padding = 1 }):reshape(-1):tolist(), one:reshape(-1):tolist(), 1e-12, 1e-12,
                 "the same convolution on 2 threads")
  torch.set_num_threads(before)
  T.raises(function() torch.set_num_threads(0) end, "positive integer number of threads", "0 threads")
  T.raises(function() torch.set_num_threads(1.5) end, "positive integer", "a fraction")
  T.raises(function() torch.set_num_threads("2") end, "got 2", "a string")
end)

T.done_testing()
