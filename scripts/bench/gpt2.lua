-- scripts/bench/gpt2.lua: a GPT-2 124M training step on one GPU
-- (examples/gpt2/model.lua: 12 layers, 12 heads, width 768, vocabulary
-- 50304), batch B x 1024 tokens, bf16 autocast, AdamW (betas 0.9/0.95,
-- weight decay 0.1 on the matrices), clip_grad_norm_(1.0). Prints "name
-- value" lines for scripts/bench/gpt2: ms per step (the mean of STEPS
-- timed steps between two synchronize() calls, after 3 untimed ones),
-- tokens/s, MFU (6N + 12 L T C FLOPs a token against the GPU's bf16 peak)
-- and max_memory_allocated in MiB; gpt2.py is the same on PyTorch.
--   dplua scripts/bench/gpt2.lua [B [STEPS]]
local torch = require("dplua")
local ok_cuda, has_cuda = pcall(function() return torch.cuda.is_available() end)
if not (ok_cuda and has_cuda) then print("no_gpu"); os.exit(0) end
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local gpt = dofile(here .. "/../../examples/gpt2/model.lua")
local clock = torch.utils.progress.clock

local B, steps, T = tonumber(arg[1]) or 8, tonumber(arg[2]) or 20, 1024
local name = torch.cuda.get_device_name(0)
print(string.format("version dplua on %s, batch %d x %d, %d steps", name, B, T, steps))

local ok, err = pcall(function()
  torch.manual_seed(0)
  torch.cuda.reset_peak_memory_stats()
  local model = gpt.GPT({ block_size = T }):to("cuda")
  local opt = model:configure_optimizers(0.1, 6e-4, { 0.9, 0.95 })
  local x = torch.randint(0, 50257, { B, T }):to("cuda")
  local y = torch.randint(0, 50257, { B, T }):to("cuda")
  local amp = { dtype = torch.bfloat16 }
  local function forward() return select(2, model(x, y)) end
  local function step()
    opt:zero_grad()
    local loss = torch.autocast("cuda", amp, forward)
    loss:backward()
    torch.nn.utils.clip_grad_norm_(model:parameters(), 1.0)
    opt:step()
  end
  for _ = 1, 3 do step() end
  torch.cuda.synchronize()
  local t0 = clock()
  for _ = 1, steps do step() end
  torch.cuda.synchronize()
  local s = (clock() - t0) / steps
  local tok_s = B * T / s
  print(string.format("ms %.3f", s * 1000))
  print(string.format("tok_s %.1f", tok_s))
  local peak = gpt.peak_bf16_tflops(name)
  if peak then print(string.format("mfu %.2f", 100 * model:flops_per_token(T) * tok_s / (peak * 1e12)))
  else print("mfu error: unknown bf16 peak for " .. name) end
  print(string.format("mem_mib %.1f", torch.cuda.max_memory_allocated() / 2 ^ 20))
end)
if not ok then
  local msg = (tostring(err):gsub("%s*\n%s*", " | "))
  for _, row in ipairs({ "ms", "tok_s", "mfu", "mem_mib" }) do print(row .. " error: " .. msg) end
end
