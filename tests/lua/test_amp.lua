-- test_amp.lua: torch.amp.GradScaler (and torch.cuda.amp's): dynamic loss
-- scaling as PyTorch's, checked against its rules (the scale halves after an
-- inf or a NaN and the step is skipped; it doubles after growth_interval
-- clean steps) and against the same training without it; the switches
-- mixed-precision programs set beside it: set_float32_matmul_precision,
-- use_deterministic_algorithms,
-- finfo and iinfo (PyTorch's values), inference_mode and compile.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local nn = torch.nn

local f64 = { dtype = torch.float64 }

local function model_and_data()
  torch.manual_seed(7)
  local m = nn.Sequential(nn.Linear(4, 8, f64), nn.Tanh(), nn.Linear(8, 2, f64))
  return m, torch.randn(16, 4, f64), torch.randn(16, 2, f64)
end

local function loss_of(m, x, y) return ((m(x) - y) ^ 2):mean() end

local function params_of(m)
  local out = {}
  for i, p in ipairs(m:parameters()) do out[i] = p:detach():clone() end
  return out
end

T.run("scaled training equals unscaled training", function()
  local m1, x, y = model_and_data()
  local m2 = model_and_data()
  local o1, o2 = torch.optim.Adam(m1:parameters()), torch.optim.Adam(m2:parameters())
  local scaler = torch.amp.GradScaler()
  for _ = 1, 5 do
    o1:zero_grad()
    loss_of(m1, x, y):backward()
    o1:step()
    o2:zero_grad()
    local scaled = scaler:scale(loss_of(m2, x, y))
    T.close(scaled:item(), loss_of(m2, x, y):item() * 65536, 1e-12, 0, "the loss times 2^16")
    scaled:backward()
    scaler:step(o2)
    scaler:update()
  end
  -- scaling by a power of two is exact: the same parameters to the bit
  local p1, p2 = params_of(m1), params_of(m2)
  for i = 1, #p1 do T.tensor_close(p2[i], p1[i], 0, 0, "parameter " .. i) end
  T.is(scaler:get_scale(), 65536, "no growth before growth_interval")
end)

T.run("an inf or a NaN skips the step and halves the scale", function()
  local m, x, y = model_and_data()
  local opt = torch.optim.SGD(m:parameters(), { lr = 0.1 })
  local scaler = torch.amp.GradScaler({ init_scale = 1024, growth_interval = 2 })
  for _, bad in ipairs({ math.huge, 0 / 0, -math.huge }) do
    local before = params_of(m)
    local scale = scaler:get_scale()
    opt:zero_grad()
    scaler:scale(loss_of(m, x, y)):backward()
    m[2].bias.grad[1] = bad
    T.is(scaler:step(opt), nil, "step returns nil when skipped (" .. tostring(bad) .. ")")
    scaler:update()
    local after = params_of(m)
    for i = 1, #before do T.tensor_close(after[i], before[i], 0, 0, "parameter " .. i .. " unchanged") end
    T.is(scaler:get_scale(), scale / 2, "the scale halved")
  end
  -- two clean steps: the scale doubles (growth_interval 2)
  for step = 1, 2 do
    local before = params_of(m)
    opt:zero_grad()
    scaler:scale(loss_of(m, x, y)):backward()
    scaler:step(opt)
    scaler:update()
    T.ok(not torch.equal(params_of(m)[1], before[1]), "clean step " .. step .. " moves the weights")
  end
  T.is(scaler:get_scale(), 1024 / 8 * 2, "doubled after growth_interval clean steps")
  T.is(scaler:state_dict(), { scale = 256, growth_factor = 2, backoff_factor = 0.5, growth_interval = 2,
                               _growth_tracker = 0 }, "PyTorch's state dict keys")
end)

T.run("unscale_ before clipping", function()
  local m, x, y = model_and_data()
  local opt = torch.optim.SGD(m:parameters(), { lr = 0.1 })
  loss_of(m, x, y):backward()
  local want = {}
  for i, p in ipairs(m:parameters()) do want[i] = p.grad:clone() end
  opt:zero_grad()
  local scaler = torch.amp.GradScaler({ init_scale = 2 ^ 20 })
  scaler:scale(loss_of(m, x, y)):backward()
  T.close(m[0].weight.grad:abs():max():item(), want[1]:abs():max():item() * 2 ^ 20, 1e-12, 0, "gradients scaled")
  scaler:unscale_(opt)
  for i, p in ipairs(m:parameters()) do T.tensor_close(p.grad, want[i], 0, 0, "gradient " .. i .. " unscaled") end
  T.raises(function() scaler:unscale_(opt) end, "unscale_%(%) has already been called on this optimizer", "twice")
  nn.utils.clip_grad_norm_(m:parameters(), 0.01)
  local before = params_of(m)
  scaler:step(opt)
  T.raises(function() scaler:step(opt) end, "step%(%) has already been called since the last update%(%)", "step twice")
  scaler:update()
  T.ok(not torch.equal(params_of(m)[1], before[1]), "stepped with the clipped gradients")
  -- a parameter without a gradient is left alone
  local extra = torch.zeros(3, f64):requires_grad_()
  local opt2 = torch.optim.SGD({ m[0].weight, extra }, { lr = 0.1 })
  opt2:zero_grad()
  scaler:scale(m(x):sum()):backward()
  scaler:step(opt2)
  T.is(extra.grad, nil, "no gradient made up")
  scaler:update()
end)

T.run("disabled, state dicts and errors", function()
  local m, x, y = model_and_data()
  local opt = torch.optim.SGD(m:parameters(), { lr = 0.1 })
  local off = torch.cuda.amp.GradScaler({ enabled = false })
  local loss = loss_of(m, x, y)
  T.ok(rawequal(off:scale(loss), loss), "disabled: scale returns its argument")
  T.is(off:get_scale(), 1.0, "disabled: scale 1")
  T.is(off:state_dict(), {}, "disabled: an empty state dict")
  loss:backward()
  local before = params_of(m)
  off:step(opt)
  off:update()
  T.ok(not torch.equal(params_of(m)[1], before[1]), "disabled: step() steps")
  T.ok(not off:is_enabled(), "is_enabled")
  local s = torch.amp.GradScaler()
  T.raises(function() s:update() end, "no inf checks were recorded prior to update", "update before a step")
  local scaled = s:scale({ loss, { loss * 2 } })
  T.close(scaled[2][1]:item(), loss:item() * 2 * 65536, 1e-12, 0, "a nested table scaled")
  local t = torch.amp.GradScaler()
  t:load_state_dict({ scale = 8, growth_factor = 4, backoff_factor = 0.25, growth_interval = 3, _growth_tracker = 1 })
  T.is(t:state_dict(), { scale = 8, growth_factor = 4, backoff_factor = 0.25, growth_interval = 3, _growth_tracker = 1 },
       "load_state_dict")
  s:update(torch.tensor({ 32.0 }))
  T.is(s:get_scale(), 32, "update(new_scale)")
  T.raises(function() torch.amp.GradScaler({ init_scale = -1 }) end, "init_scale must be positive", "a negative scale")
  T.raises(function() torch.amp.GradScaler({ growth_factor = 1 }) end, "growth factor must be > 1", "no growth")
  T.raises(function() torch.amp.GradScaler({ backoff_factor = 2 }) end, "backoff factor must be in %(0, 1%)", "backoff")
  T.raises(function() torch.amp.GradScaler({ growth_interval = 0.5 }) end, "growth interval must be a positive integer", "interval")
  T.raises(function() torch.amp.GradScaler({ init_scal = 2 }) end, "unknown option 'init_scal'", "a misspelt option")
  T.raises(function() torch.amp.GradScaler("tpu") end, 'expected device "cuda" or "cpu", got tpu', "a device")
  T.raises(function() s:step({}) end, "expected an optimizer", "not an optimizer")
  T.raises(function() s:step(opt, function() end) end, "closure use is not supported", "a closure")
  T.raises(function() s:scale(3) end, "expected a tensor or a table of tensors, got number", "a number")
  T.raises(function() t:load_state_dict({}) end, "saved from a disabled GradScaler", "an empty state dict")
end)

T.run("torch.cuda.amp.autocast and torch.amp.autocast", function()
  local seen = torch.cuda.amp.autocast({ dtype = torch.bfloat16 }, function()
    return torch.is_autocast_enabled("cuda")
  end)
  T.ok(seen, "cuda.amp.autocast sets CUDA's autocast")
  T.ok(not torch.is_autocast_enabled("cuda"), "and puts it back")
  local a, b = torch.randn(3, 4), torch.randn(4, 2)
  local dt = torch.amp.autocast("cpu", function() return (a:matmul(b)).dtype end)
  T.is(dt, torch.bfloat16, "amp.autocast on the CPU: the product in bfloat16")
end)

T.run("use_deterministic_algorithms", function()
  T.is(torch.are_deterministic_algorithms_enabled(), false, "off by default")
  local x = torch.randn(50, 4)
  local idx = torch.randint(0, 3, { 50, 4 })
  local before = torch.zeros(3, 4):scatter_add(0, idx, x)
  torch.use_deterministic_algorithms(true, { warn_only = true })
  T.ok(torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled(), "on, warn_only")
  T.ok(torch.zeros(3, 4):scatter_add(0, idx, x):eq(before):all():item(), "the CPU's ops are the same")
  torch.use_deterministic_algorithms(false)
  T.ok(not torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled(), "off")
  T.raises(function() torch.use_deterministic_algorithms("yes") end, "expected mode to be a boolean, got string", "mode")
  T.raises(function() torch.use_deterministic_algorithms(true, true) end, "expected the options as a table", "options")
end)

T.run("set_float32_matmul_precision", function()
  T.is(torch.get_float32_matmul_precision(), "highest", "highest by default")
  torch.set_float32_matmul_precision("high")
  T.ok(torch.backends.cuda.matmul.allow_tf32, "high allows TF32")
  T.is(torch.get_float32_matmul_precision(), "high", "read back")
  torch.set_float32_matmul_precision("medium")
  T.is(torch.get_float32_matmul_precision(), "medium", "medium read back")
  torch.set_float32_matmul_precision("highest")
  T.ok(not torch.backends.cuda.matmul.allow_tf32, "highest: no TF32")
  torch.backends.cuda.matmul.allow_tf32 = true
  T.is(torch.get_float32_matmul_precision(), "high", "allow_tf32 set directly reads as high")
  torch.backends.cuda.matmul.allow_tf32 = false
  T.raises(function() torch.set_float32_matmul_precision("low") end,
           'expected "highest", "high" or "medium", got low', "an unknown precision")
end)

T.run("torch.cpu: a namespace that is still callable", function()
  T.tensor_close(torch.cpu(torch.ones(2)), torch.ones(2), 0, 0, "torch.cpu(t) is t:cpu()")
  T.ok(torch.cpu.is_available() and torch.cpu.device_count() == 1 and torch.cpu.current_device() == "cpu",
       "is_available, device_count, current_device")
  T.ok(torch.cpu.amp.autocast({ dtype = torch.bfloat16 }, function() return torch.is_autocast_enabled("cpu") end),
       "torch.cpu.amp.autocast is CPU autocast")
  T.raises(function() torch.cpu("x") end, "cpu: expected a tensor as the first argument", "torch.cpu of a string")
end)

T.run("torch.backends.cudnn and mps", function()
  local cudnn = torch.backends.cudnn
  T.is({ cudnn.enabled, cudnn.benchmark, cudnn.deterministic, cudnn.allow_tf32 }, { true, false, false, true },
       "PyTorch's defaults")
  cudnn.benchmark, cudnn.deterministic = true, true
  T.is({ cudnn.benchmark, cudnn.deterministic }, { true, true }, "kept and read back")
  cudnn.benchmark, cudnn.deterministic = false, false
  T.ok(not cudnn.is_available(), "dplua does not use cuDNN")
  T.ok(not torch.backends.mps.is_available() and not torch.backends.mps.is_built(), "no MPS")
  T.raises(function() cudnn.benchmrk = true end, "backends.cudnn: unknown setting 'benchmrk'", "a misspelt setting")
  T.raises(function() cudnn.benchmark = 1 end, "backends.cudnn.benchmark: expected a boolean", "a number")
end)

T.run("finfo and iinfo", function()
  -- PyTorch's values (torch.finfo(torch.float32).max etc.)
  local f = torch.finfo(torch.float32)
  T.is({ f.bits, f.eps, f.max, f.min, f.tiny, f.resolution },
       { 32, 1.1920928955078125e-07, 3.4028234663852886e+38, -3.4028234663852886e+38, 1.1754943508222875e-38, 1e-06 },
       "float32")
  T.is(torch.tensor({ f.max }):item(), f.max, "float32's max is a float32")
  T.ok(torch.tensor({ f.max * (1 + f.eps) }):item() == math.huge, "one step above overflows")
  local d = torch.finfo(torch.float64)
  T.is({ d.bits, d.eps, d.max, d.tiny }, { 64, 2.220446049250313e-16, 1.7976931348623157e+308, 2.2250738585072014e-308 },
       "float64")
  local b = torch.finfo(torch.bfloat16)
  T.is({ b.bits, b.eps, b.max, b.tiny, b.resolution }, { 16, 0.0078125, 3.3895313892515355e+38, 1.1754943508222875e-38, 0.01 },
       "bfloat16")
  T.is(torch.tensor({ b.max }, { dtype = torch.bfloat16 }):item(), b.max, "bfloat16's max is a bfloat16")
  T.is(torch.finfo().eps, f.eps, "finfo() is the default dtype's")
  T.is(tostring(torch.finfo(torch.float32)),
       "finfo(resolution=1e-06, min=-3.40282e+38, max=3.40282e+38, eps=1.19209e-07, smallest_normal=1.17549e-38, "
       .. "tiny=1.17549e-38, dtype=float32)", "prints as PyTorch's")
  T.is({ torch.iinfo(torch.int32).min, torch.iinfo(torch.int32).max }, { -2147483648, 2147483647 }, "int32")
  T.is({ torch.iinfo(torch.uint8).min, torch.iinfo(torch.uint8).max }, { 0, 255 }, "uint8")
  local i = torch.iinfo(torch.int64)
  T.is(tostring(i.max), "9223372036854775807LL", "int64's max exactly")
  T.is(tostring(i), "iinfo(min=-9223372036854775808, max=9223372036854775807, dtype=int64)", "int64 printed")
  T.raises(function() torch.finfo(torch.int64) end, "finfo: expected a floating dtype", "finfo of an integer")
  T.raises(function() torch.iinfo(torch.float32) end, "iinfo: expected an integer dtype", "iinfo of a float")
end)

T.run("inference_mode and compile", function()
  local w = torch.ones(3, { requires_grad = true })
  local y = torch.inference_mode(function() return w * 2 end)
  T.ok(not y.requires_grad, "nothing recorded")
  T.ok(torch.is_grad_enabled(), "grad mode back")
  T.ok(torch.inference_mode(false, function() return w * 2 end).requires_grad, "inference_mode(false) records")
  T.raises(function() torch.inference_mode(true, 3) end, "expected a function to run", "not a function")
  local m = nn.Linear(2, 2)
  T.ok(rawequal(torch.compile(m), m), "compile returns the module, which runs eagerly")
  T.raises(function() torch.compile() end, "expected a module or a function", "nothing to compile")
end)

T.done_testing()
