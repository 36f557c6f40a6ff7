-- Run under the launcher: dplua --nproc_per_node=N tests/dist/collectives.lua
-- TAP from rank 0 (the other ranks print only what fails).
--
-- isend/irecv, batch_isend_irecv, scatter, gather and the object
-- collectives on Gloo, each result checked against what every rank is
-- known to contribute (rank r's values are built from r), and their
-- argument errors; with "mismatch", a gather met by a scatter. With DPLUA_TEST_BACKEND=nccl (scripts/device-check
-- multi) the tensors are on each rank's GPU.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local torch = require("dplua")
local dist = torch.distributed
local objects = require("dplua.objects")

local rank = tonumber(os.getenv("RANK") or "0")
local tap = dofile(here .. "/rank_tap.lua")
local ok, raises = tap.ok, tap.raises
local function same(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

local backend = os.getenv("DPLUA_TEST_BACKEND") or "gloo"
dist.init_process_group(backend, { timeout = 30 })
local world = dist.get_world_size()
local device = "cpu"
if backend == "nccl" then
  device = "cuda:" .. dist.get_local_rank()
  torch.cuda.set_device(device)
end
-- "mismatch": rank 0 gathers where the others scatter; DPLUA_DIST_DEBUG=1
-- must stop every rank with a message naming both calls.
if arg[1] == "mismatch" then
  local t = torch.ones(4, { device = device })
  local good, err = pcall(function()
    if rank == 0 then
      local list = {}
      for r = 1, world do list[r] = torch.zeros(4, { device = device }) end
      dist.gather(t, list, 0)
    else
      dist.scatter(t, nil, 0)
    end
  end)
  print("rank " .. rank .. ": " .. (good and "the mismatched collective returned (a bug)" or tostring(err)))
  -- rank 0 serves the store that the others' check reads: it leaves last
  local store = dist.get_store()
  store:set("mismatch/seen/" .. rank, "1")
  if rank == 0 then
    local keys = {}
    for r = 1, world - 1 do keys[r] = "mismatch/seen/" .. r end
    if #keys > 0 then store:wait(keys, 60) end
  end
  os.exit(good and 1 or 0)
end
local right, left = (rank + 1) % world, (rank - 1) % world
local function full(shape, v, dtype) return torch.full(shape, v, { dtype = dtype or torch.float32, device = device }) end
local function values(t) return t:cpu():reshape(-1):tolist() end

---------------------------------------------------------------- point to point

-- (on nccl a send may wait for its receiver on the GPU, so a rank's
-- sends and receives to one peer go in one batch there, as in PyTorch)
if world > 1 and backend ~= "nccl" then
  -- every rank isends to its right and then irecvs from its left: a posted
  -- send does not wait for its receive
  local got = full({ 5 }, -1)
  local s = dist.isend(full({ 5 }, rank), right)
  local r = dist.irecv(got, left)
  ok(r:wait() and s:wait(), "isend to the right, irecv from the left: both wait")
  ok(same(values(got), { left, left, left, left, left }), "irecv got the left neighbour's rank")
  ok(s:is_completed() and r:is_completed(), "is_completed after wait")

  -- is_completed turns true without wait (the group's finisher completes them)
  local got2 = full({ 2 }, -1)
  local s2, r2 = dist.isend(full({ 2 }, rank), right), dist.irecv(got2, left)
  local polls = 0
  while not (s2:is_completed() and r2:is_completed()) and polls < 3000 do
    os.execute("sleep 0.01")
    polls = polls + 1
  end
  ok(s2:is_completed() and r2:is_completed(), "is_completed becomes true by polling, without wait")
  r2:wait(); s2:wait()
  ok(same(values(got2), { left, left }), "and the message is there")

  -- the tutorial's ring: isend, then a blocking recv, then wait
  local from_left = full({ 3 }, 0, torch.int64)
  local req = dist.isend(full({ 3 }, 100 + rank, torch.int64), right, { tag = 7 })
  dist.recv(from_left, left, nil, 7)
  req:wait()
  ok(same(values(from_left), { 100 + left, 100 + left, 100 + left }), "isend then a blocking recv (int64, tag 7)")

end
if world > 1 then
  -- a batch: two tensors each way, told apart by their tags
  local a, b = full({ 2, 2 }, 0), full({ 4 }, 0, torch.int32)
  local works = dist.batch_isend_irecv({
    dist.P2POp(dist.irecv, b, left, nil, 2),
    dist.P2POp(dist.isend, full({ 2, 2 }, rank + 0.5), right, nil, 1),
    dist.P2POp(dist.isend, full({ 4 }, 10 * rank, torch.int32), right, { tag = 2 }),
    dist.P2POp(dist.irecv, a, left, { tag = 1 }),
  })
  ok(#works == 4, "batch_isend_irecv gives one work per op")
  for _, w in ipairs(works) do w:wait() end
  ok(same(values(a), { left + 0.5, left + 0.5, left + 0.5, left + 0.5 }) and
     same(values(b), { 10 * left, 10 * left, 10 * left, 10 * left }), "batch_isend_irecv: both tensors from the left")

end
if world > 1 and backend ~= "nccl" then
  -- p2p between collectives keeps every rank's collectives in step
  local after = full({ 1 }, 1)
  local w = dist.isend(full({ 1 }, rank), right)
  dist.all_reduce(after)
  local back = full({ 1 }, -1)
  dist.recv(back, left)
  w:wait()
  ok(values(after)[1] == world and values(back)[1] == left, "an isend, an all_reduce, then the matching recv")
end

-- an isend nobody receives fails at wait once its group's timeout passes
-- (a group of its own: the failure breaks it)
if world > 1 and backend ~= "nccl" then
  local lonely = dist.new_group(nil, { timeout = 2 })
  if rank == 0 then
    local w = dist.isend(full({ 3 }, 1), 1, { group = lonely, tag = 5 })
    raises(function() w:wait() end, "the send of 3 float32 elements to group rank 1 (tag 5) did not complete",
           "an isend without a receiver fails at wait, naming the send")
  end
  dist.barrier()
  dist.destroy_process_group(lonely)
end

raises(function() dist.isend(full({ 2 }, 0), rank) end, "cannot send to itself", "isend to itself")
raises(function() dist.isend(full({ 2 }, 0), world) end, "out of range", "isend to a rank out of range")
raises(function() dist.irecv(full({ 2 }, 0)) end, "pass src", "irecv without src")
raises(function() dist.isend(full({ 2 }, 0), right, { tag = -1 }) end, "tag must be in", "a negative tag")
raises(function() dist.batch_isend_irecv({}) end, "non-empty list of dist.P2POp", "an empty batch")
raises(function() dist.batch_isend_irecv({ { tensor = full({ 1 }, 0) } }) end, "entry 1 is not a dist.P2POp",
       "a batch entry that is not a P2POp")
raises(function() dist.P2POp(dist.send, full({ 1 }, 0), right) end, "expected dist.isend or dist.irecv",
       "P2POp with dist.send")

---------------------------------------------------------------- scatter and gather

local src = world - 1
do
  local list
  if rank == src then
    list = {}
    for r = 0, world - 1 do list[r + 1] = full({ 2, 3 }, 10 * r + 1) end
  end
  local t = full({ 2, 3 }, -1)
  dist.scatter(t, list, src)
  ok(same(values(t), { 10 * rank + 1, 10 * rank + 1, 10 * rank + 1, 10 * rank + 1, 10 * rank + 1, 10 * rank + 1 }),
     "scatter from the last rank: rank r gets its 2x3 tensor of 10r + 1")
  local ints
  if rank == 0 then
    ints = {}
    for r = 0, world - 1 do ints[r + 1] = torch.arange(3 * r, 3 * r + 3, { dtype = torch.int64, device = device }) end
  end
  local mine = full({ 3 }, 0, torch.int64)
  local w = dist.scatter(mine, ints, 0, { async_op = true })
  w:wait()
  ok(same(values(mine), { 3 * rank, 3 * rank + 1, 3 * rank + 2 }), "scatter of int64 from rank 0 with async_op")
end

do
  local dst = world > 1 and 1 or 0
  local gl
  if rank == dst then
    gl = {}
    for r = 1, world do gl[r] = full({ 4 }, -1) end
  end
  dist.gather(torch.arange(0, 4, { dtype = torch.float32, device = device }) + 100 * rank, gl, dst)
  if rank == dst then
    local good = true
    for r = 0, world - 1 do good = good and same(values(gl[r + 1]), { 100 * r, 100 * r + 1, 100 * r + 2, 100 * r + 3 }) end
    ok(good, "gather to rank " .. dst .. ": entry r + 1 is rank r's tensor")
  else
    ok(gl == nil, "gather on a rank that is not the destination leaves nothing")
  end
  local g2
  if rank == 0 then
    g2 = {}
    for r = 1, world do g2[r] = full({ 1, 2 }, 0) end
  end
  local w = dist.gather(full({ 1, 2 }, rank * 2), g2, 0, { async_op = true })
  w:wait()
  if rank == 0 then
    local good = true
    for r = 0, world - 1 do good = good and same(values(g2[r + 1]), { 2 * r, 2 * r }) end
    ok(good, "gather with async_op: the list is filled by wait()")
  else
    ok(true, "gather with async_op")
  end
end

-- errors found on the rank that makes them: on a group of rank 0 alone,
-- so that no other rank waits in the collective
local solo = dist.new_group({ 0 })
if rank == 0 then
  local t = full({ 2 }, 0)
  raises(function() dist.gather(t, { t, t }, 0, solo) end, "gather_list has 2 tensors but the group has 1 ranks",
         "gather_list of the wrong length")
  raises(function() dist.gather(t, { torch.zeros(2, { dtype = torch.float64, device = device }) }, 0, solo) end,
         "gather_list[1] is float64 but the tensor is float32", "gather_list of the wrong dtype")
  raises(function() dist.scatter(t, { full({ 3 }, 0) }, 0, solo) end, "scatter_list[1] has 3 elements but the tensor has 2",
         "scatter_list of the wrong size")
  raises(function() dist.gather(t, nil, 0, solo) end, "expected gather_list", "gather without gather_list on the destination")
  raises(function() dist.scatter_object_list({}, { 1, 2 }, 0, solo) end,
         "scatter_object_input_list has 2 objects but the group has 1 ranks", "scatter_object_list of the wrong length")
  raises(function() dist.gather(t, { t }, 1, solo) end, "not a member of the group", "a destination outside the group")
  local out = {}
  dist.all_gather_object(out, { 1, "two" }, solo)
  ok(out[1][2] == "two", "an object collective on a group of one")
end
-- the group queries
local all = {}
for r = 0, world - 1 do all[#all + 1] = r end
ok(same(dist.get_process_group_ranks(), all), "get_process_group_ranks of the default group: every rank")
local tail_ranks = {}
for r = 1, world - 1 do tail_ranks[#tail_ranks + 1] = r end
local tail_group = dist.new_group(tail_ranks)
if rank >= 1 then
  ok(same(dist.get_process_group_ranks(tail_group), tail_ranks), "get_process_group_ranks of a subgroup")
  ok(dist.get_global_rank(tail_group, 0) == 1, "get_global_rank: the subgroup's rank 0 is global rank 1")
  ok(dist.get_group_rank(tail_group, rank) == rank - 1, "get_group_rank")
  raises(function() dist.get_global_rank(tail_group, world) end, "is not part of the group", "a group rank out of range")
else
  for _ = 1, 4 do ok(true, "subgroup queries (rank 0 is outside)") end
end
-- subgroups of consecutive ranks, and one by enumeration
if world % 2 == 0 then
  local mine, all = dist.new_subgroups(2)
  ok(#all == world / 2 and dist.get_world_size(mine) == 2 and dist.get_rank(mine) == rank % 2,
     "new_subgroups(2): world / 2 groups, this rank in its pair")
  local t = full({ 1 }, rank)
  dist.all_reduce(t, dist.ReduceOp.SUM, mine)
  local first = rank - rank % 2
  ok(values(t)[1] == first + first + 1, "all_reduce within the pair sums the pair's ranks")
else
  raises(function() dist.new_subgroups(2) end, "the world size " .. world .. " is not divisible by group_size 2",
         "new_subgroups: a size that does not divide the world")
  ok(true, "new_subgroups (odd world)")
end
do
  local evens, odds = {}, {}
  for r = 0, world - 1 do if r % 2 == 0 then evens[#evens + 1] = r else odds[#odds + 1] = r end end
  local mine, all = dist.new_subgroups_by_enumeration({ evens, odds })
  ok(#all == 2 and dist.get_process_group_ranks(mine)[1] == rank % 2, "new_subgroups_by_enumeration: evens and odds")
  raises(function() dist.new_subgroups_by_enumeration({ { 0 }, { 0, 1 } }) end, "rank 0 is in more than one subgroup",
         "new_subgroups_by_enumeration: overlapping lists")
end
ok(dist.group.WORLD ~= nil and same(dist.get_process_group_ranks(dist.group.WORLD), all) and dist.Backend.GLOO == "gloo",
   "dist.group.WORLD is the default group; dist.Backend")
-- PrefixStore over the job's store: rank 0 writes, every rank reads through the same prefix
do
  local ps = dist.PrefixStore("trial7", dist.get_store())
  if rank == 0 then ps:set("lr", "0.01") end
  ok(ps:get("lr") == "0.01" and dist.get_store():get("trial7/lr") == "0.01", "PrefixStore: keys under prefix/")
  ps:add("arrived", 1)
  ps:wait({ "lr" })
  dist.barrier()
  ok(ps:add("arrived", 0) == world and ps:check({ "lr", "arrived" }), "PrefixStore: add, wait and check")
  local hs = dist.HashStore()
  hs:set("a", 1)
  ok(hs:get("a") == "1" and hs:add("n", 2) == 2 and hs:add("n", 3) == 5 and hs:num_keys() == 2 and hs:delete_key("a")
     and not hs:check({ "a" }), "HashStore: set, get, add, num_keys, delete_key, check")
  raises(function() hs:get("missing") end, "key 'missing' is not set", "HashStore: a missing key is an error at once")
end
ok(dist.is_gloo_available() and dist.is_torchelastic_launched(), "is_gloo_available, is_torchelastic_launched")
dist.monitored_barrier()
ok(true, "monitored_barrier")
raises(function() dist.gather(full({ 2 }, 0), nil, world + 3) end, "out of range", "gather to a rank out of range")
raises(function() dist.scatter(full({ 2 }, 0), nil, -1) end, "out of range", "scatter from rank -1")

---------------------------------------------------------------- objects

local function my_object(r)
  return { rank = r, name = "rank " .. r, even = r % 2 == 0, ratio = r / 3, list = { 1, 2, { r, "x" } },
           t = torch.arange(0, 3, { dtype = torch.float64 }) * r, [7] = "seven", big = 2 ^ 53 + 2 * r }
end
local function same_object(o, r)
  local want = my_object(r)
  return type(o) == "table" and o.rank == r and o.name == want.name and o.even == want.even and o.ratio == want.ratio and
         o.list[3][1] == r and o.list[3][2] == "x" and #o.list == 3 and o[7] == "seven" and o.big == want.big and
         torch.is_tensor(o.t) and o.t.dtype == torch.float64 and same(o.t:tolist(), want.t:tolist())
end

do
  local out = {}
  dist.all_gather_object(out, my_object(rank))
  local good = #out == world
  for r = 0, world - 1 do good = good and same_object(out[r + 1], r) end
  ok(good, "all_gather_object: entry r + 1 is rank r's table (numbers, strings, booleans, nested tables, a tensor)")

  local sizes = {}
  dist.all_gather_object(sizes, string.rep("x", 10 * rank))
  local good2 = true
  for r = 0, world - 1 do good2 = good2 and sizes[r + 1] == string.rep("x", 10 * r) end
  ok(good2, "all_gather_object of strings of different lengths")

  local list = rank == src and { "a", { x = 1 }, 3.25, false } or {}
  dist.broadcast_object_list(list, src)
  ok(#list == 4 and list[1] == "a" and list[2].x == 1 and list[3] == 3.25 and list[4] == false,
     "broadcast_object_list from the last rank into an empty list")
  local same_len = rank == 0 and { 1, 2 } or { "old", "old" }
  dist.broadcast_object_list(same_len, 0)
  ok(same_len[1] == 1 and same_len[2] == 2, "broadcast_object_list into a list of the same length")

  local gathered = rank == src and {} or nil
  dist.gather_object({ rank = rank }, gathered, src)
  if rank == src then
    local good3 = true
    for r = 0, world - 1 do good3 = good3 and gathered[r + 1].rank == r end
    ok(good3, "gather_object to the last rank")
  else
    ok(true, "gather_object from this rank")
  end

  local got = {}
  local input = nil
  if rank == 0 then
    input = {}
    for r = 0, world - 1 do input[r + 1] = { for_rank = r, pad = string.rep("p", r * 5) } end
  end
  dist.scatter_object_list(got, input, 0)
  ok(got[1].for_rank == rank and got[1].pad == string.rep("p", rank * 5), "scatter_object_list from rank 0")
end

raises(function() dist.all_gather_object({}, { f = print }) end, "is a function, which cannot be sent",
       "an object holding a function")
local cyclic = {}
cyclic.self = cyclic
raises(function() dist.all_gather_object({}, cyclic) end, "a cycle", "a cyclic table")
raises(function() dist.all_gather_object({}, torch.nn.Linear(2, 2)) end, "a table with a metatable",
       "a module as an object")
raises(function() dist.all_gather_object(nil, 1) end, "expected object_list to be a list", "no object_list")
raises(function() dist.gather_object(1, {}, world + 3) end, "out of range", "gather_object to a rank out of range")
-- received bytes are data: code in a string stays a string, bad bytes are an error
ok(objects.decode(objects.encode("os.exit(3)")) == "os.exit(3)", "a string of Lua code decodes as that string")
raises(function() objects.decode("s5:abc") end, "malformed bytes", "truncated bytes")
raises(function() objects.decode("Xs5:evil!1:2:s0:") end, "unknown dtype", "a tensor of an unknown dtype")
raises(function() objects.decode("q") end, "unknown tag", "an unknown tag")
local d = objects.decode(objects.encode({ inf = math.huge, nan = 0 / 0, neg = -0.0, tiny = 5e-324 }))
ok(d.inf == math.huge and d.nan ~= d.nan and 1 / d.neg == -math.huge and d.tiny == 5e-324,
   "numbers survive exactly (inf, nan, -0, denormals)")

dist.barrier()
dist.destroy_process_group()
if rank == 0 then print("1.." .. tap.n) end
