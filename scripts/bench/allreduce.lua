-- dplua's side of scripts/bench/allreduce: all_reduce (SUM) of a float32
-- tensor of each size on every rank's device (NCCL on GPUs, Gloo on the
-- CPU), timed the way nccl-tests does: after warm-up calls, a run of calls
-- between two synchronisations, its mean. Rank 0 prints lines
-- "allreduce BYTES US" (µs per call). arg[1]: the largest size in bytes.
local torch = require("dplua")
local dist = torch.distributed
local now = torch.utils.progress.clock   -- seconds, monotonic

local gpu = torch.cuda.is_available()
dist.init_process_group(gpu and "nccl" or "gloo")
local device = gpu and ("cuda:" .. (dist.get_local_rank() or 0)) or "cpu"
if gpu then torch.cuda.set_device(device) end
local function sync() if gpu then torch.cuda.synchronize() end end
local largest = tonumber(arg[1]) or (gpu and 2 ^ 30 or 2 ^ 24)

local sizes = { 8, 64, 512, 4096, 32768, 262144, 1048576, 4194304, 16777216, 67108864, 268435456, 1073741824 }
for _, bytes in ipairs(sizes) do
  if bytes > largest then break end
  local x = torch.ones(math.floor(bytes / 4), { device = device })
  for _ = 1, 5 do dist.all_reduce(x) end
  sync()
  dist.barrier()
  local t0 = now()
  dist.all_reduce(x)
  sync()
  -- every rank must make the same number of calls: the slowest rank's
  local once = torch.tensor({ math.max(now() - t0, 1e-6) }, { dtype = torch.float64 })
  dist.all_reduce(once, dist.ReduceOp.MAX)
  local calls = math.max(5, math.min(1000, math.floor(0.2 / once:item())))
  dist.barrier()
  t0 = now()
  for _ = 1, calls do dist.all_reduce(x) end
  sync()
  local us = (now() - t0) / calls * 1e6
  if dist.get_rank() == 0 then print(string.format("allreduce %d %.2f", bytes, us)) end
  x = nil
  collectgarbage()
end
dist.destroy_process_group()
