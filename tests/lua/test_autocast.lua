-- test_autocast.lua -- torch.autocast (bfloat16) on the CPU.
--
-- ref/autocast.lua is written by scripts/gen_autocast.py (PyTorch 1.13,
-- torch.autocast("cpu", dtype=torch.bfloat16)): a Linear-ReLU-Linear MLP
-- with cross_entropy and with mse_loss, a Linear-GELU(tanh)-Linear MLP with
-- a label-smoothed cross_entropy ignoring a row, and a conv2d with mse_loss, run
-- forward under autocast and backward outside it. Checked against it: the
-- output dtype (bfloat16), the loss dtype (float32), the float32 gradients
-- of the float32 weights, and the values with a bfloat16 tolerance. Then by
-- hand: the state (restored after an error, nesting, enabled=false, the
-- device type), which ops run in bfloat16 and which in float32, and the
-- argument errors.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local dir = os.getenv("DPLUA_TEST_DIR") or (here .. "/..")
package.path = dir .. "/lua/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
torch.manual_seed(0)   -- random inputs, the same in every run
local nn = torch.nn
local F = nn.functional

local ref = dofile(dir .. "/ref/autocast.lua")
local bf16, f32 = torch.bfloat16, torch.float32

-- bfloat16 keeps 8 bits of mantissa, and PyTorch and dplua round at
-- different places (dplua's CPU linear rounds x @ w^T to bfloat16 before it
-- adds the bias, PyTorch's addmm rounds once), so a hidden activation may
-- differ by one bfloat16 step, and more after a cancellation such as
-- mse_loss's (out - target). Entries are compared at
-- RTOL * max(|expected|, SCALE * the tensor's largest |value|).
local RTOL, SCALE = 2e-2, 1

local function tensor_of(spec)
  return torch.tensor(spec.values, { dtype = torch[spec.dtype] }):reshape(spec.shape)
end

local function close(got, spec, name)
  local peak = 0
  for _, v in ipairs(spec.values) do peak = math.max(peak, math.abs(v)) end
  T.is(T.shape(got), spec.shape, name .. ": shape")
  local ok, why = T.compare_values(got:float():reshape(-1), spec.values, RTOL, RTOL * SCALE * peak)
  T.ok(ok, name .. ": values (rtol " .. RTOL .. ")", why)
end

local function check_case(name, case, out, loss, params)
  T.is(tostring(out.dtype), "torch." .. case.out.dtype, name .. ": output dtype is bfloat16")
  close(out, case.out, name .. ": output")
  T.is(tostring(loss.dtype), "torch." .. case.loss.dtype, name .. ": loss dtype is float32")
  T.close(loss:item(), case.loss.value, RTOL, 0, name .. ": loss")
  for i, spec in ipairs(case.params) do
    local p = params[i]
    T.ok(p.grad ~= nil, name .. ": " .. spec.name .. " has a gradient")
    if p.grad then
      T.is(tostring(p.grad.dtype), "torch." .. spec.grad.dtype, name .. ": " .. spec.name .. ".grad is float32")
      T.is(tostring(p.dtype), "torch.float32", name .. ": " .. spec.name .. " stays float32")
      close(p.grad, spec.grad, name .. ": " .. spec.name .. ".grad")
    end
  end
end

---------------------------------------------------------------- against PyTorch

local function mlp_from(case, act)
  local m = nn.Sequential(nn.Linear(6, 8), act or nn.ReLU(), nn.Linear(8, 3))
  local lin = { m[0], m[2] }
  torch.no_grad(function()
    for i, spec in ipairs(case.params) do
      local layer = lin[math.floor((i + 1) / 2)]
      local p = i % 2 == 1 and layer.weight or layer.bias
      p:copy_(tensor_of(spec.value))
    end
  end)
  return m, { m[0].weight, m[0].bias, m[2].weight, m[2].bias }
end

-- The MLP case ref[name]: forward and loss_fn under autocast(options), then
-- the backward, checked against PyTorch's.
local function run_mlp(name, options, loss_fn, act)
  local case = ref[name]
  local m, params = mlp_from(case, act)
  local x, y = tensor_of(case.inputs.x), tensor_of(case.inputs.target)
  local out, loss = torch.autocast("cpu", options, function()
    local o = m(x)
    return o, loss_fn(o, y)
  end)
  loss:backward()
  check_case(name, case, out, loss, params)
end

T.run("mlp, cross_entropy", function() run_mlp("mlp", { dtype = torch.bfloat16 }, F.cross_entropy) end)
T.run("mlp, cross_entropy, parameters in an optimizer's flat buffer", function()
  -- the casts' gradients are written into the parameters' slots of the
  -- optimizer's flat gradient buffer, each parameter's after the one before
  local case = ref.mlp
  local m, params = mlp_from(case)
  torch.optim.SGD(m:parameters(), { lr = 0.1 })
  local x, y = tensor_of(case.inputs.x), tensor_of(case.inputs.target)
  local out, loss = torch.autocast("cpu", { dtype = torch.bfloat16 }, function()
    local o = m(x)
    return o, F.cross_entropy(o, y)
  end)
  loss:backward()
  check_case("mlp in a flat buffer", case, out, loss, params)
  local ffi = require("ffi")
  local function addr(t) return tonumber(ffi.cast("intptr_t", t:data_ptr())) end
  local at = addr(params[1].grad)
  for i, p in ipairs(params) do
    T.is(addr(p.grad) - at, 0, "gradient " .. i .. " sits in the flat buffer, after the one before")
    at = at + p:numel() * 4
  end
end)
T.run("mlp, mse_loss", function() run_mlp("mlp_mse", {}, nn.MSELoss()) end)
-- nn.Sequential's Linear then GELU is one fused op under autocast too, and
-- cross_entropy's float32 cast is made by its C op: the same values
T.run("Linear, GELU(tanh), Linear, cross_entropy with label smoothing and ignore_index", function()
  run_mlp("gelu_mlp", {}, function(o, y) return F.cross_entropy(o, y, { label_smoothing = 0.1 }) end,
          nn.GELU("tanh"))
end)

T.run("conv2d, mse_loss", function()
  local case = ref.conv
  local w = tensor_of(case.params[1].value):requires_grad_()
  local b = tensor_of(case.params[2].value):requires_grad_()
  local x, y = tensor_of(case.inputs.x), tensor_of(case.inputs.target)
  local out, loss = torch.autocast("cpu", {}, function()
    local o = F.conv2d(x, w, b, 1, 1)
    return o, F.mse_loss(o, y)
  end)
  loss:backward()
  check_case("conv", case, out, loss, { w, b })
end)

---------------------------------------------------------------- state

T.run("state, return values, errors inside fn", function()
  T.is(torch.is_autocast_enabled("cpu"), false, "off by default (cpu)")
  T.is(torch.is_autocast_enabled(), false, "off by default (no argument: cuda, as in PyTorch)")
  T.is(tostring(torch.get_autocast_dtype("cpu")), "torch.bfloat16", "default dtype bfloat16")
  local a, b, c, n = torch.autocast("cpu", { dtype = bf16 }, function(p, q)
    return torch.is_autocast_enabled("cpu"), torch.is_autocast_enabled(), p + q, nil
  end, 2, 3)
  T.is({ a, b, c }, { true, false, 5 }, "fn gets the extra arguments, its results come back; cuda's state is separate")
  T.is(torch.is_autocast_enabled("cpu"), false, "off again afterwards")
  T.is(select("#", torch.autocast("cpu", function() return 1, nil, 3 end)), 3, "opts may be left out; nils inside the results kept")

  local ok, err = pcall(torch.autocast, "cpu", {}, function() error("boom in the body") end)
  T.ok(not ok and tostring(err):find("boom in the body", 1, true), "an error in fn is raised again", tostring(err))
  T.is(torch.is_autocast_enabled("cpu"), false, "state restored after the error")
  local obj = {}
  ok, err = pcall(torch.autocast, "cpu", {}, function() error(obj) end)
  T.ok(not ok and err == obj, "a non-string error object comes through unchanged")
  local x = torch.randn(2, 3)
  local w = torch.randn(4, 3)
  T.is(tostring(F.linear(x, w).dtype), "torch.float32", "linear is float32 again after the error")
end)

T.run("nesting and enabled=false", function()
  local x, w = torch.randn(2, 3), torch.randn(4, 3)
  torch.autocast("cpu", {}, function()
    T.is(tostring(F.linear(x, w).dtype), "torch.bfloat16", "outer: linear in bfloat16")
    torch.autocast("cpu", { enabled = false }, function()
      T.is(torch.is_autocast_enabled("cpu"), false, "inner enabled=false: off")
      T.is(tostring(F.linear(x, w).dtype), "torch.float32", "inner enabled=false: linear in float32")
      T.is(tostring((x:matmul(w:t())).dtype), "torch.float32", "inner enabled=false: matmul in float32")
    end)
    T.is(torch.is_autocast_enabled("cpu"), true, "outer on again after the inner region")
    torch.autocast("cpu", { dtype = f32 }, function()
      T.is(tostring(torch.get_autocast_dtype("cpu")), "torch.float32", "inner dtype float32")
      local y = F.linear(x:bfloat16(), w:bfloat16())
      T.is(tostring(y.dtype), "torch.float32", "inner dtype float32: bfloat16 inputs cast up")
    end)
    T.is(tostring(torch.get_autocast_dtype("cpu")), "torch.bfloat16", "outer dtype restored")
    local ok = pcall(torch.autocast, "cpu", { enabled = false }, function() error("inner") end)
    T.ok(not ok and torch.is_autocast_enabled("cpu"), "outer still on after an error in a nested region")
    T.is(tostring(F.linear(x, w).dtype), "torch.bfloat16", "outer: linear in bfloat16 again")
  end)
  T.is(torch.is_autocast_enabled("cpu"), false, "off after the outer region")
  local y = torch.autocast("cpu", { enabled = false }, function() return F.linear(x, w) end)
  T.is(tostring(y.dtype), "torch.float32", "enabled=false alone: float32")
  T.tensor_close(y, F.linear(x, w):tolist(), 0, 0, "enabled=false alone: the plain float32 result")
end)

T.run("device types", function()
  local x, w = torch.randn(2, 3), torch.randn(4, 3)
  torch.autocast("cuda", {}, function()
    T.is(torch.is_autocast_enabled(), true, "autocast(\"cuda\"): is_autocast_enabled() is true")
    T.is(torch.is_autocast_enabled("cpu"), false, "autocast(\"cuda\"): the cpu state stays off")
    T.is(tostring(F.linear(x, w).dtype), "torch.float32", "autocast(\"cuda\") leaves CPU tensors alone")
    T.is(tostring(x:matmul(w:t()).dtype), "torch.float32", "autocast(\"cuda\") leaves a CPU matmul alone")
  end)
  T.is(torch.is_autocast_enabled(), false, "cuda off again")
end)

---------------------------------------------------------------- which ops

T.run("ops in bfloat16 and in float32", function()
  local a, b = torch.randn(2, 3), torch.randn(3, 4)
  local a3, b3 = torch.randn(2, 2, 3), torch.randn(2, 3, 4)
  local xb = torch.randn(2, 5):bfloat16()
  local y = torch.tensor({ 1, 4 }, { dtype = torch.int64 })
  torch.autocast("cpu", {}, function()
    T.is(tostring(a:matmul(b).dtype), "torch.bfloat16", "t:matmul")
    T.is(tostring(torch.matmul(a, b).dtype), "torch.bfloat16", "torch.matmul")
    T.is(tostring(torch.mm(a, b).dtype), "torch.bfloat16", "torch.mm")
    T.is(tostring(a:mm(b).dtype), "torch.bfloat16", "t:mm")
    T.is(tostring(torch.bmm(a3, b3).dtype), "torch.bfloat16", "torch.bmm")
    T.tensor_close(torch.mm(a, b):float(), torch.mm(a:bfloat16(), b:bfloat16()):float():tolist(), 0, 0,
                   "mm under autocast equals mm of the bfloat16 casts")
    T.is(tostring(torch.mm(a:double(), b:double()).dtype), "torch.float64", "float64 is left alone, as in PyTorch")
    T.is(tostring(nn.Linear(3, 2)(a).dtype), "torch.bfloat16", "nn.Linear")
    T.is(tostring(nn.Conv2d(1, 2, 3)(torch.randn(1, 1, 5, 5)).dtype), "torch.bfloat16", "nn.Conv2d")
    T.is(tostring(F.softmax(xb, 1).dtype), "torch.float32", "softmax in float32")
    T.is(tostring(F.log_softmax(xb, -1).dtype), "torch.float32", "log_softmax in float32")
    T.is(tostring(nn.LayerNorm(5)(xb).dtype), "torch.float32", "layer_norm in float32")
    T.is(tostring(F.cross_entropy(xb, y).dtype), "torch.float32", "cross_entropy in float32")
    T.is(tostring(F.nll_loss(F.log_softmax(xb, 1), y).dtype), "torch.float32", "nll_loss in float32")
    T.is(tostring(F.mse_loss(xb, xb).dtype), "torch.float32", "mse_loss in float32")
    T.is(tostring(F.l1_loss(xb, torch.zeros(2, 5)).dtype), "torch.float32", "l1_loss in float32")
    T.is(tostring(F.binary_cross_entropy_with_logits(xb, torch.rand(2, 5)).dtype), "torch.float32",
         "binary_cross_entropy_with_logits in float32")
    T.is(tostring(F.relu(xb).dtype), "torch.bfloat16", "other ops keep their input's dtype")
    T.close(F.cross_entropy(xb, y):item(), F.cross_entropy(xb:float(), y):item(), 1e-6, 0,
            "cross_entropy of bfloat16 logits: the float32 loss of the same values")
    local leaf = xb:clone():requires_grad_()
    F.cross_entropy(leaf, y, { reduction = "sum" }):backward()
    T.is(tostring(leaf.grad.dtype), "torch.bfloat16", "cross_entropy's gradient reaches bfloat16 logits as bfloat16")
    T.raises(function() F.cross_entropy(xb, torch.tensor({ 1, 5 }, { dtype = torch.int64 })) end,
             { "cross_entropy", "target 5 is out of bounds" }, "a target out of range is an error under autocast")
    T.raises(function() F.cross_entropy(xb, torch.tensor({ 1, 2, 3 }, { dtype = torch.int64 })) end,
             { "cross_entropy", "expected target of shape %[2%]" }, "a target of the wrong shape is an error under autocast")
  end)
  -- outside: PyTorch's ordinary type rules
  T.is(tostring(F.cross_entropy(xb, y).dtype), "torch.bfloat16", "outside autocast cross_entropy keeps bfloat16")
  T.is(tostring(a:matmul(b).dtype), "torch.float32", "outside autocast matmul keeps float32")
end)

T.run("gradients reach the float32 leaves", function()
  local w = torch.randn(3, 4, { requires_grad = true })
  local x = torch.randn(2, 3, { requires_grad = true })
  local out = torch.autocast("cpu", {}, function() return x:matmul(w) end)
  T.is(tostring(out.dtype), "torch.bfloat16", "matmul output bfloat16")
  T.is(torch._grad_fn_name(out), "MmBackward0", "recorded by autograd")
  out:float():sum():backward()
  T.is(tostring(w.grad.dtype), "torch.float32", "weight grad float32")
  T.is(tostring(x.grad.dtype), "torch.float32", "input grad float32")
  local expect = torch.ones(2, 4):bfloat16():t():matmul(x:detach():bfloat16()):t():float()
  T.tensor_close(w.grad, expect:tolist(), 0, 0, "weight grad is the bfloat16 product, cast up")
  w.grad, x.grad = nil, nil
  torch.no_grad(function()
    local o = torch.autocast("cpu", {}, function() return x:matmul(w) end)
    T.is(tostring(o.dtype), "torch.bfloat16", "autocast inside no_grad")
    T.is(o.requires_grad, false, "nothing recorded inside no_grad")
  end)
end)

---------------------------------------------------------------- errors

T.run("argument errors", function()
  local body = function() end
  T.raises(function() torch.autocast("cpu", { dtype = "float16" }, body) end,
           { "autocast", "torch.bfloat16", "torch.float32", "float16 is not supported" },
           "float16: an error naming the accepted dtypes")
  T.raises(function() torch.autocast("cpu", { dtype = torch.int64 }, body) end,
           { "autocast", "torch.bfloat16 or torch.float32", "torch.int64" }, "an integer dtype")
  T.raises(function() torch.autocast("cpu", { dtype = torch.float64 }, body) end,
           { "torch.bfloat16 or torch.float32", "torch.float64" }, "float64")
  T.raises(function() torch.autocast("cuda:0", {}, body) end,
           { "autocast", 'device_type "cuda" or "cpu"', "cuda:0" }, "device_type with an index")
  T.raises(function() torch.autocast("gpu", {}, body) end, { 'device_type "cuda" or "cpu"', "gpu" }, "unknown device_type")
  T.raises(function() torch.autocast(nil, {}, body) end, { 'device_type "cuda" or "cpu"', "nil" }, "missing device_type")
  T.raises(function() torch.autocast("cpu", {}) end, { "autocast", "function", "nil" }, "missing fn")
  T.raises(function() torch.autocast("cpu", 5, body) end, { "autocast", "options table", "number" }, "opts not a table")
  T.raises(function() torch.autocast("cpu", { dtpye = bf16 }, body) end, { "unknown option", "dtpye" }, "a misspelt option")
  T.raises(function() torch.is_autocast_enabled("tpu") end, { "is_autocast_enabled", "tpu" }, "is_autocast_enabled: bad device type")
  T.is(torch.is_autocast_enabled("cpu"), false, "no error left autocast on")
end)

T.done_testing()
