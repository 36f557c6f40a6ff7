-- test_matmul.lua -- matmul in all its shape cases, mm and bmm, in float32 and
-- float64, against PyTorch; and bigger products against a plain Lua loop.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local dir = os.getenv("DPLUA_TEST_DIR") or (here .. "/..")
package.path = dir .. "/lua/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")

T.run_ref(torch, "matmul")

-- A deterministic m x n matrix with values in (-1, 1).
local function mat(m, n, seed, dtype)
    local rows = {}
    for i = 1, m do
        local r = {}
        for j = 1, n do r[j] = math.sin(seed + 0.37 * i + 1.13 * j * j) end
        rows[i] = r
    end
    return rows, torch.tensor(rows, {dtype = dtype})
end

local function lua_mm(a, b)
    local out = {}
    for i = 1, #a do
        local r = {}
        for j = 1, #b[1] do
            local s = 0
            for k = 1, #b do s = s + a[i][k] * b[k][j] end
            r[j] = s
        end
        out[i] = r
    end
    return out
end

local function transpose(a)
    local out = {}
    for j = 1, #a[1] do
        out[j] = {}
        for i = 1, #a do out[j][i] = a[i][j] end
    end
    return out
end

T.run("bigger products against Lua", function()
    for _, case in ipairs({{64, 33, 17}, {1, 100, 1}, {130, 70, 65}, {7, 1, 9}}) do
        local m, k, n = case[1], case[2], case[3]
        local la, a = mat(m, k, 1, torch.float64)
        local lb, b = mat(k, n, 2, torch.float64)
        local want = lua_mm(la, lb)
        local tag = ("[%d,%d]x[%d,%d]"):format(m, k, k, n)
        T.tensor_close(a:mm(b), want, 1e-12, 1e-12, "mm float64 " .. tag)
        T.tensor_close(a:float():matmul(b:float()), want, 1e-4, 1e-4, "matmul float32 " .. tag)
        T.tensor_close(b:t():mm(a:t()), transpose(want), 1e-12, 1e-12, "mm of transposes float64 " .. tag)
        local c = a:mm(b)
        T.ok(c:is_contiguous(), "mm result is contiguous " .. tag)
    end
    local la, a = mat(6, 5, 3, torch.float64)
    local lb, b = mat(5, 4, 4, torch.float64)
    local ab = a:unsqueeze(0):expand(3, 6, 5):bmm(b:unsqueeze(0):expand(3, 5, 4))
    local want = lua_mm(la, lb)
    T.tensor_close(ab, {want, want, want}, 1e-12, 1e-12, "bmm of expanded (stride 0) batches")
    T.tensor_close(a:matmul(b:unsqueeze(0):expand(2, 5, 4)), {want, want}, 1e-12, 1e-12,
                   "matmul 2-D . expanded 3-D")
end)

T.run("matmul shapes by hand", function()
    local v = torch.tensor({1, 2, 3}, {dtype = torch.float32})
    T.is(v:matmul(v):dim(), 0, "1-D . 1-D is 0-d")
    T.is(v:matmul(v):item(), 14, "dot product value")
    T.is(T.shape(torch.ones(2, 3):matmul(v)), {2}, "2-D . 1-D is 1-D")
    T.is(T.shape(v:matmul(torch.ones(3, 4))), {4}, "1-D . 2-D is 1-D")
    T.is(T.shape(torch.ones(5, 1, 2, 3):matmul(torch.ones(4, 3, 6))), {5, 4, 2, 6}, "batch dims broadcast")
    T.is(tostring(torch.ones({2, 2}, {dtype = torch.float64}):mm(torch.ones({2, 2}, {dtype = torch.float64})).dtype),
         "torch.float64", "float64 mm stays float64")
end)

-- torch.backends.cuda.matmul.allow_tf32, as in PyTorch: off by default, a
-- boolean. TF32 is a CUDA GEMM mode; a float32 product on the CPU keeps
-- every bit of its inputs whichever way the setting is.
T.run("torch.backends.cuda.matmul.allow_tf32", function()
    local settings = torch.backends.cuda.matmul
    T.is(settings.allow_tf32, false, "off by default")
    -- 1 + 2^-20 needs 21 bits of mantissa; TF32 keeps 10 and would give 1
    local fine = 1 + 2 ^ -20
    local a, eye = torch.full({8, 8}, fine), torch.eye(8)
    for _, allow in ipairs({true, false}) do
        settings.allow_tf32 = allow
        T.is(settings.allow_tf32, allow, "reads back " .. tostring(allow))
        T.ok(a:mm(eye):eq(fine):all():item(), "allow_tf32 = " .. tostring(allow) .. ": a CPU float32 mm keeps 24 bits")
    end
    for _, bad in ipairs({"yes", 1, 0}) do
        local shown = type(bad) == "string" and ("%q"):format(bad) or tostring(bad)
        T.raises(function() settings.allow_tf32 = bad end, {"allow_tf32", "boolean"},
                 "allow_tf32 = " .. shown .. " is refused, naming the setting and the type")
        T.is(settings.allow_tf32, false, "and the setting is left as it was")
        settings.allow_tf32 = false
    end
    T.raises(function() settings.allow_tf33 = true end, "unknown setting 'allow_tf33'", "an unknown setting is refused")
    T.is(settings.allow_tf33, nil, "and not stored")
end)

T.done_testing()
