-- test_batch_norm.lua: nn.BatchNorm1d/2d/3d and F.batch_norm (one fused
-- op, src/core/norm.c) against PyTorch (tests/ref/batch_norm.lua, written
-- by scripts/gen_batch_norm_ref.py): three training steps and one in eval
-- mode, each step's output, input/weight/bias gradients and running
-- statistics, in float64 and again in float32 (and one case of bfloat16
-- input with float32 parameters, autocast's mixed BatchNorm); momentum,
-- momentum = false (cumulative), no affine, no running statistics, (N, C),
-- (N, C, L), 4-D and 5-D inputs, odd sizes, planes and rows longer than
-- the CPU kernel's pieces, large values with a small spread; gradients
-- when only some inputs require them; state dict keys; float64 gradcheck;
-- errors.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
torch.manual_seed(0)   -- random inputs, the same in every run
local nn, F = torch.nn, torch.nn.functional
local ref = dofile(here .. "/../ref/batch_norm.lua")
torch.set_default_dtype(torch.float64)

local makers = {
  bn1d_nc = function() return nn.BatchNorm1d(3) end,
  bn1d_ncl = function() return nn.BatchNorm1d(4, { eps = 1e-3, momentum = 0.3 }) end,
  bn1d_cumulative = function() return nn.BatchNorm1d(3, { momentum = false }) end,
  bn1d_wide = function() return nn.BatchNorm1d(37, { eps = 1e-4, momentum = 0.2 }) end,
  bn1d_long_rows = function() return nn.BatchNorm1d(1030) end,
  bn2d = function() return nn.BatchNorm2d(3) end,
  bn2d_cumulative = function() return nn.BatchNorm2d(2, { momentum = false }) end,
  bn2d_no_affine = function() return nn.BatchNorm2d(2, { affine = false }) end,
  bn2d_no_stats = function() return nn.BatchNorm2d(2, { track_running_stats = false }) end,
  bn2d_plain = function() return nn.BatchNorm2d(3, { affine = false, track_running_stats = false }) end,
  bn2d_odd = function() return nn.BatchNorm2d(5, { eps = 1e-4, momentum = 0.05 }) end,
  bn2d_long_planes = function() return nn.BatchNorm2d(2) end,
  bn2d_shifted = function() return nn.BatchNorm2d(2) end,
  bn2d_bf16_mixed = function() return nn.BatchNorm2d(3, { dtype = torch.float32 }) end,
  bn3d = function() return nn.BatchNorm3d(3) end,
  bn3d_cumulative_no_affine = function() return nn.BatchNorm3d(2, { affine = false, momentum = false }) end,
}

-- the generator's input: offset + sin(1 + 0.37 k + step) over the flat
-- index k, rounded as the case says, in dtype
local function x_of(r, step, dtype)
  local x = T.filled(torch, r.shape, function(k) return (r.offset or 0) + math.sin(1 + 0.37 * k + step) end)
  if r.bf16 then return x:to(torch.bfloat16) end
  if r.round32 then x = x:float():double() end
  return x:to(dtype)
end

-- every `every`-th element of t, flattened (as the generator keeps them)
local function picked(t, every)
  local all, out = t:double():reshape(-1):tolist(), {}
  for i = 1, #all, every or 1 do out[#out + 1] = all[i] end
  return out
end

-- tolerances (rtol, atol) by the dtype the module runs in; an input of
-- large values (offset) rounds x - mean to its size, and float32 keeps
-- the mean it saves for the backward in float32, as PyTorch does
local tols = { float64 = { 1e-12, 1e-14 }, float32 = { 1e-4, 1e-5 }, bfloat16 = { 2e-2, 2e-2 } }
local offset_atol = { float64 = 2e-15, float32 = 1e-7 }

local function against_pytorch(name, dtype)
  local m, r = makers[name](), ref[name]
  if not r.bf16 then m = m:to(dtype) end
  local dt = r.bf16 and "bfloat16" or tostring(dtype):gsub("^torch%.", "")
  local rtol, atol = tols[dt][1], r.offset and offset_atol[dt] * r.offset or tols[dt][2]
  local function close(got, want, what) T.values_close(got, want, rtol, atol, what) end
  for step = 0, 3 do
    if step == 3 then m:eval() end
    local what = string.format("%s %s step %d%s", name, r.bf16 and "bfloat16" or tostring(dtype), step,
                               step == 3 and " (eval)" or "")
    local x = x_of(r, step, dtype):requires_grad_()
    local y = m(x)
    if step == 0 then
      T.is(y.grad_fn and y.grad_fn.name, "NativeBatchNormBackward0", name .. ": one node")
      T.is(tostring(y.dtype), tostring(x.dtype), name .. ": the output has the input's dtype")
    end
    local wt = torch.arange(0, y:numel(), { dtype = torch.float64 }):cos():reshape(y:size())
    local loss = (y * wt):sum()
    loss:backward()
    local want = r.steps[step + 1]
    close(picked(y, r.every), want.y, what .. ": output")
    close(picked(x.grad, r.every), want.dx, what .. ": input gradient")
    if want.dweight then
      close(picked(m.weight.grad, r.every_c), want.dweight, what .. ": weight gradient")
      close(picked(m.bias.grad, r.every_c), want.dbias, what .. ": bias gradient")
      m.weight.grad, m.bias.grad = nil, nil
    end
    if want.running_mean then
      close(picked(m.running_mean, r.every_c), want.running_mean, what .. ": running_mean")
      close(picked(m.running_var, r.every_c), want.running_var, what .. ": running_var")
    end
  end
  if m.track_running_stats then T.is(m.num_batches_tracked:item(), 3, name .. ": three batches tracked") end
end

for _, name in ipairs(T.sorted_keys(makers)) do
  T.run(name .. " against PyTorch", against_pytorch, name, torch.float64)
  if not ref[name].bf16 then T.run(name .. " in float32 against PyTorch", against_pytorch, name, torch.float32) end
end

-- the first training step of bn2d with only some of x, weight and bias requiring grad
T.run("gradients of the inputs that require them", function()
  local r = ref.bn2d
  local want = r.steps[1]
  for _, case in ipairs({ { x = false, w = true }, { x = true, w = false }, { x = false, w = false } }) do
    local what = string.format("x %s, weight and bias %s", case.x and "requires grad" or "does not",
                               case.w and "require grad" or "do not")
    local m = nn.BatchNorm2d(3)
    m.weight:requires_grad_(case.w)
    m.bias:requires_grad_(case.w)
    local x = x_of(r, 0, torch.float64):requires_grad_(case.x)
    local y = m(x)
    T.values_close(y:reshape(-1):tolist(), want.y, 1e-12, 1e-14, what .. ": output")
    T.values_close(m.running_var:tolist(), want.running_var, 1e-12, 1e-14, what .. ": running_var")
    if not case.x and not case.w then
      T.ok(not y.requires_grad, what .. ": no node")
    else
      local wt = torch.arange(0, y:numel(), { dtype = torch.float64 }):cos():reshape(y:size())
      ;(y * wt):sum():backward()
      T.ok((x.grad ~= nil) == case.x, what .. ": an input gradient only when it requires one")
      if case.x then T.values_close(x.grad:reshape(-1):tolist(), want.dx, 1e-12, 1e-14, what .. ": dx") end
      if case.w then
        T.values_close(m.weight.grad:tolist(), want.dweight, 1e-12, 1e-14, what .. ": dweight")
        T.values_close(m.bias.grad:tolist(), want.dbias, 1e-12, 1e-14, what .. ": dbias")
      else
        T.ok(m.weight.grad == nil and m.bias.grad == nil, what .. ": no weight or bias gradient")
      end
    end
  end
end)

T.run("F.batch_norm's forms", function()
  local r = ref.bn2d_no_stats
  local x = x_of(r, 0, torch.float64)
  local w, b = torch.ones(2), torch.zeros(2)
  local y1 = F.batch_norm(x, nil, nil, w, b, true)
  local y2 = F.batch_norm(x, nil, nil, { weight = w, bias = b, training = true, momentum = 0.5, eps = 1e-5 })
  local y3 = F.batch_norm(x, nil, nil)
  for i, y in ipairs({ y1, y2, y3 }) do
    T.values_close(y:reshape(-1):tolist(), r.steps[1].y, 1e-12, 1e-14, "form " .. i .. ": the batch's statistics")
  end
  -- eval mode with running statistics: (x - running_mean) / sqrt(running_var + eps)
  local rm, rv = torch.tensor({ 0.5, -1 }), torch.tensor({ 4, 0.25 })
  local y = F.batch_norm(x, rm, rv, nil, nil, false, 0.1, 0)
  local want = ((x - rm:reshape(1, 2, 1, 1)) / rv:reshape(1, 2, 1, 1):sqrt()):reshape(-1):tolist()
  T.values_close(y:reshape(-1):tolist(), want, 1e-14, 1e-14, "running statistics in eval mode")
  T.is(rm:tolist(), { 0.5, -1 }, "eval mode leaves running_mean alone")
  -- running statistics that are not contiguous are moved in place too
  local stats = torch.zeros(2, 2)
  local m, v = stats:select(1, 0), stats:select(1, 1)
  v:fill_(1)
  F.batch_norm(x, m, v, nil, nil, true, 1)
  T.values_close(m:tolist(), { x:select(1, 0):mean():item(), x:select(1, 1):mean():item() }, 1e-14, 1e-14,
                 "strided running_mean moved by momentum 1 to the batch's mean")
end)

T.run("state dict, printing", function()
  T.is(T.sorted_keys(nn.BatchNorm2d(2):state_dict()), { "bias", "num_batches_tracked", "running_mean", "running_var", "weight" },
       "PyTorch's state dict keys")
  T.is(T.sorted_keys(nn.BatchNorm2d(2, { affine = false, track_running_stats = false }):state_dict()), {},
       "nothing without affine and running statistics")
  T.is(tostring(nn.BatchNorm2d(8)), "BatchNorm2d(8, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True)",
       "printed as PyTorch's")
  T.is(tostring(nn.BatchNorm3d(4, { momentum = false })),
       "BatchNorm3d(4, eps=1e-05, momentum=None, affine=True, track_running_stats=True)", "BatchNorm3d printed")
  local m = nn.BatchNorm1d(2)
  m(torch.rand(4, 2))
  m:reset_running_stats()
  T.is(m.running_var:tolist(), { 1, 1 }, "reset_running_stats")
end)

T.run("gradcheck (float64 finite differences)", function()
  local gc = torch.autograd.gradcheck
  local function leaf(...) return torch.rand(...):requires_grad_() end
  local rm, rv = torch.tensor({ 0.3, -0.2 }), torch.tensor({ 0.5, 2 })
  T.ok(gc(function(t, w, b) return F.batch_norm(t, nil, nil, w, b, true) end, { leaf(3, 2, 2, 2), leaf(2), leaf(2) }),
       "training, 4-D, weight and bias")
  T.ok(gc(function(t, w, b) return F.batch_norm(t, nil, nil, w, b, true) end, { leaf(5, 3), leaf(3), leaf(3) }),
       "training, (N, C)")
  T.ok(gc(function(t) return F.batch_norm(t, nil, nil, nil, nil, true) end, { leaf(2, 2, 3) }),
       "training, (N, C, L), no affine")
  T.ok(gc(function(t, w) return F.batch_norm(t, nil, nil, w, nil, true) end, { leaf(2, 2, 1, 2, 3), leaf(2) }),
       "training, 5-D, weight only")
  T.ok(gc(function(t, b) return F.batch_norm(t, nil, nil, nil, b, true) end, { leaf(4, 2, 3), leaf(2) }),
       "training, bias only")
  T.ok(gc(function(t, w, b) return F.batch_norm(t, rm, rv, w, b, false) end, { leaf(3, 2, 2, 2), leaf(2), leaf(2) }),
       "eval mode with running statistics")
  T.ok(gc(function(t) return F.batch_norm(t, rm, rv, nil, nil, false) end, { leaf(3, 2) }),
       "eval mode, no affine")
end)

T.run("errors", function()
  T.raises(function() nn.BatchNorm2d(3)(torch.rand(2, 3, 4)) end, "BatchNorm2d: expected 4D input %(got 3D", "a 3-D input to BatchNorm2d")
  T.raises(function() nn.BatchNorm3d(3)(torch.rand(2, 3, 4, 4)) end, "BatchNorm3d: expected 5D input %(got 4D", "a 4-D input to BatchNorm3d")
  T.raises(function() nn.BatchNorm1d(3)(torch.rand(2, 4)) end, "running_mean should contain 4 elements not 3", "channels that differ")
  T.raises(function() nn.BatchNorm1d(3, { track_running_stats = false })(torch.rand(2, 4)) end,
           "weight should contain 4 elements not 3", "channels that differ from the weight's")
  T.raises(function() nn.BatchNorm1d(3)(torch.rand(1, 3)) end, "Expected more than 1 value per channel when training",
           "one value per channel")
  T.raises(function() nn.BatchNorm1d(0) end, "num_features", "no features")
  T.raises(function() F.batch_norm(torch.rand(4), nil, nil) end, "at least 2 dims", "a 1-D input")
  T.raises(function() F.batch_norm(torch.ones(4, 2, { dtype = torch.int64 }), nil, nil) end,
           "expected input to be a floating point tensor", "an integer input")
  T.raises(function() F.batch_norm(torch.rand(4, 2), torch.zeros(2, { dtype = torch.float32 }), torch.ones(2, { dtype = torch.float32 })) end,
           "expected running_mean of the input's dtype float64, got float32", "running statistics of another dtype")
  T.raises(function() F.batch_norm(torch.rand(4, 2), torch.zeros(2), torch.ones(2), torch.ones(2, { dtype = torch.float32 })) end,
           "expected weight of dtype float64 %(the running_mean's%), got float32", "a weight of another dtype")
  T.raises(function() F.batch_norm(torch.rand(4, 2), torch.zeros(2), torch.ones(3)) end,
           "running_var should contain 2 elements not 3", "a running_var of the wrong size")
  T.raises(function() F.batch_norm(torch.rand(4, 2), torch.zeros(2), nil) end,
           "expected both running_mean and running_var, or neither", "running_mean without running_var")
  T.raises(function() F.batch_norm(torch.rand(4, 2), torch.zeros(2):requires_grad_(), torch.ones(2), nil, nil, true) end,
           "requires grad", "running statistics that require grad")
  T.raises(function() F.batch_norm(torch.rand(4, 2), "mean", torch.ones(2)) end,
           "expected running_mean to be a tensor or nil, got string", "a running_mean that is not a tensor")
  T.raises(function() F.batch_norm(torch.rand(4, 2), nil, nil, nil, nil, true, "0.1") end,
           "expected momentum to be a number", "a momentum that is not a number")
  T.raises(function() nn.BatchNorm2d(2)(torch.rand(2, 2, 3, 3, { dtype = torch.float32 })) end,
           "expected running_mean of the input's dtype float32, got float64", "a float32 input to a float64 module")
end)

T.done_testing()
