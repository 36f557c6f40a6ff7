-- The reference workload (shared/seed/seed_ddp.py) ported line by line.
-- Launch: dplua --nproc_per_node=NUM_GPUS examples/seed.lua
-- Its one change: the backend is "nccl" where CUDA is available and "gloo"
-- otherwise (and then the tensors stay on the CPU).
local torch = require("dplua")
local nn = torch.nn
local optim = torch.optim
local dist = torch.distributed


local SimpleNN = nn.Module:extend("SimpleNN")

function SimpleNN:__init()
  self.fc1 = nn.Linear(10, 10)
  self.fc2 = nn.Linear(10, 2)
end

function SimpleNN:forward(x)
  x = torch.relu(self.fc1(x))
  return self.fc2(x)
end


local function main()
  local backend = torch.cuda.is_available() and "nccl" or "gloo"
  dist.init_process_group(backend)
  local device = torch.device(backend == "nccl" and ("cuda:" .. dist.get_rank()) or "cpu")
  local model = SimpleNN():to(device)
  model = nn.parallel.DistributedDataParallel(model)
  local criterion = nn.CrossEntropyLoss():to(device)
  local optimizer = optim.SGD(model:parameters(), { lr = 0.01 })
  local input_data = torch.rand(32, 10):to(device)
  local target_data = torch.randint(0, 2, { 32 }):to(device)
  optimizer:zero_grad()
  local outputs = model(input_data)
  local loss = criterion(outputs, target_data)
  loss:backward()
  optimizer:step()
  print(string.format("[%d] Loss: %s", dist.get_rank(), loss:item()))
end


main()
