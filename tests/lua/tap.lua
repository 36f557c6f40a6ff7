--[[
tap.lua -- a tiny TAP producer for dplua's Lua tests.

    local T = require("tap")          -- after putting tests/lua on package.path
    T.ok(cond, "name")
    T.is(got, expected, "name")       -- deep for tables; NaN equals NaN
    T.close(got, expected, rtol, atol, "name")
    T.tensor_close(t, expected, rtol, atol, "name")
    T.raises(function() ... end, "pattern", "name")
    T.check("name", function() return x end, expected)  -- isolated
    T.run("name", function() ... end) -- an error inside is a failure
    T.done_testing()                  -- prints the plan, exits 1 on failure
    T.read_file(path), T.write_file(path, bytes), T.temp_dir(name), T.sh_quote(s)
    T.sorted_keys(t)                  -- a reference table's cases in order
    T.ref_tensor(torch, r, dtype)     -- a tensor of a tests/ref/*.lua table

Output goes to stdout in TAP 13 form for automake's tap-driver.sh; failures
carry `#` diagnostics that say what differed and where. The second half
of the file runs the reference cases of tests/ref/ops.lua (written by
scripts/gen_reference.py) against dplua; it takes the dplua module as an
argument, so this file itself needs nothing but plain Lua.
--]]

local T = {}

-- Each result is written out as it is made: a test process that dies
-- (a signal, a tool that stops it) still shows the last check it passed.
io.stdout:setvbuf("line")

local count, failed, planned = 0, 0, nil
local failures = {}

-- ---------------------------------------------------------------- output

local function clean_name(name)
    -- "#" starts a directive in TAP; keep names on one line
    return (tostring(name or ""):gsub("#", "no."):gsub("\n", " "))
end

function T.diag(msg)
    for line in (tostring(msg) .. "\n"):gmatch("(.-)\n") do
        io.write("# ", line, "\n")
    end
end

function T.plan(n)
    planned = n
    io.write("1..", n, "\n")
end

function T.skip_all(reason)
    io.write("1..0 # SKIP ", reason, "\n")
    io.stdout:flush()
    os.exit(0)
end

function T.ok(cond, name, diagnostic)
    count = count + 1
    name = clean_name(name)
    if cond then
        io.write("ok ", count, " - ", name, "\n")
    else
        failed = failed + 1
        failures[#failures + 1] = name
        io.write("not ok ", count, " - ", name, "\n")
        if diagnostic then T.diag(diagnostic) end
    end
    return cond and true or false
end

function T.skip(reason, name)
    count = count + 1
    io.write("ok ", count, " - ", clean_name(name), " # SKIP ", reason, "\n")
end

function T.done_testing()
    if planned == nil then
        io.write("1..", count, "\n")
    elseif planned ~= count then
        T.diag(("planned %d tests but ran %d"):format(planned, count))
        failed = failed + 1
    end
    if failed > 0 then
        T.diag(("failed %d of %d tests"):format(failed, count))
    end
    io.stdout:flush()
    os.exit(failed == 0 and 0 or 1)
end

function T.failed() return failed end

-- ---------------------------------------------------------------- values

local function fmt(v)
    if type(v) == "number" then
        if v ~= v then return "nan" end
        if v == math.huge then return "inf" end
        if v == -math.huge then return "-inf" end
        return ("%.9g"):format(v)
    elseif type(v) == "string" then
        return ("%q"):format(v)
    elseif type(v) == "table" then
        local parts, n = {}, 0
        for i, x in ipairs(v) do
            n = n + 1
            if n > 32 then parts[#parts + 1] = "..."; break end
            parts[#parts + 1] = fmt(x)
        end
        return "{" .. table.concat(parts, ", ") .. "}"
    end
    return tostring(v)
end
T.fmt = fmt

local function deep_equal(a, b, path)
    if type(a) ~= type(b) then
        return false, ("%s: got %s (%s), expected %s (%s)"):format(path, fmt(a), type(a), fmt(b), type(b))
    end
    if type(a) == "number" then
        if a == b or (a ~= a and b ~= b) then return true end
        return false, ("%s: got %s, expected %s"):format(path, fmt(a), fmt(b))
    end
    if type(a) ~= "table" then
        if a == b then return true end
        return false, ("%s: got %s, expected %s"):format(path, fmt(a), fmt(b))
    end
    for k, v in pairs(b) do
        local ok, why = deep_equal(a[k], v, path .. "[" .. tostring(k) .. "]")
        if not ok then return false, why end
    end
    for k in pairs(a) do
        if b[k] == nil then
            return false, ("%s[%s]: unexpected %s"):format(path, tostring(k), fmt(a[k]))
        end
    end
    return true
end

function T.is(got, expected, name)
    local ok, why = deep_equal(got, expected, "value")
    return T.ok(ok, name, why)
end

local function num_close(g, e, rtol, atol)
    if type(g) ~= "number" or type(e) ~= "number" then return g == e, math.huge end
    if e ~= e then return g ~= g, (g ~= g) and 0 or math.huge end
    if g ~= g then return false, math.huge end
    if e == math.huge or e == -math.huge or g == math.huge or g == -math.huge then
        return g == e, (g == e) and 0 or math.huge
    end
    local d = math.abs(g - e)
    return d <= atol + rtol * math.abs(e), d
end

function T.close(got, expected, rtol, atol, name)
    rtol, atol = rtol or 1e-5, atol or 1e-8
    local ok = num_close(got, expected, rtol, atol)
    return T.ok(ok, name, not ok and ("got %s, expected %s (rtol %g, atol %g)"):format(
        fmt(got), fmt(expected), rtol, atol) or nil)
end

-- ---------------------------------------------------------------- tensors

-- Tolerances per dtype: the bound is atol + rtol * |expected|.
local TOL = {
    float32 = {1e-5, 1e-5}, float64 = {1e-12, 1e-12}, bfloat16 = {1e-2, 1e-2},
    int64 = {0, 0}, int32 = {0, 0}, uint8 = {0, 0}, bool = {0, 0},
}
function T.tol(dtype)
    local t = TOL[(tostring(dtype):gsub("^torch%.", ""))] or TOL.float32
    return t[1], t[2]
end

local function is_tensor(x)
    local ty = type(x)
    if ty ~= "table" and ty ~= "userdata" and ty ~= "cdata" then return false end
    local ok, d = pcall(function() return x:dim() end)
    return ok and type(d) == "number"
end
T.is_tensor = is_tensor

-- A nested table (or a number) flattened, with the shape it implies.
local function flatten(v)
    local flat, shape = {}, {}
    if type(v) ~= "table" then
        flat[1] = v
        return flat, shape
    end
    local node = v
    while type(node) == "table" do
        shape[#shape + 1] = #node
        node = node[1]
    end
    local function walk(x)
        if type(x) == "table" then
            for i = 1, #x do walk(x[i]) end
        else
            flat[#flat + 1] = x
        end
    end
    walk(v)
    return flat, shape
end
T.flatten = flatten

local function unravel(i, shape)
    -- 1-based flat index -> "[i0, i1, ...]" (0-based, like PyTorch)
    local idx, rest = {}, i - 1
    for d = #shape, 1, -1 do
        local s = shape[d]
        if s > 0 then
            idx[d] = rest % s
            rest = math.floor(rest / s)
        else
            idx[d] = 0
        end
    end
    return "[" .. table.concat(idx, ", ") .. "]"
end

local function to_values(x)
    if is_tensor(x) then return x:tolist() end
    return x
end

-- Compares values (a tensor, nested table or number) with expected; returns
-- ok and a diagnostic naming the largest difference and where it is.
function T.compare_values(got, expected, rtol, atol)
    local gflat, gshape = flatten(to_values(got))
    local eflat, eshape = flatten(to_values(expected))
    if #gflat ~= #eflat then
        return false, ("got %d elements %s, expected %d %s"):format(
            #gflat, fmt(gshape), #eflat, fmt(eshape))
    end
    local nbad, worst, worst_i = 0, -1, nil
    for i = 1, #eflat do
        local ok, d = num_close(gflat[i], eflat[i], rtol, atol)
        if not ok then
            nbad = nbad + 1
            if d > worst then worst, worst_i = d, i end
        end
    end
    if nbad == 0 then return true end
    local lines = {("max abs difference %s at %s (got %s, expected %s); %d of %d elements differ (rtol %g, atol %g)")
        :format(fmt(worst), unravel(worst_i, eshape), fmt(gflat[worst_i]), fmt(eflat[worst_i]),
                nbad, #eflat, rtol, atol)}
    if #eflat <= 32 then
        lines[2] = "got      " .. fmt(gflat)
        lines[3] = "expected " .. fmt(eflat)
    end
    return false, table.concat(lines, "\n")
end

function T.tensor_close(t, expected, rtol, atol, name)
    local dt = is_tensor(t) and tostring(t.dtype) or "float32"
    local r0, a0 = T.tol(dt)
    local ok, why = T.compare_values(t, expected, rtol or r0, atol or a0)
    return T.ok(ok, name, why)
end

-- The shape of a tensor as a plain 1-based table.
function T.shape(t)
    local sz, out = t:size(), {}
    for i = 1, t:dim() do out[i] = sz[i] end
    return out
end

-- ---------------------------------------------------------------- errors

local function strip_location(msg)
    msg = tostring(msg)
    local prev
    repeat
        prev = msg
        msg = msg:gsub("^[^\n:]-:%d+: ", "", 1)
    until msg == prev
    return msg
end
T.strip_location = strip_location

-- pattern: nil (any error), a Lua pattern, or a list whose entries must all
-- match, each entry a pattern or a list of alternative patterns.
local function matches(msg, pattern)
    if pattern == nil then return true end
    if type(pattern) == "string" then return msg:find(pattern) ~= nil end
    for _, p in ipairs(pattern) do
        if type(p) == "table" then
            local any = false
            for _, alt in ipairs(p) do
                if msg:find(alt) then any = true; break end
            end
            if not any then return false end
        elseif not msg:find(p) then
            return false
        end
    end
    return true
end

local function describe(pattern)
    if type(pattern) ~= "table" then return tostring(pattern) end
    local parts = {}
    for _, p in ipairs(pattern) do
        parts[#parts + 1] = type(p) == "table" and ("(" .. table.concat(p, " | ") .. ")") or p
    end
    return table.concat(parts, " and ")
end

function T.raises(fn, pattern, name)
    local ok, err = pcall(fn)
    if ok then
        return T.ok(false, name, "no error was raised (expected one matching " .. describe(pattern) .. ")")
    end
    local msg = strip_location(err)
    return T.ok(matches(msg, pattern), name,
                "error message: " .. tostring(err) .. "\ndoes not match: " .. describe(pattern)), msg
end

function T.lives(fn, name)
    local ok, err = pcall(fn)
    return T.ok(ok, name, not ok and ("raised: " .. tostring(err)) or nil)
end

-- One isolated check: fn() runs under pcall, so an error fails only this
-- test. With `expected` the result must equal it (deeply, NaN equal to NaN);
-- without, it must be true.
function T.check(name, fn, expected)
    local ok, got = pcall(fn)
    if not ok then return T.ok(false, name, "raised: " .. tostring(got)) end
    if expected == nil then return T.ok(got, name, "got " .. fmt(got)) end
    return T.is(got, expected, name)
end

-- Runs fn (which may call T.ok and friends); an error inside it counts as
-- one failed test named `name`, with the traceback as diagnostic.
function T.run(name, fn, ...)
    local ok, err = xpcall(fn, debug.traceback, ...)
    if not ok then T.ok(false, name .. " (raised)", err) end
    return ok
end

-- The keys of t, sorted: the cases of a reference table in a fixed order.
function T.sorted_keys(t)
    local keys = {}
    for k in pairs(t) do keys[#keys + 1] = k end
    table.sort(keys)
    return keys
end

-- ---------------------------------------------------------------- files

-- s as one sh word, whatever it holds.
function T.sh_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

function T.read_file(path)
    local f = assert(io.open(path, "rb"))
    local s = f:read("*a")
    f:close()
    return s
end

function T.write_file(path, bytes)
    local f = assert(io.open(path, "wb"))
    f:write(bytes)
    f:close()
end

-- A new directory $TMPDIR/dplua-NAME.XXXXXX (TMPDIR: /tmp by default).
function T.temp_dir(name)
    local p = io.popen("mktemp -d " .. T.sh_quote((os.getenv("TMPDIR") or "/tmp") .. "/dplua-" .. name .. ".XXXXXX"))
    local d = p:read("*l")
    p:close()
    assert(d and d ~= "", "mktemp -d failed")
    return d
end

-- ---------------------------------------------------------------- reference cases

function T.test_dir()
    local d = os.getenv("DPLUA_TEST_DIR")
    if d and d ~= "" then return d end
    local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
    return here .. "/.."
end

local ref_cache
function T.load_ref()
    if not ref_cache then ref_cache = dofile(T.test_dir() .. "/ref/ops.lua") end
    return ref_cache
end

function T.make_input(torch, spec)
    local dtype = torch[spec.dtype] or spec.dtype
    local n = 1
    for _, s in ipairs(spec.shape) do n = n * s end
    if n == 0 then return torch.zeros(spec.shape, {dtype = dtype}) end
    return torch.tensor(spec.values, {dtype = dtype})
end

-- A tensor of a tests/ref/*.lua table {shape = {...}, v1, v2, ...}, of
-- dtype (float64 by default), or {shape = {...}, bool = {...}} for a bool
-- tensor.
function T.ref_tensor(torch, r, dtype)
    if r.bool then return torch.tensor(r.bool):reshape(r.shape) end
    local flat = {}
    for i = 1, #r do flat[i] = r[i] end
    return torch.tensor(flat, {dtype = dtype or torch.float64}):reshape(r.shape)
end

-- A float64 tensor of this shape holding f(k) at flat index k, as the
-- reference generators build their inputs.
function T.filled(torch, shape, f)
    local n = 1
    for _, s in ipairs(shape) do n = n * s end
    local v = {}
    for k = 0, n - 1 do v[k + 1] = f(k) end
    return torch.tensor(v, {dtype = torch.float64}):reshape(shape)
end

-- make(opts) with its weight 0.5 sin(1 + 0.7 k) and its bias 0.1 k, and an
-- input of xshape holding cos(0.3 k) that requires grad, as the weight-norm,
-- parametrize and prune generators' fixed_module (float64 unless dtype).
function T.fixed_module(torch, make, xshape, dtype)
    dtype = dtype or torch.float64
    local m = make({dtype = dtype})
    torch.no_grad(function()
        m.weight:copy_(T.filled(torch, T.shape(m.weight), function(k) return 0.5 * math.sin(1 + 0.7 * k) end))
        m.bias:copy_(T.filled(torch, T.shape(m.bias), function(k) return 0.1 * k end))
    end)
    return m, T.filled(torch, xshape, function(k) return math.cos(0.3 * k) end):to(dtype):requires_grad_()
end

-- T.compare_values as one check: ok when got equals want within rtol and atol.
function T.values_close(got, want, rtol, atol, name)
    local ok, why = T.compare_values(got, want, rtol, atol)
    T.ok(ok, name, why)
end

-- The reference generators' check of an op: its output y against r.y
-- and, after the backward of y weighted by cos of its flat index (the
-- generators' weight), x's gradient against r.dx.
function T.output_and_grad(torch, y, x, r, tol, what)
    local wt = torch.arange(0, y:numel(), {dtype = torch.float64}):cos():reshape(y:size()):to(y.dtype)
    local loss = (y * wt):sum()
    loss:backward()
    T.values_close(y:reshape(-1):tolist(), r.y, tol, tol, what .. "output")
    T.values_close(x.grad:reshape(-1):tolist(), r.dx, tol, tol, what .. "input gradient")
end

local chunk_cache = {}
local function compile(expr, name)
    local src = expr:find("return ") and expr or ("return " .. expr)
    local f, err = chunk_cache[src], nil
    if not f then
        f, err = load("local torch, a, b, c, d = ...\n" .. src, "=" .. name)
        chunk_cache[src] = f
    end
    return f, err
end

-- One tensor against {dtype=, shape=, values=}: returns ok, diagnostic.
function T.check_tensor(t, spec, rtol, atol)
    if not is_tensor(t) then
        return false, ("expected a tensor, got %s %s"):format(type(t), fmt(t))
    end
    local why = {}
    local dt = tostring(t.dtype)
    if dt ~= "torch." .. spec.dtype then
        why[#why + 1] = ("dtype %s, expected torch.%s"):format(dt, spec.dtype)
    end
    local shape = T.shape(t)
    local sok = deep_equal(shape, spec.shape, "shape")
    if not sok then
        why[#why + 1] = ("shape %s, expected %s"):format(fmt(shape), fmt(spec.shape))
    else
        local r0, a0 = T.tol(spec.dtype)
        local ok, vwhy = T.compare_values(t, spec.values, rtol or r0, atol or a0)
        if not ok then why[#why + 1] = vwhy end
    end
    if #why == 0 then return true end
    return false, table.concat(why, "\n")
end

local function values_diag(got, c)
    local r, a = T.tol(c.dtype)
    r, a = c.rtol or r, c.atol or a
    if type(c.expected) == "table" and type(got) ~= "table" then
        return false, ("expected a table, got %s %s"):format(type(got), fmt(got))
    end
    if type(c.expected) ~= "table" and type(got) ~= type(c.expected) then
        return false, ("expected a %s, got %s %s"):format(type(c.expected), type(got), fmt(got))
    end
    if type(c.expected) == "table" then
        local _, gshape = flatten(got)
        local _, eshape = flatten(c.expected)
        if not deep_equal(gshape, eshape, "") then
            return false, ("nested shape %s, expected %s"):format(fmt(gshape), fmt(eshape))
        end
    end
    return T.compare_values(got, c.expected, r, a)
end

-- Runs one reference case: one TAP test, plus one for strides when the
-- case records them.
function T.ref_case(torch, ref, c)
    local name = c.group .. ": " .. c.name
    local diag_expr = "expr: " .. c.expr
    local args = {}
    for i, key in ipairs(c.inputs or {}) do
        local ok, t = pcall(T.make_input, torch, ref.inputs[key])
        if not ok then
            return T.ok(false, name, "could not build input " .. key .. ": " .. tostring(t) .. "\n" .. diag_expr)
        end
        args[i] = t
    end
    local f, err = compile(c.expr, c.name)
    if not f then return T.ok(false, name, "bad expr: " .. tostring(err)) end
    local res = {pcall(f, torch, args[1], args[2], args[3], args[4])}
    if not res[1] then
        return T.ok(false, name, "raised: " .. tostring(res[2]) .. "\n" .. diag_expr)
    end
    local ok, why
    local kind = c.kind or "tensor"
    if kind == "tensor" then
        ok, why = T.check_tensor(res[2], c, c.rtol, c.atol)
    elseif kind == "multi" then
        ok = true
        local parts = {}
        for i, spec in ipairs(c.expected) do
            local o, w = T.check_tensor(res[i + 1], spec)
            if not o then ok = false; parts[#parts + 1] = ("result %d: %s"):format(i, w) end
        end
        why = table.concat(parts, "\n")
    elseif kind == "string" then
        ok = res[2] == c.expected
        if not ok then
            why = "got:\n" .. tostring(res[2]) .. "\nexpected:\n" .. c.expected
        end
    else
        ok, why = values_diag(res[2], c)
    end
    local pass = T.ok(ok, name, not ok and (tostring(why) .. "\n" .. diag_expr) or nil)
    if c.stride and ok then
        local t = res[2]
        local sok, st = pcall(function()
            local s = t:stride()
            if type(s) ~= "table" then s = {t:stride()} end
            local out = {}
            for i = 1, t:dim() do out[i] = s[i] end
            return out
        end)
        local cok, contig = pcall(function() return t:is_contiguous() end)
        local good = sok and cok and deep_equal(st, c.stride, "") and contig == c.contiguous
        T.ok(good, name .. " (strides)", not good and ("stride %s contiguous %s, expected %s %s"):format(
            sok and fmt(st) or tostring(st), tostring(contig), fmt(c.stride), tostring(c.contiguous)) or nil)
    end
    return pass
end

-- Runs every case of a group (optionally filtered by filter(case)).
function T.run_ref(torch, group, filter)
    local ref = T.load_ref()
    local list = ref.cases[group]
    if not list then return T.ok(false, "reference group " .. group .. " exists") end
    local n = 0
    for _, c in ipairs(list) do
        if not filter or filter(c) then
            T.ref_case(torch, ref, c)
            n = n + 1
        end
    end
    return n
end

return T
