-- dplua.distributed: torch.distributed for Lua, and DistributedDataParallel.
--
--   local dist = torch.distributed
--   dist.init_process_group("gloo")            -- env:// (RANK, WORLD_SIZE, ...)
--   dist.all_reduce(t)                          -- SUM by default, in place
--
-- The rendezvous follows PyTorch's env:// contract, also reading mpirun's
-- (OMPI_COMM_WORLD_*) and Slurm's (SLURM_*) variables; with none of them
-- set the process is a world of one. Rank 0 serves the store (src/dist);
-- under torchrun (TORCHELASTIC_USE_AGENT_STORE=True) the agent already
-- serves PyTorch's TCPStore on MASTER_PORT, and we speak its protocol.
-- Collectives run in C on the group's worker; errors (a timeout, a dead
-- peer, mismatched collectives) are raised at the caller's line.
local ffi = require("ffi")
local torch = require("dplua")
local C = torch.C
local raise = torch._raise
local is_tensor = torch.is_tensor

local dist = {}

-- The reductions of collectives: dplua.h's dp_redop values (AVG is DP_MEAN).
dist.ReduceOp = { SUM = tonumber(C.DP_SUM), AVG = tonumber(C.DP_MEAN), MAX = tonumber(C.DP_MAX),
                  MIN = tonumber(C.DP_MIN), PRODUCT = tonumber(C.DP_PROD) }
dist.ReduceOp.PROD = dist.ReduceOp.PRODUCT
local reduce_ops = {}
for _, v in pairs(dist.ReduceOp) do reduce_ops[v] = true end

local DEFAULT_TIMEOUT = 300

local state = { pg = nil, store = nil, rank = 0, world_size = 1, local_rank = 0, backend = nil, groups = {},
                subgroups = setmetatable({}, { __mode = "k" }) }   -- new_group's, alive: destroyed with the default

local function check(st)
  if st ~= 0 then raise(ffi.string(C.dp_last_error())) end
end

local function env_int(...)
  for _, name in ipairs({ ... }) do
    local v = os.getenv(name)
    if v and v ~= "" then
      local n = tonumber(v)
      if not n or n % 1 ~= 0 then raise(string.format("init_process_group: %s=%q is not an integer", name, v)) end
      return n
    end
  end
end

---------------------------------------------------------------- store

local store_box = ffi.new("dp_store*[1]")
local value_box, len_box = ffi.new("void*[1]"), ffi.new("size_t[1]")
local i64_box = ffi.new("int64_t[1]")

local Store = {}
Store.__index = Store

local function wrap_store(p) return setmetatable({ p = ffi.gc(p, C.dp_store_close) }, Store) end

-- The store's pointer, checked: destroy_process_group closes the default
-- group's store, and an object kept from dist.get_store() then says so.
local function store_p(self)
  if getmetatable(self) ~= Store then raise("store: expected a store (call it as store:set(...)), got " .. type(self)) end
  if self.p == nil then raise("store: this store was closed (destroy_process_group closes the default group's)") end
  return self.p
end

-- TCPStore(host, port [, world_size, is_master, timeout_s]), as in PyTorch.
function dist.TCPStore(host, port, world_size, is_master, timeout)
  if type(host) ~= "string" then raise("TCPStore: expected a host name, got " .. type(host)) end
  if type(port) ~= "number" or port % 1 ~= 0 or port < 0 or port > 65535 then
    raise("TCPStore: expected a port number in [0, 65535], got " .. tostring(port))
  end
  if world_size ~= nil and (type(world_size) ~= "number" or world_size % 1 ~= 0) then
    raise("TCPStore: expected the world size as an integer (or nil), got " .. tostring(world_size))
  end
  -- (no DPLUA_JOB_TOKEN: the server writes a private token file, the clients read it)
  local token = os.getenv("DPLUA_JOB_TOKEN") or ""
  check(C.dp_store_open(store_box, host, port, is_master and 1 or 0, -1, world_size or 0, token, 0,
                        timeout or DEFAULT_TIMEOUT))
  return wrap_store(store_box[0])
end

local function take_value()
  local s = ffi.string(value_box[0], len_box[0])
  C.dp_free(value_box[0])
  return s
end

-- A store's keys are strings, its timeouts seconds, as in PyTorch.
local function store_key(key, fn)
  if type(key) ~= "string" then raise(string.format("store:%s: expected a string key, got %s", fn, type(key))) end
  return key
end
local function store_timeout(timeout, fn)
  if timeout == nil then return DEFAULT_TIMEOUT end
  if type(timeout) ~= "number" or timeout ~= timeout then
    raise(string.format("store:%s: expected a timeout in seconds, got %s", fn, tostring(timeout)))
  end
  return timeout
end

