-- test_views.lua -- view, reshape, transpose, permute, squeeze, expand, narrow,
-- select, flatten and slicing: values and strides against PyTorch, and that
-- views share storage with their base.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local dir = os.getenv("DPLUA_TEST_DIR") or (here .. "/..")
package.path = dir .. "/lua/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")

T.run_ref(torch, "views")

local function seq(...)
    -- 0, 1, 2, ... as float32 in the given shape
    local shape = {...}
    local n = 1
    for _, s in ipairs(shape) do n = n * s end
    return torch.arange(n):float():reshape(shape)
end

T.run("views share storage", function()
    local a = torch.zeros(2, 3)
    a:view(6):fill_(1)
    T.is(a:sum():item(), 6, "fill_ through view() writes the base")
    a:t():fill_(2)
    T.is(a:sum():item(), 12, "fill_ through t() writes the base")
    a:narrow(1, 1, 2):fill_(0)
    T.is(a:tolist(), {{2, 0, 0}, {2, 0, 0}}, "fill_ through narrow() writes the base")
    a:select(0, 1):fill_(5)
    T.is(a:tolist(), {{2, 0, 0}, {5, 5, 5}}, "fill_ through select() writes the base")
    a:reshape(3, 2):mul_(2)
    T.is(a:tolist(), {{4, 0, 0}, {10, 10, 10}}, "reshape of a contiguous tensor is a view")
    a:unsqueeze(0):squeeze(0):add_(1)
    T.is(a:tolist(), {{5, 1, 1}, {11, 11, 11}}, "unsqueeze/squeeze are views")
    a:permute(1, 0)[{{}, 0}]:zero_()
    T.is(a:tolist(), {{0, 0, 0}, {11, 11, 11}}, "permute and slicing are views")
    local c = a:contiguous()
    c:fill_(3)
    T.is(a:sum():item(), 18, "contiguous() of a contiguous tensor is the tensor itself")
    local f = a:flatten()
    f:fill_(-1)
    T.is(a:sum():item(), -6, "flatten() of a contiguous tensor is a view")
    local b = a:t():contiguous()
    b:fill_(100)
    T.is(a:sum():item(), -6, "contiguous() of a transpose is a copy")
    local s = a[{{}, {0, nil, 2}}]
    s:fill_(7)
    T.is(a:tolist(), {{7, -1, 7}, {7, -1, 7}}, "stepped slice is a view")
end)

local function shape_of(fn) return function() return T.shape(fn()) end end
T.check("view(t:size()) takes a size table", shape_of(function() return seq(2, 6):view(torch.zeros(3, 4):size()) end), {3, 4})
T.check("reshape(t.shape)", shape_of(function() return seq(2, 6):reshape(torch.zeros(3, 4).shape) end), {3, 4})
T.check("zeros(t:size())", shape_of(function() return torch.zeros(seq(2, 6):size()) end), {2, 6})
T.check("view(12)", shape_of(function() return seq(2, 6):view(12) end), {12})
T.check("view(-1, 3)", shape_of(function() return seq(2, 6):view(-1, 3) end), {4, 3})
T.check("squeeze of [1] is 0-d", shape_of(function() return torch.tensor({5}):squeeze() end), {})
T.check("unsqueeze of 0-d is [1]", shape_of(function() return torch.tensor(5):unsqueeze(0) end), {1})
T.check("view of 0-d", shape_of(function() return torch.tensor(5):view(1, 1) end), {1, 1})
T.check("squeeze of [1, 1]", shape_of(function() return torch.zeros(1, 1):squeeze() end), {})
T.check("expand adds leading dims", shape_of(function() return seq(3):expand(2, 2, 3) end), {2, 2, 3})
T.check("expand has stride 0", function()
    local st = torch.ones(3, 1):expand(3, 4):stride()
    return {st[1], st[2]}
end, {1, 0})
T.check("sum of an expanded view", function() return torch.ones(3, 1):expand(3, 4):sum():item() end, 12)
T.check("#t of 1-d", function() return #seq(5) end, 5)

T.run("slicing", function()
    local t = torch.arange(10)
    T.is(t[{{2, 5}}]:tolist(), {2, 3, 4}, "t[{{2, 5}}]")
    T.is(t[{{nil, 3}}]:tolist(), {0, 1, 2}, "t[{{nil, 3}}]")
    T.is(t[{{7}}]:tolist(), {7, 8, 9}, "t[{{7}}] runs to the end")
    T.is(t[{{-3}}]:tolist(), {7, 8, 9}, "t[{{-3}}]")
    T.is(t[{{0, 10, 3}}]:tolist(), {0, 3, 6, 9}, "t[{{0, 10, 3}}]")
    T.is(t[{{1, -1, 4}}]:tolist(), {1, 5}, "t[{{1, -1, 4}}]")
    T.is(t[{{5, 2}}]:numel(), 0, "empty range gives an empty tensor")
    T.is(t[{{}}]:tolist(), t:tolist(), "t[{{}}] is everything")
    T.is(t[3]:item(), 3, "t[3]")
    T.is(t[-1]:item(), 9, "t[-1]")
    T.is(t[{-2}]:item(), 8, "t[{-2}]")
    local m = seq(3, 4)
    T.is(m[{{}, {1, 3}}]:tolist(), {{1, 2}, {5, 6}, {9, 10}}, "t[{{}, {1, 3}}] is t[:, 1:3]")
    T.is(m[{1, {}}]:tolist(), {4, 5, 6, 7}, "t[{1, {}}]")
    T.is(m[{{}, 2}]:tolist(), {2, 6, 10}, "t[{{}, 2}]")
    T.is(m[{-1, -1}]:item(), 11, "t[{-1, -1}]")
    T.is(m[1][2]:item(), 6, "t[1][2]")
    T.is(T.shape(m[{{0, 2}, {0, nil, 2}}]), {2, 2}, "two ranges")
end)

T.done_testing()
