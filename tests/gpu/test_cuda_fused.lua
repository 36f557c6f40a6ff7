-- The GPU's fusions for a language model (make check-gpu):
--  * the classifier's cross-entropy (cuda/classifier.cu) over bfloat16
--    logits, against the CPU's in float64 from the same values: the loss
--    and the logits' gradient, mean, sum and no reduction, ignore_index,
--    label smoothing, GPT-2's 50,304 classes, rows read 16 bytes at a time
--    and rows that cannot be, in bfloat16 and under autocast (a float32
--    loss); a bad target is an error;
--  * nn.Sequential's Linear then GELU(tanh) under autocast (one fused op,
--    the GELU in cuBLASLt's epilogue or our kernel's), against the same
--    layers called one by one (F.linear, F.gelu);
--  * the MLP's GELU backward folded into the next Linear's product (the
--    DGELU epilogue), against the layers one by one;
--  * an Embedding's backward (index_add in a fixed order): two runs give
--    the same bits, and the CPU's values in float64.
local dir = os.getenv("DPLUA_TEST_DIR") or (debug.getinfo(1, "S").source:match("^@(.*)/gpu/") or "tests")
package.path = dir .. "/lua/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local nn = torch.nn
local F = nn.functional
if not torch.cuda.is_available() then T.skip_all("no CUDA device") end

local dev = "cuda:0"
local bf16 = torch.bfloat16
torch.manual_seed(0)
math.randomseed(0)

-- the largest difference relative to the reference's largest magnitude
local function rel_err(got, want)
  return (got:double() - want):abs():max():item() / math.max(want:abs():max():item(), 1e-30)
end

local function within(got, want, tol, name)
  local err = rel_err(got:cpu(), want)
  T.ok(err <= tol, name, string.format("relative error %.3g > %.3g", err, tol))
end

---------------------------------------------------------------- the classifier's cross-entropy

-- logits (N, C) in bfloat16 on the GPU; `unaligned`: rows that do not start
-- on 16 bytes (a view one element into its storage)
local function logits_of(N, C, unaligned)
  local x = (torch.randn(N * C + 1) * 4):to(bf16):to(dev)
  return x:narrow(0, unaligned and 1 or 0, N * C):view(N, C)
end

-- class indices, the first row's ignored (-100), `bad` (if given) at row 3
local function targets_of(N, C, bad)
  local v = {}
  for i = 1, N do v[i] = math.random(0, C - 1) end
  v[1] = -100
  if bad then v[3] = bad end
  return torch.tensor(v, { dtype = torch.int64 })
end

-- The loss and the logits' gradient on the GPU (under autocast when
-- `autocast`) and on the CPU in float64 from the same values.
local function classifier_case(N, C, opts, autocast, unaligned)
  local name = string.format("cross_entropy %d x %d%s, %s%s%s", N, C, unaligned and " (rows not on 16 bytes)" or "",
                             opts.reduction or "mean", (opts.label_smoothing or 0) > 0 and ", smoothed" or "",
                             autocast and ", under autocast" or ", bfloat16")
  T.run(name, function()
    local x = logits_of(N, C, unaligned):requires_grad_()
    local t = targets_of(N, C)
    local loss
    if autocast then
      loss = torch.autocast("cuda", {}, function() return F.cross_entropy(x, t:to(dev), opts) end)
    else
      loss = F.cross_entropy(x, t:to(dev), opts)
    end
    T.is(tostring(loss.dtype), autocast and "torch.float32" or "torch.bfloat16", name .. ": the loss's dtype")
    local g = opts.reduction == "none" and torch.rand(N):to(loss.dtype) or nil
    loss:backward(g and g:to(dev))
    T.is(tostring(x.grad.dtype), "torch.bfloat16", name .. ": the gradient is bfloat16")
    local xr = x:detach():cpu():double():requires_grad_()
    local lr = F.cross_entropy(xr, t, opts)
    lr:backward(g and g:double())
    within(loss:detach(), lr:detach(), autocast and 1e-4 or 8e-3, name .. ": loss")
    within(x.grad, xr.grad, 8e-3, name .. ": gradient")
  end)
end

for _, shape in ipairs({ { 64, 50304 }, { 37, 1000 }, { 33, 1003 } }) do
  for _, opts in ipairs({ {}, { reduction = "sum" }, { reduction = "none" }, { label_smoothing = 0.1 } }) do
    classifier_case(shape[1], shape[2], opts, true)
  end
  classifier_case(shape[1], shape[2], {}, false)
end
classifier_case(16, 50304, {}, true, true)
classifier_case(16, 50304, { label_smoothing = 0.2, reduction = "sum" }, false, true)

T.run("cross_entropy over bfloat16 logits: a target out of range is an error", function()
  local x = logits_of(8, 1000)
  local t = targets_of(8, 1000, 1000)
  T.raises(function() return F.cross_entropy(x, t:to(dev)):item() end, "target 1000 is out of bounds",
           "the error names the target")
  T.ok(pcall(function() return F.cross_entropy(x, t:clamp(0, 999):to(dev)):item() end), "the next loss runs")
end)

---------------------------------------------------------------- Linear + GELU(tanh) under autocast

