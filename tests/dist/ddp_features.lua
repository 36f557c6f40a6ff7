-- Run under the launcher: dplua --nproc_per_node=N tests/dist/ddp_features.lua
-- TAP from rank 0 (the other ranks stay silent unless something fails).
-- no_sync accumulates locally and the next synchronised backward averages
-- the sum; an unused parameter is an error naming it unless
-- find_unused_parameters=true; state_dict keys carry the "module." prefix;
-- parameters start equal on every rank (broadcast from rank 0).
local torch = require("dplua")
local nn, dist = torch.nn, torch.distributed

dist.init_process_group("gloo")
local rank, world = dist.get_rank(), dist.get_world_size()
local n, failed = 0, false
local function ok(cond, name)
  n = n + 1
  if not cond then failed = true end
  if rank == 0 or not cond then print((cond and "ok " or "not ok ") .. n .. " - " .. name) end
end

-- every rank seeds differently: DDP must still start from rank 0's weights
torch.manual_seed(100 + rank)
local ddp = nn.parallel.DistributedDataParallel(nn.Linear(4, 3):to(torch.float64))
local w = ddp.module.weight:detach():clone()
local all = torch.empty({ world * w:numel() }, { dtype = torch.float64 })
dist.all_gather_into_tensor(all, w:reshape(-1):contiguous())
ok((all:view(world, -1) - w:reshape(1, -1)):abs():max():item() == 0, "parameters are broadcast from rank 0")

local keys = ddp:state_dict():keys()
ok(keys[1] == "module.weight" and keys[2] == "module.bias", "state_dict keys have the module. prefix")

-- no_sync: two local backward passes, then a synchronised third
torch.manual_seed(7)
local xs = {}
for i = 1, 3 do xs[i] = torch.rand(world, 2, 4, { dtype = torch.float64 }) end
ddp:no_sync(function()
  ddp(xs[1][rank]):sum():backward()
  ddp(xs[2][rank]):sum():backward()
end)
ddp(xs[3][rank]):sum():backward()
-- expected: the average over ranks of each rank's three-batch sum of gradients
local ref = nn.Linear(4, 3):to(torch.float64)
torch.no_grad(function() ref.weight:copy_(w); ref.bias:copy_(ddp.module.bias) end)
for r = 0, world - 1 do
  for i = 1, 3 do ref(xs[i][r]):sum():backward() end
end
local diff = (ddp.module.weight.grad - ref.weight.grad / world):abs():max():item()
ok(diff < 1e-12, "no_sync accumulates locally, the next backward averages (diff " .. diff .. ")")

-- unused parameters
local Two = nn.Module:extend("Two")
function Two:__init() self.used = nn.Linear(3, 2); self.unused = nn.Linear(3, 2) end
function Two:forward(x) return self.used(x) end
local strict = nn.parallel.DistributedDataParallel(Two())
local okcall, err = pcall(function() strict(torch.rand(2, 3)):sum():backward() end)
ok(not okcall and tostring(err):find("unused.weight", 1, true) ~= nil and tostring(err):find("find_unused_parameters", 1, true) ~= nil,
   "an unused parameter is an error naming it")
local lenient = nn.parallel.DistributedDataParallel(Two(), { find_unused_parameters = true })
local okcall2, err2 = pcall(function() lenient(torch.rand(2, 3)):sum():backward() end)
ok(okcall2, "find_unused_parameters=true accepts it " .. tostring(err2 or ""))
ok(lenient.module.unused.weight.grad ~= nil and lenient.module.unused.weight.grad:abs():sum():item() == 0,
   "the unused parameter gets a zero gradient")

if rank == 0 then print("1.." .. n) end
dist.destroy_process_group()
os.exit(failed and 1 or 0)
