-- examples/gpt2/model.lua's GPT trained on a GPU (make check-gpu): the
-- small GPT of tests/ref/gpt_small.* (scripts/gen_gpt_ref.py) for 20 AdamW
-- steps with clip_grad_norm_(1.0) on CUDA, in float32 (losses within 1e-3
-- of PyTorch's float32 CPU run) and under bfloat16 autocast (within 5e-2);
-- then a GPT whose heads are 64 wide, so that bfloat16 attention runs the
-- flash kernels, under autocast on CUDA against the same model in float32
-- on the CPU (itself checked against PyTorch by tests/lua/test_gpt_train.lua);
-- and the KV cache on CUDA against the full forward.
local dir = os.getenv("DPLUA_TEST_DIR") or (debug.getinfo(1, "S").source:match("^@(.*)/gpu/") or "tests")
package.path = dir .. "/lua/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
if not torch.cuda.is_available() then T.skip_all("no CUDA device") end
local gpt = dofile(dir .. "/../examples/gpt2/model.lua")
local ref = dofile(dir .. "/ref/gpt_small.lua")
local dev = "cuda:0"

local function ids(r) return T.ref_tensor(torch, r, torch.int64) end

-- Losses of steps on the batches, on device, bf16 autocast when amp.
local function train(model, batches, device, amp, lr)
  model:to(device)
  local opt = model:configure_optimizers(0.1, lr, { 0.9, 0.95 })
  local losses = {}
  for i, seq in ipairs(batches) do
    seq = seq:to(device)
    local n = seq:size(1) - 1
    local x, y = seq:narrow(1, 0, n), seq:narrow(1, 1, n)
    opt:zero_grad()
    local loss
    if amp then
      loss = torch.autocast("cuda", { dtype = torch.bfloat16 }, function() return select(2, model(x, y)) end)
    else
      loss = select(2, model(x, y))
    end
    loss:backward()
    torch.nn.utils.clip_grad_norm_(model:parameters(), 1.0)
    opt:step()
    losses[i] = loss:item()
  end
  return losses
end

local function reference_model()
  local model = gpt.GPT(ref.config)
  model:load_state_dict(torch.load(dir .. "/ref/gpt_small.safetensors"))
  return model
end

local batches = {}
for i, b in ipairs(ref.batches) do batches[i] = ids(b) end

for _, amp in ipairs({ false, true }) do
  local label = amp and "bf16 autocast" or "float32"
  local tol = amp and 5e-2 or 1e-3
  T.run("small GPT on CUDA, " .. label .. ", against PyTorch", function()
    local losses = train(reference_model(), batches, dev, amp, ref.lr)
    for i, l in ipairs(losses) do T.close(l, ref.losses[i], 0, tol, label .. ": loss at step " .. i) end
  end)
end

T.run("heads of 64 (flash kernels) under bf16 autocast on CUDA against float32 on the CPU", function()
  local cfg = { n_layer = 2, n_head = 2, n_embd = 128, vocab_size = 101, block_size = 64 }
  torch.manual_seed(5)
  local model = gpt.GPT(cfg)
  local sd = {}
  for k, v in pairs(model:state_dict()) do sd[k] = v:clone() end
  -- sequences of the reference's chain, two batches joined to 64 + 1 tokens
  local long = {}
  for i = 1, 10 do
    long[i] = torch.cat({ batches[2 * i - 1], batches[2 * i]:narrow(1, 0, 32) }, 1)
  end
  local cpu = train(model, long, "cpu", false, 1e-3)
  local again = gpt.GPT(cfg)
  again:load_state_dict(sd)
  local gpu = train(again, long, dev, true, 1e-3)
  for i = 1, #cpu do T.close(gpu[i], cpu[i], 0, 5e-2, "loss at step " .. i) end
end)

T.run("the KV cache on CUDA", function()
  local model = reference_model():to(dev)
  local seq = batches[3]:narrow(1, 0, 24):to(dev)
  local full = model(seq, seq)
  torch.no_grad(function()
    local cache = model:new_cache(seq:size(0))
    local a = model:forward_cached(seq:narrow(1, 0, 16), cache)
    local b = model:forward_cached(seq:narrow(1, 16, 1), cache)
    local c = model:forward_cached(seq:narrow(1, 17, 7), cache)
    T.tensor_close(torch.cat({ a, b, c }, 1):cpu(), full:cpu(), 1e-4, 1e-5, "cached logits equal the full forward's")
  end)
end)

T.done_testing()
