-- scripts/bench/attention.lua: F.scaled_dot_product_attention on the GPU,
-- 12 heads, bf16, causal: GPT-2's head dim 64 at batch 16 x 1024 tokens
-- and batch 4 x 4096, and head dim 128 at batch 8 x 2048: forward, and
-- forward + backward, in µs per call (CUDA events over 10 calls after 10
-- untimed ones). Printed as "name
-- value" lines for scripts/bench/attention; attention.py is the same on
-- PyTorch.
local torch = require("dplua")
local F = torch.nn.functional
local ok_cuda, has_cuda = pcall(function() return torch.cuda.is_available() end)
if not (ok_cuda and has_cuda) then print("no_gpu"); os.exit(0) end

local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local T = dofile(here .. "/timing.lua")
local row, gpu_ms = T.row, T.gpu_ms

for _, shape in ipairs({ { 16, 1024, 64 }, { 4, 4096, 64 }, { 8, 2048, 128 } }) do
  local B, L, D = shape[1], shape[2], shape[3]
  local function qkv()
    return torch.randn(B, 12, L, D, { device = "cuda" }):bfloat16():requires_grad_()
  end
  local q, k, v = qkv(), qkv(), qkv()
  local dout = torch.randn(B, 12, L, D, { device = "cuda" }):bfloat16()
  local name = L .. "_" .. D
  row("fwd_" .. name, function()
    return 1000 * gpu_ms(function()
      torch.no_grad(function() F.scaled_dot_product_attention(q, k, v, { is_causal = true }) end)
    end, 10)
  end, 1)
  row("fwdbwd_" .. name, function()
    return 1000 * gpu_ms(function()
      local out = F.scaled_dot_product_attention(q, k, v, { is_causal = true })
      out:backward(dout)
    end, 10)
  end, 1)
end
