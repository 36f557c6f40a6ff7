-- test_pg_collectives.lua -- process groups over Gloo (src/dist/pg.c,
-- gloo.cc) through the C API: every collective for every dtype at world
-- sizes 2 and 4 against a reference each rank computes itself, async
-- works, subgroups, argument errors, and the failures that must end in an
-- error instead of a hang: mismatched collectives with DPLUA_DIST_DEBUG,
-- by the stall check and at a short timeout, a killed peer, a rank that never arrives, a dead store.
--
-- Run as a test, this file is the launcher: for each scenario it starts
-- WORLD copies of itself (RANK, WORLD_SIZE, MASTER_ADDR, DPLUA_JOB_TOKEN
-- and DPLUA_PG_SCENARIO in the environment), each bounded by `timeout`,
-- and turns what they print ("ok - name" / "not ok - name") into TAP.
-- Rank 0 opens the store on a free port (port 0) and writes the port to a
-- file that the other ranks read, so no fixed port is needed.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local dir = os.getenv("DPLUA_TEST_DIR") or (here .. "/..")
package.path = dir .. "/lua/?.lua;" .. package.path
local torch = require("dplua")
local ffi = require("ffi")
local C = torch.C

pcall(ffi.cdef, [[
typedef struct { long tv_sec; long tv_nsec; } pgtest_timespec;
int clock_gettime(int clk, pgtest_timespec *ts);
int usleep(unsigned int usec);
void _exit(int status);
]])
local ts = ffi.new("pgtest_timespec")
local function now()
  C.clock_gettime(1, ts)   -- CLOCK_MONOTONIC
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end
local function sleep(s) C.usleep(math.floor(s * 1e6)) end

-- the reductions that collectives take, dplua.h's dp_redop (AVG is DP_MEAN)
local SUM, AVG, MAX, MIN, PRODUCT = C.DP_SUM, C.DP_MEAN, C.DP_MAX, C.DP_MIN, C.DP_PROD
local op_names = { [SUM] = "SUM", [AVG] = "AVG", [MAX] = "MAX", [MIN] = "MIN", [PRODUCT] = "PRODUCT" }
local dtypes = { "float32", "float64", "int64", "int32", "uint8", "bool", "bfloat16" }
local floating = { float32 = true, float64 = true, bfloat16 = true }

---------------------------------------------------------------- the launcher

local scenario = os.getenv("DPLUA_PG_SCENARIO")

