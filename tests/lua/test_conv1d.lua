-- test_conv1d.lua: F.conv1d and nn.Conv1d against PyTorch in float64
-- (tests/ref/conv1d.lua, written by scripts/gen_conv1d_ref.py): outputs
-- and input/weight/bias gradients with stride, padding (numbers and
-- "same"), dilation, groups and no bias; unbatched input; the module's
-- shapes, printing and init; errors.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
torch.manual_seed(0)   -- random inputs, the same in every run
local nn, F = torch.nn, torch.nn.functional
local ref = dofile(here .. "/../ref/conv1d.lua")

local cases = {  -- name: input shape, weight shape, options
  plain = { { 2, 3, 11 }, { 4, 3, 3 }, {} },
  stride_pad = { { 2, 3, 11 }, { 4, 3, 5 }, { stride = 2, padding = 2 } },
  dilation = { { 1, 2, 13 }, { 3, 2, 3 }, { dilation = 3, padding = 1 } },
  groups = { { 2, 4, 9 }, { 6, 2, 3 }, { groups = 2, padding = 1 } },
  same = { { 2, 3, 10 }, { 2, 3, 3 }, { padding = "same" } },
  no_bias = { { 2, 3, 8 }, { 2, 3, 2 }, { bias = false } },
}

local function filled(shape, f) return T.filled(torch, shape, f) end
local function close(got, want, what) T.values_close(got, want, 1e-12, 1e-13, what) end

for _, name in ipairs(T.sorted_keys(cases)) do
  T.run(name .. " against PyTorch", function()
    local c, r = cases[name], ref[name]
    local x = filled(c[1], function(k) return math.sin(1 + 0.3 * k) end):requires_grad_()
    local w = filled(c[2], function(k) return math.cos(2 + 0.7 * k) end):requires_grad_()
    local b = c[3].bias ~= false and filled({ c[2][1] }, function(k) return math.sin(3 + k) end):requires_grad_() or nil
    local y = F.conv1d(x, w, b, { stride = c[3].stride, padding = c[3].padding, dilation = c[3].dilation,
                                  groups = c[3].groups })
    T.is(y:size(), r.shape, name .. ": the shape")
    local wt = torch.arange(0, y:numel(), { dtype = torch.float64 }):cos():reshape(y:size())
    local loss = (y * wt):sum()
    loss:backward()
    close(y:reshape(-1):tolist(), r.y, name .. ": output")
    close(x.grad:reshape(-1):tolist(), r.dx, name .. ": input gradient")
    close(w.grad:reshape(-1):tolist(), r.dw, name .. ": weight gradient")
    if b then close(b.grad:tolist(), r.db, name .. ": bias gradient") end
  end)
end

T.run("torch.conv_tbc against PyTorch", function()
  local tbc = dofile(here .. "/../ref/conv_tbc.lua")
  for name, c in pairs({ plain = { { 7, 2, 3 }, { 3, 3, 4 }, 0 }, pad = { { 7, 2, 3 }, { 2, 3, 5 }, 1 } }) do
    local r = tbc[name]
    local x = filled(c[1], function(k) return math.sin(1 + 0.3 * k) end):requires_grad_()
    local w = filled(c[2], function(k) return math.cos(2 + 0.7 * k) end):requires_grad_()
    local b = filled({ c[2][3] }, function(k) return math.sin(3 + k) end):requires_grad_()
    local y = torch.conv_tbc(x, w, b, c[3])
    T.is(y:size(), r.shape, name .. ": the shape")
    local loss = (y * torch.arange(0, y:numel(), { dtype = torch.float64 }):cos():reshape(y:size())):sum()
    loss:backward()
    close(y:reshape(-1):tolist(), r.y, name .. ": output")
    close(x.grad:reshape(-1):tolist(), r.dx, name .. ": input gradient")
    close(w.grad:reshape(-1):tolist(), r.dw, name .. ": weight gradient")
    close(b.grad:tolist(), r.db, name .. ": bias gradient")
  end
  T.raises(function() torch.conv_tbc(torch.ones(3, 2), torch.ones(2, 2, 2), torch.ones(2)) end,
           "Input must have 3 dims", "a 2-D input")
end)

T.run("nn.Conv1d", function()
  local m = nn.Conv1d(4, 6, 3, { padding = 1, groups = 2 })
  T.is(m.weight:size(), { 6, 2, 3 }, "weight (out, in/groups, k), as PyTorch's state dict has it")
  T.is(m(torch.rand(2, 4, 10)):size(), { 2, 6, 10 }, "a batch")
  T.is(m(torch.rand(4, 10)):size(), { 6, 10 }, "an unbatched input")
  T.is(tostring(m), "Conv1d(4, 6, kernel_size=(3,), stride=(1,), padding=(1,), groups=2)", "printed as PyTorch's")
  local bound = 1 / math.sqrt(2 * 3)
  T.ok(m.weight:abs():max():item() <= bound and m.bias:abs():max():item() <= bound, "PyTorch's init bounds")
  T.is(tostring(nn.Conv2d(3, 8, 3)), "Conv2d(3, 8, kernel_size=(3, 3), stride=(1, 1))", "Conv2d prints as before")
end)

T.run("errors", function()
  T.raises(function() F.conv1d(torch.rand(2, 3, 8), torch.rand(4, 3, 3, 3)) end, "expected weight of shape %(out_channels, in_channels/groups, kW%)",
           "a 4-D weight")
  T.raises(function() F.conv1d(torch.rand(8), torch.rand(4, 3, 3)) end, "expected 2%-D %(C, L%) or 3%-D %(N, C, L%)", "a 1-D input")
  T.raises(function() F.conv1d(torch.rand(2, 5, 8), torch.rand(4, 3, 3)) end, "to have 3 channels, but got 5", "wrong channels")
  T.raises(function() nn.Conv1d(3, 4, 3, { groups = 2 }) end, "in_channels must be divisible by groups", "bad groups")
end)

T.done_testing()
