-- dplua.cuda: torch.cuda (devices, synchronisation, memory statistics,
-- streams, events and CUDA graphs) and torch.backends.cuda.
local B = require("dplua.base")
local ffi, C, torch = B.ffi, B.C, B.torch
local raise, check, finally, typename = B.raise, B.check, B.finally, B.typename
local parse_device, DP_CPU = B.parse_device, B.DP_CPU

---------------------------------------------------------------- devices and memory

-- torch.cuda: devices, synchronisation and memory statistics. "cuda"
-- without an index means the current device (set_device).
local current_device = 0
-- The index of a CUDA device d (nil: the current one), which must exist
-- unless any_index: the allocation counters answer 0 for any device that
-- has none, as PyTorch's do.
local function device_index(d, fn, any_index)
  if d == nil then return current_device end
  local i = parse_device(d, fn)
  if i == DP_CPU then raise(fn .. ": expected a CUDA device, got cpu") end
  local n = C.dp_cuda_device_count()
  if i >= n and not any_index then
    raise(string.format("%s: device cuda:%d is not available (%d CUDA devices)", fn, i, n))
  end
  return i
end
torch.cuda = {
  is_available = function() return C.dp_cuda_device_count() > 0 end,
  device_count = function() return C.dp_cuda_device_count() end,
  current_device = function() return current_device end,
  set_device = function(d)
    current_device = device_index(d, "cuda.set_device")
  end,
  synchronize = function(d) check(C.dp_cuda_synchronize(device_index(d, "cuda.synchronize"))) end,
  memory_allocated = function(d) return tonumber(C.dp_memory_allocated(device_index(d, "cuda.memory_allocated", true))) end,
  max_memory_allocated = function(d) return tonumber(C.dp_max_memory_allocated(device_index(d, "cuda.max_memory_allocated", true))) end,
  reset_peak_memory_stats = function(d) C.dp_reset_peak_memory_stats(device_index(d, "cuda.reset_peak_memory_stats", true)) end,
}
torch._current_cuda_device = function() return current_device end
-- torch.cuda.amp (GradScaler, autocast) loads with dplua.amp on first use
torch._lazy(torch.cuda, { amp = function() return require("dplua.amp").cuda end })
-- how many launches the waiting of small Linears saved: forwards run in
-- one launch with the ReLU, GELU or cross-entropy after them, and
-- backwards chained with the layer before's (src/core/gpu_linear.c, "deferred
-- launches"): for tests and benchmarks
torch.cuda._linear_fusions = function() return tonumber(C.dp_cuda_linear_fusions()) end
-- for tests: with false, every op launches on its own
torch.cuda._set_deferral = function(on) C.dp_cuda_set_deferral(on and 1 or 0) end

-- What PyTorch scripts also call on torch.cuda: seeds (one stream serves
-- every device, see docs/API.md), memory and device queries.
local i64_box, i64_box2 = ffi.new("int64_t[1]"), ffi.new("int64_t[1]")
torch.cuda.manual_seed = function(seed) torch.manual_seed(seed) end
torch.cuda.manual_seed_all = torch.cuda.manual_seed
torch.cuda.empty_cache = function() check(C.dp_cuda_empty_cache(current_device)) end
local function reserved(d, fn)
  check(C.dp_cuda_memory_reserved(device_index(d, fn), i64_box, i64_box2))
  return tonumber(i64_box[0]), tonumber(i64_box2[0])
end
torch.cuda.memory_reserved = function(d) return (reserved(d, "cuda.memory_reserved")) end
torch.cuda.max_memory_reserved = function(d) return select(2, reserved(d, "cuda.max_memory_reserved")) end
-- PyTorch's older names: "cached" is "reserved", and the max resets are
-- reset_peak_memory_stats (dplua keeps no accumulated counters to reset)
torch.cuda.memory_cached, torch.cuda.max_memory_cached = torch.cuda.memory_reserved, torch.cuda.max_memory_reserved
torch.cuda.reset_max_memory_allocated = torch.cuda.reset_peak_memory_stats
torch.cuda.reset_max_memory_cached = torch.cuda.reset_peak_memory_stats
torch.cuda.reset_accumulated_memory_stats = function(d) device_index(d, "cuda.reset_accumulated_memory_stats", true) end
-- dplua starts CUDA when it is first used: init checks that there is a device
torch.cuda.is_initialized = function() return torch.cuda.is_available() end
torch.cuda.init = function()
  if not torch.cuda.is_available() then raise("cuda.init: no CUDA device (torch.cuda.is_available() is false)") end