if not scenario then
  local T = require("tap")
  local prog = os.getenv("top_builddir") and (os.getenv("top_builddir") .. "/dplua") or arg[-1]
  local script = arg[0]

  -- Starts `world` ranks of this script on scenario `name`; returns each
  -- rank's output and exit status (124: killed by timeout).
  local function spawn(name, world, env, limit)
    local base = os.tmpname()
    local token = ("pgtest-%d-%d"):format(os.time(), math.random(1, 1e9))
    local cmd = {}
    for r = 0, world - 1 do
      local vars = ("RANK=%d WORLD_SIZE=%d LOCAL_RANK=%d MASTER_ADDR=127.0.0.1 MASTER_PORT=0 " ..
                    "DPLUA_JOB_TOKEN=%s DPLUA_PG_SCENARIO=%s DPLUA_PG_PORTFILE=%s.port %s")
        :format(r, world, r, token, name, base, env or "DPLUA_DIST_DEBUG=0")
      cmd[#cmd + 1] = ("( env %s timeout -k 5 %d '%s' '%s' > %s.out%d 2>&1; echo $? > %s.rc%d ) &")
        :format(vars, limit, prog, script, base, r, base, r)
    end
    os.execute(table.concat(cmd, " ") .. " wait")
    local res = {}
    for r = 0, world - 1 do
      local f = io.open(("%s.out%d"):format(base, r))
      local out = f and f:read("*a") or ""
      if f then f:close() end
      f = io.open(("%s.rc%d"):format(base, r))
      local rc = f and tonumber(f:read("*l")) or -1
      if f then f:close() end
      res[r] = { out = out, rc = rc }
      os.remove(("%s.out%d"):format(base, r)); os.remove(("%s.rc%d"):format(base, r))
    end
    os.remove(base); os.remove(base .. ".port")
    return res
  end

  -- One TAP line per "ok"/"not ok" line a rank printed, plus its exit status.
  local function run(name, world, opts)
    opts = opts or {}
    local t0 = now()
    local res = spawn(name, world, opts.env, opts.limit or 120)
    T.diag(("%s with %d ranks: %.1f s"):format(name, world, now() - t0))
    for r = 0, world - 1 do
      local tag = ("[%s w%d r%d] "):format(name, world, r)
      local diag, count = nil, 0
      for line in (res[r].out .. "\n"):gmatch("(.-)\n") do
        local bad, what = line:match("^(n?o?t? ?ok) %- (.*)$")
        if bad == "ok" or bad == "not ok" then
          if diag then T.diag(diag) end
          count = count + 1
          T.ok(bad == "ok", tag .. what)
          diag = nil
        elseif line:match("^# ") and count > 0 then
          T.diag(line:sub(3))
        end
      end
      local want = opts.rc and opts.rc[r] or 0
      T.ok(res[r].rc == want and count > 0, tag .. ("exits with status %d after %d checks"):format(want, count),
           ("exit status %d, %d checks; output:\n%s"):format(res[r].rc, count, res[r].out))
    end
  end

  -- the whole stack under the launcher: torch.distributed over dp_pg_*
  local function run_launched(name, world)
    local base = os.tmpname()
    local t0 = now()
    os.execute(("DPLUA_PG_SCENARIO=%s timeout -k 5 120 '%s' --nproc_per_node=%d --prefix-output '%s' > %s.out 2>&1; echo $? > %s.rc")
      :format(name, prog, world, script, base, base))
    T.diag(("%s under the launcher with %d ranks: %.1f s"):format(name, world, now() - t0))
    local f = io.open(base .. ".out"); local out = f and f:read("*a") or ""; if f then f:close() end
    f = io.open(base .. ".rc"); local rc = f and tonumber(f:read("*l")) or -1; if f then f:close() end
    os.remove(base); os.remove(base .. ".out"); os.remove(base .. ".rc")
    local count = 0
    for line in out:gmatch("[^\n]+") do
      local r, bad, what = line:match("^%[(%d+)%]: (n?o?t? ?ok) %- (.*)$")
      if bad == "ok" or bad == "not ok" then
        count = count + 1
        T.ok(bad == "ok", ("[%s launched w%d r%s] %s"):format(name, world, r, what))
      elseif r then
        local d = line:match("^%[%d+%]: # (.*)$")
        if d then T.diag(d) end
      end
    end
    T.ok(rc == 0 and count > 0, ("[%s launched w%d] the launcher exits 0 after %d checks"):format(name, world, count),
         ("exit status %d; output:\n%s"):format(rc, out))
  end

  run_launched("dist_module", 4)
  run("ops", 2)
  run("ops", 4)
  run("async", 2)
  run("subgroups", 4)
  run("mismatch_debug", 2, { env = "DPLUA_DIST_DEBUG=1" })
  run("mismatch", 2)
  run("mismatch_stall", 2)
  run("mismatch_sizes", 2)
  run("p2p_sizes", 2)
  run("dead_peer", 3, { rc = { [2] = 7 } })
  run("absent", 2)
  run("dead_store", 2, { rc = { [0] = 7 } })
  run("no_join", 2)
  T.done_testing()
end

---------------------------------------------------------------- a rank

local rank, world = tonumber(os.getenv("RANK")), tonumber(os.getenv("WORLD_SIZE"))

local function check(cond, name, diag)
  io.write(cond and "ok - " or "not ok - ", name, "\n")
  if (not cond or os.getenv("DPLUA_PG_VERBOSE")) and diag then
    for l in (tostring(diag) .. "\n"):gmatch("(.-)\n") do io.write("# ", l, "\n") end
  end
  io.stdout:flush()
  return cond
end

local function last_error() return ffi.string(C.dp_last_error()) end

-- Rank 0 serves the store on a free port and writes it where the others look.
local function open_store()
  local box = ffi.new("dp_store*[1]")
  local token = os.getenv("DPLUA_JOB_TOKEN")
  local portfile = os.getenv("DPLUA_PG_PORTFILE")
  if rank == 0 then
    assert(C.dp_store_open(box, "127.0.0.1", 0, 1, rank, 0, token, 0, 30) == 0, last_error())
    local f = assert(io.open(portfile .. ".tmp", "w"))
    f:write(C.dp_store_port(box[0]), "\n")
    f:close()
    assert(os.rename(portfile .. ".tmp", portfile))
  else
    local port, deadline = nil, now() + 30
    while not port and now() < deadline do
      local f = io.open(portfile)
      if f then port = tonumber(f:read("*l")); f:close() end
      if not port then sleep(0.01) end
    end
    assert(port, "rank 0 did not write the store's port")
    assert(C.dp_store_open(box, "127.0.0.1", port, 0, rank, 0, token, 0, 30) == 0, last_error())
  end
  return box[0]
end

local store = scenario ~= "dist_module" and open_store() or nil

local function new_group(name, timeout, members)
  local box = ffi.new("dp_pg*[1]")
  local arr, grank, size = nil, rank, world
  if members then
    arr = ffi.new("int[?]", #members, members)
    size = #members
    for i, r in ipairs(members) do if r == rank then grank = i - 1 end end
  end
  local st = C.dp_pg_new(box, store, "gloo", grank, size, timeout, name, arr)
  assert(st == 0, last_error())
  return box[0]
end

-- Frees the groups and leaves; rank 0, which serves the store, first
-- waits until the ranks in `wait_for` (default: all) have said they are
-- done, so that no rank loses the store while it still reads it.
local function done(groups, wait_for)
  for _, g in ipairs(groups) do C.dp_pg_free(g) end
  local key = "pgtest/done/" .. rank
  if rank ~= 0 then
    C.dp_store_set(store, key, "1", 1)
  else
    local keys = {}
    for r = 1, world - 1 do
      if not wait_for or wait_for[r] then keys[#keys + 1] = "pgtest/done/" .. r end
    end
    if #keys > 0 then
      local arr = ffi.new("const char*[?]", #keys, keys)
      if C.dp_store_wait(store, arr, #keys, 30) ~= 0 then check(false, "the other ranks finished", last_error()) end
    end
  end
  C.dp_store_close(store)
  os.exit(0)
end

-- The input of rank r at element i for dtype dt (and reduce op op):
-- values whose sums, products and averages are exact in every dtype.
local function value(dt, r, i, op)
  if dt == "bool" then return (r + i) % 3 == 0 end
  if dt == "uint8" then return op == PRODUCT and (r + i) % 4 + 1 or (r * 70 + i * 3 + 200) % 256 end
  local v = (r + 2 * i) % 5 - 1
  if dt == "int64" and op ~= PRODUCT and i == 1 then v = v + r * 2 ^ 40 end
  return v
end

local function input(dt, r, n, op)
  local t = {}
  for i = 0, n - 1 do t[i + 1] = value(dt, r, i, op) end
  return t
end

local function combine(dt, op, a, b)
  if dt == "bool" then
    if op == SUM or op == MAX then return a or b end
    return a and b
  end
  local v
  if op == SUM or op == AVG then v = a + b
  elseif op == PRODUCT then v = a * b
  elseif op == MAX then v = math.max(a, b)
  else v = math.min(a, b) end
  if dt == "uint8" then v = v % 256 end
  return v
end

-- The reduction over ranks 0..size-1 of input(dt, r, n, op).
local function expected(dt, op, n, size, ranks)
  local acc
  for g = 0, size - 1 do
    local x = input(dt, ranks and ranks[g + 1] or g, n, op)
    if not acc then acc = x else
      for i = 1, n do acc[i] = combine(dt, op, acc[i], x[i]) end
    end
  end
  if op == AVG then for i = 1, n do acc[i] = acc[i] / size end end
  return acc
end

local function same(got, want)
  if #got ~= #want then return false, ("%d elements, expected %d"):format(#got, #want) end
  for i = 1, #want do
    if got[i] ~= want[i] then
      return false, ("element %d is %s, expected %s"):format(i - 1, tostring(got[i]), tostring(want[i]))
    end
  end
  return true
end

local function tensor(dt, list) return torch.tensor(list, { dtype = torch[dt] }) end
local function zeros(dt, n) return torch.zeros(n, { dtype = torch[dt] }) end

local function check_call(st, name)
  return check(st == 0, name, st ~= 0 and last_error() or nil)
end

local function check_values(t, want, name)
  local ok, why = same(t:tolist(), want)
  return check(ok, name, why)
end

---------------------------------------------------------------- scenarios

local S = {}

-- Every collective, every dtype, against the reference.
function S.ops()
  local pg = new_group("default", 60)
  local n, issued = 6, 0
  local function call(st, name) issued = issued + 1; return check_call(st, name) end
  for _, dt in ipairs(dtypes) do
    for _, op in ipairs({ SUM, AVG, MAX, MIN, PRODUCT }) do
      if op ~= AVG or floating[dt] then
        local t = tensor(dt, input(dt, rank, n, op))
        if call(C.dp_pg_all_reduce(pg, t.p, op, nil), ("all_reduce %s %s"):format(dt, op_names[op])) then
          check_values(t, expected(dt, op, n, world), ("all_reduce %s %s values"):format(dt, op_names[op]))
        end
      end
    end
    if not floating[dt] then
      local t = tensor(dt, input(dt, rank, n))
      local st = C.dp_pg_all_reduce(pg, t.p, AVG, nil)
      check(st ~= 0 and last_error():find("AVG needs a floating%-point tensor, got " .. dt),
            "all_reduce " .. dt .. " AVG is refused", last_error())
    end

    local root = world - 1
    local t = tensor(dt, input(dt, rank, n))
    if call(C.dp_pg_broadcast(pg, t.p, root, nil), "broadcast " .. dt) then
      check_values(t, input(dt, root, n), "broadcast " .. dt .. " values")
    end

    for _, op in ipairs({ SUM, MAX }) do
      root = 1 % world
      t = tensor(dt, input(dt, rank, n, op))
      if call(C.dp_pg_reduce(pg, t.p, root, op, nil), ("reduce %s %s"):format(dt, op_names[op])) then
        check_values(t, rank == root and expected(dt, op, n, world) or input(dt, rank, n, op),
                     ("reduce %s %s: %s"):format(dt, op_names[op], rank == root and "root has the result"
                                                  or "non-root keeps its tensor"))
      end
    end

    local src = tensor(dt, input(dt, rank, n))
    local out = zeros(dt, n * world)
    if call(C.dp_pg_all_gather(pg, out.p, src.p, nil), "all_gather " .. dt) then
      local want = {}
      for r = 0, world - 1 do for _, v in ipairs(input(dt, r, n)) do want[#want + 1] = v end end
      check_values(out, want, "all_gather " .. dt .. " values")
    end

    for _, op in ipairs(floating[dt] and { SUM, AVG } or { SUM }) do
      local big = tensor(dt, input(dt, rank, n * world, op))
      out = zeros(dt, n)
      if call(C.dp_pg_reduce_scatter(pg, out.p, big.p, op, nil), ("reduce_scatter %s %s"):format(dt, op_names[op])) then
        local all = expected(dt, op, n * world, world)
        local want = {}
        for i = 1, n do want[i] = all[rank * n + i] end
        check_values(out, want, ("reduce_scatter %s %s values"):format(dt, op_names[op]))
      end
    end

    -- all_to_all: rank r sends block j of its input to rank j
    local k = 2
    src = tensor(dt, input(dt, rank, k * world)):view(world, k)
    out = zeros(dt, k * world):view(world, k)
    if call(C.dp_pg_all_to_all(pg, out.p, src.p, nil), "all_to_all " .. dt) then
      local want = {}
      for j = 0, world - 1 do
        local x = input(dt, j, k * world)
        for i = 1, k do want[#want + 1] = x[rank * k + i] end
      end
      check_values(out:view(-1), want, "all_to_all " .. dt .. " values")
    end
  end

  -- a large all_reduce: several Gloo segments
  local big_n = 600000
  local big = torch.ones(big_n) * (rank + 1)
  if call(C.dp_pg_all_reduce(pg, big.p, SUM, nil), "all_reduce of 600000 float32") then
    local s = world * (world + 1) / 2
    check(big:min():item() == s and big:max():item() == s, "all_reduce of 600000 float32 values")
  end

  -- send/recv around the ring: even ranks send first, odd ranks receive first
  local nxt, prv = (rank + 1) % world, (rank - 1) % world
  local mine, got = tensor("float64", input("float64", rank, n)), zeros("float64", n)
  local function send() return check_call(C.dp_pg_send(pg, mine.p, nxt, 7), "send to " .. nxt) end
  local function recv()
    if check_call(C.dp_pg_recv(pg, got.p, prv, 7), "recv from " .. prv) then
      check_values(got, input("float64", prv, n), "recv from " .. prv .. " values")
    end
  end
  if rank % 2 == 0 then send(); recv() else recv(); send() end

  call(C.dp_pg_barrier(pg), "barrier")
  check(tonumber(C.dp_pg_seq(pg)) == issued, "dp_pg_seq counts the collectives issued (not send/recv, not refused ones)",
        ("seq %d, issued %d"):format(tonumber(C.dp_pg_seq(pg)), issued))
  check(C.dp_pg_rank(pg) == rank and C.dp_pg_size(pg) == world and ffi.string(C.dp_pg_backend(pg)) == "gloo",
        "rank, size and backend")

  -- argument errors: refused at once, and the group stays usable
  local t = torch.ones(4)
  local errs = {
    { function() return C.dp_pg_all_gather(pg, torch.ones(3).p, t.p, nil) end,
      "all_gather: the output has 3 elements but needs" },
    { function() return C.dp_pg_reduce_scatter(pg, torch.ones(4).p, t.p, SUM, nil) end,
      "reduce_scatter: the input has 4 elements but needs" },
    { function() return C.dp_pg_all_gather(pg, torch.ones(4 * world, { dtype = torch.float64 }).p, t.p, nil) end,
      "all_gather: the output is float64 but the input is float32" },
    { function() return C.dp_pg_broadcast(pg, t.p, world, nil) end, "broadcast: root " .. world .. " is out of range" },
    { function() return C.dp_pg_all_reduce(pg, torch.ones(2, 3):t().p, SUM, nil) end, "must be contiguous" },
    { function() return C.dp_pg_all_reduce(pg, t.p, C.DP_ARGMAX, nil) end,
      "all_reduce: reduce op " .. tonumber(C.DP_ARGMAX) .. " is not a reduction of collectives (expected DP_SUM" },
    { function() return C.dp_pg_reduce_scatter(pg, t.p, torch.ones(4 * world).p, C.DP_VAR, nil) end,
      "reduce_scatter: reduce op " .. tonumber(C.DP_VAR) .. " is not a reduction of collectives" },
    { function() return C.dp_pg_all_reduce(pg, t.p, 99, nil) end, "all_reduce: reduce op 99 is not a reduction" },
    { function() return C.dp_pg_send(pg, t.p, rank, 0) end, "cannot send to itself" },
    { function() return C.dp_pg_recv(pg, t.p, world, 0) end, "recv: source " .. world .. " is out of range" },
    { function() return C.dp_pg_all_to_all(pg, torch.ones(3 * world + 1).p, torch.ones(3 * world + 1).p, nil) end,
      "does not split evenly" },
  }
  for _, e in ipairs(errs) do
    local st = e[1]()
    check(st ~= 0 and last_error():find(e[2], 1, true), "refused: " .. e[2], last_error())
  end
  t = torch.ones(4)
  if call(C.dp_pg_all_reduce(pg, t.p, SUM, nil), "the group works after refused calls") then
    check_values(t, { world, world, world, world }, "and gives the right values")
  end
  done({ pg })
end

-- Async works: queued in order, waited in any order, mixed with sync ops.
function S.async()
  local pg = new_group("default", 60)
  local ts, works = {}, {}
  local box = ffi.new("dp_work*[1]")
  for k = 1, 8 do
    ts[k] = torch.full({ 1000 }, rank + k)
    if k == 4 then
      check_call(C.dp_pg_all_reduce(pg, ts[k].p, MAX, nil), "a sync all_reduce between async ones")
    else
      check_call(C.dp_pg_all_reduce(pg, ts[k].p, SUM, box), "async all_reduce " .. k)
      works[k] = box[0]
    end
  end
  for k = 8, 1, -1 do
    if works[k] then
      check_call(C.dp_work_wait(works[k]), "wait " .. k)
      check(C.dp_work_is_completed(works[k]) == 1, "completed after wait " .. k)
      C.dp_work_free(works[k])
    end
  end
  for k = 1, 8 do
    local want = k == 4 and (world - 1 + k) or (world * (world - 1) / 2 + world * k)
    check(ts[k]:min():item() == want and ts[k]:max():item() == want, "async result " .. k,
          ("got %g, expected %g"):format(ts[k]:min():item(), want))
  end
  -- a work freed before it finished, and its tensor dropped: nothing breaks
  do
    local t = torch.full({ 100000 }, 1)
    check_call(C.dp_pg_all_reduce(pg, t.p, SUM, box), "async all_reduce freed before waiting")
    C.dp_work_free(box[0])
    t = nil
    collectgarbage()
  end
  local t = torch.ones(3)
  check_call(C.dp_pg_all_reduce(pg, t.p, SUM, box), "async after an orphaned one")
  check_call(C.dp_work_wait(box[0]), "wait")
  check_call(C.dp_work_wait(box[0]), "waiting twice is fine")
  C.dp_work_free(box[0])
  check(t:sum():item() == 3 * world, "async after an orphaned one: values")
  check(tonumber(C.dp_pg_seq(pg)) == 10, "seq counts async ops too", tostring(C.dp_pg_seq(pg)))
  done({ pg })
end

-- Subgroups beside the default group, each with its own keys and order.
function S.subgroups()
  local pg = new_group("default", 60)
  local groups = { pg }
  local defs = { { name = "odd", ranks = { 1, 3 } }, { name = "first3", ranks = { 0, 1, 2 } },
                 { name = "reversed", ranks = { 3, 2, 1, 0 } } }
  for _, d in ipairs(defs) do
    local member = false
    for _, r in ipairs(d.ranks) do member = member or r == rank end
    if member then
      local g = new_group(d.name, 60, d.ranks)
      groups[#groups + 1] = g
      local grank
      for i, r in ipairs(d.ranks) do if r == rank then grank = i - 1 end end
      check(C.dp_pg_rank(g) == grank and C.dp_pg_size(g) == #d.ranks, d.name .. ": group rank and size")
      local t = tensor("int64", input("int64", rank, 5))
      if check_call(C.dp_pg_all_reduce(g, t.p, SUM, nil), d.name .. ": all_reduce") then
        check_values(t, expected("int64", SUM, 5, #d.ranks, d.ranks), d.name .. ": all_reduce values")
      end
      -- broadcast from group rank 0 (global rank d.ranks[1])
      t = tensor("float32", input("float32", rank, 5))
      if check_call(C.dp_pg_broadcast(g, t.p, 0, nil), d.name .. ": broadcast from group rank 0") then
        check_values(t, input("float32", d.ranks[1], 5), d.name .. ": broadcast values")
      end
    end
    local t = torch.ones(2)
    if check_call(C.dp_pg_all_reduce(pg, t.p, SUM, nil), "default group after " .. d.name) then
      check_values(t, { world, world }, "default group values after " .. d.name)
    end
  end
  local st = C.dp_pg_new(ffi.new("dp_pg*[1]"), store, "gloo", 0, 2, 5, "bad", ffi.new("int[2]", { 1, 1 }))
  check(st ~= 0 and last_error():find("listed twice"), "a rank listed twice is refused", last_error())
  st = C.dp_pg_new(ffi.new("dp_pg*[1]"), store, "mpi", rank, world, 5, "bad", nil)
  check(st ~= 0 and last_error():find("unknown backend 'mpi'"), "an unknown backend is refused", last_error())
  st = C.dp_pg_new(ffi.new("dp_pg*[1]"), store, "nccl", rank, world, 5, "bad", nil)
  check(st ~= 0 and last_error():find("nccl"), "nccl without a GPU is refused with a message", last_error())
  done(groups)
end

local mismatch_want = "collective mismatch at #2 on group default: rank 0 called all_reduce(float32, 10 elements, SUM) " ..
                      "but rank 1 called broadcast(float32, 10 elements, root 0)"

-- Both ranks run one matching all_reduce, then rank 0 all_reduce and
-- rank 1 broadcast; returns the status, message and seconds it took.
local function mismatched(pg)
  local t = torch.ones(10)
  check_call(C.dp_pg_all_reduce(pg, t.p, SUM, nil), "a first, matching all_reduce")
  local t0 = now()
  local st
  if rank == 0 then st = C.dp_pg_all_reduce(pg, t.p, SUM, nil) else st = C.dp_pg_broadcast(pg, t.p, 0, nil) end
  return st, last_error(), now() - t0
end

function S.mismatch_debug()
  local pg = new_group("default", 3)
  local st, msg, dt = mismatched(pg)
  check(st ~= 0 and msg == mismatch_want, "the mismatch names both sides", msg)
  check(dt < 2, "at once, not after the timeout", ("%.2f s"):format(dt))
  local t0 = now()
  st = C.dp_pg_barrier(pg)
  check(st ~= 0 and last_error() == mismatch_want and now() - t0 < 0.5,
        "later ops on the group fail at once with the same message", last_error())
  done({ pg })
end

-- A timeout (2 s) shorter than the stall check (DPLUA_DIST_STALL, 3 s):
-- the ranks time out, then find the mismatch in the states they publish.
function S.mismatch()
  local pg = new_group("default", 2)
  local st, msg, dt = mismatched(pg)
  check(st ~= 0 and msg == mismatch_want, "the timeout's error names both sides", msg)
  check(dt < 2 + 3, ("within the timeout (%.2f s)"):format(dt))
  done({ pg })
end

-- A timeout (30 s) far longer than the stall check (3 s): the check ends
-- both ranks' collectives with the mismatch, long before the timeout.
function S.mismatch_stall()
  local pg = new_group("default", 30)
  local st, msg, dt = mismatched(pg)
  check(st ~= 0 and msg == mismatch_want, "the stall check's error names both sides", msg)
  check(dt < 20, ("long before the 30 s timeout (%.2f s)"):format(dt))
  local t0 = now()
  st = C.dp_pg_barrier(pg)
  check(st ~= 0 and last_error() == mismatch_want and now() - t0 < 0.5,
        "later ops on the group fail at once with the same message", last_error())
  done({ pg })
end

-- The same collective with different sizes: Gloo would abort the process
-- on the size mismatch; the ranks must get an error instead.
function S.mismatch_sizes()
  local pg = new_group("default", 2)
  local t = torch.ones(rank == 0 and 10 or 20)
  -- rank 1 comes late, so rank 0 gives up first and closes its
  -- connections: rank 1 sees a lost peer and must still say why
  if rank == 1 then sleep(0.5) end
  local t0 = now()
  local st = C.dp_pg_all_reduce(pg, t.p, SUM, nil)
  local msg = last_error()
  check(st ~= 0 and msg == "collective mismatch at #1 on group default: rank 0 called all_reduce(float32, 10 elements, " ..
                            "SUM) but rank 1 called all_reduce(float32, 20 elements, SUM)",
        "an error, not an abort, that names both sizes", msg)
  check(now() - t0 < 2 + 3, ("within the timeout (%.2f s)"):format(now() - t0))
  done({ pg })
end

-- A send and a recv of different sizes: both time out, naming the peer.
function S.p2p_sizes()
  local pg = new_group("default", 2)
  local t0 = now()
  local st
  if rank == 0 then st = C.dp_pg_recv(pg, torch.ones(10).p, 1, 3) else st = C.dp_pg_send(pg, torch.ones(20).p, 0, 3) end
  local msg = last_error()
  local want = rank == 0 and "recv on group default (rank 0 of 2) failed: " or "send on group default (rank 1 of 2) failed: "
  local peer = rank == 0 and "rank 1 did not send 10 float32 elements with tag 3 in time"
                          or "rank 0 did not receive 20 float32 elements with tag 3 in time"
  -- (or, if the peer timed out first and exited, quoting its error)
  local other = rank == 0 and "rank 1 reported: send on group default" or "rank 0 reported: recv on group default"
  check(st ~= 0 and msg:find(want, 1, true) and (msg:find(peer, 1, true) or msg:find(other, 1, true)),
        "an error naming the peer and the tag", msg)
  check(now() - t0 < 2 + 3, ("within the timeout (%.2f s)"):format(now() - t0))
  done({ pg })
end

-- A new group (timeout in seconds) and a first all_reduce on it; then rank
-- away_rank runs away(pg), which does not return, and the others a second
-- all_reduce. Returns the group, the tensor, and the second all_reduce's
-- status, error message and seconds.
local function second_all_reduce(timeout, away_rank, away)
  local pg = new_group("default", timeout)
  local t = torch.ones(10)
  check_call(C.dp_pg_all_reduce(pg, t.p, SUM, nil), "a first all_reduce")
  if rank == away_rank then away(pg) end
  local t0 = now()
  local st = C.dp_pg_all_reduce(pg, t.p, SUM, nil)
  return pg, t, st, last_error(), now() - t0
end

-- die(): the process ends at once (status 7), as if killed.
local function die()
  io.stdout:flush()
  C._exit(7)
end

-- Rank 2 dies after one all_reduce; ranks 0 and 1 must name it.
function S.dead_peer()
  local pg, t, st, msg, dt = second_all_reduce(10, 2, die)
  check(st ~= 0 and msg:find("all_reduce #2 on group default", 1, true) and msg:find("rank 2 is dead", 1, true),
        "the survivors name the dead rank", msg)
  check(dt < 10, "before the timeout", ("%.2f s"):format(dt))
  st = C.dp_pg_all_reduce(pg, t.p, SUM, nil)
  check(st ~= 0 and last_error() == msg, "the group stays failed")
  done({ pg }, { [1] = true })
end

-- Rank 1 makes the group, then never calls the second collective.
function S.absent()
  local pg, _, st, msg, dt = second_all_reduce(2, 1, function(g)
    sleep(3.5)
    check(true, "rank 1 stayed away")
    done({ g })
  end)
  check(st ~= 0 and msg:find("rank 1 did not arrive (the last collective it entered is #1)", 1, true),
        "the error names the rank that did not arrive", msg)
  check(dt < 2 + 2, "within the timeout", ("%.2f s"):format(dt))
  done({ pg })
end

-- Rank 0 (which serves the store) dies; rank 1 must say so, not hang.
function S.dead_store()
  local pg, _, st, msg, dt = second_all_reduce(10, 0, die)
  check(st ~= 0 and msg:find("the store did not answer", 1, true), "the error says the store (rank 0) is gone", msg)
  check(dt < 10, "before the timeout", ("%.2f s"):format(dt))
  done({ pg })
end

-- torch.distributed (lua/dplua/distributed.lua) under the launcher.
function S.dist_module()
  local dist = torch.distributed
  dist.init_process_group("gloo", { timeout = 60 })
  check(dist.get_rank() == rank and dist.get_world_size() == world, "rank and world size come from the launcher")
  local sum = world * (world + 1) / 2
  local t = torch.tensor({ rank + 1, 2 * (rank + 1) })
  dist.all_reduce(t)
  check_values(t, { sum, 2 * sum }, "all_reduce (SUM)")
  t = torch.tensor({ rank + 0.5 })
  local work = dist.all_reduce(t, dist.ReduceOp.AVG, nil, true)
  check(work:wait() and work:is_completed(), "async all_reduce (AVG): wait")
  check_values(t, { (sum - world) / world + 0.5 }, "async all_reduce (AVG) values")
  t = torch.full({ 3 }, rank)
  dist.broadcast(t, world - 1)
  check_values(t, { world - 1, world - 1, world - 1 }, "broadcast")
  local out = torch.zeros(2 * world)
  dist.all_gather_into_tensor(out, torch.tensor({ rank, -rank }))
  local want = {}
  for r = 0, world - 1 do want[#want + 1] = r; want[#want + 1] = -r end
  check_values(out, want, "all_gather_into_tensor")
  local mine = torch.zeros(2)
  local big = torch.arange(0, 2 * world):float() + rank
  dist.reduce_scatter_tensor(mine, big)
  check_values(mine, { world * 2 * rank + sum - world, world * (2 * rank + 1) + sum - world }, "reduce_scatter_tensor")
  local g = dist.new_group({ 0, world - 1 })
  t = torch.ones(1)
  dist.all_reduce(t, dist.ReduceOp.SUM, g)
  if g ~= dist.GroupMember.NON_GROUP_MEMBER then
    check_values(t, { 2 }, "all_reduce on new_group({0, world - 1})")
  else
    check(rank ~= 0 and rank ~= world - 1 and t[0]:item() == 1,
          "non-members get GroupMember.NON_GROUP_MEMBER, with which all_reduce does nothing")
  end
  dist.barrier()
  dist.destroy_process_group()
  os.exit(0)
end

-- Rank 1 never makes the group: rank 0's dp_pg_new names it.
function S.no_join()
  if rank == 1 then
    check(true, "rank 1 stays out")
    done({})
  end
  local t0 = now()
  local st = C.dp_pg_new(ffi.new("dp_pg*[1]"), store, "gloo", 0, 2, 1.5, "lonely", nil)
  check(st ~= 0 and last_error() == "process group lonely (gloo, rank 0 of 2): rank 1 did not join within 1.5 s",
        "dp_pg_new names the rank that did not join", last_error())
  check(now() - t0 < 1.5 + 2, ("within the timeout (%.2f s)"):format(now() - t0))
  done({})
end

local fn = S[scenario]
if not fn then
  check(false, "unknown scenario " .. scenario)
  os.exit(1)
end
local ok, err = pcall(fn)
if not ok then check(false, "scenario " .. scenario .. " raised an error", err) end
os.exit(1)
