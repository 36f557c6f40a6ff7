-- test_batch_norm.lua: nn.BatchNorm1d and nn.BatchNorm2d (and
-- F.batch_norm) against PyTorch in float64 (tests/ref/batch_norm.lua,
-- written by scripts/gen_batch_norm_ref.py): three training steps and one
-- in eval mode, each step's output, input/weight/bias gradients and
-- running statistics; momentum, momentum = false (cumulative), no affine,
-- no running statistics; state dict keys; gradcheck; errors.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local nn, F = torch.nn, torch.nn.functional
local ref = dofile(here .. "/../ref/batch_norm.lua")
torch.set_default_dtype(torch.float64)

local makers = {
  bn1d_nc = function() return nn.BatchNorm1d(3) end,
  bn1d_ncl = function() return nn.BatchNorm1d(4, { eps = 1e-3, momentum = 0.3 }) end,
  bn2d = function() return nn.BatchNorm2d(3) end,
  bn2d_cumulative = function() return nn.BatchNorm2d(2, { momentum = false }) end,
  bn2d_no_affine = function() return nn.BatchNorm2d(2, { affine = false }) end,
  bn2d_no_stats = function() return nn.BatchNorm2d(2, { track_running_stats = false }) end,
}

-- the generator's input: sin(1 + 0.37 k + step) over the flat index k
local function x_of(shape, step)
  return T.filled(torch, shape, function(k) return math.sin(1 + 0.37 * k + step) end)
end

local function close(got, want, what) T.values_close(got, want, 1e-12, 1e-14, what) end

for _, name in ipairs(T.sorted_keys(makers)) do
  T.run(name .. " against PyTorch", function()
    local m, r = makers[name](), ref[name]
    for step = 0, 3 do
      if step == 3 then m:eval() end
      local what = string.format("%s step %d%s", name, step, step == 3 and " (eval)" or "")
      local x = x_of(r.shape, step):requires_grad_()
      local y = m(x)
      local wt = torch.arange(0, y:numel(), { dtype = torch.float64 }):cos():reshape(y:size())
      local loss = (y * wt):sum()
      loss:backward()
      local want = r.steps[step + 1]
      close(y:reshape(-1):tolist(), want.y, what .. ": output")
      close(x.grad:reshape(-1):tolist(), want.dx, what .. ": input gradient")
      if want.dweight then
        close(m.weight.grad:tolist(), want.dweight, what .. ": weight gradient")
        close(m.bias.grad:tolist(), want.dbias, what .. ": bias gradient")
        m.weight.grad, m.bias.grad = nil, nil
      end
      if want.running_mean then
        close(m.running_mean:tolist(), want.running_mean, what .. ": running_mean")
        close(m.running_var:tolist(), want.running_var, what .. ": running_var")
      end
    end
    if m.track_running_stats then T.is(m.num_batches_tracked:item(), 3, name .. ": three batches tracked") end
  end)
end

T.run("state dict, printing, gradcheck", function()
  T.is(T.sorted_keys(nn.BatchNorm2d(2):state_dict()), { "bias", "num_batches_tracked", "running_mean", "running_var", "weight" },
       "PyTorch's state dict keys")
  T.is(T.sorted_keys(nn.BatchNorm2d(2, { affine = false, track_running_stats = false }):state_dict()), {},
       "nothing without affine and running statistics")
  T.is(tostring(nn.BatchNorm2d(8)), "BatchNorm2d(8, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True)",
       "printed as PyTorch's")
  local x = torch.rand(3, 2, 2, 2):requires_grad_()
  local w, b = torch.rand(2):requires_grad_(), torch.rand(2):requires_grad_()
  T.ok(torch.autograd.gradcheck(function(t, ww, bb) return F.batch_norm(t, nil, nil, ww, bb, true) end, { x, w, b }),
       "gradcheck through the batch statistics")
  local m = nn.BatchNorm1d(2)
  m(torch.rand(4, 2))
  m:reset_running_stats()
  T.is(m.running_var:tolist(), { 1, 1 }, "reset_running_stats")
end)

T.run("errors", function()
  T.raises(function() nn.BatchNorm2d(3)(torch.rand(2, 3, 4)) end, "BatchNorm2d: expected 4D input %(got 3D", "a 3-D input to BatchNorm2d")
  T.raises(function() nn.BatchNorm1d(3)(torch.rand(2, 4)) end, "running_mean should contain 4 elements not 3", "channels that differ")
  T.raises(function() nn.BatchNorm1d(3)(torch.rand(1, 3)) end, "Expected more than 1 value per channel when training",
           "one value per channel")
  T.raises(function() nn.BatchNorm1d(0) end, "num_features", "no features")
  T.raises(function() F.batch_norm(torch.rand(4), nil, nil) end, "at least 2 dims", "a 1-D input")
end)

T.done_testing()