end

-- device(d, fn, ...) and device_of(t, fn, ...): fn run with the current
-- device set to d (to t's device; a CPU tensor leaves it as it is) and
-- put back after, also when fn raises (PyTorch's context managers; Lua
-- has no with statement)
function torch.cuda.device(d, fn, ...)
  if type(fn) ~= "function" then raise("cuda.device: expected (device, function), got a " .. typename(fn)) end
  if d == nil or (type(d) == "number" and d < 0) then return fn(...) end
  local prev = current_device
  torch.cuda.set_device(d)
  return finally(torch.cuda.set_device, prev, pcall(fn, ...))
end
function torch.cuda.device_of(t, fn, ...)
  if not torch.is_tensor(t) then raise("cuda.device_of: expected a tensor, got " .. typename(t)) end
  if t.device.type ~= "cuda" then
    if type(fn) ~= "function" then raise("cuda.device_of: expected (tensor, function), got a " .. typename(fn)) end
    return fn(...)
  end
  return torch.cuda.device(t.device, fn, ...)
end

-- The generator's state: one counter-based stream serves every device (as
-- cuda.manual_seed is torch.manual_seed), so each device's state is
-- torch.get_rng_state()'s, and setting any sets it.
torch.cuda.get_rng_state = function(d)
  device_index(d, "cuda.get_rng_state", true)
  return torch.get_rng_state()
end
torch.cuda.set_rng_state = function(state, d)
  device_index(d, "cuda.set_rng_state", true)
  torch.set_rng_state(state)
end
torch.cuda.get_rng_state_all = function()
  local states = {}
  for i = 1, C.dp_cuda_device_count() do states[i] = torch.get_rng_state() end
  return states
end
torch.cuda.set_rng_state_all = function(states)
  if type(states) ~= "table" then raise("cuda.set_rng_state_all: expected a list of states, got " .. typename(states)) end
  if states[1] ~= nil then torch.set_rng_state(states[1]) end
end
torch.cuda.seed = function() return torch.seed() end
torch.cuda.seed_all = torch.cuda.seed
torch.cuda.initial_seed = function() return torch.initial_seed() end

-- memory_stats([device]): PyTorch's keys for what dplua's allocator counts
-- (bytes in tensors and held in its pool, now and at their peak);
-- memory_summary([device]): the same as a table
torch.cuda.memory_stats = function(d)
  local i = device_index(d, "cuda.memory_stats")
  local now, peak = reserved(i, "cuda.memory_stats")
  return {
    ["allocated_bytes.all.current"] = tonumber(C.dp_memory_allocated(i)),
    ["allocated_bytes.all.peak"] = tonumber(C.dp_max_memory_allocated(i)),
    ["reserved_bytes.all.current"] = now,
    ["reserved_bytes.all.peak"] = peak,
  }
end
torch.cuda.memory_summary = function(d)
  local i = device_index(d, "cuda.memory_summary")
  local s = torch.cuda.memory_stats(i)
  local function mib(b) return string.format("%12.1f MiB", b / 2 ^ 20) end
  return table.concat({
    string.format("dplua CUDA memory, device cuda:%d", i),
    string.format("%-22s %16s %16s", "", "current", "peak"),
    string.format("%-22s %s %s", "allocated (tensors)", mib(s["allocated_bytes.all.current"]), mib(s["allocated_bytes.all.peak"])),
    string.format("%-22s %s %s", "reserved (pool)", mib(s["reserved_bytes.all.current"]), mib(s["reserved_bytes.all.peak"])),
  }, "\n")
end
-- free and total bytes of the device, as cudaMemGetInfo says
torch.cuda.mem_get_info = function(d)
  check(C.dp_cuda_mem_get_info(device_index(d, "cuda.mem_get_info"), i64_box, i64_box2))
  return tonumber(i64_box[0]), tonumber(i64_box2[0])
end
local name_buf, int_boxes = ffi.new("char[256]"), ffi.new("int[3]")
local function device_properties(d, fn)
  check(C.dp_cuda_device_properties(device_index(d, fn), name_buf, 256, i64_box, int_boxes, int_boxes + 1,
                                    int_boxes + 2))
  return { name = ffi.string(name_buf), total_memory = tonumber(i64_box[0]), major = int_boxes[0],
           minor = int_boxes[1], multi_processor_count = int_boxes[2] }
