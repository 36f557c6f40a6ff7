-- dplua.utils.data_workers: DataLoader's worker processes (num_workers >
-- 0). Each worker is a fork of this process: it reads batches' index
-- lists from a pipe, fetches and collates the samples as the loader would,
-- and writes the batch back through another pipe as a message: an 8-byte
-- length, a header (the values' structure, and each tensor's dtype and
-- shape, as a Lua table constructor), then the tensors' bytes. Batch k
-- goes to worker k mod N, so each worker's answers arrive in order and the
-- batches come back in the sampler's order, the same batches as without
-- workers. With an IterableDataset each worker runs its own copy of the
-- stream (split by get_worker_info() in the dataset's __iter) and the
-- batches are taken from the workers in turn, a worker leaving the turn
-- when its stream ends, as PyTorch's. A worker's error comes back as the
-- batch's error; a worker that dies is an error naming it (with its exit
-- status or signal), never a hang; workers die with the process that
-- forked them.
local ffi = require("ffi")
local torch = require("dplua")
local C = torch.C
local raise = torch._raise
local is_tensor = torch.is_tensor

local M = {}

local len_buf = ffi.new("uint64_t[1]")
local function check(st) if st ~= 0 then raise(ffi.string(C.dp_last_error())) end end

---------------------------------------------------------------- messages

