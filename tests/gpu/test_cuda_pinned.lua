-- Pinned host memory and non-blocking copies to the GPU (pin_memory,
-- to(device, {non_blocking = true}), src/core/gpu_memory.c) and the token
-- shards that stage their batches through them: the data that arrives is
-- the data that was sent, even when the host buffer is reused at once.
local dir = os.getenv("DPLUA_TEST_DIR") or (debug.getinfo(1, "S").source:match("^@(.*)/gpu/") or "tests")
package.path = dir .. "/lua/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
if not torch.cuda.is_available() then T.skip_all("no CUDA device") end

local dev = "cuda:0"

T.run("pin_memory copies into page-locked memory", function()
  local x = torch.randn(3, 5)
  local p = x:pin_memory()
  T.ok(p:is_pinned() and not x:is_pinned(), "the copy is pinned, the source is not")
  T.ok(torch.equal(p, x), "the pinned copy holds the same values")
  T.ok(p:pin_memory():data_ptr() == p:data_ptr(), "pinning a pinned tensor gives it back")
  local v = x:t():pin_memory()
  T.ok(v:is_contiguous() and torch.equal(v, x:t()), "a strided source is pinned contiguous")
  T.raises(function() x:to(dev):pin_memory() end, "pin_memory: expected a CPU tensor", "a GPU tensor is refused")
end)

T.run("DataLoader pin_memory: every tensor of a batch pinned", function()
  local X, Y = torch.randn(10, 3), torch.arange(10)
  local loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), { batch_size = 4, pin_memory = true })
  local x, y = loader:iter()()
  T.ok(x:is_pinned() and y:is_pinned(), "both tensors of the batch are pinned")
  T.ok(torch.equal(x, X:narrow(0, 0, 4)) and torch.equal(y, Y:narrow(0, 0, 4)), "with the batch's values")
end)

T.run("non-blocking copies deliver what was sent", function()
  local p = torch.empty(2 ^ 20):pin_memory()
  local outs = {}
  for i = 1, 8 do
    p:fill_(i)
    outs[i] = p:to(dev, { non_blocking = true })
    torch.C.dp_pinned_wait(p.p)   -- what TokenShards does before refilling its buffer
  end
  local ok = true
  for i = 1, 8 do ok = ok and outs[i]:eq(i):all():item() end
  T.ok(ok, "eight uploads from one buffer refilled after each arrive intact")
  local q = torch.arange(10):pin_memory()
  local g = q:cuda({ non_blocking = true })
  T.ok(g.device.type == "cuda" and torch.equal(g:cpu(), q), "cuda{non_blocking=true} uploads too")
  local f = q:to(dev, torch.float32, true)
  T.ok(f.dtype == torch.float32 and torch.equal(f:cpu(), q:float()), "another dtype falls back to a blocking copy")
  local w = torch.ones(4, { requires_grad = true })
  local y = w:pin_memory():to(dev, { non_blocking = true })
  y:sum():backward()
  T.ok(w.grad ~= nil and torch.equal(w.grad, torch.ones(4)), "gradients flow back through pin_memory and the upload")
end)

T.run("a pinned tensor freed while its copy runs stays valid for the copy", function()
  local outs = {}
  for i = 1, 20 do
    outs[i] = torch.full({ 2 ^ 18 }, i):pin_memory():to(dev, { non_blocking = true })
    collectgarbage()
  end
  local ok = true
  for i = 1, 20 do ok = ok and outs[i]:eq(i):all():item() end
  T.ok(ok, "uploads from pinned tensors released at once arrive intact")
end)

T.run("TokenShards on the GPU give the CPU's batches", function()
  local data = torch.utils.data
  local ref = dir .. "/ref/"
  local opts = { files = ref .. "tokens_u16.bin", block_size = 16, batch_size = 4, shuffle = true, seed = 3 }
  local cpu = data.TokenShards(opts)
  opts.device = dev
  local gpu = data.TokenShards(opts)
  local ok, n = true, 0
  local it = gpu:iter()
  for x, y in cpu:iter() do
    local gx, gy = it()
    n = n + 1
    ok = ok and gx.device.type == "cuda" and torch.equal(gx:cpu(), x) and torch.equal(gy:cpu(), y)
  end
  T.ok(ok and n == #cpu, "every batch of the epoch (" .. n .. ") equal on both devices")
end)

T.done_testing()
