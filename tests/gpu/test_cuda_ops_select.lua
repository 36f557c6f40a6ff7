-- The GPU's sort, topk, cumsum, multinomial, nonzero, put_, scatter and
-- advanced indexing (cuda/sort.cu, cuda/index.cu, make check-gpu) against the CPU
-- (itself checked against PyTorch by tests/lua/test_select.lua) from the
-- same inputs: every dtype sort takes, NaN and ties, rows of GPT-2's
-- 50,304 columns, gradients, and the same draws from the same seed.
local dir = os.getenv("DPLUA_TEST_DIR") or (debug.getinfo(1, "S").source:match("^@(.*)/gpu/") or "tests")
package.path = dir .. "/lua/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
if not torch.cuda.is_available() then T.skip_all("no CUDA device") end

local dev = "cuda:0"
torch.manual_seed(0)

-- equal shapes, dtypes and elements (NaN equal to NaN), the GPU's result copied back
local function same(gpu, cpu, name)
  local got = gpu:cpu()
  local ok = got.dtype == cpu.dtype and tostring(got.shape) == tostring(cpu.shape)
  if ok and got:numel() > 0 then
    ok = got:eq(cpu):logical_or(got:ne(got):logical_and(cpu:ne(cpu))):all():item()
  end
  T.ok(ok, name)
end

T.run("sort: every dtype, both directions, NaN and ties, stable indices", function()
  local base = (torch.randn(5, 37) * 3):round()   -- many ties
  base[{ 1, 4 }] = 0 / 0
  base[{ 2, 7 }] = -math.huge
  for _, dt in ipairs({ torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.int32, torch.uint8,
                        torch.bool }) do
    local x = dt == torch.uint8 and base:abs() or base
    x = x:to(dt)
    for _, desc in ipairs({ false, true }) do
      for _, dim in ipairs({ 0, 1 }) do
        local v, i = x:sort(dim, desc)
        local gv, gi = x:to(dev):sort(dim, desc)
        same(gv, v, string.format("%s dim %d descending=%s values", dt.name, dim, tostring(desc)))
        same(gi, i, string.format("%s dim %d descending=%s indices", dt.name, dim, tostring(desc)))
      end
    end
  end
  local big = torch.tensor({ 2 ^ 62, 2 ^ 62, -5, 7 }, { dtype = torch.int64 }) + torch.tensor({ 1, 0, 0, 1 },
                                                                                           { dtype = torch.int64 })
  local _, i = big:sort()
  local _, gi = big:to(dev):sort()
  same(gi, i, "int64 beyond 2^53 compares exactly")
end)

T.run("topk and sort of GPT-2 sized rows", function()
  local logits = torch.randn(4, 50304)
  for _, k in ipairs({ 1, 50, 50304 }) do
    local v, i = logits:topk(k)
    local gv, gi = logits:to(dev):topk(k)
    same(gv, v, "topk " .. k .. " values")
    same(gi, i, "topk " .. k .. " indices")
  end
  local v, i = logits:topk(7, -1, false)
  local gv, gi = logits:to(dev):topk(7, -1, false)
  same(gv, v, "smallest 7 values")
  same(gi, i, "smallest 7 indices")
  local r = torch.randn(3000, 5)
  local _, si = r:sort(0)
  local _, gsi = r:to(dev):sort(0)
  same(gsi, si, "many short rows (a long dim 0)")
  local many = torch.randn(70000, 3)
  local _, mi = many:sort(1)
  local _, gmi = many:to(dev):sort(1)
  same(gmi, mi, "more rows than the grid's blocks")
end)

