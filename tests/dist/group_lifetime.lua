-- Run under the launcher: dplua --nproc_per_node=N tests/dist/group_lifetime.lua [store-first]
-- TAP from rank 0 (the other ranks stay silent unless something fails).
-- A group or store used after destroy_process_group, or a value that is
-- not a group, is a Lua error naming it (never a null or freed pointer
-- passed to C); destroy_process_group() also destroys new_group's groups,
-- as in PyTorch; a DistributedDataParallel over a destroyed group says so,
-- and a new default group can be made. With "store-first": the store
-- closed before its group (the order the collector may pick at exit) stays
-- open for the group until the group is freed (the group's heartbeat uses
-- the store: a freed one would be a use after free, or a hang at exit for
-- the store's timeout).
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local torch = require("dplua")
local ffi = require("ffi")
local nn, dist = torch.nn, torch.distributed

local rank = tonumber(os.getenv("RANK") or "0")
local tap = dofile(here .. "/rank_tap.lua")
local ok, raises = tap.ok, tap.raises

dist.init_process_group("gloo")
local world = dist.get_world_size()
local t = torch.ones(2)

if arg[1] == "store-first" then
  local store = dist.get_store()
  torch.C.dp_store_close(ffi.gc(store.p, nil))
  store.p = nil
  dist.all_reduce(t)
  ok(t[0]:item() == world, "the group works after its store was closed first")
  dist.barrier()
  local started = os.time()
  dist.destroy_process_group()
  ok(os.time() - started <= 2, "and destroying the group then returns at once")
else
  local everyone = {}
  for r = 0, world - 1 do everyone[#everyone + 1] = r end
  raises(function() dist.all_reduce(torch.ones(2), { group = {} }) end, "expected a process group", "a table as a group")
  raises(function() dist.barrier("default") end, "expected a process group", "a string as a group")
  raises(function() dist.all_reduce(torch.ones(2), 2.5) end, "expected a dist.ReduceOp", "an op of 2.5")
  raises(function() dist.send(torch.ones(2), 0, nil, 1.5) end, "expected a tag", "a tag of 1.5")
  raises(function() dist.recv(torch.ones(2), 0, nil, 2 ^ 40) end, "expected a tag", "a tag of 2^40")
  local st = dist.get_store()
  raises(function() st:wait({ 1 }) end, "store:wait: expected a string key, got number", "a number as a store key")
  raises(function() st:get("k", "soon") end, "store:get: expected a timeout in seconds", "a string as a timeout")
  raises(function() st:add("k", 0.5) end, "store:add: expected an integer to add", "half as a store's delta")
  raises(function() nn.parallel.DistributedDataParallel(nn.Linear(3, 2), { bucket_cap_mb = "big" }) end,
         "expected bucket_cap_mb to be a positive number", "a string as bucket_cap_mb")
  raises(function() dist.all_to_all({}, {}) end, "one tensor per rank of the group", "all_to_all of empty lists")
  local sub = dist.new_group(everyone)
  dist.all_reduce(t, { group = sub })
  ok(t[0]:item() == world, "a subgroup's all_reduce")
  -- a group of rank 0 alone: elsewhere new_group gives NON_GROUP_MEMBER,
  -- with which a collective does nothing (as in PyTorch) rather than run
  -- on the default group, and anything else is refused by name
  local solo = dist.new_group({ 0 })
  local u = torch.full({ 2 }, rank + 1)
  dist.all_reduce(u, { group = solo })
  dist.all_reduce(u, dist.ReduceOp.SUM, solo)
  dist.broadcast(u, 0, solo)
  dist.barrier(solo)
  ok(u[0]:item() == rank + 1, "all_reduce, broadcast and barrier on a group of rank 0 alone leave a tensor as it was")
  ok((rank == 0) == (solo ~= dist.GroupMember.NON_GROUP_MEMBER) and dist.get_world_size(solo) == (rank == 0 and 1 or -1)
     and dist.get_rank(solo) == (rank == 0 and 0 or -1), "new_group's answer outside the group, and its rank and size -1")
  if rank ~= 0 then
    raises(function() nn.parallel.DistributedDataParallel(nn.Linear(3, 2), { process_group = solo }) end,
           "not a member of the group", "a DDP over a group this rank is not in")
  else
    ok(true, "a DDP over a group this rank is not in (a member here)")
  end
  dist.destroy_process_group(solo)
  local ddp = nn.parallel.DistributedDataParallel(nn.Linear(3, 2))
  local store = dist.get_store()
  dist.destroy_process_group(sub)
  raises(function() dist.all_reduce(t, { group = sub }) end, "was destroyed", "a subgroup after destroying it")
  raises(function() dist.destroy_process_group(sub) end, "was destroyed", "destroying it twice")
  local sub2 = dist.new_group(everyone)
  dist.barrier()
  dist.destroy_process_group()
  raises(function() dist.all_reduce(t, { group = sub2 }) end, "was destroyed", "a subgroup after destroying the default")
  raises(function() store:set("k", "v") end, "was closed", "the store after destroying the default")
  raises(function() dist.barrier() end, "has not been initialized", "the default group after destroying it")
  -- (at world size 1 a DDP sends nothing, and steps on)
  local good, err = pcall(function() ddp(torch.rand(4, 3)):sum():backward() end)
  ok(world == 1 and good or not good and tostring(err):find("was destroyed", 1, true) ~= nil,
     "a DDP made before destroy_process_group: its backward says the group was destroyed " .. tostring(err))
  ddp = nil
  collectgarbage()
  -- a new default group may serve the port the one the DDP held served;
  -- a rank that gets there before rank 0 has closed the old store is
  -- refused by it (another generation) and retries
  for round = 1, 3 do
    dist.init_process_group("gloo")
    local u = torch.ones(2)
    dist.all_reduce(u)
    ok(u[0]:item() == world, "a new default group after destroying the one a DDP held, round " .. round)
    dist.destroy_process_group()
  end
end

if rank == 0 then print("1.." .. tap.n) end
os.exit(tap.failed and 1 or 0)
