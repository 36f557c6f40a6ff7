-- restart_train.lua DIR [FAIL_AT]: two ranks train a linear model for 10
-- steps (gradients all-reduced by hand, each step's batch drawn from a
-- seed of its own), rank 0 saving a checkpoint after every step. On the
-- first start (TORCHELASTIC_RESTART_COUNT=0) rank 1 exits with status 3
-- after step FAIL_AT; a start finding the checkpoint resumes from it. Rank
-- 0 prints the final weights. Run by tests/sh/test_restarts.sh under
-- `dplua --nproc_per_node=2 --max_restarts=N`.
local torch = require("dplua")
local dist = torch.distributed
local dir, fail_at = arg[1], tonumber(arg[2])
dist.init_process_group(os.getenv("DPLUA_TEST_BACKEND") or "gloo", { timeout = 30 })
local rank, world = dist.get_rank(), dist.get_world_size()
local restart = tonumber(os.getenv("TORCHELASTIC_RESTART_COUNT"))
local ckpt = dir .. "/ckpt.safetensors"

torch.manual_seed(0)
local w = torch.randn(4, 1, { dtype = torch.float64 })
local first = 1
local f = io.open(ckpt, "rb")
if f then
  f:close()
  local sd = torch.load(ckpt)
  w:copy_(sd.w)
  first = math.floor(sd.step:item()) + 1
end
print(string.format("rank %d: start %d from step %d", rank, restart, first))

for step = first, 10 do
  torch.manual_seed(1000 * step + rank)
  local x = torch.randn(8, 4, { dtype = torch.float64 })
  local y = x:sum(1, true)
  local grad = x:t():matmul(x:matmul(w) - y) * (2 / 8)
  dist.all_reduce(grad)
  w:sub_(grad * (0.05 / world))
  if rank == 0 then torch.save({ w = w, step = torch.tensor({ step }, { dtype = torch.float64 }) }, ckpt) end
  dist.barrier()
  if restart == 0 and rank == 1 and step == fail_at then
    io.stderr:write("rank 1: failing on purpose after step ", step, "\n")
    os.exit(3)
  end
end
if rank == 0 then
  local out = {}
  for i, v in ipairs(w:reshape(-1):tolist()) do out[i] = string.format("%.17g", v) end
  print("final " .. table.concat(out, " "))
end
dist.destroy_process_group()