T.run("gradients of topk, sort and cumsum", function()
  local x = torch.randn(6, 40, { dtype = torch.float64 })
  local g = torch.randn(6, 5, { dtype = torch.float64 })
  local function grad_of(dv, f)
    local a = x:detach():to(dv):clone():requires_grad_()
    f(a):backward(g:to(dv))
    return a.grad
  end
  same(grad_of(dev, function(a) return (a:topk(5)) end), grad_of("cpu", function(a) return (a:topk(5)) end), "topk")
  local gs = torch.randn(6, 40, { dtype = torch.float64 })
  local a, b = x:detach():to(dev):clone():requires_grad_(), x:detach():clone():requires_grad_()
  a:sort(0, true):backward(gs:to(dev))
  b:sort(0, true):backward(gs)
  same(a.grad, b.grad, "sort")
  a, b = x:detach():to(dev):clone():requires_grad_(), x:detach():clone():requires_grad_()
  a:cumsum(1):backward(gs:to(dev))
  b:cumsum(1):backward(gs)
  same(a.grad, b.grad, "cumsum (the same order of additions: the same bits)")
end)

T.run("cumsum: dtypes and dims", function()
  for _, dt in ipairs({ torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.int32, torch.bool }) do
    local x = (torch.randn(7, 9) * 4):round():to(dt)
    for _, dim in ipairs({ 0, 1 }) do same(x:to(dev):cumsum(dim), x:cumsum(dim), dt.name .. " dim " .. dim) end
  end
  local long = torch.randn(50304)
  same(long:to(dev):cumsum(0), long:cumsum(0), "one long row")
end)

T.run("multinomial: the CPU's draws from the same seed", function()
  local probs = torch.rand(3, 50304):pow(4)
  probs[{ 1, { 0, 50000 } }] = 0
  for _, repl in ipairs({ true, false }) do
    torch.manual_seed(11)
    local c = probs:multinomial(20, repl)
    torch.manual_seed(11)
    local g = probs:to(dev):multinomial(20, repl)
    same(g, c, "replacement=" .. tostring(repl))
  end
  torch.manual_seed(12)
  local p1 = torch.tensor({ 0.2, 0.8 }):multinomial(1000, true)
  torch.manual_seed(12)
  same(torch.tensor({ 0.2, 0.8 }):to(dev):multinomial(1000, true), p1, "1-D")
  torch.manual_seed(13)
  local perm = torch.randperm(1000)
  torch.manual_seed(13)
  same(torch.randperm(1000, { device = dev }), perm, "randperm")
  T.raises(function() torch.tensor({ 1, -1 }):to(dev):multinomial(1) end, "non%-negative", "checks on the GPU too")
end)

T.run("nonzero, put_ and advanced indexing", function()
  local x = (torch.randn(4, 5, 6) * 2):round()
  same(x:to(dev):nonzero(), x:nonzero(), "nonzero")
  local g = x:to(dev)
  local idx = torch.tensor({ 3, 0, -1, 3 }, { dtype = torch.int64 })
  same(g[idx], x[idx], "t[idx]")
  same(g[{ {}, idx:to(dev), {} }], x[{ {}, idx, {} }], "t[{{}, idx, {}}] (idx on the GPU)")
  local mask = x:gt(0)
  same(g[mask:to(dev)], x[mask], "t[mask]")
  local w, gw = x:clone(), g:clone()
  w[mask] = -7; gw[mask:to(dev)] = -7
  same(gw, w, "t[mask] = number")
  w, gw = x:clone(), g:clone()
  local vals = torch.arange(mask:sum():item())
  w[mask] = vals; gw[mask:to(dev)] = vals:to(dev)
  same(gw, w, "t[mask] = values")
  w, gw = x:clone(), g:clone()
  w[{ 1, idx }] = 5; gw[{ 1, idx }] = 5
  same(gw, w, "t[{1, idx}] = 5")
  local t = torch.zeros(3, 4):t()
  local gt = torch.zeros(3, 4, { device = dev }):t()
  local pos, src = torch.tensor({ 0, 5, -1 }, { dtype = torch.int64 }), torch.tensor({ 1, 2, 3 })
  t:put_(pos, src); gt:put_(pos:to(dev), src:to(dev))
  same(gt, t, "put_ into a transposed view")
  local bad = torch.zeros(3, { device = dev })
  bad:put_(torch.tensor({ 9 }, { dtype = torch.int64 }):to(dev), torch.ones(1, { device = dev }))
  T.raises(function() torch.cuda.synchronize() end, "put_: index 9 is out of bounds",
           "a bad position found by the kernel is reported at the next synchronisation")
end)

