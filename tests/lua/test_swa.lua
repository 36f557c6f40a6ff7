-- test_swa.lua: torch.optim.swa_utils (AveragedModel, an exponential
-- moving average through avg_fn and multi_avg_fn, update_bn, SWALR)
-- against PyTorch (tests/ref/swa.lua, written by scripts/gen_swa_ref.py);
-- the state dict, printing and bad input.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local nn = torch.nn
local S = torch.optim.swa_utils
local ref = dofile(here .. "/../ref/swa.lua")

local f64 = { dtype = torch.float64 }

-- the generator's model: Linear(3, 4) - BatchNorm1d(4) - ReLU - Linear(4, 2)
local function model_of()
  local m = nn.Sequential(nn.Linear(3, 4, f64), nn.BatchNorm1d(4, f64), nn.ReLU(), nn.Linear(4, 2, f64))
  torch.no_grad(function()
    for _, pair in ipairs({ { 0, m[0] }, { 3, m[3] } }) do
      local layer, lin = pair[1], pair[2]
      lin.weight:copy_(T.filled(torch, T.shape(lin.weight), function(k) return 0.5 * math.sin(1 + 0.7 * k + layer) end))
      lin.bias:copy_(T.filled(torch, T.shape(lin.bias), function(k) return 0.1 * k end))
    end
  end)
  return m
end

local function flat(list)
  local out = {}
  for _, t in ipairs(list) do
    for _, v in ipairs(t:detach():double():reshape(-1):tolist()) do out[#out + 1] = v end
  end
  return out
end

local function train(model, averaged)
  local opt = torch.optim.SGD(model:parameters(), { lr = 0.1, momentum = 0.9 })
  for step = 0, 5 do
    local x = T.filled(torch, { 5, 3 }, function(k) return math.cos(0.3 * k + step) end)
    local y = T.filled(torch, { 5, 2 }, function(k) return math.sin(0.2 * k + step) end)
    opt:zero_grad()
    local loss = ((model(x) - y) ^ 2):mean()
    loss:backward()
    opt:step()
    for _, a in ipairs(averaged) do a:update_parameters(model) end
  end
end

T.run("AveragedModel and an exponential moving average against PyTorch", function()
  local model = model_of()
  local swa = S.AveragedModel(model)
  local ema = S.AveragedModel(model, { avg_fn = function(avg, cur) return avg * 0.8 + cur * 0.2 end, use_buffers = true })
  local multi = S.AveragedModel(model, { multi_avg_fn = S.get_ema_multi_avg_fn(0.8), use_buffers = true })
  train(model, { swa, ema, multi })
  local r = ref.train
  T.values_close(flat(model:parameters()), r.model, 1e-12, 1e-12, "the model trained as PyTorch's")
  T.values_close(flat(swa.module:parameters()), r.swa, 1e-12, 1e-12, "the equal-weight average")
  T.is(swa.n_averaged:item(), r.n_averaged, "n_averaged")
  T.values_close(flat(ema.module:parameters()), r.ema, 1e-12, 1e-12, "the moving average (avg_fn)")
  T.values_close(flat(ema.module:buffers()), r.ema_buffers, 1e-12, 1e-12,
                 "use_buffers: the buffers averaged too (num_batches_tracked truncated to an integer, as PyTorch's)")
  T.values_close(flat(multi.module:parameters()), r.ema, 1e-12, 1e-12, "the moving average (get_ema_multi_avg_fn)")
  T.values_close(flat(swa.module:buffers()), flat(model:buffers()), 0, 0, "without use_buffers the buffers follow the model's")
  local x = torch.randn(2, 3, f64)
  swa:eval()
  T.tensor_close(swa(x), swa.module(x), 0, 0, "calling it runs the averaged copy")
  T.is(T.sorted_keys(swa:state_dict())[1], "module.0.bias", "state dict keys under module.")
  T.ok(swa:state_dict().n_averaged ~= nil, "and n_averaged")
  local fresh = S.AveragedModel(model_of())
  fresh:load_state_dict(swa:state_dict())
  T.values_close(flat(fresh.module:parameters()), flat(swa.module:parameters()), 0, 0, "load_state_dict")
end)

T.run("update_bn against PyTorch", function()
  local model = model_of()
  local swa = S.AveragedModel(model)
  train(model, { swa })
  local batches = {}
  for b = 0, 2 do batches[#batches + 1] = T.filled(torch, { 4, 3 }, function(k) return math.cos(0.5 * k + b) end) end
  S.update_bn(batches, swa)
  local bn, r = swa.module[1], ref.update_bn
  T.values_close(bn.running_mean:tolist(), r.running_mean, 1e-12, 1e-12, "running_mean")
  T.values_close(bn.running_var:tolist(), r.running_var, 1e-12, 1e-12, "running_var")
  T.is(bn.momentum, r.momentum, "momentum put back")
  T.is(swa.training, r.training, "the training mode put back")
  -- the same through a DataLoader, whose batches are (x, y) pairs
  local swa2 = S.AveragedModel(model)
  train(model_of(), {})
  swa2:load_state_dict(swa:state_dict())
  local x = torch.cat(batches, 0)
  local loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, torch.zeros(12)), { batch_size = 4 })
  swa2:eval()
  S.update_bn(loader, swa2)
  T.values_close(swa2.module[1].running_mean:tolist(), r.running_mean, 1e-12, 1e-12, "over a DataLoader")
  T.ok(not swa2.training, "an evaluating model stays in evaluation")
end)