function Store:set(key, value)
  value = tostring(value)
  check(C.dp_store_set(store_p(self), store_key(key, "set"), value, #value))
end
function Store:get(key, timeout)
  check(C.dp_store_get(store_p(self), store_key(key, "get"), value_box, len_box, store_timeout(timeout, "get")))
  return take_value()
end
function Store:add(key, delta)
  if delta ~= nil and (type(delta) ~= "number" or delta % 1 ~= 0 or delta < -2 ^ 63 or delta >= 2 ^ 63) then
    raise("store:add: expected an integer to add, got " .. tostring(delta))
  end
  check(C.dp_store_add(store_p(self), store_key(key, "add"), delta or 1, i64_box))
  return tonumber(i64_box[0])
end
function Store:compare_set(key, expected, desired)
  expected, desired = tostring(expected), tostring(desired)
  check(C.dp_store_compare_set(store_p(self), store_key(key, "compare_set"), expected, #expected, desired, #desired,
                               value_box, len_box))
  return take_value()
end
local function key_array(keys, fn)
  if type(keys) == "string" then keys = { keys } end
  if type(keys) ~= "table" then raise(string.format("store:%s: expected a key or a list of keys, got %s", fn, type(keys))) end
  local arr = ffi.new("const char*[?]", #keys)
  for i, k in ipairs(keys) do arr[i - 1] = store_key(k, fn) end
  return arr, #keys, keys
end
function Store:wait(keys, timeout)
  local arr, n, hold = key_array(keys, "wait")
  check(C.dp_store_wait(store_p(self), arr, n, store_timeout(timeout, "wait")))
  return hold ~= nil
end
function Store:check(keys)
  local arr, n, hold = key_array(keys, "check")
  local out = ffi.new("int[1]")
  check(C.dp_store_check(store_p(self), arr, n, out))
  return hold ~= nil and out[0] ~= 0
end
function Store:delete_key(key)
  local out = ffi.new("int[1]")
  check(C.dp_store_delete(store_p(self), store_key(key, "delete_key"), out))
  return out[0] ~= 0
end
function Store:port() return C.dp_store_port(store_p(self)) end

-- PrefixStore(prefix, store): store's calls with every key read as
-- "prefix/key", as PyTorch's (a namespace per use of one store).
local PrefixStore = {}
PrefixStore.__index = PrefixStore
function dist.PrefixStore(prefix, store)
  if type(prefix) ~= "string" then raise("PrefixStore: expected a string prefix, got " .. type(prefix)) end
  if type(store) ~= "table" or type(store.set) ~= "function" then
    raise("PrefixStore: expected a store (TCPStore, HashStore, PrefixStore or dist.get_store()), got " .. type(store))
  end
  return setmetatable({ prefix = prefix, store = store }, PrefixStore)
end
local function prefixed(self, key, fn)
  if getmetatable(self) ~= PrefixStore then raise("store: expected a store (call it as store:" .. fn .. "(...))") end
  return self.prefix .. "/" .. store_key(key, fn)
end
local function prefixed_keys(self, keys, fn)
  if type(keys) == "string" then keys = { keys } end
  if type(keys) ~= "table" then raise(string.format("store:%s: expected a key or a list of keys, got %s", fn, type(keys))) end
  local out = {}
  for i, k in ipairs(keys) do out[i] = prefixed(self, k, fn) end
  return out
end
for _, fn in ipairs({ "set", "get", "add", "compare_set", "delete_key" }) do
  PrefixStore[fn] = function(self, key, ...) return self.store[fn](self.store, prefixed(self, key, fn), ...) end
end
function PrefixStore:wait(keys, timeout) return self.store:wait(prefixed_keys(self, keys, "wait"), timeout) end
function PrefixStore:check(keys) return self.store:check(prefixed_keys(self, keys, "check")) end

-- HashStore(): a store in this process's memory (a table), with the calls
-- of the others; nothing else can set a key while get or wait waits, so a
-- missing key is an error at once.
local HashStore = {}
HashStore.__index = HashStore
function dist.HashStore() return setmetatable({ values = {} }, HashStore) end
local function hash_values(self, fn)
  if getmetatable(self) ~= HashStore then raise("store: expected a store (call it as store:" .. fn .. "(...))") end
  return self.values
end
local function missing(key)
  raise("HashStore: key '" .. key .. "' is not set, and nothing else in this process can set it while get or wait waits")
end
function HashStore:set(key, value) hash_values(self, "set")[store_key(key, "set")] = tostring(value) end
function HashStore:get(key)
  local v = hash_values(self, "get")[store_key(key, "get")]
  if v == nil then missing(key) end
  return v
end
function HashStore:add(key, delta)
  local values = hash_values(self, "add")
  if delta ~= nil and (type(delta) ~= "number" or delta % 1 ~= 0) then
    raise("store:add: expected an integer to add, got " .. tostring(delta))
  end
  local now = tonumber(values[store_key(key, "add")] or "0")
  if now == nil then raise("store:add: key '" .. key .. "' holds a value that is not a number") end
  values[key] = tostring(now + (delta or 1))
  return now + (delta or 1)
end
function HashStore:compare_set(key, expected, desired)
  local values = hash_values(self, "compare_set")
  local now = values[store_key(key, "compare_set")]
  expected, desired = tostring(expected), tostring(desired)
  if (now == nil and expected == "") or now == expected then values[key] = desired; return desired end
  return now or expected
end
function HashStore:wait(keys)
  if type(keys) == "string" then keys = { keys } end
  for _, k in ipairs(keys) do if hash_values(self, "wait")[store_key(k, "wait")] == nil then missing(k) end end
  return true
end
function HashStore:check(keys)
  if type(keys) == "string" then keys = { keys } end
  for _, k in ipairs(keys) do if hash_values(self, "check")[store_key(k, "check")] == nil then return false end end
  return true
end
function HashStore:delete_key(key)
  local values = hash_values(self, "delete_key")
  local had = values[store_key(key, "delete_key")] ~= nil
  values[key] = nil
  return had
end
function HashStore:num_keys()
  local n = 0
  for _ in pairs(hash_values(self, "num_keys")) do n = n + 1 end
  return n
end

---------------------------------------------------------------- rendezvous

-- rank, world size, local rank and master address from the environment
local function rendezvous_env(opts)
  local rank = opts.rank or env_int("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")
  local world = opts.world_size or env_int("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")
  local local_rank = env_int("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID")
  local addr, port = os.getenv("MASTER_ADDR"), env_int("MASTER_PORT")
  local method = opts.init_method or "env://"
  local h, p = method:match("^tcp://([^:]+):(%d+)$")
  if h then addr, port = h, tonumber(p)
  elseif method ~= "env://" then
    raise("init_process_group: unsupported init_method '" .. method .. "' (expected env:// or tcp://host:port)")
  end
  if rank == nil and world == nil then
    -- no launcher: a world of one process with a private store
    return { rank = 0, world_size = 1, local_rank = 0, addr = "127.0.0.1", port = 0, alone = true }
  end
  if rank == nil or world == nil then
    raise("init_process_group: found " .. (rank and "RANK" or "WORLD_SIZE") .. " but not " ..
          (rank and "WORLD_SIZE" or "RANK") .. " in the environment; set both (the launcher does: dplua --nproc_per_node=N)")
  end
  if world < 1 or rank < 0 or rank >= world then
    raise(string.format("init_process_group: rank %d is out of range for world size %d", rank, world))
  end
  if world > 1 and (not addr or not port) then
    raise("init_process_group: MASTER_ADDR and MASTER_PORT must be set for env:// with world size " .. world)
  end
  return { rank = rank, world_size = world, local_rank = local_rank or rank, addr = addr or "127.0.0.1", port = port or 0 }
end

-- init_process_group's stores opened by this process: their generation
local inits = 0

-- A token for a store of one process: random, when /dev/urandom is there.
local function private_token()
  local f = io.open("/dev/urandom", "rb")
  local bytes = f and f:read(16) or tostring(os.time()) .. tostring({})
  if f then f:close() end
  return (bytes:gsub(".", function(c) return string.format("%02x", c:byte()) end))
end

local function open_store(env, timeout)
  if os.getenv("TORCHELASTIC_USE_AGENT_STORE") == "True" and not env.alone then
    check(C.dp_store_open_torch(store_box, env.addr, env.port, timeout))
  else
    -- (the generation: a rank that re-initialises before rank 0 has
    -- closed the last group's store is refused by it and retries)
    local token = os.getenv("DPLUA_JOB_TOKEN") or ""
    if env.alone then token = private_token() end   -- nobody else joins: no token file
    check(C.dp_store_open(store_box, env.addr, env.port, env.rank == 0 and 1 or 0, env.rank, env.world_size, token,
                          inits + 1, timeout))
  end
  inits = inits + 1   -- (not on a failure: a retry under pcall stays in step with the other ranks)
  return wrap_store(store_box[0])
end

local Group = {}
Group.__index = Group
Group.__tostring = function(g) return string.format("ProcessGroup(%s, rank %d of %d)", g.backend, g.rank, g.size) end

local pg_box = ffi.new("dp_pg*[1]")

local function make_group(backend, rank, size, timeout, name, ranks)
  local arr = nil
  if ranks then
    arr = ffi.new("int[?]", #ranks)
    for i, r in ipairs(ranks) do arr[i - 1] = r end
  end
  check(C.dp_pg_new(pg_box, state.store.p, backend, rank, size, timeout, name, arr))
  return setmetatable({ p = ffi.gc(pg_box[0], C.dp_pg_free), backend = backend, rank = rank, size = size,
                        ranks = ranks }, Group)
end

local function check_backend(backend)
  if backend == "nccl" then
    if not torch.cuda.is_available() then
      raise("init_process_group: ProcessGroupNCCL is only supported with GPUs, no GPUs found! " ..
            "(use backend \"gloo\" for CPU tensors)")
    end
  elseif backend ~= "gloo" then
    raise("init_process_group: unknown backend '" .. tostring(backend) .. "' (expected \"nccl\" or \"gloo\")")
  end
end

-- In the distributed REPL, a line typed as `:on 0,2 CODE` runs on some
-- ranks only (dplua.repl's `only` names them): a collective there would
-- wait for ranks that never call it, so it is refused at once. (Point to
-- point send and recv between those ranks still work.)
local function all_ranks_run(fn)
  local repl = package.loaded["dplua.repl"]
  local only = type(repl) == "table" and rawget(repl, "only")
  if only then
    raise(string.format("%s: this line was typed with ':on %s', so it runs on some ranks only, but a " ..
                        "collective needs every rank of the group; type it without :on", fn, tostring(only)))
  end
end

-- init_process_group(backend [, opts]) or init_process_group{backend=, init_method=, rank=, world_size=, timeout=}
function dist.init_process_group(backend, opts)
  all_ranks_run("init_process_group")
  if type(backend) == "table" then opts, backend = backend, backend.backend end
  opts = opts or {}
  if state.pg then raise("init_process_group: trying to initialize the default process group twice") end
  backend = backend or (torch.cuda.is_available() and "nccl" or "gloo")
  check_backend(backend)
  local timeout = opts.timeout or tonumber(os.getenv("DPLUA_DIST_TIMEOUT")) or DEFAULT_TIMEOUT
  local env = rendezvous_env(opts)
  state.store = open_store(env, timeout)
  state.rank, state.world_size, state.local_rank = env.rank, env.world_size, env.local_rank
  state.backend, state.timeout = backend, timeout
  -- (a later initialisation's keys apart from the last's, in a store that
  -- outlives it: torchrun's agent store)
  state.pg = make_group(backend, env.rank, env.world_size, timeout, inits > 1 and "default." .. inits or "default", nil)
end

-- The group a call runs on (nil: the default one), checked: a value that
-- is not a group, or a group destroyed, would reach C as a null pointer.
-- new_group's answer on a rank outside the group, as PyTorch's
-- GroupMember.NON_GROUP_MEMBER: a collective given it does nothing there
-- (and says so once a call's name, on stderr), get_rank and
-- get_world_size give -1, and anything else refuses it by name.
local NON_MEMBER = setmetatable({}, { __tostring = function() return "GroupMember.NON_GROUP_MEMBER" end })
dist.GroupMember = setmetatable({ NON_GROUP_MEMBER = NON_MEMBER }, {
  __index = function(_, k) if k == "WORLD" then return state.pg end end,
})

-- dist.group.WORLD (PyTorch's name for the default group) and the backends' names
dist.group = dist.GroupMember
dist.Backend = { GLOO = "gloo", NCCL = "nccl", UNDEFINED = "undefined" }

local said_outside = {}
local function outside(group, fn)
  if group ~= NON_MEMBER then return false end
  if not said_outside[fn] then
    said_outside[fn] = true
    io.stderr:write(string.format("dplua: %s on global rank %d, which is not a member of the given group " ..
                                  "(new_group gave it GroupMember.NON_GROUP_MEMBER): nothing done, as in PyTorch\n",
                                  fn, state.rank))
  end
  return true
end

local function group_of(group)
  if group == NON_MEMBER then
    raise("this rank is not a member of the group (new_group gave it GroupMember.NON_GROUP_MEMBER)")
  end
  if group == nil then
    if not state.pg then
      raise("Default process group has not been initialized, please make sure to call init_process_group.")
    end
    group = state.pg
  end
  if getmetatable(group) ~= Group then
    raise("expected a process group (from init_process_group or new_group), got " ..
          (torch.is_tensor(group) and "a tensor" or type(group) .. " " .. tostring(group)))
  end
  if group.p == nil then raise("this process group was destroyed (destroy_process_group)") end
  return group
end

function dist.is_available() return true end
function dist.is_initialized() return state.pg ~= nil end
function dist.get_rank(group) return group == NON_MEMBER and -1 or group_of(group).rank end
function dist.get_world_size(group) return group == NON_MEMBER and -1 or group_of(group).size end
function dist.get_local_rank() group_of(); return state.local_rank end
function dist.get_backend(group) return group_of(group).backend end
function dist.get_store() group_of(); return state.store end

-- new_group(ranks): every rank calls it; members get a group, others nil.
function dist.new_group(ranks, opts)
  all_ranks_run("new_group")
  local world = group_of()
  opts = opts or {}
  local backend = opts.backend or state.backend
  state.groups.n = (state.groups.n or 0) + 1
  local name = "group" .. state.groups.n
  if ranks == nil then
    ranks = {}
    for r = 0, world.size - 1 do ranks[#ranks + 1] = r end
  end
  local mine
  for i, r in ipairs(ranks) do
    if type(r) ~= "number" or r < 0 or r >= world.size or r % 1 ~= 0 then
      raise("new_group: rank " .. tostring(r) .. " is out of range for world size " .. world.size)
    end
    if r == world.rank then mine = i - 1 end
  end
  if mine == nil then return NON_MEMBER end
  local g = make_group(backend, mine, #ranks, opts.timeout or state.timeout, name, ranks)
  state.subgroups[g] = true
  return g
end

-- new_subgroups_by_enumeration(ranks_per_subgroup_list [, opts]): a group
-- for each list of ranks (every rank calls it with the same lists; a rank
-- is in at most one), as PyTorch: this rank's subgroup (NON_GROUP_MEMBER
-- if it is in none) and the list of them all.
function dist.new_subgroups_by_enumeration(lists, opts)
  local fn = "new_subgroups_by_enumeration"
  if type(lists) ~= "table" or #lists == 0 then raise(fn .. ": expected a non-empty list of lists of ranks") end
  local seen = {}
  for i, ranks in ipairs(lists) do
    if type(ranks) ~= "table" then raise(string.format("%s: expected entry %d to be a list of ranks", fn, i)) end
    for _, r in ipairs(ranks) do
      if seen[r] then raise(string.format("%s: rank %s is in more than one subgroup", fn, tostring(r))) end
      seen[r] = true
    end
  end
  local mine, all = NON_MEMBER, {}
  for i, ranks in ipairs(lists) do
    all[i] = dist.new_group(ranks, opts)
    if all[i] ~= NON_MEMBER then mine = all[i] end
  end
  return mine, all
end

-- new_subgroups([group_size [, opts]]): the world cut into groups of
-- group_size consecutive ranks (by default the ranks of a node:
-- LOCAL_WORLD_SIZE, as PyTorch's default of the GPUs on a machine).
function dist.new_subgroups(group_size, opts)
  local fn = "new_subgroups"
  local world = group_of().size
  group_size = group_size or tonumber(os.getenv("LOCAL_WORLD_SIZE") or "") or world
  if type(group_size) ~= "number" or group_size % 1 ~= 0 or group_size < 1 or group_size > world then
    raise(string.format("%s: expected group_size to be an integer from 1 to the world size %d, got %s", fn, world,
                        tostring(group_size)))
  end
  if world % group_size ~= 0 then
    raise(string.format("%s: the world size %d is not divisible by group_size %d", fn, world, group_size))
  end
  local lists = {}
  for first = 0, world - 1, group_size do
    local ranks = {}
    for r = first, first + group_size - 1 do ranks[#ranks + 1] = r end
    lists[#lists + 1] = ranks
  end
  return dist.new_subgroups_by_enumeration(lists, opts)
end

-- destroy_process_group(group) destroys that group; with no group, the
-- default one, every group made by new_group and the store, as in
-- PyTorch. The groups' objects in Lua keep their tables, without a
-- pointer: later calls with them say that they were destroyed. (In C a
-- group lives on while a DistributedDataParallel uses it, and the store
-- while a group does.)
local function free_group(g)
  C.dp_pg_free(ffi.gc(g.p, nil)); g.p = nil
  state.subgroups[g] = nil
end

function dist.destroy_process_group(group)
  if group == NON_MEMBER then return end
  if group ~= nil and group ~= state.pg then
    free_group(group_of(group))
    return
  end
  for g in pairs(state.subgroups) do if g.p ~= nil then free_group(g) end end
  if state.pg then free_group(state.pg) end
  if state.store and state.store.p ~= nil then C.dp_store_close(ffi.gc(state.store.p, nil)); state.store.p = nil end
  state.pg, state.store, state.backend = nil, nil, nil
end

---------------------------------------------------------------- collectives

local Work = {}
Work.__index = Work
function Work:wait()
  if not self.done then
    self.done = true
    local st = C.dp_work_wait(self.p)
    if st ~= 0 then raise(ffi.string(C.dp_last_error())) end
  end
  -- (a collective whose result is copied out once it is there: gather's list)
  local after = self.after
  if after then self.after = nil; after() end
  return true
end
function Work:is_completed() return self.done or C.dp_work_is_completed(self.p) ~= 0 end

local work_box = ffi.new("dp_work*[1]")

-- Runs cfn(pg, <n arguments>, work_ptr_or_nil); returns a Work for
-- async_op. (The count is explicit: Lua truncates `...` in the middle of
-- an argument list to one value.)
local function call(cfn, pg, n, a, b, c, w)
  if n == 1 then return cfn(pg, a, w) elseif n == 2 then return cfn(pg, a, b, w) end
  return cfn(pg, a, b, c, w)
end

local function collective(fn, group, async_op, cfn, n, a, b, c)
  all_ranks_run(fn)
  local g = group_of(group)
  if async_op then
    check(call(cfn, g.p, n, a, b, c, work_box))
    return setmetatable({ p = ffi.gc(work_box[0], C.dp_work_free) }, Work)
  end
  check(call(cfn, g.p, n, a, b, c, nil))
end

-- Roots and peers are global ranks, as in PyTorch; the C layer takes the
-- rank within the group.
local function group_rank(group, global, fn)
  local g = group_of(group)
  if type(global) ~= "number" or global % 1 ~= 0 then
    raise(string.format("%s: expected a rank number, got %s", fn, tostring(global)))
  end
  if not g.ranks then return global end
  for i, r in ipairs(g.ranks) do
    if r == global then return i - 1 end
  end
  raise(string.format("%s: global rank %d is not a member of the group (ranks %s)", fn, global,
                      table.concat(g.ranks, ", ")))
end

local function contiguous_tensor(t, fn)
  if not is_tensor(t) then raise(fn .. ": expected a tensor, got " .. type(t)) end
  if not t:is_contiguous() then raise(fn .. ": tensors must be contiguous (call :contiguous() first)") end
  return t
end

local function reduce_op(op, fn)
  if op == nil then return dist.ReduceOp.SUM end
  if not reduce_ops[op] then
    raise(fn .. ": expected a dist.ReduceOp (SUM, AVG, MAX, MIN, PRODUCT), got " .. tostring(op))
  end
  return op
end

-- Options come as positional PyTorch arguments or a trailing table:
-- all_reduce(t, op, group, async_op) or all_reduce(t, {op=, group=, async_op=}).
local function opts_of(a, names)
  if type(a[1]) == "table" and not is_tensor(a[1]) and getmetatable(a[1]) ~= Group and a[1] ~= NON_MEMBER then
    return a[1]
  end
  local o = {}
  for i, n in ipairs(names) do o[n] = a[i] end
  return o
end

-- The collectives from one contiguous tensor t into another, out:
-- cfn(out, t), or cfn(out, t, op) for one that reduces.
local function pair_collective(fn, o, cfn, out, t, reduces)
  if outside(o.group, fn) then return end
  contiguous_tensor(out, fn); contiguous_tensor(t, fn)
  if reduces then return collective(fn, o.group, o.async_op, cfn, 3, out.p, t.p, reduce_op(o.op, fn)) end
  return collective(fn, o.group, o.async_op, cfn, 2, out.p, t.p)
end

function dist.all_reduce(t, ...)
  local o = opts_of({ ... }, { "op", "group", "async_op" })
  if outside(o.group, "all_reduce") then return end
  contiguous_tensor(t, "all_reduce")
  return collective("all_reduce", o.group, o.async_op, C.dp_pg_all_reduce, 2, t.p, reduce_op(o.op, "all_reduce"))
end

function dist.broadcast(t, src, ...)
  local o = opts_of({ ... }, { "group", "async_op" })
  if outside(o.group, "broadcast") then return end
  contiguous_tensor(t, "broadcast")
  return collective("broadcast", o.group, o.async_op, C.dp_pg_broadcast, 2, t.p,
                    group_rank(o.group, src or 0, "broadcast"))
end

function dist.reduce(t, dst, ...)
  local o = opts_of({ ... }, { "op", "group", "async_op" })
  if outside(o.group, "reduce") then return end
  contiguous_tensor(t, "reduce")
  return collective("reduce", o.group, o.async_op, C.dp_pg_reduce, 3, t.p, group_rank(o.group, dst or 0, "reduce"),
                    reduce_op(o.op, "reduce"))
end

function dist.all_gather_into_tensor(out, t, ...)
  local o = opts_of({ ... }, { "group", "async_op" })
  return pair_collective("all_gather_into_tensor", o, C.dp_pg_all_gather, out, t)
end

-- all_gather(list, t): list gets one tensor per rank (existing tensors are filled)
function dist.all_gather(list, t, ...)
  local o = opts_of({ ... }, { "group", "async_op" })
  if outside(o.group, "all_gather") then return end
  local g = group_of(o.group)
  contiguous_tensor(t, "all_gather")
  if type(list) ~= "table" then raise("all_gather: expected a table for the output list") end
  local shape = t:size()
  local flat = torch.empty({ g.size * t:numel() }, { dtype = t.dtype, device = t.device })
  collective("all_gather", g, false, C.dp_pg_all_gather, 2, flat.p, t.p)
  for r = 0, g.size - 1 do
    local piece = flat:narrow(0, r * t:numel(), t:numel()):view(shape)
    if list[r + 1] then list[r + 1]:copy_(piece) else list[r + 1] = piece end
  end
  if o.async_op then return setmetatable({ done = true }, Work) end
end

function dist.reduce_scatter_tensor(out, t, ...)
  local o = opts_of({ ... }, { "op", "group", "async_op" })
  return pair_collective("reduce_scatter_tensor", o, C.dp_pg_reduce_scatter, out, t, true)
end

function dist.reduce_scatter(out, list, ...)
  if outside(opts_of({ ... }, { "op", "group", "async_op" }).group, "reduce_scatter") then return end
  if type(list) ~= "table" or #list == 0 then raise("reduce_scatter: expected a non-empty list of input tensors") end
  local flat = torch.cat(list, 0):contiguous()
  return dist.reduce_scatter_tensor(out, flat:view(-1):view(flat:size()), ...)
end

function dist.all_to_all_single(out, t, ...)
  local o = opts_of({ ... }, { "output_split_sizes", "input_split_sizes", "group", "async_op" })
  if o.output_split_sizes or o.input_split_sizes then
    raise("all_to_all_single: uneven splits are not supported; use equal splits along dim 0")
  end
  return pair_collective("all_to_all_single", o, C.dp_pg_all_to_all, out, t)
end

function dist.all_to_all(out_list, in_list, ...)
  local o = opts_of({ ... }, { "group", "async_op" })
  if outside(o.group, "all_to_all") then return end
  if type(out_list) ~= "table" or type(in_list) ~= "table" or #out_list ~= #in_list then
    raise("all_to_all: expected output and input lists of the same length (one tensor per rank)")
  end
  local size = group_of(o.group).size
  if #in_list ~= size then
    raise(string.format("all_to_all: expected one tensor per rank of the group (%d), got %d", size, #in_list))
  end
  local inp = torch.cat(in_list, 0):contiguous()
  local out = torch.empty(inp:size(), { dtype = inp.dtype, device = inp.device })
  collective("all_to_all", o.group, false, C.dp_pg_all_to_all, 2, out.p, inp.p)
  local at = 0
  for i, dst in ipairs(out_list) do
    local n = dst:size(0)
    dst:copy_(out:narrow(0, at, n))
    at = at + n
  end
end

-- A message tag: an integer that C's int holds (0 when not given).
local function tag_of(tag, fn)
  if tag == nil then return 0 end
  if type(tag) ~= "number" or tag % 1 ~= 0 or tag < -2 ^ 31 or tag >= 2 ^ 31 then
    raise(string.format("%s: expected a tag that is an integer of 32 bits, got %s", fn, tostring(tag)))
  end
  return tag
end

function dist.send(t, dst, group, tag)
  if outside(group, "send") then return end
  contiguous_tensor(t, "send")
  check(C.dp_pg_send(group_of(group).p, t.p, group_rank(group, dst, "send"), tag_of(tag, "send")))
end

function dist.recv(t, src, group, tag)
  if outside(group, "recv") then return -1 end
  contiguous_tensor(t, "recv")
  if src == nil then raise("recv: receiving from any source is not supported; pass src") end
  check(C.dp_pg_recv(group_of(group).p, t.p, group_rank(group, src, "recv"), tag_of(tag, "recv")))
  return src
end

function dist.barrier(group)
  if outside(group, "barrier") then return end
  all_ranks_run("barrier")
  check(C.dp_pg_barrier(group_of(group).p))
end
-- monitored_barrier([group, timeout, wait_all_ranks]): barrier, which here
-- always fails by name and with the group's timeout when a rank does not
-- come (timeout and wait_all_ranks are accepted)
function dist.monitored_barrier(group) return dist.barrier(group) end

-- the global ranks of a group, in its order (every rank for the default one)
function dist.get_process_group_ranks(group)
  local g = group_of(group)
  if g.ranks then return { unpack(g.ranks) } end
  local all = {}
  for r = 0, g.size - 1 do all[#all + 1] = r end
  return all
end
-- get_global_rank(group, group_rank) and get_group_rank(group, global_rank)
function dist.get_global_rank(group, group_rank)
  local ranks = dist.get_process_group_ranks(group)
  local r = ranks[(group_rank or -1) + 1]
  if r == nil then raise(string.format("get_global_rank: group rank %s is not part of the group", tostring(group_rank))) end
  return r
end
function dist.get_group_rank(group, global_rank)
  for i, r in ipairs(dist.get_process_group_ranks(group)) do
    if r == global_rank then return i - 1 end
  end
  raise(string.format("get_group_rank: global rank %s is not part of the group", tostring(global_rank)))
end
function dist.is_gloo_available() return true end
function dist.is_nccl_available() return torch.cuda.is_available() end
-- whether the job was started by a launcher (dplua's or torchrun): the
-- variables they set
function dist.is_torchelastic_launched()
  return os.getenv("TORCHELASTIC_RUN_ID") ~= nil or os.getenv("DPLUA_JOB_TOKEN") ~= nil
end

-- isend, irecv and batch_isend_irecv: sends and receives posted in issue
-- order with the group's other ops, each batch done as a whole. A posted
-- send does not wait for its receiver, so two ranks may each isend to the
-- other and then receive. (On nccl, a batch is one NCCL group call: pair
-- a rank's sends and receives to one peer in one batch_isend_irecv.)
local function post_p2p(fn, ops, group)
  local g = group_of(group)
  local n = #ops
  local ts, sends = ffi.new("dp_tensor*[?]", n), ffi.new("int[?]", n)
  local peers, tags = ffi.new("int[?]", n), ffi.new("int[?]", n)
  for i, o in ipairs(ops) do
    contiguous_tensor(o.tensor, fn)
    ts[i - 1], sends[i - 1] = o.tensor.p, o.send and 1 or 0
    peers[i - 1] = group_rank(group, o.peer, fn)
    tags[i - 1] = tag_of(o.tag, fn)
  end
  check(C.dp_pg_p2p(g.p, n, ts, sends, peers, tags, work_box))
  return ffi.gc(work_box[0], C.dp_work_free)
end

-- isend(t, dst [, group, tag]) or isend(t, dst, {group=, tag=}): a Work.
function dist.isend(t, dst, ...)
  local o = opts_of({ ... }, { "group", "tag" })
  if outside(o.group, "isend") then return end
  if dst == nil then raise("isend: expected the destination rank (dst)") end
  return setmetatable({ p = post_p2p("isend", { { tensor = t, peer = dst, tag = o.tag, send = true } }, o.group) }, Work)
end

-- irecv(t, src [, group, tag]) or irecv(t, src, {group=, tag=}): a Work; t holds the message once it is waited.
function dist.irecv(t, src, ...)
  local o = opts_of({ ... }, { "group", "tag" })
  if outside(o.group, "irecv") then return end
  if src == nil then raise("irecv: receiving from any source is not supported; pass src") end
  return setmetatable({ p = post_p2p("irecv", { { tensor = t, peer = src, tag = o.tag, send = false } }, o.group) }, Work)
end

-- P2POp(dist.isend or dist.irecv, tensor, peer [, group, tag]) or with an
-- options table after peer: one op of batch_isend_irecv.
local P2POp = {}
P2POp.__index = P2POp
P2POp.__tostring = function(p)
  return string.format("P2POp(%s, peer %d, tag %d)", p.send and "isend" or "irecv", p.peer, p.tag or 0)
end
function dist.P2POp(op, tensor, peer, group, tag)
  if op ~= dist.isend and op ~= dist.irecv then
    raise("P2POp: expected dist.isend or dist.irecv as the op, got " .. tostring(op))
  end
  if type(group) == "table" and getmetatable(group) == nil and not is_tensor(group) and group ~= NON_MEMBER then
    group, tag = group.group, group.tag
  end
  if not is_tensor(tensor) then raise("P2POp: expected a tensor, got " .. type(tensor)) end
  if type(peer) ~= "number" then raise("P2POp: expected the peer's rank, got " .. tostring(peer)) end
  return setmetatable({ send = op == dist.isend, tensor = tensor, peer = peer, group = group, tag = tag }, P2POp)
end

-- batch_isend_irecv(list of P2POp): the ops posted together, as one; a
-- list of one Work per op (waiting on any one waits for the whole batch).
function dist.batch_isend_irecv(ops)
  if type(ops) ~= "table" or #ops == 0 then raise("batch_isend_irecv: expected a non-empty list of dist.P2POp") end
  for i, o in ipairs(ops) do
    if getmetatable(o) ~= P2POp then
      raise(string.format("batch_isend_irecv: entry %d is not a dist.P2POp (got %s)", i, tostring(o)))
    end
    if o.group ~= ops[1].group then raise("batch_isend_irecv: every op of a batch must use the same group") end
  end
  if outside(ops[1].group, "batch_isend_irecv") then return {} end
  local p = post_p2p("batch_isend_irecv", ops, ops[1].group)
  local works = {}
  for i = 1, #ops do works[i] = setmetatable({ p = p }, Work) end
  return works
end

-- The list argument of gather (the output) and scatter (the input): on the
-- root one tensor per rank, each shaped like t; on the other ranks nil or
-- empty, as in PyTorch.
local function root_list(fn, name, list, t, g, root)
  if g.rank ~= root then
    if list ~= nil and not (type(list) == "table" and not is_tensor(list) and #list == 0) then
      raise(string.format("%s: %s must not be given on a rank other than the %s (global rank %s)", fn, name,
                          fn == "gather" and "destination" or "source", tostring((g.ranks or {})[root + 1] or root)))
    end
    return nil
  end
  if type(list) ~= "table" or is_tensor(list) then
    raise(string.format("%s: expected %s, a list of one tensor per rank of the group (%d), on this rank", fn, name,
                        g.size))
  end
  if #list ~= g.size then
    raise(string.format("%s: %s has %d tensors but the group has %d ranks (one tensor per rank)", fn, name, #list,
                        g.size))
  end
  for i, x in ipairs(list) do
    if not is_tensor(x) then raise(string.format("%s: %s[%d] is %s, not a tensor", fn, name, i, type(x))) end
    if x.dtype ~= t.dtype then
      raise(string.format("%s: %s[%d] is %s but the tensor is %s; they must have one dtype", fn, name, i,
                          x.dtype.name, t.dtype.name))
    end
    if x:numel() ~= t:numel() then
      raise(string.format("%s: %s[%d] has %d elements but the tensor has %d; they must have one size", fn, name, i,
                          x:numel(), t:numel()))
    end
  end
  return list
end

-- gather(t, gather_list, dst [, group, async_op]): the destination's
-- gather_list[r + 1] gets group rank r's t.
function dist.gather(t, gather_list, dst, ...)
  local o = opts_of({ ... }, { "group", "async_op" })
  if outside(o.group, "gather") then return end
  local g = group_of(o.group)
  contiguous_tensor(t, "gather")
  local root = group_rank(o.group, dst or 0, "gather")
  local list = root_list("gather", "gather_list", gather_list, t, g, root)
  local flat = list and torch.empty({ g.size * t:numel() }, { dtype = t.dtype, device = t.device })
  local work = collective("gather", o.group, o.async_op, C.dp_pg_gather, 3, flat and flat.p or nil, t.p, root)
  local function fill()
    if not list then return end
    for r = 0, g.size - 1 do list[r + 1]:copy_(flat:narrow(0, r * t:numel(), t:numel()):view(list[r + 1]:size())) end
  end
  if work then work.after = fill; return work end
  fill()
end

-- scatter(t, scatter_list, src [, group, async_op]): t gets the source's
-- scatter_list[r + 1] on group rank r.
function dist.scatter(t, scatter_list, src, ...)
  local o = opts_of({ ... }, { "group", "async_op" })
  if outside(o.group, "scatter") then return end
  local g = group_of(o.group)
  contiguous_tensor(t, "scatter")
  local root = group_rank(o.group, src or 0, "scatter")
  local list = root_list("scatter", "scatter_list", scatter_list, t, g, root)
  local flat
  if list then
    local parts = {}
    for i, x in ipairs(list) do parts[i] = x:reshape({ -1 }) end
    flat = torch.cat(parts, 0):contiguous()
  end
  return collective("scatter", o.group, o.async_op, C.dp_pg_scatter, 3, t.p, flat and flat.p or nil, root)
end

-- The object collectives: values as bytes (dplua.objects: numbers,
-- strings, booleans, tensors and tables of them; decoded as data, never
-- run), sent in uint8 tensors on the group's device: the CPU for gloo,
-- the current CUDA device for nccl. Each sends the sizes first.
local objects = require("dplua.objects")

local function object_device(g)
  if g.backend == "nccl" then return "cuda:" .. torch.cuda.current_device() end
  return "cpu"
end

local function bytes_tensor(s, len, device)
  local t = torch.zeros({ len }, { dtype = torch.uint8 })
  if #s > 0 then ffi.copy(C.dp_tensor_data(t.p), s, #s) end
  return device == "cpu" and t or t:to(device)
end

local function tensor_bytes(t, offset, len)
  if len == 0 then return "" end
  local c = t:narrow(0, offset, len):cpu():contiguous()
  return ffi.string(C.dp_tensor_data(c.p), len)
end

local function int64s(values, device)
  local t = torch.tensor(values, { dtype = torch.int64 })
  return device == "cpu" and t or t:to(device)
end

-- The group rank of an object collective's root, checked on every rank
-- before anything that only the root or only the others check.
local function object_root(fn, group, g, global)
  local r = group_rank(group, global, fn)
  if r < 0 or r >= g.size then
    raise(string.format("%s: rank %d is out of range for a group of %d ranks", fn, r, g.size))
  end
  return r
end

local function object_list_arg(fn, name, list)
  if type(list) ~= "table" or is_tensor(list) or getmetatable(list) ~= nil then
    raise(string.format("%s: expected %s to be a list (a plain table), got %s", fn, name,
                        is_tensor(list) and "a tensor" or type(list)))
  end
  return list
end

-- Every rank's encoded object, each padded to the longest: the lengths and that longest.
local function gathered_lengths(s, g, group, device)
  local lens = torch.empty({ g.size }, { dtype = torch.int64, device = device })
  dist.all_gather_into_tensor(lens, int64s({ #s }, device), group)
  local list = lens:tolist()
  local longest = 0
  for _, n in ipairs(list) do longest = math.max(longest, n) end
  return list, longest
end

-- all_gather_object(object_list, obj [, group]): object_list[r + 1] gets group rank r's obj.
function dist.all_gather_object(object_list, obj, group)
  if outside(group, "all_gather_object") then return end
  local g = group_of(group)
  object_list_arg("all_gather_object", "object_list", object_list)
  local s, device = objects.encode(obj), object_device(g)
  local lens, longest = gathered_lengths(s, g, group, device)
  local all = torch.empty({ g.size * longest }, { dtype = torch.uint8, device = device })
  dist.all_gather_into_tensor(all, bytes_tensor(s, longest, device), group)
  for r = 0, g.size - 1 do object_list[r + 1] = objects.decode(tensor_bytes(all, r * longest, lens[r + 1])) end
end

-- gather_object(obj, object_gather_list, dst [, group]): on dst,
-- object_gather_list[r + 1] gets group rank r's obj; nil elsewhere.
function dist.gather_object(obj, object_gather_list, dst, group)
  if outside(group, "gather_object") then return end
  local g = group_of(group)
  local root = object_root("gather_object", group, g, dst or 0)
  if g.rank == root then
    object_list_arg("gather_object", "object_gather_list", object_gather_list)
  elseif object_gather_list ~= nil then
    raise("gather_object: object_gather_list must not be given on a rank other than the destination")
  end
  local s, device = objects.encode(obj), object_device(g)
  local lens, longest = gathered_lengths(s, g, group, device)
  local all = g.rank == root and torch.empty({ g.size * longest }, { dtype = torch.uint8, device = device }) or nil
  check(C.dp_pg_gather(g.p, all and all.p or nil, bytes_tensor(s, longest, device).p, root, nil))
  if all then
    for r = 0, g.size - 1 do object_gather_list[r + 1] = objects.decode(tensor_bytes(all, r * longest, lens[r + 1])) end
  end
end

-- broadcast_object_list(object_list, src [, group]): the other ranks'
-- object_list gets src's entries, in place. Their list may be empty, else
-- it must have as many entries as src's (as in PyTorch).
function dist.broadcast_object_list(object_list, src, group)
  if outside(group, "broadcast_object_list") then return end
  local g = group_of(group)
  object_list_arg("broadcast_object_list", "object_list", object_list)
  src = src or 0
  local root = object_root("broadcast_object_list", group, g, src)
  local device = object_device(g)
  local s = g.rank == root and objects.encode(object_list) or ""
  local header = int64s({ #s, #object_list }, device)
  dist.broadcast(header, src, group)
  local len, count = unpack(header:tolist())
  local bytes = bytes_tensor(s, len, device)
  dist.broadcast(bytes, src, group)
  if g.rank == root then return end
  if #object_list ~= 0 and #object_list ~= count then
    raise(string.format("broadcast_object_list: rank %d sent %d objects but this rank's object_list has %d " ..
                        "(pass a list of the same length, or an empty one)", src, count, #object_list))
  end
  local got = objects.decode(tensor_bytes(bytes, 0, len))
  for k in pairs(object_list) do object_list[k] = nil end
  for k, v in pairs(got) do object_list[k] = v end
end

-- scatter_object_list(output_list, input_list, src [, group]):
-- output_list[1] gets src's input_list[r + 1] on group rank r. input_list
-- is read on src only, where it has one object per rank.
function dist.scatter_object_list(output_list, input_list, src, group)
  if outside(group, "scatter_object_list") then return end
  local g = group_of(group)
  object_list_arg("scatter_object_list", "scatter_object_output_list", output_list)
  src = src or 0
  local root = object_root("scatter_object_list", group, g, src)
  local device = object_device(g)
  local encoded, longest = {}, 0
  if g.rank == root then
    object_list_arg("scatter_object_list", "scatter_object_input_list", input_list)
    if #input_list ~= g.size then
      raise(string.format("scatter_object_list: scatter_object_input_list has %d objects but the group has %d " ..
                          "ranks (one object per rank)", #input_list, g.size))
    end
    for i = 1, g.size do
      encoded[i] = objects.encode(input_list[i])
      longest = math.max(longest, #encoded[i])
    end
  end
  local header = int64s({ longest }, device)
  dist.broadcast(header, src, group)
  longest = header:tolist()[1]
  local lens, flat
  if g.rank == root then
    local ls = {}
    for i = 1, g.size do ls[i] = #encoded[i] end
    lens = int64s(ls, device)
    local parts = {}
    for i = 1, g.size do parts[i] = bytes_tensor(encoded[i], longest, device) end
    flat = torch.cat(parts, 0)
  end
  local my_len = torch.empty({ 1 }, { dtype = torch.int64, device = device })
  check(C.dp_pg_scatter(g.p, my_len.p, lens and lens.p or nil, root, nil))
  local mine = torch.empty({ longest }, { dtype = torch.uint8, device = device })
  check(C.dp_pg_scatter(g.p, mine.p, flat and flat.p or nil, root, nil))
  output_list[1] = objects.decode(tensor_bytes(mine, 0, my_len:tolist()[1]))
end

-- torch.distributed.nn.functional: collectives that autograd
-- differentiates. all_reduce(t [, op, group]) returns the sum over the
-- group of a copy of t (SUM only); its backward all_reduces the gradient.
dist.nn = { functional = {} }
local diff_box = ffi.new("dp_tensor*[1]")
function dist.nn.functional.all_reduce(t, op, group)
  if type(op) == "table" and getmetatable(op) == nil then op, group = op.op, op.group end
  if op ~= nil and op ~= dist.ReduceOp.SUM then
    raise("nn.functional.all_reduce: only ReduceOp.SUM is differentiable here, got " .. tostring(op))
  end
  if not is_tensor(t) then raise("nn.functional.all_reduce: expected a tensor, got " .. type(t)) end
  all_ranks_run("all_reduce")
  check(C.dp_pg_all_reduce_autograd(diff_box, group_of(group).p, t.p))
  return torch._wrap(diff_box[0])
end

---------------------------------------------------------------- DistributedDataParallel

local ddp_box = ffi.new("dp_ddp*[1]")

local function make_ddp_class()
  local nn = torch.nn
  local DDP = nn.Module:extend("DistributedDataParallel")

  -- DistributedDataParallel(module, {device_ids=, bucket_cap_mb=25, find_unused_parameters=false,
  --                                  broadcast_buffers=true, process_group=, sharding_strategy="NO_SHARD"})
  -- sharding_strategy="SHARD_GRAD_OP": each rank keeps its shard of the
  -- gradients (ZeRO-2, with dist.optim.ZeroRedundancyOptimizer; see dplua.distributed_zero).
  function DDP:__init(module, opts)
    opts = opts or {}
    if type(module) ~= "table" or not module.parameters then
      raise("DistributedDataParallel: expected an nn.Module to wrap, got " .. type(module))
    end
    local g = group_of(opts.process_group)
    self.module = module
    rawset(self, "_group", g)
    rawset(self, "_broadcast_buffers", opts.broadcast_buffers ~= false)
    local names, params = {}, {}
    for name, p in module:named_parameters() do
      if p.requires_grad then names[#names + 1] = name; params[#params + 1] = p end
    end
    self:_check_shapes(params, names)
    local n = #params
    local parr, narr = ffi.new("dp_tensor*[?]", n), ffi.new("const char*[?]", n)
    for i = 1, n do parr[i - 1] = params[i].p; narr[i - 1] = names[i] end
    local cap_mb = opts.bucket_cap_mb or 25
    if type(cap_mb) ~= "number" or not (cap_mb * 1024 * 1024 >= 1 and cap_mb < 2 ^ 40) then
      raise("DistributedDataParallel: expected bucket_cap_mb to be a positive number of megabytes (at least one " ..
            "byte, less than 2^40), got " .. tostring(cap_mb))
    end
    local cap = cap_mb * 1024 * 1024
    check(C.dp_ddp_new(ddp_box, g.p, n, parr, narr, math.min(1024 * 1024, cap), cap,
                       opts.find_unused_parameters and 1 or 0))
    rawset(self, "_reducer", ffi.gc(ddp_box[0], C.dp_ddp_free))
    rawset(self, "_names", names)
    require("dplua.distributed_zero").attach_ddp(self, opts.sharding_strategy)
    -- every rank starts from rank 0's parameters and buffers
    if g.size > 1 then
      local flat = torch._wrap(C.dp_ddp_flat_param(self._reducer))
      torch.no_grad(function() dist.broadcast(flat, g.ranks and g.ranks[1] or 0, g) end)
      self:_sync_buffers()
    end
  end

  -- Every rank must hold the same parameter shapes: compare a digest of
  -- them across ranks before anything is broadcast.
  function DDP:_check_shapes(params, names)
    local g = self._group
    if g.size == 1 then return end
    local desc = {}
    for i, p in ipairs(params) do desc[i] = names[i] .. table.concat(p:size(), "x") .. tostring(p.dtype) end
    local text = table.concat(desc, ";")
    local h = 5381
    for i = 1, #text do h = (h * 33 + text:byte(i)) % 2147483647 end
    -- an nccl group takes CUDA tensors: the digests go on the parameters' device
    local device = g.backend == "nccl" and (params[1] and params[1].device or object_device(g)) or "cpu"
    local mine = torch.tensor({ #params, h }, { dtype = torch.int64 }):to(device)
    local all = torch.empty({ 2 * g.size }, { dtype = torch.int64, device = device })
    dist.all_gather_into_tensor(all, mine, g)
    local v = all:cpu():tolist()
    for r = 0, g.size - 1 do
      if v[2 * r + 1] ~= #params or v[2 * r + 2] ~= h then
        raise(string.format("DistributedDataParallel: rank %d has different parameters than rank %d " ..
                            "(%d vs %d parameter tensors, or different shapes); every rank must build the same model",
                            r, g.rank, v[2 * r + 1], #params))
      end
    end
  end

  function DDP:_sync_buffers()
    local g = self._group
    if g.size == 1 or not self._broadcast_buffers then return end
    for _, b in ipairs(self.module:buffers()) do
      torch.no_grad(function() dist.broadcast(b, g.ranks and g.ranks[1] or 0, g) end)
    end
  end

  function DDP:forward(...)
    require("dplua.distributed_zero").ddp_forward(self)   -- (Join's notification)
    self:_sync_buffers()
    return self.module(...)
  end

  -- no_sync(fn): gradients of backward passes inside fn accumulate locally.
  function DDP:no_sync(fn)
    C.dp_ddp_set_sync(self._reducer, 0)
    rawset(self, "_no_sync", true)
    local ok, err = pcall(fn)
    rawset(self, "_no_sync", nil)
    C.dp_ddp_set_sync(self._reducer, 1)
    if not ok then error(err, 0) end
  end

  function DDP:num_buckets() return C.dp_ddp_num_buckets(self._reducer) end

  -- register_comm_hook(state, hook): how the buckets are averaged; hook is
  -- one of dist.algorithms.ddp_comm_hooks.default_hooks: allreduce_hook
  -- (the gradients' dtype) or bf16_compress_hook (cast to bfloat16, averaged,
  -- cast back: half the bytes). The reducer runs in C, so a hook of one's
  -- own (a Lua function) is refused.
  function DDP:register_comm_hook(state, hook)
    local hooks = require("dplua.distributed_zero").default_hooks
    local fn = "DistributedDataParallel.register_comm_hook"
    if hook == hooks.fp16_compress_hook then
      raise(fn .. ": dplua has no float16; use ddp_comm_hooks.default_hooks.bf16_compress_hook")
    end
    local dtype
    if hook == hooks.allreduce_hook then dtype = -1
    elseif hook == hooks.bf16_compress_hook then dtype = torch.bfloat16.id
    else
      raise(fn .. ": expected one of dist.algorithms.ddp_comm_hooks.default_hooks (allreduce_hook, " ..
            "bf16_compress_hook), got " .. tostring(hook) .. "; the reducer runs in C and calls no Lua hook")
    end
    check(C.dp_ddp_set_comm_dtype(self._reducer, dtype))
    rawset(self, "_comm_state", state)
  end

  -- clip_grad_norm_(max_norm [, norm_type=2]): of the averaged gradients,
  -- also when they are sharded (SHARD_GRAD_OP; see dplua.distributed_zero).
  function DDP:clip_grad_norm_(max_norm, norm_type)
    return require("dplua.distributed_zero").ddp_clip_grad_norm_(self, max_norm, norm_type)
  end

  -- join(fn): dist.algorithms.Join({self}, fn), for uneven inputs.
  function DDP:join(fn) return dist.algorithms.Join({ self }, fn) end

  return DDP
end

local ddp_class
function dist._ddp_class()
  ddp_class = ddp_class or make_ddp_class()
  return ddp_class
end

-- dist.optim (ZeroRedundancyOptimizer), dist.algorithms (Join) and
-- dist.fsdp (ShardingStrategy) live in dplua.distributed_zero.
setmetatable(dist, { __index = function(_, k)
  if k == "optim" or k == "algorithms" or k == "fsdp" then return require("dplua.distributed_zero").exports[k] end
end })

return dist
