-- test_vmath.lua: the float32 ops that run on src/cpu/vmath.h's
-- vectorised exp, log, sigmoid, tanh and erf against PyTorch's float64
-- values of the same float32 inputs (tests/ref/vmath.lua, written by
-- scripts/gen_vmath_ref.py): exp, sigmoid, tanh and log at expf's edges
-- (NaN, infinities, zeros, overflow, subnormal results) and over a sweep;
-- softmax and log_softmax and their backward, with -inf, NaN and +inf in a
-- row; nll_loss of log_softmax (its folded backward) and cross_entropy;
-- gelu (erf) and its tanh form. Each within a few float32 ulps of the
-- exact value.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local F = torch.nn.functional
local ref = dofile(here .. "/../ref/vmath.lua")

local f32 = { dtype = torch.float32 }
local SUB = 3e-45   -- two of float32's smallest subnormals

-- PyTorch's exact values rounded to float32 (inf beyond FLT_MAX, as expf)
local function rounded(values) return torch.tensor(values, f32):double() end

T.run("exp, sigmoid and tanh at the edges and over a sweep", function()
  local x = torch.tensor(ref.edge.x, f32)
  -- within 1.1, 2.5 and 1.5 ulp of the exact value, so 1.6, 3 and 2 of
  -- its rounding; an ulp is at most 2^-23 of the value
  for _, c in ipairs({ { "exp", 1.9e-7 }, { "sigmoid", 3.6e-7 }, { "tanh", 2.4e-7 } }) do
    local name, rtol = c[1], c[2]
    local y = torch[name](x)
    T.is(tostring(y.dtype), "torch.float32", name .. ": float32")
    local ok, why = T.compare_values(y:double(), rounded(ref.edge[name]), rtol, SUB)
    T.ok(ok, name .. ": every value within its ulps (NaN, inf and 0 exactly)", why)
  end
  local y = torch.exp(x):tolist()
  T.ok(y[1] ~= y[1], "exp(NaN) is NaN")
  T.is(y[2], math.huge, "exp(inf) is inf")
  T.is(y[3], 0, "exp(-inf) is 0")
  T.is(y[10], math.huge, "exp overflows to inf just past 88.7228")
  T.ok(y[9] < math.huge and y[9] > 3.4e38, "exp(88.7228317) is FLT_MAX's neighbour, finite")
  T.ok(y[17] > 0 and y[17] < 2e-45, "exp(-103.972) is the smallest subnormal")
  T.is(y[18], 0, "exp just below -103.972 rounds to 0")
  -- log: within 1 ulp, so 1.5 of the rounded value; NaN below 0, -inf at 0
  local ok, why = T.compare_values(torch.log(x):double(), rounded(ref.edge.log), 1.8e-7, SUB)
  T.ok(ok, "log: every value within its ulps (NaN, inf and -inf exactly)", why)
  ok, why = T.compare_values(torch.log(x:abs()):double(), rounded(ref.edge.log_abs), 1.8e-7, SUB)
  T.ok(ok, "log of the magnitudes, subnormals included", why)
  local tz = torch.tanh(torch.tensor({ -0.0 }, f32)):tolist()[1]
  T.is(1 / tz, -math.huge, "tanh(-0) is -0")
end)

T.run("exp of a strided view and of bfloat16", function()
  local x = torch.tensor(ref.edge.x, f32)
  local strided = torch.exp(x:view(-1, 1):expand(#ref.edge.x, 2):select(1, 1))
  T.tensor_close(strided:double(), rounded(ref.edge.exp), 1.9e-7, SUB, "a stride-2 view takes the same path")
  local bf = torch.exp(torch.tensor({ 0.5, -3, 10 }, { dtype = torch.bfloat16 })):float()
  T.tensor_close(bf, { math.exp(0.5), math.exp(-3), math.exp(10) }, 8e-3, 0, "bfloat16 (computed in float)")
end)

T.run("softmax and log_softmax, forward and backward", function()
  local x = torch.tensor(ref.softmax.x, f32):view(4, -1)
  local w = torch.tensor(ref.softmax.w, f32):view(4, -1)
  for _, name in ipairs({ "softmax", "log_softmax" }) do
    local a = x:clone():requires_grad_()
    local y = a[name](a, 1)
    ;(y * w):sum():backward()
    -- softmax: the exp of (x - max) rounded to float32 first, a relative
    -- error of |x - max| ulps; log_softmax: x - lse in double, rounded once
    local rtol, atol = name == "softmax" and 3e-6 or 2e-7, name == "softmax" and 1e-30 or 3e-6
    T.tensor_close(y:double(), ref.softmax[name], rtol, atol, name .. ": the values")
    T.tensor_close(a.grad:double(), ref.softmax[name .. "_dx"], 1e-5, 1e-6, name .. ": the gradient")
    a = x:clone():requires_grad_()
    a[name](a, 1):sum():backward()   -- the gradient one value along each row
    T.tensor_close(a.grad:double(), ref.softmax[name .. "_dx_sum"], 1e-5, 1e-5, name .. ": the gradient of its sum")
  end
  local p = torch.softmax(x, 1):tolist()
  T.is(p[2][18], 0, "a -inf logit has probability 0")
end)

T.run("softmax and log_softmax of rows with NaN or +inf", function()
  local x = torch.tensor(ref.nonfinite.x, f32):view(3, 3)
  local ok, why = T.compare_values(torch.softmax(x, 1):double(), ref.nonfinite.softmax, 1e-6, 1e-7)
  T.ok(ok, "softmax as PyTorch's: a row with NaN or +inf is NaN", why)
  ok, why = T.compare_values(torch.log_softmax(x, 1):double(), ref.nonfinite.log_softmax, 1e-6, 1e-6)
  T.ok(ok, "log_softmax as PyTorch's", why)
end)

T.run("nll_loss of log_softmax and cross_entropy", function()
  local L = ref.loss
  local x = torch.tensor(L.x, f32):view(5, -1)
  local weight = torch.tensor(L.weight, f32)
  local a = x:clone():requires_grad_()
  local loss = F.nll_loss(F.log_softmax(a, 1), torch.tensor(L.target, { dtype = torch.int64 }), { weight = weight })
  loss:backward()
  T.close(loss:item(), L.nll, 1e-6, 0, "nll_loss with class weights and an ignored row")
  T.tensor_close(a.grad:double(), L.nll_dx, 1e-5, 1e-8, "its gradient, through the folded log_softmax")
  a = x:clone():requires_grad_()
  loss = F.cross_entropy(a, torch.tensor(L.ce_target, { dtype = torch.int64 }))
  loss:backward()
  T.close(loss:item(), L.ce, 1e-6, 0, "cross_entropy")
  T.tensor_close(a.grad:double(), L.ce_dx, 1e-5, 1e-8, "its gradient")
end)

T.run("gelu and its tanh approximation, forward and backward", function()
  local G = ref.gelu
  for _, c in ipairs({ { "gelu", "none" }, { "gelu_tanh", "tanh" } }) do
    local a = torch.tensor(G.x, f32):requires_grad_()
    local y = F.gelu(a, { approximate = c[2] })
    y:sum():backward()
    T.tensor_close(y:double(), G[c[1]], 2e-6, 1e-7, c[1] .. ": the values")
    -- the tanh form's 1 + tanh(u) cancels for u << 0: 1e-6 absolute in
    -- float32 (PyTorch's float32 gradient is off by as much there)
    T.tensor_close(a.grad:double(), G[c[1] .. "_dx"], 2e-6, 1e-6, c[1] .. ": the gradient")
  end
end)

T.done_testing()
