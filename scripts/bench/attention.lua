-- scripts/bench/attention.lua: F.scaled_dot_product_attention on the GPU,
-- GPT-2's heads (B 16, H 12, D 64, bf16, causal) at sequence lengths 1024
-- and 4096 (batch 4 there): forward, and forward + backward, in ms per
-- call (CUDA events over 10 calls after 3 untimed ones). Printed as "name
-- value" lines for scripts/bench/attention; attention.py is the same on
-- PyTorch.
local torch = require("dplua")
local F = torch.nn.functional
local ok_cuda, has_cuda = pcall(function() return torch.cuda.is_available() end)
if not (ok_cuda and has_cuda) then print("no_gpu"); os.exit(0) end

local function row(name, f)
  local ok, v = pcall(f)
  if ok then print(string.format("%s %.3f", name, v))
  else print(string.format("%s error: %s", name, (tostring(v):gsub("%s*\n%s*", " | ")))) end
end

local function gpu_ms(f)
  for _ = 1, 3 do f() end
  torch.cuda.synchronize()
  local e0, e1 = torch.cuda.Event({ enable_timing = true }), torch.cuda.Event({ enable_timing = true })
  e0:record()
  for _ = 1, 10 do f() end
  e1:record()
  e1:synchronize()
  return e0:elapsed_time(e1) / 10
end

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
    end)
  end)
  row("fwdbwd_" .. L, function()
    return gpu_ms(function()
      local out = F.scaled_dot_product_attention(q, k, v, { is_causal = true })
      out:backward(dout)
    end)
  end)
end
