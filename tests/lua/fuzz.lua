--[=[
fuzz.lua -- drives the Lua tensor API (docs/API.md) with random calls:
random shapes (empty, negative, nine dims, sizes like 2^40 and products
that overflow int64), random and invalid dtypes and devices, views with
dims and indices out of range, mismatched operands, and wrong argument
types (nil, strings, tables, functions, booleans, numbers or plain tables
where tensors are expected, NaN and infinities). Errors are fine as long as
they are Lua errors with a non-empty string message; the fuzzer exists to
show that nothing a script does crashes the process.

    ./dplua tests/lua/fuzz.lua [ITERATIONS [SEED]]

  DPLUA_FUZZ_ITERATIONS   calls to make (default 5000; the argument wins)
  DPLUA_FUZZ_SEED         seed (default: the time; printed either way)
  DPLUA_FUZZ_TRACE=FILE   append every statement to FILE before it runs
  DPLUA_FUZZ_SKIP=PATS    Lua patterns separated by ";;": statements that
                          match one are not run (counted and listed in
                          the output, and the final test fails: a way to
                          look for more crashes past a known one, not a
                          way to pass)
  DPLUA_FUZZ_SLOW=SECONDS  list the statements that take longer
  DPLUA_FUZZ_GUARD_SELF=1 refuse, before the library sees it, a call of a
                          Tensor method (t:NAME() or torch.NAME(t)) whose
                          t is not a tensor; likewise counted, listed and
                          failed: it gets past a crash of that kind

Every call is generated as one line of Lua source and run with load()
under pcall, so what runs is exactly what is traced: after a crash, FILE
is a script that replays the run up to the crashing line (`./dplua FILE`);
the same seed gives the same statements, so a crash seen without a trace
is reproduced by running again with DPLUA_FUZZ_TRACE set. Statements work
on a small pool of values P[1..NPOOL]; tensors above MAX_NUMEL elements
are dropped from the pool so that every call stays cheap.

Sizes between "small" and "absurd" (an allocation of a few GB that would
succeed) are not generated on purpose, but random numbers can still land
in a size (torch.arange(2^31 - 1) is 16 GB). So that such a call fails
quickly instead of filling memory, the fuzzer caps its own address space
with setrlimit at what it uses when it starts plus DPLUA_FUZZ_MAX_BYTES
(default 1 GiB; 0: no cap) plus 64 MiB per CPU for OpenBLAS's per-thread
buffers. Under AddressSanitizer, which reserves
terabytes of shadow memory, it cannot: there
ASAN_OPTIONS=allocator_may_return_null=1:max_allocation_size_mb=N does the
same (tests/sh/test_fuzz_asan.sh sets it).

Output is TAP: one test per batch of BATCH calls (a failure lists the
statements whose error was not a non-empty string, or whose check failed)
and a final summary. A crash leaves the plan unfinished and the exit
status non-zero, which the TAP driver reports.
--]=]

local torch = require("dplua")

local NPOOL, MAX_NUMEL, BATCH = 12, 1024, 500

