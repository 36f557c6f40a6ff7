-- dplua's side of scripts/bench/gpt2_parts: the pieces a GPT-2 124M step
-- (batch 16 x 1024, width 768, 12 heads, bf16 autocast) spends its time
-- in, each forward and backward, in ms per call by CUDA events; printed
-- as "name value" lines for compare.sh (gpt2_parts.py is PyTorch's side).
local torch = require("dplua")
local nn, F = torch.nn, torch.nn.functional
io.stdout:setvbuf("line")
local ok_cuda, has_cuda = pcall(function() return torch.cuda.is_available() end)
if not (ok_cuda and has_cuda) then print("no_gpu"); os.exit(0) end
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local T = dofile(here .. "/timing.lua")
local d, B, L, C, H, V = "cuda", 16, 1024, 768, 12, 50304
print("version dplua on " .. torch.cuda.get_device_name(0))
torch.manual_seed(0)
local amp = { dtype = torch.bfloat16 }
local function autocast(f) return torch.autocast("cuda", amp, f) end
local x = torch.randn(B, L, C, { device = d, requires_grad = true })
local function fwd_bwd(f)
  return T.gpu_ms(function()
    local y = autocast(f)
    y:float():sum():backward()
  end)
end
local ln = nn.LayerNorm(C):to(d)
T.row("layer_norm", function() return fwd_bwd(function() return ln(x) end) end)
local qkv = nn.Linear(C, 3 * C):to(d)
T.row("linear_qkv", function() return fwd_bwd(function() return qkv(x) end) end)
local fc, proj = nn.Linear(C, 4 * C):to(d), nn.Linear(4 * C, C):to(d)
T.row("mlp", function() return fwd_bwd(function() return proj(F.gelu(fc(x), { approximate = "tanh" })) end) end)
local q = torch.randn(B, H, L, C / H, { device = d, dtype = torch.bfloat16, requires_grad = true })
T.row("attention", function()
  return T.gpu_ms(function() F.scaled_dot_product_attention(q, q, q, { is_causal = true }):float():sum():backward() end)
end)
local head = nn.Linear(C, V, { bias = false }):to(d)
local y = torch.randint(0, V, { B * L }):to(d)
T.row("head_loss", function()
  return T.gpu_ms(function()
    local loss = autocast(function() return F.cross_entropy(head(x):view(-1, V), y) end)
    loss:backward()
  end)
end)
local g = torch.randn(124 * 1000 * 1000, { device = d })
T.row("grad_norm_124M", function() return T.gpu_ms(function() return g:norm() end) end)
T.row("sum_124M", function() return T.gpu_ms(function() return g:sum() end) end)
T.row("square_124M", function() return T.gpu_ms(function() return g:square() end) end)
T.row("scale_124M", function() return T.gpu_ms(function() return g:mul_(1.0) end) end)
