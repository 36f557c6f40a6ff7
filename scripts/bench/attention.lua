-- scripts/bench/attention.lua: F.scaled_dot_product_attention on the GPU,
-- GPT-2's heads (B 16, H 12, D 64, bf16, causal) at sequence lengths 1024
-- and 4096 (batch 4 there): forward, and forward + backward, in ms per
-- call (CUDA events over 10 calls after 10 untimed ones). Printed as "name
-- value" lines for scripts/bench/attention; attention.py is the same on
-- PyTorch.
local torch = require("dplua")
local F = torch.nn.functional
local ok_cuda, has_cuda = pcall(function() return torch.cuda.is_available() end)
if not (ok_cuda and has_cuda) then print("no_gpu"); os.exit(0) end

local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local T = dofile(here .. "/timing.lua")
local row, gpu_ms = T.row, T.gpu_ms

for _, shape in ipairs({ { 16, 1024 }, { 4, 4096 } }) do
  local B, L = shape[1], shape[2]
  local function qkv()
    return torch.randn(B, 12, L, 64, { device = "cuda" }):bfloat16():requires_grad_()
  end
  local q, k, v = qkv(), qkv(), qkv()
  local dout = torch.randn(B, 12, L, 64, { device = "cuda" }):bfloat16()
  row("fwd_" .. L, function()
    return gpu_ms(function()
      torch.no_grad(function() F.scaled_dot_product_attention(q, k, v, { is_causal = true }) end)
    end, 10)
  end, 3)
  row("fwdbwd_" .. L, function()
    return gpu_ms(function()
      local out = F.scaled_dot_product_attention(q, k, v, { is_causal = true })
      out:backward(dout)
    end, 10)
  end, 3)
end
