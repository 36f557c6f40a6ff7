-- The BatchNorm kernels (cuda/norm.cu, make check-gpu) against the CPU's
-- BatchNorm in float64 (itself checked against PyTorch by
-- tests/lua/test_batch_norm.lua) from the same inputs: the output, the
-- gradients of input, weight and bias, the running statistics after a
-- training step, in training and eval mode, in float32, float64, bfloat16
-- and bfloat16 input with float32 parameters (autocast's mixed
-- BatchNorm). Shapes: the small ResNet's (128 x {16, 32, 64} x {28, 14,
-- 7}^2: several blocks a channel, and one), (N, C), (N, C, L) of odd
-- sizes (one element a load), 5-D, a channel of millions of elements
-- (more slices than the 256 a channel may have), an input that does not
-- start on 16 bytes, large values with a small spread; no affine, weight
-- only, momentum = false (cumulative); the same bits on a second run;
-- errors for running statistics on another device.
local dir = os.getenv("DPLUA_TEST_DIR") or (debug.getinfo(1, "S").source:match("^@(.*)/gpu/") or "tests")
package.path = dir .. "/lua/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local nn, F = torch.nn, torch.nn.functional
if not torch.cuda.is_available() then T.skip_all("no CUDA device") end

local dev = "cuda:0"
torch.manual_seed(0)

-- the largest difference relative to the reference's largest magnitude
local function rel_err(got, want)
  return (got:cpu():double() - want):abs():max():item() / math.max(want:abs():max():item(), 1e-30)
end

local tols = { [torch.float32] = 5e-5, [torch.bfloat16] = 1e-2, [torch.float64] = 1e-10 }

local function leaf(t) return t and t:detach():requires_grad_() or nil end

-- F.batch_norm of x with w, b and running statistics rm, rv (moved in
-- place when training), its backward from dy; returns the output and the
-- leaves
local function run(x, w, b, rm, rv, training, dy)
  x, w, b = leaf(x), leaf(w), leaf(b)
  local y = F.batch_norm(x, rm, rv, w, b, training, 0.1, 1e-5)
  y:backward(dy)
  return y, x, w, b
end