-- A value as a JSON-able description; tensors go to the list `tensors`
local function describe(v, tensors)
  if is_tensor(v) then
    if v.device.type ~= "cpu" then
      raise("DataLoader worker: a batch may hold CPU tensors only (a worker cannot use the GPU); got one on "
            .. tostring(v.device))
    end
    tensors[#tensors + 1] = v:contiguous()
    return { t = #tensors }
  end
  local ty = type(v)
  if ty == "number" then
    if v ~= v or v == math.huge or v == -math.huge then return { f = tostring(v) } end
    return { n = v }
  end
  if ty == "string" then return { s = v } end
  if ty == "boolean" then return { b = v } end
  if ty == "nil" then return { z = true } end
  if ty == "table" and getmetatable(v) == nil then
    local keys, vals = {}, {}
    for k, x in pairs(v) do
      keys[#keys + 1] = describe(k, tensors)
      vals[#vals + 1] = describe(x, tensors)
    end
    return { k = keys, v = vals }
  end
  raise("DataLoader worker: a batch value of type " .. ty .. " cannot be sent from a worker (tensors, numbers, " ..
        "strings, booleans and tables of them can)")
end

local special = { nan = 0 / 0, inf = math.huge, ["-inf"] = -math.huge, ["-nan"] = 0 / 0 }
local function rebuild(d, tensors)
  if d.t then return tensors[d.t] end
  if d.n ~= nil then return d.n end
  if d.f then return special[d.f] end
  if d.s ~= nil then return d.s end
  if d.b ~= nil then return d.b end
  if d.z then return nil end
  local out = {}
  for i, k in ipairs(d.k) do out[rebuild(k, tensors)] = rebuild(d.v[i], tensors) end
  return out
end

-- The header as a Lua table constructor (numbers to the bit, strings
-- quoted), read back by loading it in an empty environment: the other end
-- is this program.
local function literal(v, out)
  local ty = type(v)
  if ty == "number" then
    out[#out + 1] = (v % 1 == 0 and math.abs(v) < 2 ^ 53) and string.format("%d", v) or string.format("%.17g", v)
  elseif ty == "string" then
    out[#out + 1] = string.format("%q", v)
  elseif ty == "boolean" then
    out[#out + 1] = tostring(v)
  else
    out[#out + 1] = "{"
    for k, x in pairs(v) do
      out[#out + 1] = "["
      literal(k, out)
      out[#out + 1] = "]="
      literal(x, out)
      out[#out + 1] = ","
    end
    out[#out + 1] = "}"
  end
end
local function encode(v)
  local out = {}
  literal(v, out)
  return table.concat(out)
end
local function decode(text)
  local f = loadstring("return " .. text, "=DataLoader message")
  if f == nil then return nil end
  setfenv(f, {})
  local ok, v = pcall(f)
  return ok and v or nil
end

local function write(fd, ptr, n) check(C.dp_fd_write_all(fd, ptr, n)) end

-- Sends `fields` (a table: what the header says) and the values vals[1..n]
local function send(fd, fields, vals, n)
  local tensors, items = {}, {}
  for i = 1, n do items[i] = describe(vals[i], tensors) end
  fields.items, fields.n, fields.tensors = items, n, {}
  for i, t in ipairs(tensors) do fields.tensors[i] = { dtype = t.dtype.name, shape = { unpack(t:size()) } } end
  local header = encode(fields)
  len_buf[0] = #header
  write(fd, len_buf, 8)
  write(fd, header, #header)
  for _, t in ipairs(tensors) do
    local bytes = t:numel() * t:element_size()
    if bytes > 0 then write(fd, ffi.cast("const void *", t:data_ptr()), bytes) end
  end
end

local function read(fd, ptr, n)
  local got = tonumber(C.dp_fd_read_all(fd, ptr, n))
  if got < 0 then raise(ffi.string(C.dp_last_error())) end
  return got
end

-- A message: its header fields and its values (a list with n); nil at the
-- end of the pipe
local function receive(fd)
  if read(fd, len_buf, 8) < 8 then return nil end
  local n = tonumber(len_buf[0])
  local buf = ffi.new("char[?]", n)
  if read(fd, buf, n) < n then return nil end
  local fields = decode(ffi.string(buf, n))
  if type(fields) ~= "table" or type(fields.tensors) ~= "table" or type(fields.items) ~= "table" then
    return nil   -- (a message cut short by the writer's death reads as its end)
  end
  local tensors = {}
  for i, spec in ipairs(fields.tensors) do
    local t = torch.empty(spec.shape, { dtype = torch[spec.dtype] })
    local bytes = t:numel() * t:element_size()
    if bytes > 0 and read(fd, ffi.cast("void *", t:data_ptr()), bytes) < bytes then return nil end
    tensors[i] = t
  end
  local vals = { n = fields.n }
  local ok = pcall(function() for i = 1, fields.n do vals[i] = rebuild(fields.items[i], tensors) end end)
  if not ok then return nil end
  return fields, vals
end

---------------------------------------------------------------- the worker

local worker_info

-- get_worker_info(): inside a worker, {id =, num_workers =, seed =,
-- dataset =}; nil in the main process, as PyTorch's
function M.get_worker_info() return worker_info end

-- The worker's life, in the forked child: never returns
local function worker_main(pool, w, load)
  pool.stopped = true   -- (this copy of the pool is the parent's to stop, not the worker's)
  -- a worker ends by _exit: no finalizer of the parent's objects runs here
  os.exit = function(code)
    C.dp_exit_now(code == nil and 0 or code == true and 0 or code == false and 1 or tonumber(code) or 1)
  end
  local me = pool.workers[w + 1]
  -- Other workers' pipes, as open as the parent had them at the fork
  -- (a copy of another worker's write end would hide that worker's end):
  -- the parent had closed the child ends of the workers forked before.
  for i, other in ipairs(pool.workers) do
    if i < w + 1 then
      C.dp_fd_close(other.task_w); C.dp_fd_close(other.result_r)
    elseif i > w + 1 then
      C.dp_fd_close(other.task_r); C.dp_fd_close(other.task_w)
      C.dp_fd_close(other.result_r); C.dp_fd_close(other.result_w)
    end
  end
  C.dp_fd_close(me.task_w)
  C.dp_fd_close(me.result_r)
  local status = 0
  local ok, err = pcall(function()
    worker_info = { id = w, num_workers = #pool.workers, seed = pool.base_seed + w, dataset = pool.dataset }
    torch.manual_seed(pool.base_seed + w)
    if pool.worker_init_fn then pool.worker_init_fn(w) end
    while true do
      local task, idx = receive(me.task_r)
      if task == nil then return end   -- the loader is done with this worker
      local vals = { n = 0 }
      local good, why = pcall(function()
        local r = { n = 0 }
        local function keep(...) r = { n = select("#", ...), ... } end
        keep(load(idx[1], task.pass))
        vals = r
      end)
      if not good then send(me.result_w, { batch = task.batch, error = tostring(why) }, {}, 0)
      elseif vals.n == 1 and vals[1] == M.END then send(me.result_w, { batch = task.batch, ended = true }, {}, 0)
      else send(me.result_w, { batch = task.batch }, vals, vals.n) end
    end
  end)
  if not ok then
    pcall(send, me.result_w, { batch = -1, error = "worker_init_fn: " .. tostring(err) }, {}, 0)
    status = 1
  end
  C.dp_exit_now(status)
end

---------------------------------------------------------------- the pool

-- What a worker's load returns when its stream has ended (an
-- IterableDataset's worker): take() then says so instead of giving values.
M.END = setmetatable({}, { __tostring = function() return "the end of a worker's stream" end })

-- start(opts): n workers forked now, each calling load(index_tensor, pass)
-- for the batches it is sent. opts: {n, dataset, base_seed,
-- worker_init_fn, timeout, load}.
function M.start(opts)
  local pool = { workers = {}, owner = {}, dataset = opts.dataset, base_seed = opts.base_seed,
                 worker_init_fn = opts.worker_init_fn, timeout = opts.timeout }
  for w = 1, opts.n do
    local task, result = ffi.new("int[2]"), ffi.new("int[2]")   -- (boxes of their own for each call)
    check(C.dp_pipe_open(task, task + 1))
    check(C.dp_pipe_open(result, result + 1))
    pool.workers[w] = { task_r = task[0], task_w = task[1], result_r = result[0], result_w = result[1] }
  end
  collectgarbage()   -- (garbage left to a child would run the parent's finalizers there)
  for w = 1, opts.n do
    local pid = C.dp_worker_fork()
    if pid < 0 then raise(ffi.string(C.dp_last_error())) end
    if pid == 0 then worker_main(pool, w - 1, opts.load) end
    local me = pool.workers[w]
    me.pid = pid
    C.dp_fd_close(me.task_r)
    C.dp_fd_close(me.result_w)
  end
  -- the workers are stopped when the pool is collected
  pool.sentinel = newproxy(true)
  getmetatable(pool.sentinel).__gc = function() M.stop(pool) end
  return pool
end

-- Sends batch k to worker w (0-based; by default k - 1 mod N): its index
-- tensor, or for a stream nil and the pass it belongs to
function M.submit(pool, k, idx, w, pass)
  w = w or (k - 1) % #pool.workers
  pool.owner[k] = w
  -- a worker that has ended (its worker_init_fn failed, the dataset called
  -- os.exit) no longer reads: take() then reports what it said or how it
  -- ended, so the failed write is not the error
  pcall(send, pool.workers[w + 1].task_w, { batch = k, pass = pass }, { idx }, 1)
end

-- (fresh boxes for each wait: the answer is read right after the call that wrote it)
local function wait_child(pid, timeout_s)
  local box = ffi.new("int[3]")
  if C.dp_process_wait(pid, timeout_s, box, box + 1, box + 2) ~= 0 then return false, 0, 0 end
  return box[0] ~= 0, box[1], box[2]
end

-- The values of batch k and the worker (0-based) that loaded them; the
-- values are nil where that worker's stream had ended. Raises the worker's
-- error, or names a worker that died or the timeout that passed
function M.take(pool, k)
  local w = pool.owner[k]
  pool.owner[k] = nil
  local me = pool.workers[w + 1]
  local waited, code, signo = 0, 0, 0
  while C.dp_fd_wait_readable(me.result_r, 0.1) == 0 do
    waited = waited + 0.1
    local gone
    gone, code, signo = wait_child(me.pid, 0)
    if gone then
      me.reaped = true
      break   -- (what it wrote before it died is still read below)
    end
    if pool.timeout and pool.timeout > 0 and waited >= pool.timeout then
      raise(string.format("DataLoader: worker %d (pid %d) gave no batch within the timeout of %g s", w, me.pid,
                          pool.timeout))
    end
  end
  local fields, vals = receive(me.result_r)
  if fields == nil then
    if not me.reaped then me.reaped, code, signo = wait_child(me.pid, 5) end
    local how = signo ~= 0 and ("killed by " .. ffi.string(C.dp_signal_name(signo))) or ("exit status " .. code)
    raise(string.format("DataLoader: worker %d (pid %d) exited unexpectedly (%s)", w, me.pid, how))
  end
  if fields.error then
    raise(string.format("DataLoader: worker %d: %s", w, tostring(fields.error):gsub("^[^\n:]-:%d+: ", "")))
  end
  if fields.ended then return nil, w end
  return vals, w
end

-- Stops the workers: their task pipes closed (a worker then exits), then
-- killed if they have not, and reaped
function M.stop(pool)
  if pool.stopped then return end
  pool.stopped = true
  for _, me in ipairs(pool.workers) do C.dp_fd_close(me.task_w) end
  for _, me in ipairs(pool.workers) do
    if me.pid and not me.reaped then
      if not wait_child(me.pid, 2) then
        C.dp_process_kill(me.pid, 9)
        wait_child(me.pid, 2)
      end
      me.reaped = true
    end
    C.dp_fd_close(me.result_r)
  end
end

return M