-- in, out features, rows and (optionally) a leading dim: cuBLASLt's GELU
-- epilogue (GPT-2's MLP, on (B, T, C) too), cuBLASLt's product with our
-- activation after it (an aux leading dimension of 1003, not divisible by
-- 8), our own kernel (small)
for _, s in ipairs({ { 768, 3072, 64 }, { 768, 3072, 32, 4 }, { 128, 1003, 256 }, { 16, 24, 8 } }) do
  local K, Nf, M, B = s[1], s[2], s[3], s[4]
  local name = string.format("Linear(%d, %d), GELU(tanh) under autocast, %s%d rows", K, Nf, B and (B .. " x ") or "", M)
  T.run(name, function()
    torch.manual_seed(1)
    local m = nn.Sequential(nn.Linear(K, Nf), nn.GELU("tanh")):to(dev)
    local x = (B and torch.randn(B, M, K) or torch.randn(M, K)):to(dev)
    local dout = (B and torch.randn(B, M, Nf) or torch.randn(M, Nf)):to(bf16):to(dev)
    local out = torch.autocast("cuda", {}, function() return m(x) end)
    T.is(tostring(out.dtype), "torch.bfloat16", name .. ": bfloat16 output")
    out:backward(dout)
    local w, b = m[0].weight:detach():clone():requires_grad_(), m[0].bias:detach():clone():requires_grad_()
    local ref = torch.autocast("cuda", {}, function() return F.gelu(F.linear(x, w, b), "tanh") end)
    ref:backward(dout)
    within(out:detach(), ref:detach():cpu():double(), 1e-2, name .. ": output as F.linear then F.gelu")
    within(m[0].weight.grad, w.grad:cpu():double(), 2e-2, name .. ": weight gradient")
    within(m[0].bias.grad, b.grad:cpu():double(), 2e-2, name .. ": bias gradient")
    T.is(tostring(m[0].weight.grad.dtype), "torch.float32", name .. ": float32 gradient of the float32 weight")
  end)
end

---------------------------------------------------------------- the GELU's backward folded into the next Linear

-- A transformer's MLP (Linear, GELU(tanh), Linear) as one Sequential: the
-- second Linear's input gradient takes the GELU's derivative in its
-- product's epilogue (cuBLASLt's DGELU; our after-kernel where the hidden
-- width is not divisible by 8; our own kernel when small), against the
-- layers called one by one, where the GELU is an op of its own; in
-- bfloat16 under autocast and in float32.
for _, s in ipairs({ { 768, 3072, 64, 4 }, { 128, 1003, 256 }, { 16, 24, 8 } }) do
  for _, amp in ipairs({ true, false }) do
    local K, Nf, M, B = s[1], s[2], s[3], s[4]
    local name = string.format("MLP %d-%d-%d, %s%d rows, %s: the GELU folded", K, Nf, K, B and (B .. " x ") or "", M,
                               amp and "bf16 autocast" or "float32")
    T.run(name, function()
      torch.manual_seed(2)
      local m = nn.Sequential(nn.Linear(K, Nf), nn.GELU("tanh"), nn.Linear(Nf, K)):to(dev)
      local x = (B and torch.randn(B, M, K) or torch.randn(M, K)):to(dev)
      local dout = (B and torch.randn(B, M, K) or torch.randn(M, K)):to(dev)
      local function run(f, xx)
        if amp then return torch.autocast("cuda", {}, f, xx) end
        return f(xx)
      end
      local xa = x:clone():requires_grad_()
      local before = torch.autograd._activation_backwards_folded()
      run(function(v) return m(v) end, xa):backward(amp and dout:to(bf16) or dout)
      T.is(torch.autograd._activation_backwards_folded() - before, 1, name .. ": one fold")
      local p = {}
      for i, t in ipairs({ m[0].weight, m[0].bias, m[2].weight, m[2].bias }) do p[i] = t:detach():clone():requires_grad_() end
      local xb = x:clone():requires_grad_()
      run(function(v) return F.linear(F.gelu(F.linear(v, p[1], p[2]), "tanh"), p[3], p[4]) end, xb)
        :backward(amp and dout:to(bf16) or dout)
      local tol = amp and 2e-2 or 1e-5
      within(xa.grad, xb.grad:cpu():double(), tol, name .. ": the input's gradient")
      within(m[0].weight.grad, p[1].grad:cpu():double(), tol, name .. ": the first weight's gradient")
      within(m[0].bias.grad, p[2].grad:cpu():double(), tol, name .. ": the first bias's gradient")
      within(m[2].weight.grad, p[3].grad:cpu():double(), tol, name .. ": the second weight's gradient")
    end)
  end
end

---------------------------------------------------------------- Embedding backward

for _, dtype in ipairs({ torch.float32, bf16 }) do
  local name = "embedding backward, " .. tostring(dtype)
  T.run(name, function()
    local V, D = 50304, 64
    local w = (torch.randn(V, D) * 0.02):to(dtype)
    local idx = torch.randint(0, 100, { 16, 256 })   -- many repeats
    idx = torch.cat({ idx:view(-1), torch.tensor({ V - 1, V - 1 }, { dtype = torch.int64 }) }):view(2, -1)
    local dout = torch.randn(2, 16 * 256 / 2 + 1, D):to(dtype)
    local function grad()
      local wg = w:to(dev):requires_grad_()
      F.embedding(idx:to(dev), wg):backward(dout:to(dev))
      return wg.grad
    end
    local g1, g2 = grad(), grad()
    T.is(g1:ne(g2):sum():item(), 0, name .. ": two runs give the same bits")
    local wr = w:double():requires_grad_()
    F.embedding(idx, wr):backward(dout:double())
    within(g1, wr.grad, dtype == bf16 and 1e-2 or 1e-5, name .. ": the CPU's sums")
  end)
end

T.done_testing()