T.run("scatter, scatter_add, index_add, index_copy, index_fill: the CPU's values and gradients", function()
  local i64 = { dtype = torch.int64 }
  for _, dt in ipairs({ torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.bool }) do
    local x = (torch.randn(4, 6) * 3):round():to(dt)
    local perm = torch.randperm(6):narrow(0, 0, 3)                   -- distinct: scatter keeps one write
    local idx = perm:unsqueeze(0):expand(4, 3):contiguous()
    local src = (torch.randn(4, 3) * 3):round():to(dt)
    same(x:to(dev):scatter(1, idx:to(dev), src:to(dev)), x:scatter(1, idx, src), dt.name .. " scatter")
    same(x:to(dev):index_fill(1, perm:to(dev), 1), x:index_fill(1, perm, 1), dt.name .. " index_fill")
    if dt ~= torch.bool then
      local rep = torch.tensor({ { 0, 5, 0 }, { 2, 2, 2 }, { 1, 0, 5 }, { 3, 3, 4 } }, i64)
      same(x:to(dev):scatter_add(1, rep:to(dev), src:to(dev)), x:scatter_add(1, rep, src), dt.name .. " scatter_add")
      same(x:to(dev):index_add(1, perm:to(dev), src:to(dev)), x:index_add(1, perm, src), dt.name .. " index_add")
    end
  end
  local x = torch.randn(5, 4, { dtype = torch.float64 }):requires_grad_()
  local src = torch.randn(3, 4, { dtype = torch.float64 }):requires_grad_()
  local idx = torch.tensor({ 4, 0, 2 }, i64)
  local w = torch.randn(5, 4, { dtype = torch.float64 })
  ;(x:index_copy(0, idx, src) * w):sum():backward()
  local gx, gs = x.grad, src.grad
  local xd, sd = x:detach():to(dev):requires_grad_(), src:detach():to(dev):requires_grad_()
  ;(xd:index_copy(0, idx:to(dev), sd) * w:to(dev)):sum():backward()
  T.tensor_close(xd.grad:cpu(), gx, 0, 0, "index_copy: the input's gradient")
  T.tensor_close(sd.grad:cpu(), gs, 0, 0, "index_copy: the source's gradient")
  -- what is built on them: max_pool2d's indices, max_unpool2d, fold
  local img = torch.randn(2, 3, 7, 9)
  local v, at = torch.nn.functional.max_pool2d(img, 3, { stride = 2, padding = 1, return_indices = true })
  local gv, gat = torch.nn.functional.max_pool2d(img:to(dev), 3, { stride = 2, padding = 1, return_indices = true })
  same(gv, v, "max_pool2d values with indices")
  same(gat, at, "max_pool2d indices")
  same(torch.nn.functional.max_unpool2d(gv, gat, 3, 2, 1, { 7, 9 }),
       torch.nn.functional.max_unpool2d(v, at, 3, 2, 1, { 7, 9 }), "max_unpool2d")
  local cols = torch.nn.functional.unfold(img, 3, { padding = 1 })
  T.tensor_close(torch.nn.functional.fold(cols:to(dev), { 7, 9 }, 3, { padding = 1 }):cpu(),
                 torch.nn.functional.fold(cols, { 7, 9 }, 3, { padding = 1 }), 1e-5, 1e-5, "fold")
  T.raises(function() torch.zeros(3, 4, { device = dev }):scatter(0, torch.tensor({ { 7 } }, i64):to(dev),
                                                                    torch.ones(1, 1, { device = dev })):cpu() end,
           "scatter: index 7 is out of bounds", "an index out of range is reported at the synchronisation")
end)

T.done_testing()
