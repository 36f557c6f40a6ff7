-- Where a GPT-2 124M training step's GPU time goes, kernel by kernel:
-- torch.cuda.profile_kernels over two steps (batch B x 1024, bf16
-- autocast, AdamW with decay groups, clip_grad_norm_(1.0)) after three
-- untimed ones, the first `rows` kernels by total time. Works where ncu
-- cannot run. Without a GPU it says so and exits 0.
-- usage: dplua scripts/bench/gpt2_kernels.lua [B [rows]]   (defaults 16 and 50)
local torch = require("dplua")
if not torch.cuda.is_available() then print("gpt2_kernels: no CUDA device; nothing measured"); os.exit(0) end
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local gpt = dofile(here .. "/../../examples/gpt2/model.lua")
local B, rows, T = tonumber(arg[1]) or 16, tonumber(arg[2]) or 50, 1024
torch.manual_seed(0)
local model = gpt.GPT({ block_size = T }):to("cuda")
local opt = model:configure_optimizers(0.1, 6e-4, { 0.9, 0.95 })
local x = torch.randint(0, 50257, { B, T }):to("cuda")
local y = torch.randint(0, 50257, { B, T }):to("cuda")
local function step()
  opt:zero_grad()
  local loss = torch.autocast("cuda", { dtype = torch.bfloat16 }, function() return select(2, model(x, y)) end)
  loss:backward()
  torch.nn.utils.clip_grad_norm_(model:parameters(), 1.0)
  opt:step()
end
for _ = 1, 3 do step() end
torch.cuda.synchronize()
local prof = torch.cuda.profile_kernels(function() step(); step() end)
print(string.format("GPT-2 124M, batch %d x %d, two steps on %s", B, T, torch.cuda.get_device_name()))
print(prof:table(rows))