local iterations = tonumber(arg and arg[1] or os.getenv("DPLUA_FUZZ_ITERATIONS") or 5000)
local seed = tonumber(arg and arg[2] or os.getenv("DPLUA_FUZZ_SEED") or os.time())
local trace_path = os.getenv("DPLUA_FUZZ_TRACE")
if trace_path == "" then trace_path = nil end
local skip_patterns = {}
for pat in (os.getenv("DPLUA_FUZZ_SKIP") or ""):gmatch("([^;]+)") do skip_patterns[#skip_patterns + 1] = pat end
local skipped = {}
local slow = tonumber(os.getenv("DPLUA_FUZZ_SLOW") or "")

local guard_self = (os.getenv("DPLUA_FUZZ_GUARD_SELF") or "") ~= ""
local GUARD_SRC = [[
local torch = ...
local count = { 0 }
for name, fn in pairs(torch.Tensor) do
  local g = function(t, ...)
    if not torch.is_tensor(t) then count[1] = count[1] + 1; error("fuzz guard: self is not a tensor", 2) end
    return fn(t, ...)
  end
  if torch[name] == fn then torch[name] = g end
  torch.Tensor[name] = g
end
return count
]]
local guarded = guard_self and assert(loadstring(GUARD_SRC))(torch)

-- The address-space cap (see the top of the file).
local ffi = require("ffi")
local max_bytes = tonumber(os.getenv("DPLUA_FUZZ_MAX_BYTES") or "") or 2^30
local under_asan = pcall(function()
  ffi.cdef("void __asan_init(void);")
  return ffi.C.__asan_init
end)
local memory_note
if under_asan then
  memory_note = "under AddressSanitizer: allocations are capped by ASAN_OPTIONS=" .. (os.getenv("ASAN_OPTIONS") or "")
elseif tonumber(os.getenv("DPLUA_MAX_ALLOC_BYTES") or "") then
  -- dplua itself refuses any one allocation above this: no address-space
  -- cap, which LuaJIT's JIT (its machine-code areas) must not run into
  memory_note = "allocations above DPLUA_MAX_ALLOC_BYTES=" .. os.getenv("DPLUA_MAX_ALLOC_BYTES") .. " refused"
elseif max_bytes > 0 and ffi.os == "Linux" then
  ffi.cdef("struct dplua_fuzz_rlimit { uint64_t cur, max; };"
           .. "int setrlimit(int resource, const struct dplua_fuzz_rlimit *rlim);"
           .. "int getrlimit(int resource, struct dplua_fuzz_rlimit *rlim);")
  local RLIMIT_AS = 9
  local in_use = 0
  local f = io.open("/proc/self/status")
  if f then
    in_use = 1024 * (tonumber(f:read("*a"):match("VmSize:%s*(%d+) kB")) or 0)
    f:close()
  end
  ffi.cdef("long sysconf(int name);")
  local ncpu = tonumber(ffi.C.sysconf(84))   -- _SC_NPROCESSORS_ONLN
  if not ncpu or ncpu < 1 then ncpu = 1 end
  local cap = in_use + max_bytes + ncpu * 64 * 2^20
  local lim = ffi.new("struct dplua_fuzz_rlimit")
  ffi.C.getrlimit(RLIMIT_AS, lim)
  if lim.cur > cap then
    lim.cur = cap
    ffi.C.setrlimit(RLIMIT_AS, lim)
  end
  memory_note = string.format("address space capped at %.2f GiB (%.2f GiB in use at the start)",
                              tonumber(lim.cur) / 2^30, in_use / 2^30)
else
  memory_note = "no cap on memory"
end

-- Wall-clock seconds (os.clock is CPU time, and odd under ASan).
ffi.cdef("struct dplua_fuzz_timespec { int64_t sec, nsec; };"
         .. "int clock_gettime(int clk, struct dplua_fuzz_timespec *ts);")
local ts = ffi.new("struct dplua_fuzz_timespec")
local function now()
  ffi.C.clock_gettime(1, ts)   -- CLOCK_MONOTONIC
  return tonumber(ts.sec) + tonumber(ts.nsec) * 1e-9
end

local R = math.random
math.randomseed(seed)
torch.manual_seed(seed % 2^31)

local function chance(p) return R() < p end
local function pick(list) return list[R(#list)] end

-- ---------------------------------------------------------------- the pool

local P = {}
local nan, inf = 0 / 0, math.huge
-- print would write into the TAP stream: a sink that still formats
local function sink(...)
  for i = 1, select("#", ...) do tostring((select(i, ...))) end
end

local function is_tensor(v) return torch.is_tensor(v) end

-- Shape (a Lua table) and dtype name of a pool tensor, or nil.
local function info(v)
  if not is_tensor(v) then return nil end
  local ok, shape, dt = pcall(function() return v:size(), v.dtype.name end)
  if not ok then return nil end
  return shape, dt
end

local function numel(shape)
  local n = 1
  for i = 1, #shape do n = n * shape[i] end
  return n
end

-- Indices of the pool slots that hold tensors.
local function tensor_slots()
  local r = {}
  for i = 1, NPOOL do if is_tensor(P[i]) then r[#r + 1] = i end end
  return r
end

-- ---------------------------------------------------------------- literals

local function num_src(v)
  if v ~= v then return "nan" end
  if v == inf then return "inf" elseif v == -inf then return "-inf" end
  if v % 1 == 0 and math.abs(v) < 2 ^ 53 then return string.format("%d", v) end
  return string.format("%.17g", v)
end

local function list_src(list)
  local parts = {}
  for i = 1, #list do parts[i] = type(list[i]) == "number" and num_src(list[i]) or list[i] end
  return table.concat(parts, ", ")
end
local function table_src(list) return "{" .. list_src(list) .. "}" end

local EDGE_INTS = { "-1", "-2", "-3", "6", "7", "9", "100", "2^31 - 1", "2^31", "-2^31 - 1", "2^32 + 1",
                    "2^40", "2^53", "2^53 + 2", "2^62", "2^63", "-2^63", "1e300", "-1e300" }
local EDGE_NUMS = { "0.5", "-0.5", "1.5", "nan", "inf", "-inf", "-0.0", "1e-300", "1e308", "-1e308",
                    "0.1", "3.75", "-2.5" }

-- A number, mostly a small integer.
local function rnum()
  local r = R()
  if r < 0.55 then return tostring(R(-3, 8)) end
  if r < 0.75 then return pick(EDGE_INTS) end
  if r < 0.92 then return pick(EDGE_NUMS) end
  return num_src(math.floor((R() * 20 - 10) * 1000) / 1000)
end

-- A number that ends up as a size (arange's bounds, linspace's steps, eye):
-- small, or absurd enough (2^40 and up) that the call must fail at once.
local ABSURD = { "2^40", "-2^40", "2^53", "2^62", "2^63", "-2^63", "1e300", "inf", "-inf", "nan", "-1", "0.5",
                 "-0.0", "1e-300" }
local function rsize()
  local r = R()
  if r < 0.7 then return tostring(R(-3, 12)) end
  if r < 0.82 then return num_src(math.floor((R() * 20 - 10) * 100) / 100) end
  return pick(ABSURD)
end

-- Values that are not what an argument wants.
local BAD = { "nil", "42", "-1", "nan", "inf", "'abc'", "''", "'2'", "{}", "{1, 2}", "{{1}, {2}}", "true", "false",
              "function() end", "print", "torch", "torch.float32", "P", "{p = 1}", "{dtype = 3}",
              "coroutine.create(function() end)", "io.stdout", "newproxy()", "torch.device('cpu')",
              "torch.Tensor", "setmetatable({}, {__index = function() error('boom') end})",
              "setmetatable({}, {__len = function() return 2^40 end})" }
local function rbad()
  if chance(0.15) then return "P[" .. R(NPOOL) .. "]" end     -- whatever is there
  return pick(BAD)
end

local DTYPE_NAMES = { "float32", "float64", "int64", "int32", "uint8", "bool", "bfloat16" }
local FLOAT_NAMES = { "float32", "float64", "bfloat16" }
local INT_NAMES = { "int64", "int32", "uint8" }
local BAD_DTYPES = { "'float16'", "'complex64'", "''", "'torch.'", "42", "{}", "true", "torch.cuda", "'cuda'",
                     "{name = 'float32', id = 99}", "setmetatable({id = 99, name = 'x'}, torch.dtype_mt)",
                     "setmetatable({id = -1, name = 'x'}, torch.dtype_mt)" }

local function rdtype()
  local r = R()
  if r < 0.6 then return "torch." .. pick(DTYPE_NAMES) end
  if r < 0.7 then return pick({ "torch.float", "torch.double", "torch.long", "torch.int" }) end
  if r < 0.82 then return "'" .. pick(DTYPE_NAMES) .. "'" end
  return pick(BAD_DTYPES)
end

local function rdevice()
  if chance(0.7) then return pick({ "'cpu'", "torch.device('cpu')" }) end
  return pick({ "'cuda'", "'cuda:1'", "'cuda:-1'", "'gpu'", "-1", "0", "7", "{}", "'cpu:0'", "1.5", "true" })
end

local function ropts()
  local r = R()
  if r < 0.35 then return nil end
  local parts = {}
  if chance(0.7) then parts[#parts + 1] = "dtype = " .. rdtype() end
  if chance(0.25) then parts[#parts + 1] = "device = " .. rdevice() end
  if chance(0.15) then parts[#parts + 1] = "requires_grad = " .. pick({ "true", "false", "1", "'yes'" }) end
  if #parts == 0 then return "{}" end
  return "{" .. table.concat(parts, ", ") .. "}"
end

-- A small shape as a Lua table of sizes: at most 625 elements.
local function small_shape(maxnd)
  local s = {}
  for i = 1, R(0, maxnd or 3) do s[i] = chance(0.07) and 0 or R(1, 5) end
  return s
end

local BAD_SHAPES = { "{-1}", "{2, -3}", "{1, 1, 1, 1, 1, 1, 1, 1, 1}", "{2, 2, 2, 2, 2, 2, 2, 2, 2, 2}", "{2^40}",
                     "{2^62, 4}", "{2^32 + 1, 2^32 - 1}", "{2^63}", "{1.5}", "{nan}", "{inf}", "{'a'}", "{{}}",
                     "{true}", "{2, nil, 3}", "{-2^63}", "{0, 2^62, 2^62}", "{2^31, 2^31, 2^31}", "{1e300}",
                     "{-0.0}", "{1, 1, 1, 1, 1, 1, 1, 1}", "{0, 2^40}", "{2^40, 0, 3}", "{0, 2^31, 2^31}",
                     "{3, 0, 2^50}" }

-- Source of a shape table: mostly a plausible one.
local function rshape()
  if chance(0.85) then return table_src(small_shape(4)) end
  return pick(BAD_SHAPES)
end

-- ---------------------------------------------------------------- tensors

-- Source of a fresh tensor of shape s (a table) and dtype name dt, made in
-- one of several layouts (contiguous, transposed, expanded, strided) and
-- with special values now and then.
local function fresh(s, dt)
  s = s or small_shape(3)
  dt = dt or pick(DTYPE_NAMES)
  local src, nd = table_src(s), #s
  local r = R(9)
  if r == 1 then
    return string.format("torch.randint(-4, 5, %s, {dtype = torch.%s})", src, dt == "bool" and "int64" or dt)
  elseif r == 2 and dt ~= "bool" then
    return string.format("torch.arange(%d, {dtype = torch.%s}):reshape(%s)", numel(s), dt, src)
  elseif r == 3 then
    return string.format("torch.full(%s, %s, {dtype = torch.%s})", src, rnum(), dt)
  elseif r == 4 and nd >= 2 then
    local t = {}
    for i = 1, nd do t[i] = s[i] end
    t[nd], t[nd - 1] = s[nd - 1], s[nd]
    return string.format("torch.randn(%s):mul(3):to(torch.%s):transpose(-1, -2)", table_src(t), dt)
  elseif r == 5 and nd >= 1 then
    local t = {}
    for i = 1, nd do t[i] = s[i] end
    t[1] = 1
    return string.format("torch.randn(%s):to(torch.%s):expand(%s)", table_src(t), dt, src)
  elseif r == 6 and nd >= 1 then
    local t, idx = {}, {}
    for i = 1, nd do t[i] = s[i]; idx[i] = "{}" end
    t[nd] = s[nd] * 2
    idx[nd] = "{0, nil, 2}"
    return string.format("torch.randn(%s):to(torch.%s)[{%s}]", table_src(t), dt, table.concat(idx, ", "))
  elseif r == 7 then
    return string.format("torch.tensor({nan, inf, -inf, 0, -0.0, 1, -1, 1e30}):to(torch.%s)", dt)
  elseif r == 8 then
    return string.format("torch.randn(%s):mul(3):to(torch.%s)", src, dt)
  end
  return string.format("torch.rand(%s):lt(0.5):to(torch.%s)", src, dt)
end

-- Source of a value used where a tensor is expected: mostly a pool tensor.
-- Anything else comes in parentheses, so that it can take a method call
-- or an index: `{}:sum()` does not parse, `({}):sum()` does.
local function rtensor()
  local r = R()
  local slots = tensor_slots()
  if r < 0.72 and #slots > 0 then return "P[" .. pick(slots) .. "]" end
  if r < 0.9 then return "(" .. fresh() .. ")" end
  return "(" .. rbad() .. ")"
end

-- The shape and dtype behind a tensor source from rtensor(), when it is a
-- pool tensor (nil otherwise).
local function shape_of(src)
  local i = src:match("^P%[(%d+)%]$")
  if i then return info(P[tonumber(i)]) end
end

-- A dim for a tensor of nd dims: mostly in range, sometimes not.
local function rdim(nd)
  nd = nd or 2
  local r = R()
  if r < 0.75 then
    local lim = math.max(nd, 1)
    return tostring(R(-lim, lim - 1))
  end
  if r < 0.9 then return tostring(pick({ nd, nd + 1, -nd - 1, -nd - 2, 8, -9, 100 })) end
  return pick({ "2^31", "-2^31 - 1", "2^63", "nan", "0.5", "inf", "'0'", "nil", "{}", "true" })
end

-- An index along a dim of size n: mostly in range.
local function rindex(n)
  n = n or 3
  local r = R()
  if r < 0.7 and n > 0 then return tostring(R(-n, n - 1)) end
  if r < 0.85 then return tostring(pick({ n, -n - 1, n + 5, -2 * n - 3 })) end
  return pick({ "2^40", "2^63", "-2^63", "nan", "1.5", "inf", "'1'", "nil", "{}", "false" })
end

-- Any argument at all.
local function rarg()
  local r = R()
  if r < 0.3 then return rtensor() end
  if r < 0.55 then return rnum() end
  if r < 0.62 then return rdtype() end
  if r < 0.66 then return rshape() end
  return rbad()
end

local function args(n, gen)
  local a = {}
  for i = 1, n do a[i] = (gen or rarg)() end
  return table.concat(a, ", ")
end

-- ---------------------------------------------------------------- actions
--
-- Each action returns the source of one statement (it may assign P[k]) and
-- optionally a check(ok, result) that returns a failure message or nil.

local UNARY = { "neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "gelu", "sin", "cos",
                "sign", "floor", "ceil", "round", "reciprocal", "log1p", "expm1", "logical_not", "square" }
local BINARY = { "add", "sub", "mul", "div", "pow", "maximum", "minimum", "remainder", "atan2", "eq", "ne", "lt",
                 "le", "gt", "ge", "logical_and", "logical_or" }
local OPERATORS = { "+", "-", "*", "/", "^", "%" }
local REDUCE = { "sum", "mean", "prod", "max", "min", "argmax", "argmin", "var", "std", "all", "any", "amax", "amin" }
local INPLACE = { "add_", "sub_", "mul_", "div_", "pow_", "remainder_", "maximum_", "eq_", "logical_and_" }
local CONVERT = { "float", "double", "long", "int", "bool", "byte", "bfloat16", "cpu", "cuda", "clone", "detach",
                  "contiguous" }
local INSPECT = { "t:size()", "t:size(%s)", "t.shape", "t:dim()", "t:numel()", "t.dtype", "t.device",
                  "t:stride()", "t:stride(%s)", "t:is_contiguous()", "#t", "t.T", "t.ndim", "t:element_size()",
                  "t:is_floating_point()", "t:type()", "t.requires_grad", "t.is_leaf", "t.grad", "t.grad_fn",
                  "t.data", "t.nonexistent", "t:item()", "t:tolist()", "tostring(t)", "print(t)",
                  "torch.tensor(t:tolist())", "t == t", "t < t", "t .. 'x'", "t()", "t.shape[1]" }

local A = {}   -- name -> generator(k) returning source, check

A.create = function(k)
  local fn = pick({ "zeros", "ones", "empty", "rand", "randn" })
  local r = R()
  if r < 0.5 then
    local o = ropts()
    return string.format("P[%d] = torch.%s(%s%s)", k, fn, rshape(), o and ", " .. o or "")
  end
  if r < 0.8 then
    local s = rshape():sub(2, -2)
    local o = ropts()
    return string.format("P[%d] = torch.%s(%s%s)", k, fn, s, o and (s ~= "" and ", " or "") .. o or "")
  end
  return string.format("P[%d] = torch.%s(%s)", k, fn, args(R(0, 3)))
end

A.create_other = function(k)
  local o = ropts()
  local os_ = o and ", " .. o or ""
  local c = pick({
    function() return string.format("torch.full(%s, %s%s)", rshape(), pick({ rnum(), "true", "false", rbad() }), os_) end,
    function() return string.format("torch.arange(%s%s)", rsize(), os_) end,
    function() return string.format("torch.arange(%s, %s%s)", rsize(), rsize(), os_) end,
    function() return string.format("torch.arange(%s, %s, %s%s)", rsize(), rsize(), rsize(), os_) end,
    function() return string.format("torch.linspace(%s, %s, %s%s)", rnum(), rnum(), rsize(), os_) end,
    function() return string.format("torch.eye(%s%s)", rsize(), os_) end,
    function() return string.format("torch.eye(%s, %s%s)", rsize(), rsize(), os_) end,
    function() return string.format("torch.randint(%s, %s, %s%s)", rnum(), rnum(), rshape(), os_) end,
    function() return string.format("torch.randint(%s, %s%s)", rnum(), rshape(), os_) end,
    function() return string.format("torch.manual_seed(%s)", rnum()) end,
    function() return string.format("torch.%s(%s%s)", pick({ "zeros_like", "ones_like", "empty_like", "rand_like",
                                                             "randn_like" }), rtensor(), os_) end,
    function() return string.format("torch.full_like(%s, %s%s)", rtensor(), rnum(), os_) end,
    function() return string.format("torch.randint_like(%s, %s, %s)", rtensor(), rnum(), rnum()) end,
    function() return string.format("torch.tensor(%s%s)", pick({ "{1, 2, 3}", "{{1, 2}, {3, 4}}", "{true, false}",
      "{{1}, {2, 3}}", "{}", "{{}}", "{1, {2}}", "{nan, inf}", "{'a'}", "3.5", "{" .. rtensor() .. "}",
      "{{{{{{{{{1}}}}}}}}}", "{{{{{{{{1}}}}}}}}", rtensor(), "{2^63, -2^63}", "{1, nil, 3}", "{function() end}" }), os_) end,
  })
  return string.format("P[%d] = %s", k, c())
end

A.fresh = function(k) return string.format("P[%d] = %s", k, fresh()) end

A.view = function(k)
  local t = rtensor()
  local shape = shape_of(t) or { 2, 3 }
  local nd = #shape
  local c = pick({
    function()
      -- a reshape of the same numel, with a -1 now and then, or junk
      local n, s = numel(shape), {}
      if chance(0.7) then
        local f = 1
        for d = 2, 5 do if n % d == 0 and chance(0.5) then s[#s + 1] = d; n = n / d end end
        s[#s + 1] = n
        if chance(0.3) then s[R(#s)] = -1 end
        if chance(0.2) then s[#s + 1] = -1 end
      else
        return string.format(":%s(%s)", pick({ "view", "reshape" }), pick({ rshape(), args(R(0, 3)) }))
      end
      return string.format(":%s(%s)", pick({ "view", "reshape" }), chance(0.5) and table_src(s) or list_src(s))
    end,
    function() return string.format(":transpose(%s, %s)", rdim(nd), rdim(nd)) end,
    function() return ":t()" end,
    function()
      local p = {}
      for i = 1, nd do p[i] = i - 1 end
      for i = nd, 2, -1 do local j = R(i); p[i], p[j] = p[j], p[i] end
      if chance(0.25) and nd > 0 then p[R(nd)] = tonumber(rdim(nd)) or 0 end
      if chance(0.1) then p[#p + 1] = 0 end
      return string.format(":permute(%s)", chance(0.5) and table_src(p) or list_src(p))
    end,
    function() return ":contiguous()" end,
    function() return chance(0.4) and ":squeeze()" or string.format(":squeeze(%s)", rdim(nd)) end,
    function() return string.format(":unsqueeze(%s)", rdim(nd + 1)) end,
    function()
      local s = {}
      local extra = chance(0.3) and R(1, 2) or 0
      for i = 1, extra do s[i] = R(1, 3) end
      for i = 1, nd do
        local v = shape[i]
        if v == 1 and chance(0.6) then v = R(0, 4) elseif chance(0.2) then v = -1 end
        if chance(0.05) then v = tonumber(rnum()) or 2 end
        s[#s + 1] = v
      end
      return string.format(":expand(%s)", chance(0.5) and table_src(s) or list_src(s))
    end,
    function() return string.format(":expand_as(%s)", rtensor()) end,
    function()
      local d = rdim(nd)
      local size = shape[(tonumber(d) or 0) % math.max(nd, 1) + 1] or 3
      return string.format(":narrow(%s, %s, %s)", d, rindex(size), pick({ tostring(R(0, size)), rnum() }))
    end,
    function()
      local d = rdim(nd)
      local size = shape[(tonumber(d) or 0) % math.max(nd, 1) + 1] or 3
      return string.format(":select(%s, %s)", d, rindex(size))
    end,
    function()
      local r = R(3)
      if r == 1 then return ":flatten()" end
      if r == 2 then return string.format(":flatten(%s)", rdim(nd)) end
      return string.format(":flatten(%s, %s)", rdim(nd), rdim(nd))
    end,
  })
  local form = c()
  -- the torch.NAME(t, ...) form too, where t can be anything
  if chance(0.15) then
    local name, rest = form:match("^:([%w_]+)%((.*)%)$")
    return string.format("P[%d] = torch.%s(%s%s)", k, name, rbad(), rest ~= "" and ", " .. rest or "")
  end
  return string.format("P[%d] = %s%s", k, t, form)
end

-- A slice entry for a dim of size n: a number, {}, {start, stop[, step]}, or junk.
local function slice_entry(n)
  local r = R()
  if r < 0.3 then return rindex(n) end
  if r < 0.45 then return "{}" end
  if r < 0.9 then
    local e = { chance(0.8) and tostring(R(-n - 1, n + 1)) or "nil", chance(0.8) and tostring(R(-n - 1, n + 2)) or "nil" }
    if chance(0.4) then e[3] = tostring(pick({ 1, 2, 3, 0, -1, 2^40 })) end
    return "{" .. table.concat(e, ", ") .. "}"
  end
  return pick({ "'x'", "true", "{'a'}", "{1, 2, 3, 4}", "{nan}", "{0, 2^63}", "{-2^63, 2^63}", "function() end",
                "{{}}", "{0, 1, 'x'}" })
end

local function index_key(shape)
  if chance(0.3) then return rindex(shape[1] or 0) end
  local e = {}
  for d = 1, R(0, #shape + 1) do e[d] = slice_entry(shape[d] or 2) end
  if chance(0.05) then return pick({ "'abc'", "true", "nil", "nan", "{[0] = 1}", "{n = 1}" }) end
  return "{" .. table.concat(e, ", ") .. "}"
end

A.index = function(k)
  local t = rtensor()
  local shape = shape_of(t) or { 3 }
  local key = index_key(shape)
  if chance(0.55) then return string.format("P[%d] = %s[%s]", k, t, key) end
  local r = R()
  local v
  if r < 0.4 then v = rnum()
  elseif r < 0.8 then v = rtensor()
  else v = pick({ "true", "false", "'x'", "{}", "nil", "function() end" }) end
  return string.format("%s[%s] = %s", t, key, v)
end

A.unary = function(k)
  local t = rtensor()
  local name = pick(UNARY)
  local r = R()
  if r < 0.55 then return string.format("P[%d] = %s:%s()", k, t, name) end
  if r < 0.75 then return string.format("P[%d] = %s:%s_()", k, t, name) end
  if r < 0.85 then return string.format("P[%d] = %s:gelu(%s)", k, t, pick({ "'tanh'", "'none'", "'x'", "1", "nil" })) end
  if r < 0.92 then return string.format("P[%d] = -%s", k, t) end
  return string.format("P[%d] = torch.%s(%s)", k, name, rarg())
end

-- A second operand that broadcasts with src's shape, most of the time.
local function operand(src)
  local shape = shape_of(src)
  if not shape or chance(0.35) then return chance(0.3) and "(" .. rnum() .. ")" or rtensor() end
  local s = {}
  local drop = R(0, #shape)
  for i = drop + 1, #shape do s[#s + 1] = chance(0.3) and 1 or shape[i] end
  if chance(0.15) then table.insert(s, 1, R(1, 3)) end
  return "(" .. fresh(s) .. ")"
end

A.binary = function(k)
  local a = rtensor()
  local b = operand(a)
  if chance(0.5) then a, b = b, a end
  local r = R()
  if r < 0.35 then return string.format("P[%d] = %s:%s(%s)", k, a, pick(BINARY), b) end
  if r < 0.6 then return string.format("P[%d] = %s %s %s", k, a, pick(OPERATORS), b) end
  if r < 0.7 then return string.format("P[%d] = %s %s %s", k, rnum(), pick(OPERATORS), a) end
  if r < 0.8 then return string.format("P[%d] = %s:%s(%s, %s)", k, a, pick({ "add", "sub", "add_", "sub_" }), b, rnum()) end
  if r < 0.9 then return string.format("P[%d] = %s:%s(%s)", k, a, pick(INPLACE), b) end
  return string.format("P[%d] = torch.%s(%s, %s)", k, pick(BINARY), rarg(), rarg())
end

A.where_clamp = function(k)
  local a = rtensor()
  local r = R()
  if r < 0.35 then
    local cond = chance(0.7) and ("(" .. operand(a) .. "):gt(0)") or rarg()
    return string.format("P[%d] = torch.where(%s, %s, %s)", k, cond, chance(0.7) and a or rnum(),
                         chance(0.6) and operand(a) or rnum())
  end
  local lo = chance(0.25) and "nil" or rnum()
  local hi = chance(0.25) and "nil" or rnum()
  if chance(0.1) then lo = rarg() end
  local c = pick({ ":clamp(%s, %s)", ":clamp_(%s, %s)", ":clamp({min = %s, max = %s})", ":clamp_min(%s)%s",
                   ":clamp_max(%s)%s", ":clip(%s, %s)" })
  if c:find("%)%%s$") then
    return string.format("P[%d] = %s" .. c, k, a, lo, "")
  end
  return string.format("P[%d] = %s" .. c, k, a, lo, hi)
end

A.reduce = function(k)
  local t = rtensor()
  local shape = shape_of(t) or { 3 }
  local nd = #shape
  local name = pick(REDUCE)
  local r = R()
  local kd = pick({ "true", "false", "nil", "1", "'yes'" })
  if r < 0.25 then return string.format("P[%d] = %s:%s()", k, t, name) end
  if r < 0.6 then return string.format("P[%d] = %s:%s(%s, %s)", k, t, name, rdim(nd), kd) end
  if r < 0.7 then return string.format("P[%d] = %s:%s({%s, %s}, %s)", k, t, name, rdim(nd), rdim(nd), kd) end
  if r < 0.78 then return string.format("P[%d] = %s:%s({dim = %s, keepdim = %s})", k, t, name, rdim(nd), kd) end
  if r < 0.88 then
    return string.format("P[%d] = %s:%s(%s, {correction = %s, keepdim = %s, unbiased = %s})", k, t,
                         pick({ "var", "std" }), rdim(nd), rnum(), kd, pick({ "true", "false", "nil" }))
  end
  if r < 0.95 then return string.format("P[%d] = %s:%s(%s)", k, t, pick({ "softmax", "log_softmax" }), rdim(nd)) end
  return string.format("P[%d] = torch.%s(%s, %s)", k, name, rarg(), rarg())
end

A.matmul = function(k)
  local fn = pick({ "matmul", "mm", "bmm", "mv", "dot" })
  local r = R()
  if r < 0.1 then   -- a Linear with its activation fused: (n, m) x (p, m)^T + (p)
    local n, m, p = R(0, 4), R(1, 5), R(0, 4)
    local dt = pick(FLOAT_NAMES)
    local bias = chance(0.5) and fresh({ chance(0.9) and p or p + 1 }, dt) or "nil"
    return string.format("P[%d] = torch._linear_act(%s, %s, %s, %q)", k, fresh({ n, m }, dt),
                         fresh({ p, chance(0.9) and m or m + 1 }, dt), bias,
                         pick({ "relu", "gelu", "gelu_tanh", "tanh", "x" }))
  end
  if r < 0.7 then
    -- operands that fit, mostly: (..., n, m) @ (..., m, p)
    local n, m, p = R(0, 4), R(0, 5), R(0, 4)
    if chance(0.85) then n, m, p = R(1, 4), R(1, 5), R(1, 4) end
    local dt = pick(FLOAT_NAMES)
    local dt2 = chance(0.85) and dt or pick(DTYPE_NAMES)
    local batch = chance(0.35) and { R(1, 3) } or {}
    local sa, sb = {}, {}
    for i = 1, #batch do sa[i] = batch[i]; sb[i] = chance(0.2) and 1 or batch[i] end
    local ka = R(4)
    if ka == 1 then sa = { m } else sa[#sa + 1] = n; sa[#sa + 1] = m end
    local kb = R(4)
    if kb == 1 then sb = { chance(0.9) and m or m + 1 } else sb[#sb + 1] = chance(0.9) and m or m + 1; sb[#sb + 1] = p end
    return string.format("P[%d] = torch.%s(%s, %s)", k, fn, fresh(sa, dt), fresh(sb, dt2))
  end
  return string.format("P[%d] = torch.%s(%s, %s)", k, fn, rtensor(), chance(0.7) and rtensor() or rarg())
end

-- An int64 index tensor for a dim of size n, mostly in range.
local function index_tensor(shape, n)
  local lo, hi = 0, math.max(n - 1, 0)
  if chance(0.2) then lo, hi = -n - 2, n + 2 end
  local dt = chance(0.9) and "int64" or pick({ "int32", "float32", "bool", "uint8" })
  return string.format("torch.randint(%d, %d, %s, {dtype = torch.%s})", lo, hi + 1, table_src(shape), dt)
end

A.select_gather = function(k)
  local t = rtensor()
  local shape = shape_of(t) or { 3, 2 }
  local nd = #shape
  local d = rdim(nd)
  local dn = tonumber(d)
  local size = (dn and nd > 0) and shape[dn % nd + 1] or 3
  local r = R()
  if r < 0.45 then
    local idx = chance(0.85) and index_tensor({ R(0, 5) }, size) or rarg()
    return string.format("P[%d] = %s:index_select(%s, %s)", k, t, d, idx)
  end
  if r < 0.9 then
    local s = {}
    for i = 1, nd do s[i] = R(0, shape[i]) end
    if chance(0.15) then s[#s + 1] = 2 end
    if chance(0.1) and nd > 0 then s[R(nd)] = shape[1] + 2 end
    local idx = chance(0.85) and index_tensor(s, size) or rarg()
    return string.format("P[%d] = %s:gather(%s, %s)", k, t, d, idx)
  end
  return string.format("P[%d] = torch.%s(%s, %s, %s)", k, pick({ "index_select", "gather" }), rarg(), rarg(), rarg())
end

A.cat_stack = function(k)
  local fn = pick({ "cat", "stack", "concat" })
  local base = small_shape(3)
  local items = {}
  for i = 1, R(0, 4) do
    local s = {}
    for j = 1, #base do s[j] = base[j] end
    if chance(0.3) and #s > 0 then local j = R(#s); s[j] = R(0, 4) end
    if chance(0.1) then s[#s + 1] = 2 end
    local r = R()
    if r < 0.75 then items[i] = fresh(s, chance(0.8) and "float32" or nil)
    elseif r < 0.9 then items[i] = rtensor()
    else items[i] = rbad() end
  end
  local list = "{" .. table.concat(items, ", ") .. "}"
  if chance(0.1) then list = rarg() end
  local d = chance(0.2) and "" or (", " .. rdim(#base + 1))
  return string.format("P[%d] = torch.%s(%s%s)", k, fn, list, d)
end

A.convert = function(k)
  local t = rtensor()
  local r = R()
  if r < 0.3 then return string.format("P[%d] = %s:to(%s)", k, t, chance(0.7) and rdtype() or rdevice()) end
  if r < 0.4 then return string.format("P[%d] = %s:to(%s, %s)", k, t, rdevice(), rdtype()) end
  if r < 0.45 then return string.format("P[%d] = %s:to(%s)", k, t, rtensor()) end
  if r < 0.5 then return string.format("P[%d] = %s:to({dtype = %s, device = %s})", k, t, rdtype(), rdevice()) end
  if r < 0.55 then return string.format("P[%d] = %s:type(%s)", k, t, rdtype()) end
  if r < 0.8 then return string.format("P[%d] = %s:%s()", k, t, pick(CONVERT)) end
  return string.format("P[%d] = torch.%s(%s)", k, pick(CONVERT), rarg())
end

-- tolist() builds a Lua table per row, so that of a 2^40 x 0 tensor is
-- 2^40 empty tables: as much legitimate work as in PyTorch, not a bug to
-- find. It runs only on tensors whose rows are few.
local function few_rows(shape)
  local n = 1
  for i = 1, #shape - 1 do n = n * math.max(shape[i], 1) end
  return n <= 2^16
end

A.inspect = function(k)
  local t = rtensor()
  local shape = shape_of(t) or {}
  local e = pick(INSPECT):gsub("%%s", rdim(#shape))
  if e:find("tolist") and not few_rows(shape) then e = "t:numel()" end
  if e == "t:item()" and chance(0.5) then e = "t:sum():item()" end
  return string.format("P[%d] = (function(t) return %s end)(%s)", k, e, t)
end

A.inplace_fill = function(k)
  local t = rtensor()
  local r = R()
  if r < 0.3 then return string.format("P[%d] = %s:fill_(%s)", k, t, chance(0.8) and rnum() or rarg()) end
  if r < 0.45 then return string.format("P[%d] = %s:zero_()", k, t) end
  return string.format("P[%d] = %s:copy_(%s)", k, t, chance(0.8) and operand(t) or rarg())
end

A.grad_leaf = function(k)
  local s = small_shape(3)
  return string.format("P[%d] = torch.randn(%s, {dtype = torch.%s, requires_grad = true})", k, table_src(s),
                       pick({ "float32", "float64", "float32", "int64", "bool" }))
end

A.grad = function(k)
  local t = rtensor()
  local r = R()
  if r < 0.15 then return string.format("%s.requires_grad = %s", t, pick({ "true", "false", "1", "nil" })) end
  if r < 0.25 then return string.format("P[%d] = %s:requires_grad_(%s)", k, t, pick({ "", "true", "false" })) end
  if r < 0.45 then return string.format("%s:sum():backward(%s)", t, pick({ "", "nil, {retain_graph = true}", "nil, true" })) end
  if r < 0.55 then return string.format("%s:backward(%s)", t, pick({ "", rtensor(), rarg(), "{retain_graph = true}" })) end
  if r < 0.65 then return string.format("P[%d] = %s.grad", k, t) end
  if r < 0.72 then return string.format("%s.grad = %s", t, chance(0.5) and operand(t) or rarg()) end
  if r < 0.8 then return string.format("P[%d] = tostring(%s.grad_fn)", k, t) end
  if r < 0.88 then return string.format("P[%d] = torch.no_grad(function() return %s * 2 end)", k, t) end
  if r < 0.93 then return string.format("torch.set_grad_enabled(%s)", pick({ "true", "false", "true" })) end
  if r < 0.97 then return string.format("P[%d] = torch.no_grad(%s)", k, rarg()) end
  return string.format("P[%d] = torch.enable_grad(%s)", k, pick({ "function() return 1 end", "nil", "42" }))
end

-- Random differentiable ops on a leaf that saves tensors for backward (so
-- PyTorch too refuses a second backward), a backward, then a second one
-- without retain_graph, which must fail with a message. With retain_graph
-- the second must succeed.
local CHAIN = { "x * x", "x:exp()", "x:tanh()", "x:sigmoid()", "x * x:sin()", "(x * x):sum(0, true) * x",
                "x:matmul(x:t())", "x:pow(3)", "x:softmax(-1) * x", "x:sqrt()", "x:relu() * x" }
A.double_backward = function(k)
  local s = small_shape(2)
  if #s == 0 or numel(s) == 0 then s = { 2, 3 } end
  local expr = pick(CHAIN)
  local retain = chance(0.3)
  local src = string.format("P[%d] = torch.enable_grad(function() local x = torch.randn(%s, {dtype = torch.%s, requires_grad = true}); "
    .. "local y = (%s):sum(); y:backward(%s); return {pcall(y.backward, y)} end)",
    k, table_src(s), pick({ "float32", "float64" }), expr, retain and "nil, {retain_graph = true}" or "")
  local check = function(ok, _)
    if not ok then return "the first backward failed: " .. tostring(_) end
    local r = P[k]
    if retain then
      if not r[1] then return "a second backward after retain_graph failed: " .. tostring(r[2]) end
    elseif r[1] then return "a second backward through freed buffers did not fail"
    elseif type(r[2]) ~= "string" or r[2] == "" then return "a second backward failed without a message" end
  end
  return src, check
end

-- Hooks: a grad hook must not break backward; torch exposes none yet in
-- Lua, so only the C tests cover them.

-- One to three differentiable ops on a fresh leaf of a random shape (0-d
-- and empty included), then a backward: every backward function meets
-- the edge shapes. A result that is a pair (max(d)) keeps its values.
local GRAD_OPS = {
  "x:neg()", "x:exp()", "x:log()", "x:sqrt()", "x:tanh()", "x:sigmoid()", "x:relu()", "x:gelu()", "x:abs()",
  "x:sin()", "x:reciprocal()", "x:square()", "x:rsqrt()", "x:log1p()", "x:gelu('tanh')",
  "x:sum(D)", "x:sum()", "x:mean(D, true)", "x:mean()", "(x:max(D))", "(x:min(D, true))", "x:max()", "x:amax(D)",
  "x:prod(D)", "x:prod()", "x:var(D)", "x:std()", "x:softmax(D)", "x:log_softmax(D)",
  "x:transpose(D, E)", "x:t()", "x:narrow(D, 0, 1)", "x:select(D, 0)", "x:unsqueeze(D)", "x:squeeze()",
  "x:squeeze(D)", "x:reshape(-1)", "x:flatten()", "x:contiguous()", "x:clone()", "x:expand_as(x)",
  "x:index_select(D, torch.zeros({2}, {dtype = torch.int64}))", "x:gather(D, torch.zeros_like(x):long())",
  "torch.cat({x, x}, D)", "torch.stack({x, x}, D)", "torch.where(x:gt(0), x, x * 2)", "x:clamp(-0.5, 0.5)",
  "x:clamp_min(0)", "x:matmul(x:t())", "x:matmul(x)", "x * x", "x / (x:abs() + 1)", "x ^ 2", "x:pow(x)",
  "2 ^ x", "x:maximum(x * 0.5)", "x:atan2(x + 1)", "x - x:mean()", "x:remainder(0.7)", "x[0]",
  "x[{{0, 1}}]", "x[{{}, {0, nil, 2}}]", "x:detach() * x", "x:float()", "x:double()", "x:to(torch.bfloat16)",
}
A.grad_chain = function(k)
  local s = small_shape(3)
  local e = "x"
  for _ = 1, R(1, 3) do
    local d, d2, inner = tostring(R(-2, 1)), tostring(R(-2, 1)), "(" .. e .. ")"
    e = pick(GRAD_OPS):gsub("%f[%w_]D%f[^%w_]", d):gsub("%f[%w_]E%f[^%w_]", d2)
                      :gsub("%f[%w_]x%f[^%w_]", function() return inner end)
  end
  local back = pick({ "y:sum():backward()", "y:backward(torch.ones_like(y))",
                      "y:sum():backward(nil, {retain_graph = true}); y:sum():backward()", "y:backward()" })
  return string.format("P[%d] = torch.enable_grad(function() local x = torch.randn(%s, {dtype = torch.%s, "
    .. "requires_grad = true}); local y = %s; %s; return x.grad end)", k, table_src(s),
    pick({ "float32", "float64", "float32", "bfloat16" }), e, back)
end

A.drop = function(k) return string.format("P[%d] = nil", k) end

A.gc = function() return pick({ "collectgarbage()", "collectgarbage('step')", "collectgarbage()" }) end

A.dtype_state = function()
  return string.format("torch.set_default_dtype(%s)", chance(0.7) and pick({ "torch.float32", "torch.float64" }) or rdtype())
end

-- Every function of the torch table and every Tensor method, with random
-- arguments. Leaves out the doors that are unsafe by design: the raw FFI
-- namespace, raw pointers, and the internal helpers (names starting with
-- "_") that the library's own Lua modules call with C results.
local EXCLUDED = { C = "the raw FFI namespace", ffi_new_tensor = "wraps a raw C result",
                   data_ptr = "returns a raw pointer", ["_*"] = "internal helpers",
                   tolist = "called only on few rows, see A.inspect" }
local function excluded(name) return EXCLUDED[name] or name:sub(1, 1) == "_" end
local TORCH_FNS, METHODS = {}, {}
torch._load_ops()   -- the compositions, which otherwise load on first use
for name, v in pairs(torch) do
  if type(v) == "function" and not excluded(name) then TORCH_FNS[#TORCH_FNS + 1] = name end
end
for name, v in pairs(torch.Tensor) do
  if type(v) == "function" and not excluded(name) then METHODS[#METHODS + 1] = name end
end
table.sort(TORCH_FNS)
table.sort(METHODS)

-- A name that is a Lua keyword (Tensor's `repeat`) is reached by indexing.
local KEYWORDS = { ["repeat"] = true }

A.any_function = function(k)
  local name = pick(TORCH_FNS)
  if name == "set_default_dtype" or name == "set_grad_enabled" then return A.dtype_state() end
  local f = KEYWORDS[name] and string.format('torch["%s"]', name) or "torch." .. name
  return string.format("P[%d] = %s(%s)", k, f, args(R(0, 4)))
end

A.any_method = function(k)
  local name, t, a = pick(METHODS), rtensor(), args(R(0, 3))
  if KEYWORDS[name] then
    return string.format('P[%d] = (function(t, ...) return t["%s"](t, ...) end)(%s%s)', k, name, t,
                         a ~= "" and ", " .. a or "")
  end
  return string.format("P[%d] = %s:%s(%s)", k, t, name, a)
end

-- nn.functional's functions and nn's module classes: a module is built
-- from random arguments and called with random ones
local FUNCTIONALS, MODULES = {}, {}
for name, v in pairs(torch.nn.functional) do
  if type(v) == "function" and not excluded(name) then FUNCTIONALS[#FUNCTIONALS + 1] = name end
end
-- (not nn.Transformer: its defaults are the paper's model, 44 M parameters
-- a call, which the collector does not see as pressure)
for name, v in pairs(torch.nn) do
  if type(v) == "table" and rawget(v, "__name") and name:match("^%u") and name ~= "Transformer" then
    MODULES[#MODULES + 1] = name
  end
end
table.sort(FUNCTIONALS)
table.sort(MODULES)
A.any_functional = function(k)
  return string.format("P[%d] = torch.nn.functional.%s(%s)", k, pick(FUNCTIONALS), args(R(0, 4)))
end
-- a module's sizes stay small (the pool would hold its weights); other
-- arguments are as wrong as any
local function module_arg()
  if R() < 0.6 then return tostring(R(0, 9)) end
  return pick({ "true", "false", "{}", "'abc'", "nil", "{2, 3}", "{bias = false}", "-1", "0.5", "{dim = 1}" })
end
A.any_module = function(k)
  return string.format("P[%d] = torch.nn.%s(%s)(%s)", k, pick(MODULES), args(R(0, 3), module_arg), args(R(0, 2)))
end

-- weights: how often each action runs
local ACTIONS = {
  { "create", 6 }, { "create_other", 6 }, { "fresh", 6 }, { "view", 12 }, { "index", 9 }, { "unary", 6 },
  { "binary", 12 }, { "where_clamp", 4 }, { "reduce", 8 }, { "matmul", 5 }, { "select_gather", 5 },
  { "cat_stack", 4 }, { "convert", 5 }, { "inspect", 6 }, { "inplace_fill", 4 }, { "grad_leaf", 3 },
  { "grad", 6 }, { "double_backward", 1 }, { "grad_chain", 4 }, { "drop", 2 }, { "gc", 1 }, { "dtype_state", 0.3 },
  { "any_function", 6 }, { "any_method", 6 }, { "any_functional", 3 }, { "any_module", 2 },
}
local total_weight = 0
for _, a in ipairs(ACTIONS) do total_weight = total_weight + a[2] end
local function pick_action()
  local x = R() * total_weight
  for _, a in ipairs(ACTIONS) do
    x = x - a[2]
    if x <= 0 then return a[1] end
  end
  return ACTIONS[1][1]
end

-- ---------------------------------------------------------------- running

local trace
if trace_path then
  trace = assert(io.open(trace_path, "w"))
  trace:write("-- dplua fuzz trace, seed ", seed, ": replay with ./dplua THIS_FILE\n",
              "local torch = require('dplua')\n",
              "local P, nan, inf = {}, 0 / 0, math.huge\n",
              "local function print(...) for i = 1, select('#', ...) do tostring((select(i, ...))) end end\n",
              "local function try(f) local ok, e = pcall(f) end\n",
              "math.randomseed(", seed, ")\n",
              "torch.manual_seed(", seed % 2^31, ")\n")
  if guard_self then trace:write("assert(loadstring(", string.format("%q", GUARD_SRC):gsub("\\\n", "\\n"), "))(torch)\n") end
  trace:flush()
end

local header = "local torch, P, nan, inf, print = ...;\n"
local function run(src)
  for _, pat in ipairs(skip_patterns) do
    if src:find(pat) then
      skipped[pat] = (skipped[pat] or 0) + 1
      return nil, true, nil, true
    end
  end
  if trace then
    trace:write("try(function() ", src, " end)\n")
    trace:flush()
  end
  local f, err = loadstring(header .. src, "=fuzz")
  if not f then return "fuzzer bug: generated code does not compile: " .. err end
  return nil, pcall(f, torch, P, nan, inf, sink)
end

-- Drops pool tensors too big to keep every call cheap.
local function shrink(k)
  local v = P[k]
  if is_tensor(v) then
    local ok, n = pcall(function() return v:numel() end)
    if not ok or n > MAX_NUMEL then run(string.format("P[%d] = nil", k)) end
  end
end

-- Valid calls that must succeed: when they fail, every random call fails
-- early too and the fuzzing is worth nothing.
local BASICS = {
  "P[1] = torch.ones(2, 3) + torch.arange(3)",
  "P[2] = P[1]:matmul(P[1]:t()):sum(0)",
  "P[3] = torch.rand({4, 5}, {dtype = torch.float64})[{{1, 3}, 2}]:clone()",
  "P[4] = torch.cat({P[1], P[1]:mul(2)}, 1):max(1)",
  "P[5] = torch.randn(3, {requires_grad = true})",
  "(P[5] * P[5]):sum():backward()",
  "assert(P[5].grad:sub(P[5]:mul(2)):abs():max():item() < 1e-6)",
  "P[6] = tostring(torch.eye(3, {dtype = torch.int32}):to(torch.bool))",
  "for k = 1, 6 do P[k] = nil end collectgarbage()",
}

local batches = math.ceil(iterations / BATCH)
io.write("1..", batches + 2, "\n")
io.write("# seed ", seed, ", ", iterations, " calls, ", #TORCH_FNS, " torch functions, ", #METHODS, " methods\n")
local excluded = {}
for name, why in pairs(EXCLUDED) do excluded[#excluded + 1] = name .. " (" .. why .. ")" end
table.sort(excluded)
io.write("# ", memory_note, "\n")
io.write("# not called: ", table.concat(excluded, ", "), "\n")
io.stdout:flush()

local basics_failed
do
  local bad = {}
  for _, src in ipairs(BASICS) do
    local bug, ok, err = run(src)
    if bug or not ok then bad[#bad + 1] = src .. "  ->  " .. tostring(bug or err) end
  end
  io.write(#bad == 0 and "ok 1" or "not ok 1", " - valid calls succeed\n")
  basics_failed = #bad
  for _, b in ipairs(bad) do io.write("#   ", (b:gsub("\n", " ")), "\n") end
  io.stdout:flush()
end

local errors, internal, internal_seen = 0, {}, {}
local failures_total = basics_failed
local n = 0
local t0 = now()
for b = 1, batches do
  local failures = {}
  local stop = math.min(iterations, n + BATCH)
  while n < stop do
    n = n + 1
    local k = R(NPOOL)
    local name = pick_action()
    local src, check = A[name](k)
    local c0 = slow and now()
    local bug, ok, err, was_skipped = run(src)
    if was_skipped then check = nil end
    if slow and now() - c0 > slow then
      io.write(string.format("# slow: %.2f s: %s\n", now() - c0, src))
    end
    if bug then
      failures[#failures + 1] = bug .. ": " .. src
    else
      if not ok then
        errors = errors + 1
        if type(err) ~= "string" or err == "" then
          failures[#failures + 1] = string.format("error value %s (%s) is not a message: %s", tostring(err), type(err), src)
        elseif err:find("^[^\n]-dplua/[%w_/]+%.lua:%d+: ") then
          -- a Lua error raised at a line of the library itself (its own
          -- errors point at the caller): no argument check caught it
          local key = err:gsub("^[^\n]-(dplua/[%w_/]+%.lua:%d+: )", "%1")
          if not internal_seen[key] then
            internal_seen[key] = true
            internal[#internal + 1] = key .. "  <-  " .. src
          end
        end
      end
      if check then
        local msg = check(ok, err)
        if msg then failures[#failures + 1] = msg .. ": " .. src end
      end
      shrink(k)
    end
    if n % 97 == 0 then run("collectgarbage()") end
  end
  failures_total = failures_total + #failures
  io.write(#failures == 0 and "ok " or "not ok ", b + 1, " - calls ", (b - 1) * BATCH + 1,
           "..", n, "\n")
  for i = 1, math.min(#failures, 10) do io.write("#   ", (failures[i]:gsub("\n", " ")), "\n") end
  io.stdout:flush()
end

for k = 1, NPOOL do P[k] = nil end
collectgarbage()
collectgarbage()

io.write(string.format("# %d calls in %.1f s: %d raised errors, %d of them without an argument check\n",
                       n, now() - t0, errors, #internal))
for i = 1, math.min(#internal, tonumber(os.getenv("DPLUA_FUZZ_LIST") or 25)) do
  io.write("#   ", (internal[i]:gsub("\n", " ")), "\n")
end
if guard_self then
  io.write(string.format("# DPLUA_FUZZ_GUARD_SELF: %d calls with a non-tensor self were refused\n", guarded[1]))
  failures_total = failures_total + 1
end
for _, pat in ipairs(skip_patterns) do
  io.write(string.format("# DPLUA_FUZZ_SKIP: %d statements matching %q were not run\n", skipped[pat] or 0, pat))
  failures_total = failures_total + 1
end
io.write(failures_total == 0 and "ok " or "not ok ", batches + 2, " - no crash in ", n, " calls (seed ", seed, ")\n")
if trace then trace:close() end
os.exit(failures_total == 0 and 0 or 1)
