-- The flash-attention kernels (cuda/attention.cu, make check-gpu) against
-- the CPU's attention in float64 (itself checked against PyTorch by
-- tests/lua/test_attention.lua) from the same inputs: out and the
-- gradients of q, k and v, in bfloat16 (head dims 64 and 128) and float32,
-- causal and not, lengths that are no multiple of a tile, L ~= S, strided
-- heads, and the composite path for what no kernel takes.
local dir = os.getenv("DPLUA_TEST_DIR") or (debug.getinfo(1, "S").source:match("^@(.*)/gpu/") or "tests")
package.path = dir .. "/lua/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local F = torch.nn.functional
if not torch.cuda.is_available() then T.skip_all("no CUDA device") end

local dev = "cuda:0"
local FLASH = "ScaledDotProductFlashAttentionBackward0"
torch.manual_seed(0)

-- the largest difference relative to the reference's largest magnitude,
-- or to 1 (the inputs' scale: they are standard normal) where that is
-- smaller: a gradient that cancels to nothing, as dq and dk of a query
-- that sees one key (dS = P (dP - delta) = 0), is as exact as the terms
-- it cancels from
local function rel_err(got, want)
  return (got:double() - want):abs():max():item() / math.max(want:abs():max():item(), 1)
end

local function attend(q, k, v, opts)
  q, k, v = q:detach():requires_grad_(), k:detach():requires_grad_(), v:detach():requires_grad_()
  local out = F.scaled_dot_product_attention(q, k, v, opts)
  return out, q, k, v
end

-- B, H, L, S, E, Ev; layout "bhld" or "blhd" (heads strided, as a GPT makes them)
local function check(dtype, B, H, L, S, E, Ev, causal, layout, fused)
  local name = string.format("%s B=%d H=%d L=%d S=%d E=%d Ev=%d causal=%s %s", tostring(dtype), B, H, L, S, E, Ev,
                             tostring(causal), layout)
  T.run(name, function()
    local function make(n, d)
      if layout == "blhd" then return torch.randn(B, n, H, d):to(dtype):to(dev):transpose(1, 2) end
      return torch.randn(B, H, n, d):to(dtype):to(dev)
    end
    local q, k, v = make(L, E), make(S, E), make(S, Ev)
    local dout = make(L, Ev)
    local opts = { is_causal = causal }
    local out, gq, gk, gv = attend(q, k, v, opts)
    T.is(out.grad_fn and out.grad_fn.name == FLASH, fused, name .. ": fused exactly when a kernel takes it")
    out:backward(dout)
    if layout == "blhd" then
      -- stored as the heads came, so that the transpose back to (B, L, H * Ev) is a view
      T.is(out:transpose(1, 2):is_contiguous(), fused, name .. ": out laid out (B, L, H, E) when fused")
    end
    local rout, rq, rk, rv = attend(q:cpu():double(), k:cpu():double(), v:cpu():double(), opts)
    rout:backward(dout:cpu():double())
    local tol = dtype == torch.bfloat16 and 2e-2 or 1e-5
    for _, pair in ipairs({ { "out", out, rout }, { "dq", gq.grad, rq.grad }, { "dk", gk.grad, rk.grad },
                            { "dv", gv.grad, rv.grad } }) do
      local got = pair[2]
      T.is(tostring(got.device), dev, name .. ": " .. pair[1] .. " on the GPU")
      T.is(tostring(got.dtype), tostring(dtype), name .. ": " .. pair[1] .. " dtype")
      local err = rel_err(got:cpu(), pair[3])
      T.ok(err <= tol, name .. ": " .. pair[1], string.format("relative error %.3g > %.3g", err, tol))
    end
  end)
end

for _, causal in ipairs({ false, true }) do
  for _, D in ipairs({ 64, 128 }) do
    check(torch.bfloat16, 2, 3, 77, 77, D, D, causal, "bhld", true)
    check(torch.bfloat16, 1, 2, 37, 100, D, D, causal, "blhd", true)
    check(torch.bfloat16, 1, 2, 100, 37, D, D, causal, "bhld", true)
  end
  check(torch.bfloat16, 1, 1, 1, 300, 64, 64, causal, "bhld", true)
  check(torch.bfloat16, 1, 2, 1024, 1024, 64, 64, causal, "blhd", true)
  check(torch.float32, 2, 3, 77, 77, 64, 64, causal, "bhld", true)
  check(torch.float32, 1, 2, 37, 100, 16, 24, causal, "blhd", true)
  check(torch.float32, 1, 2, 130, 70, 128, 128, causal, "bhld", true)
  -- no kernel: bfloat16 head dim 96, float32 head dim 200, float64
  check(torch.bfloat16, 1, 2, 33, 33, 96, 96, causal, "bhld", false)
  check(torch.float32, 1, 1, 20, 20, 200, 200, causal, "bhld", false)
  check(torch.float64, 1, 2, 20, 30, 8, 8, causal, "bhld", false)
end

T.run("inputs on two devices are a clear error", function()
  local q = torch.randn(1, 2, 8, 64):to(dev)
  T.raises(function() F.scaled_dot_product_attention(q, q:cpu(), q) end, "one device", "q on the GPU, k on the CPU")
end)

T.run("an empty key sequence gives zeros", function()
  local out = F.scaled_dot_product_attention(torch.randn(1, 2, 5, 64):bfloat16():to(dev),
                                             torch.randn(1, 2, 0, 64):bfloat16():to(dev),
                                             torch.randn(1, 2, 0, 64):bfloat16():to(dev))
  T.is(out:float():abs():sum():item(), 0, "zeros")
end)

T.done_testing()