T.run("SWALR against PyTorch", function()
  for name, opts in pairs({ cos = { swa_lr = 0.05, anneal_epochs = 3 },
                            linear = { swa_lr = 0.05, anneal_epochs = 4, anneal_strategy = "linear" },
                            no_anneal = { swa_lr = 0.05, anneal_epochs = 0 } }) do
    local p = torch.zeros(1):requires_grad_()
    local opt = torch.optim.SGD({ p }, { lr = 0.5 })
    local sched = S.SWALR(opt, opts)
    local lrs = { opt.param_groups[1].lr }
    for _ = 1, 8 do
      opt:step()
      sched:step()
      lrs[#lrs + 1] = opt.param_groups[1].lr
    end
    T.values_close(lrs, ref["swalr_" .. name].lrs, 1e-14, 1e-15, "SWALR " .. name)
  end
  local p = torch.zeros(1):requires_grad_()
  local opt = torch.optim.SGD({ { params = { p } }, { params = { torch.zeros(1):requires_grad_() }, lr = 1 } }, { lr = 0.5 })
  S.SWALR(opt, { 0.1, 0.2 }, 0)
  T.is({ opt.param_groups[1].lr, opt.param_groups[2].lr }, { 0.1, 0.2 }, "one swa_lr per group")
end)

T.run("errors", function()
  local model = model_of()
  T.raises(function() S.AveragedModel("x") end, "expected a module to average, got string", "not a module")
  T.raises(function() S.AveragedModel(model, { use_buffer = true }) end, "unknown option 'use_buffer'", "a misspelt option")
  T.raises(function() S.AveragedModel(model, { avg_fn = function() end, multi_avg_fn = function() end }) end,
           "at most one of avg_fn and multi_avg_fn", "both averaging functions")
  local swa = S.AveragedModel(model)
  T.raises(function() swa:update_parameters(nn.Linear(2, 2)) end, "the model has 2 parameters, the averaged copy 6",
           "a different model")
  T.raises(function() swa:update_parameters(nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))) end,
           "tensor 1 has shape %[3, 3%] in the model but %[4, 3%]", "a different shape")
  local opt = torch.optim.SGD(model:parameters(), { lr = 0.1 })
  T.raises(function() S.SWALR(opt, { 0.1, 0.2 }) end, "swa_lr must have the same length as optimizer.param_groups", "lrs per group")
  T.raises(function() S.SWALR(opt, 0.1, -1) end, "anneal_epochs must be equal or greater than 0", "negative anneal epochs")
  T.raises(function() S.SWALR(opt, 0.1, 5, "exp") end, "anneal_strategy must be one of 'cos' or 'linear'", "an unknown strategy")
  T.raises(function() S.update_bn(42, model) end, "expected a DataLoader, a list of batches or an iterator function", "not a loader")
end)

T.done_testing()
