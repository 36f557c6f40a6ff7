-- test_elementwise.lua -- binary ops with broadcasting and type promotion,
-- scalars, operators, unary ops (with special values), where, clamp and the
-- in-place ops, against PyTorch; plus semantics checked by hand.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local dir = os.getenv("DPLUA_TEST_DIR") or (here .. "/..")
package.path = dir .. "/lua/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")

T.run_ref(torch, "elementwise")

T.run("operators make new tensors", function()
    local a, b = torch.tensor({1, 2, 3}), torch.tensor({10, 20, 30})
    local c = a + b
    T.is(c:tolist(), {11, 22, 33}, "a + b")
    T.is(a:tolist(), {1, 2, 3}, "a + b leaves a alone")
    T.is((a * 2 - 1):tolist(), {1, 3, 5}, "a * 2 - 1")
    T.is((1 - a):tolist(), {0, -1, -2}, "1 - a")
    T.is((6 / a):tolist(), {6, 3, 2}, "6 / a")
    T.is((a ^ 2):tolist(), {1, 4, 9}, "a ^ 2")
    T.is((2 ^ a):tolist(), {2, 4, 8}, "2 ^ a")
    T.is((-a):tolist(), {-1, -2, -3}, "-a")
    T.is(torch.add(a, b, 2):tolist(), {21, 42, 63}, "torch.add(a, b, alpha)")
end)

T.run("== is identity", function()
    local a = torch.ones(2)
    T.ok(a == a, "a == a")
    T.ok(not (a == a:clone()), "a ~= a:clone() (== is not elementwise)")
    T.is(a:eq(a:clone()):tolist(), {true, true}, "eq() is elementwise")
end)

T.run("in-place ops return self", function()
    local a = torch.zeros(3)
    local r = a:add_(1)
    r:mul_(4)
    T.is(a:tolist(), {4, 4, 4}, "the result of add_ is a itself")
    a:exp_():log_()
    T.close(a[0]:item(), 4, 1e-6, 0, "exp_():log_() chain")
    local v = torch.zeros(2, 3)
    v[1]:fill_(2)
    v:sub_(torch.tensor({1, 2, 3}))
    T.is(v:tolist(), {{-1, -2, -3}, {1, 0, -1}}, "sub_ broadcasts the argument")
    local d = torch.ones({4}, {dtype = torch.float64})
    d:div_(3)
    T.close(d[2]:item(), 1 / 3, 0, 1e-16, "div_ in float64 is exact")
end)

T.run("type promotion by hand", function()
    local i = torch.tensor({1, 2, 3}, {dtype = torch.int64})
    local f = torch.tensor({0.5, 1.5, 2.5})
    T.is(tostring((i + 1).dtype), "torch.int64", "int64 + 1 is int64")
    T.is(tostring((i + 1.5).dtype), "torch.float32", "int64 + 1.5 is float32")
    T.is(tostring((i / 2).dtype), "torch.float32", "int64 / 2 is float32")
    T.is((i / 2):tolist(), {0.5, 1, 1.5}, "int64 / 2 is true division")
    T.is(tostring((i + f).dtype), "torch.float32", "int64 + float32 is float32")
    T.is(tostring(i:lt(2).dtype), "torch.bool", "comparisons give bool")
    T.is(tostring(f:double():add(f).dtype), "torch.float64", "float64 + float32 is float64")
    T.is(tostring(torch.ones({2}, {dtype = torch.uint8}):add(torch.ones({2}, {dtype = torch.int32})).dtype),
         "torch.int32", "uint8 + int32 is int32")
    T.is(tostring(torch.ones({2}, {dtype = torch.bool}):add(1).dtype), "torch.int64", "bool + 1 is int64")
    T.is(tostring(i:sqrt().dtype), "torch.float32", "sqrt of int64 is float32")
    T.is(tostring(i:abs().dtype), "torch.int64", "abs of int64 stays int64")
end)

-- Numbers in ops are kept as 0-d tensors between calls (src/core/ops.c):
-- the kept one must be the same number of the same dtype, whatever came
-- before it and whatever shares its slot.
T.run("numbers reused across ops keep their value and dtype", function()
    local x = torch.tensor({1, 2, 3})
    T.is((x / 0.0):tolist(), {math.huge, math.huge, math.huge}, "x / 0.0")
    T.is((x / -0.0):tolist(), {-math.huge, -math.huge, -math.huge}, "x / -0.0 (not the 0.0 kept before)")
    local i = torch.tensor({1, 2, 3}, {dtype = torch.int64})
    T.is(tostring((x * 2).dtype) .. " " .. tostring((i * 2).dtype), "torch.float32 torch.int64",
         "the same number in a float32 and an int64 op")
    T.is((i * 2):tolist(), {2, 4, 6}, "int64 * 2")
    local wrong = 0
    for round = 1, 3 do
        for v = 1, 300 do   -- more numbers than kept slots: evictions
            local y = (x + v * 0.25):tolist()
            if y[1] ~= 1 + v * 0.25 or y[3] ~= 3 + v * 0.25 then wrong = wrong + 1 end
        end
    end
    T.is(wrong, 0, "900 ops with 300 different numbers, each right")
    local nan = (x * (0 / 0)):tolist()
    T.ok(nan[1] ~= nan[1], "x * NaN is NaN")
end)

T.done_testing()