-- shape: the input's; dtype: the input's; opts: pdtype (the parameters'
-- dtype, default the input's), affine ("both", "weight", "none"), eval,
-- offset (added to x: float32 keeps the mean it saves for the backward
-- in float32, as PyTorch does, which costs dweight digits), shift (x
-- starts one element past 16 bytes)
local function check(shape, dtype, opts)
  opts = opts or {}
  local pdtype, affine = opts.pdtype or dtype, opts.affine or "both"
  local C = shape[2]
  local name = string.format("%s %s in, %s parameters, %s%s%s%s", table.concat(shape, "x"), dtype, pdtype, affine,
                             opts.eval and ", eval" or "", opts.offset and ", offset " .. opts.offset or "",
                             opts.shift and ", shifted" or "")
  T.run(name, function()
    local x = (torch.randn(unpack(shape)) * 2 + (opts.offset or 0.5)):to(dtype)
    local w = affine ~= "none" and (torch.randn(C) * 0.3 + 1):to(pdtype) or nil
    local b = affine == "both" and (torch.randn(C) * 0.3):to(pdtype) or nil
    local rm = (torch.randn(C) * 0.1 + (opts.offset or 0)):to(pdtype)
    local rv = (torch.rand(C) + 0.5):to(pdtype)
    local dy = torch.randn(unpack(shape)):to(dtype)
    local gx = x:to(dev)
    if opts.shift then
      gx = torch.zeros(x:numel() + 1, { dtype = dtype, device = dev }):narrow(0, 1, x:numel()):view(x:size()):copy_(gx)
    end
    local grm, grv, crm, crv = rm:to(dev), rv:to(dev), rm:double(), rv:double()
    local y, lx, lw, lb = run(gx, w and w:to(dev), b and b:to(dev), grm, grv, not opts.eval, dy:to(dev))
    T.is(y.grad_fn and y.grad_fn.name, "NativeBatchNormBackward0", name .. ": one node")
    T.is(tostring(y.dtype), tostring(dtype), name .. ": the input's dtype")
    T.is(tostring(y.device), dev, name .. ": on the GPU")
    local cy, cx, cw, cb = run(x:double(), w and w:double(), b and b:double(), crm, crv, not opts.eval, dy:double())
    local got = { out = y, dx = lx.grad, running_mean = grm, running_var = grv }
    local want = { out = cy, dx = cx.grad, running_mean = crm, running_var = crv }
    if lw then got.dweight, want.dweight = lw.grad, cw.grad end
    if lb then got.dbias, want.dbias = lb.grad, cb.grad end
    for _, key in ipairs(T.sorted_keys(got)) do
      local tol = (key:match("^running") or key:match("^d[wb]")) and tols[pdtype] or tols[dtype]
      if opts.offset then tol = tol * 4 end
      local err = rel_err(got[key], want[key])
      T.ok(err <= tol, name .. ": " .. key, string.format("relative error %.3g > %.3g", err, tol))
    end
    if lw then
      local _, _, lw2 = run(gx, lw:detach(), lb and lb:detach(), grm:clone(), grv:clone(), not opts.eval, dy:to(dev))
      T.is((lw2.grad - lw.grad):abs():max():item(), 0, name .. ": dweight has the same bits on a second run")
    end
  end)
end

for _, dtype in ipairs({ torch.float32, torch.bfloat16 }) do
  for _, s in ipairs({ { 16, 28 }, { 32, 14 }, { 64, 7 } }) do
    check({ 128, s[1], s[2], s[2] }, dtype)
    check({ 128, s[1], s[2], s[2] }, dtype, { eval = true })
  end
  check({ 64, 100 }, dtype)
  check({ 7, 5, 33 }, dtype, { affine = "weight" })
  check({ 2, 3, 4, 5, 6 }, dtype, { affine = "none" })
  check({ 4, 2, 1024, 1024 }, dtype)
  check({ 8, 16, 12, 12 }, dtype, { shift = true })
  check({ 3, 5, 7, 7 }, dtype, { eval = true, affine = "none" })
end
check({ 128, 16, 28, 28 }, torch.float32, { offset = 1000 })
check({ 128, 32, 14, 14 }, torch.bfloat16, { pdtype = torch.float32 })
check({ 128, 64, 7, 7 }, torch.bfloat16, { pdtype = torch.float32, eval = true })
check({ 64, 100 }, torch.bfloat16, { pdtype = torch.float32 })
check({ 16, 8, 10, 10 }, torch.float64)
check({ 16, 8, 10, 10 }, torch.float64, { eval = true, affine = "weight" })
check({ 33, 7 }, torch.float64)

T.run("BatchNorm2d with momentum = false over two steps, then eval", function()
  local cpu = nn.BatchNorm2d(4, { momentum = false })
  local gpu = nn.BatchNorm2d(4, { momentum = false, device = dev })
  for step = 1, 3 do
    if step == 3 then cpu:eval(); gpu:eval() end
    local x = torch.randn(8, 4, 5, 5) * 1.5 + step
    local y, cy = gpu(x:to(dev)), cpu(x)
    local err = rel_err(y, cy:double())
    T.ok(err <= 5e-5, "step " .. step .. ": output", string.format("relative error %.3g", err))
    err = rel_err(gpu.running_var, cpu.running_var:double())
    T.ok(err <= 5e-5, "step " .. step .. ": running_var", string.format("relative error %.3g", err))
  end
  T.is(gpu.num_batches_tracked:item(), 2, "two batches tracked")
end)

T.run("autocast: a bfloat16 convolution's output, float32 BatchNorm", function()
  local conv = nn.Conv2d(3, 8, 3, { device = dev })
  local bn = nn.BatchNorm2d(8, { device = dev })
  local y = torch.autocast("cuda", function() return bn(conv(torch.randn(4, 3, 10, 10, { device = dev }))) end)
  T.is(tostring(y.dtype), "torch.bfloat16", "the output stays bfloat16, as PyTorch's")
  T.is(tostring(bn.running_mean.dtype), "torch.float32", "running statistics stay float32")
  y:float():sum():backward()
  T.ok(bn.weight.grad ~= nil and tostring(bn.weight.grad.dtype) == "torch.float32", "a float32 weight gradient")
end)

T.run("errors", function()
  local x = torch.randn(4, 3, 2, 2, { device = dev })
  T.raises(function() F.batch_norm(x, torch.zeros(3), torch.ones(3), nil, nil, true) end,
           "expected running_mean on the input's device 0, got device %-1", "running statistics on the CPU")
  T.raises(function() F.batch_norm(x, nil, nil, torch.ones(3), nil, true) end,
           "expected weight on the input's device 0, got device %-1", "a weight on the CPU")
end)

T.done_testing()