end
torch.cuda.get_device_properties = function(d) return device_properties(d, "cuda.get_device_properties") end
torch.cuda.get_device_name = function(d) return device_properties(d, "cuda.get_device_name").name end
torch.cuda.get_device_capability = function(d)
  local p = device_properties(d, "cuda.get_device_capability")
  return p.major, p.minor
end
torch.cuda.is_bf16_supported = function()
  return torch.cuda.is_available() and torch.cuda.get_device_properties().major >= 8
end

---------------------------------------------------------------- streams and events

-- Streams and events: tables around a cudaStream_t / cudaEvent_t (NULL is
-- a device's default stream). Kernels for a device go to its current
-- stream; torch.cuda.stream(s, fn) makes s current while fn runs.
local Stream, Event = {}, {}
Stream.__index, Event.__index = Stream, Event
local stream_ptr_ct, done_box, ms_box = ffi.typeof("void*[1]"), ffi.new("int[1]"), ffi.new("double[1]")
Stream.__eq = function(a, b) return a.p == b.p and a.device == b.device end
Stream.__tostring = function(s)
  return string.format("<torch.cuda.Stream device=cuda:%d cuda_stream=%s>", s.device,
                       s.p == nil and "0x0 (default)" or tostring(s.p):match("0x%x+"))
end
local function stream_of(p, device) return setmetatable({ p = p, device = device }, Stream) end

function torch.cuda.Stream(device)
  if type(device) == "table" and getmetatable(device) == nil then device = device.device end
  local d = device_index(device, "cuda.Stream")
  local box = stream_ptr_ct()
  check(C.dp_cuda_stream_new(box, d))
  return stream_of(ffi.gc(box[0], C.dp_cuda_stream_free), d)
end
function torch.cuda.current_stream(device)
  local d = device_index(device, "cuda.current_stream")
  C.dp_cuda_launch_deferred()   -- (see data_ptr)
  return stream_of(C.dp_cuda_current_stream(d), d)
end
function torch.cuda.default_stream(device) return stream_of(nil, device_index(device, "cuda.default_stream")) end
local function as_stream(s, fn)
  if getmetatable(s) ~= Stream then raise(fn .. ": expected a torch.cuda.Stream, got " .. typename(s)) end
  return s
end
-- The stream stays referenced while current, so its finalizer cannot run.
local current_streams = {}
function torch.cuda.set_stream(s)
  as_stream(s, "cuda.set_stream")
  check(C.dp_cuda_set_stream(s.device, s.p))
  current_streams[s.device] = s
end
function torch.cuda.stream(s, fn, ...)
  as_stream(s, "cuda.stream")
  if type(fn) ~= "function" then raise("cuda.stream: expected (stream, function), got a " .. typename(fn)) end
  local prev = torch.cuda.current_stream(s.device)
  torch.cuda.set_stream(s)
  return finally(torch.cuda.set_stream, prev, pcall(fn, ...))
end
function Stream:synchronize() check(C.dp_cuda_stream_synchronize(self.p)) end
function Stream:query() check(C.dp_cuda_stream_query(self.p, done_box)); return done_box[0] ~= 0 end
function Stream:wait_event(e) check(C.dp_cuda_stream_wait_event(self.p, e.p)) end
function Stream:record_event(e)
  e = e or torch.cuda.Event()
  e:record(self)
  return e
end
function Stream:wait_stream(other) self:wait_event(as_stream(other, "Stream:wait_stream"):record_event()) end

function torch.cuda.Event(opts)
  opts = opts or {}
  local box = stream_ptr_ct()
  local d = device_index(opts.device, "cuda.Event")
  check(C.dp_cuda_event_new(box, d, opts.enable_timing and 1 or 0))
  return setmetatable({ p = ffi.gc(box[0], C.dp_cuda_event_free), device = d,
                        enable_timing = opts.enable_timing and true or false }, Event)
end
function Event:record(s)
  s = s and as_stream(s, "Event:record") or torch.cuda.current_stream(self.device)
  check(C.dp_cuda_event_record(self.p, s.p))
end
function Event:wait(s)
  s = s and as_stream(s, "Event:wait") or torch.cuda.current_stream(self.device)
  s:wait_event(self)
end
function Event:query() check(C.dp_cuda_event_query(self.p, done_box)); return done_box[0] ~= 0 end
function Event:synchronize() check(C.dp_cuda_event_synchronize(self.p)) end
-- milliseconds from this event to `later`, both recorded with enable_timing
function Event:elapsed_time(later)
  if getmetatable(later) ~= Event then raise("Event:elapsed_time: expected a torch.cuda.Event, got " .. typename(later)) end
  if not (self.enable_timing and later.enable_timing) then
    raise("Event:elapsed_time: both events need torch.cuda.Event{enable_timing = true}")
  end
  check(C.dp_cuda_event_elapsed(ms_box, self.p, later.p))
  return ms_box[0]
end

---------------------------------------------------------------- the kernel profile

-- torch.cuda.profile_kernels(fn, ...) runs fn(...) with every GPU kernel of
-- dplua's and every cuBLASLt product timed by events on its stream, and
-- returns a profile, then fn's results. The profile is a list of rows
-- { name =, calls =, ms = } (kernels by name, total time descending), with
-- total_ms (their sum), span_ms (first start to last end: total_ms / span_ms
-- is how busy the GPU was) and dropped (launches past the cap of 400,000);
-- print(profile) shows the table, profile:table(n) its first n rows. The
-- events serialise each stream around every kernel, so the profiled code
-- runs a little slower; a kernel's own time is what is measured.
local Profile = {}
Profile.__index = Profile
function Profile:table(n)
  n = math.min(n or 40, #self)
  local out = { string.format("%9s %6s %8s %9s  %s", "ms", "%", "calls", "us/call", "kernel") }
  for i = 1, n do
    local r = self[i]
    out[#out + 1] = string.format("%9.3f %6.1f %8d %9.2f  %s", r.ms, 100 * r.ms / math.max(self.total_ms, 1e-12),
                                  r.calls, 1000 * r.ms / r.calls, r.name)
  end
  if #self > n then out[#out + 1] = string.format("(%d more kernels)", #self - n) end
  out[#out + 1] = string.format("%9.3f ms in %d kernels over a span of %.3f ms%s", self.total_ms, #self, self.span_ms,
                                self.dropped > 0 and string.format(" (%d launches not recorded)", self.dropped) or "")
  return table.concat(out, "\n")
end
Profile.__tostring = function(self) return self:table() end

local profile_box, dropped_box, span_box = ffi.new("int[1]"), ffi.new("int64_t[1]"), ffi.new("double[1]")
local row_name, row_calls, row_ms = ffi.new("const char *[1]"), ffi.new("int64_t[1]"), ffi.new("double[1]")
local profiling = false
-- _profile_start(who) and _profile_stop(): the two halves, which
-- torch.profiler's CUDA activity also uses; the stop returns the profile
function torch.cuda._profile_start(who)
  if profiling then raise(who .. ": a kernel profile is already running (profiles do not nest)") end
  check(C.dp_cuda_profile_start())
  profiling = true
end
function torch.cuda._profile_stop()
  profiling = false
  check(C.dp_cuda_profile_stop(profile_box, dropped_box, span_box))
  local prof = setmetatable({ total_ms = 0, span_ms = tonumber(span_box[0]), dropped = tonumber(dropped_box[0]) },
                            Profile)
  for i = 0, profile_box[0] - 1 do
    check(C.dp_cuda_profile_row(i, row_name, row_calls, row_ms))
    prof[i + 1] = { name = ffi.string(row_name[0]), calls = tonumber(row_calls[0]), ms = tonumber(row_ms[0]) }
    prof.total_ms = prof.total_ms + prof[i + 1].ms
  end
  return prof
end
function torch.cuda.profile_kernels(fn, ...)
  if type(fn) ~= "function" then raise("cuda.profile_kernels: expected a function to run, got " .. typename(fn)) end
  torch.cuda._profile_start("cuda.profile_kernels")
  local function run(okfn, ...)
    local prof = torch.cuda._profile_stop()
    if not okfn then error((...), 0) end
    return prof, ...
  end
  return run(pcall(fn, ...))
end

---------------------------------------------------------------- graphs

-- CUDA graphs: torch.cuda.graph(fn) runs fn once under stream capture and
-- returns a graph whose :replay() runs the same kernels again on the same
-- memory. fn (and so the tensors it reaches) stays referenced by the
-- graph. See docs/API.md for what cannot be captured.
local CUDAGraph = {}
CUDAGraph.__index = CUDAGraph
local graph_box = ffi.new("dp_cuda_graph*[1]")
function torch.cuda.graph(fn)
  if type(fn) ~= "function" then raise("cuda.graph: expected a function to capture, got a " .. typename(fn)) end
  check(C.dp_cuda_graph_begin(graph_box, current_device))
  local g = ffi.gc(graph_box[0], C.dp_cuda_graph_free)
  local ok, err = pcall(fn)
  local st = C.dp_cuda_graph_end(g, ok and 1 or 0)
  if not ok then error(err, 0) end
  check(st)
  return setmetatable({ g = g, fn = fn, device = current_device }, CUDAGraph)
end
function CUDAGraph:replay() check(C.dp_cuda_graph_replay(self.g)) end
function torch.cuda.is_current_stream_capturing() return C.dp_cuda_capturing() ~= 0 end

---------------------------------------------------------------- torch.backends

-- torch.backends.cuda.matmul.allow_tf32, as in PyTorch (off by default)
local matmul_flags = { allow_tf32 = false }
torch.backends = { cuda = { matmul = setmetatable({}, {
  __index = matmul_flags,
  __newindex = function(_, k, v)
    if k ~= "allow_tf32" then raise("backends.cuda.matmul: unknown setting '" .. tostring(k) .. "'") end
    if type(v) ~= "boolean" then
      raise("backends.cuda.matmul.allow_tf32: expected a boolean, got " .. type(v))
    end
    matmul_flags.allow_tf32 = v
    C.dp_cuda_set_allow_tf32(v and 1 or 0)
  end,
}) } }

-- A table of boolean settings with the given defaults: unknown names and
-- non-booleans are refused by name.
local function switches(prefix, defaults, on_set)
  local values = {}
  for k, v in pairs(defaults) do values[k] = v end
  return setmetatable({}, {
    __index = values,
    __newindex = function(_, k, v)
      if values[k] == nil then raise(prefix .. ": unknown setting '" .. tostring(k) .. "'") end
      if type(v) ~= "boolean" then raise(string.format("%s.%s: expected a boolean, got %s", prefix, k, type(v))) end
      values[k] = v
      if on_set then on_set(k, v) end
    end,
  })
end

-- torch.backends.cudnn: dplua does not use cuDNN (is_available() is
-- false); its settings (enabled, benchmark, deterministic, allow_tf32) are
-- kept and read back, so that scripts that set them run, and change
-- nothing: the convolutions choose their kernels without a benchmark pass.
torch.backends.cudnn = switches("backends.cudnn", { enabled = true, benchmark = false, deterministic = false,
                                                    allow_tf32 = true })
rawset(getmetatable(torch.backends.cudnn).__index, "is_available", function() return false end)
rawset(getmetatable(torch.backends.cudnn).__index, "version", function() return nil end)
-- torch.backends.mps (Apple's GPUs): never available
torch.backends.mps = { is_available = function() return false end, is_built = function() return false end }

-- The attention backends: enable_flash_sdp(false) makes
-- F.scaled_dot_product_attention take its matmul-softmax-matmul path (the
-- "math" backend) instead of the fused kernel; the memory-efficient and
-- cuDNN backends are PyTorch's alone, their switches kept for reading.
local sdp = { flash = true, mem_efficient = true, math = true, cudnn = true }
for name in pairs(sdp) do
  torch.backends.cuda["enable_" .. name .. "_sdp"] = function(on)
    if type(on) ~= "boolean" then raise("backends.cuda.enable_" .. name .. "_sdp: expected a boolean, got " .. type(on)) end
    sdp[name] = on
  end
  torch.backends.cuda[name .. "_sdp_enabled"] = function() return sdp[name] end
end

-- set_float32_matmul_precision("highest" | "high" | "medium"): PyTorch's
-- switch for float32 products; "high" and "medium" allow TF32 (dplua has no
-- bfloat16-pass float32 product, so "medium" is "high").
local precisions = { highest = false, high = true, medium = true }
local precision_set = "highest"
function torch.set_float32_matmul_precision(precision)
  local tf32 = precisions[precision]
  if tf32 == nil then
    raise(string.format('set_float32_matmul_precision: expected "highest", "high" or "medium", got %s', tostring(precision)))
  end
  torch.backends.cuda.matmul.allow_tf32 = tf32
  precision_set = precision
end
function torch.get_float32_matmul_precision()
  if not matmul_flags.allow_tf32 then return "highest" end
  return precision_set == "medium" and "medium" or "high"
end
