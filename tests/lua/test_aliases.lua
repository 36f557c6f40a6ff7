-- test_aliases.lua -- the PyTorch names that dplua defines as another name
-- (t:ndimension() is t:dim(), torch.concat is torch.cat, ...). Each one is
-- called as a method and as a torch function, and its result, and its
-- original's, must equal a value worked out by hand here: an alias bound
-- to the wrong function, or one that drops an argument, fails.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local dir = os.getenv("DPLUA_TEST_DIR") or (here .. "/..")
package.path = dir .. "/lua/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")

local function f32(values) return torch.tensor(values, { dtype = torch.float32 }) end

-- A result as plain Lua: a number stays a number, a tensor becomes its
-- dtype's name and its values.
local function plain(x)
    if torch.is_tensor(x) then return { x.dtype.name, x:tolist() } end
    return x
end

-- { alias, original, arguments (fresh each call), expected plain result }
local cases = {
    { "ndimension", "dim", function() return torch.zeros(2, 3, 4) end, 3 },
    { "nelement", "numel", function() return torch.zeros(2, 3, 4) end, 24 },
    { "negative", "neg", function() return f32({ 1.5, -2, 0 }) end, { "float32", { -1.5, 2, 0 } } },
    { "absolute", "abs", function() return f32({ -1.5, 2, -3 }) end, { "float32", { 1.5, 2, 3 } } },
    { "multiply", "mul", function() return f32({ 1, 2, 3 }), f32({ 4, -5, 0.5 }) end,
      { "float32", { 4, -10, 1.5 } } },
    { "divide", "div", function() return f32({ 1, -3, 3 }), f32({ 2, 4, 8 }) end,
      { "float32", { 0.5, -0.75, 0.375 } } },
    -- integers divided give floats, as in PyTorch
    { "true_divide", "div", function() return torch.tensor({ 1, 2, 3 }, { dtype = torch.int64 }), 2 end,
      { "float32", { 0.5, 1, 1.5 } } },
    -- a - alpha * b
    { "subtract", "sub", function() return f32({ 5, 6 }), f32({ 1, 2 }), 2 end, { "float32", { 3, 2 } } },
    { "clip", "clamp", function() return f32({ -2, 0.5, 3 }), -1, 1 end, { "float32", { -1, 0.5, 1 } } },
    { "mv", "matmul", function() return f32({ { 1, 2 }, { 3, 4 }, { 5, 6 } }), f32({ 1, -1 }) end,
      { "float32", { -1, -1, -1 } } },
    { "dot", "matmul", function() return f32({ 1, 2, 3 }), f32({ 4, 5, 6 }) end, { "float32", 32 } },
}

local function method_call(name, t, ...) return t[name](t, ...) end

for _, c in ipairs(cases) do
    local alias, original, args, expected = c[1], c[2], c[3], c[4]
    T.check(("t:%s() gives the hand-computed result"):format(alias), function()
        return plain(method_call(alias, args()))
    end, expected)
    T.check(("torch.%s() gives the hand-computed result"):format(alias), function()
        return plain(torch[alias](args()))
    end, expected)
    T.check(("%s, its original, gives the same"):format(original), function()
        return plain(torch[original](args()))
    end, expected)
end

T.run("clip takes min and max by name, as clamp does", function()
    T.is(f32({ -2, 0.5, 3 }):clip({ min = 0 }):tolist(), { 0, 0.5, 3 }, "clip{min = 0}")
    T.is(f32({ -2, 0.5, 3 }):clip({ max = 0 }):tolist(), { -2, 0, 0 }, "clip{max = 0}")
end)

T.run("t.ndim is t:dim()", function()
    T.is(torch.zeros(2, 3, 4).ndim, 3, "a 3-d tensor")
    T.is(torch.tensor(7).ndim, 0, "a 0-d tensor")
end)

T.run("torch.concat is torch.cat", function()
    local a, b = f32({ { 1, 2 } }), f32({ { 3, 4 } })
    T.is(torch.concat({ a, b }):tolist(), { { 1, 2 }, { 3, 4 } }, "along dim 0 by default")
    T.is(torch.concat({ a, b }, 1):tolist(), { { 1, 2, 3, 4 } }, "along dim 1")
    T.is(torch.cat({ a, b }, 1):tolist(), { { 1, 2, 3, 4 } }, "torch.cat gives the same")
    T.raises(function() return torch.concat({}) end, { "cat", "non%-empty" }, "and refuses what cat refuses")
end)

-- One random stream serves every device, so seeding through torch.cuda
-- (GPU or not) is seeding torch.
T.run("torch.cuda.manual_seed_all is torch.cuda.manual_seed is torch.manual_seed", function()
    torch.manual_seed(5)
    local after_5 = torch.rand(4):tolist()
    torch.manual_seed(6)
    local after_6 = torch.rand(4):tolist()
    T.ok(after_5[1] ~= after_6[1], "two seeds give two streams (the check below can fail)")
    torch.cuda.manual_seed_all(5)
    T.is(torch.rand(4):tolist(), after_5, "cuda.manual_seed_all(5) restarts manual_seed(5)'s stream")
    torch.cuda.manual_seed(6)
    T.is(torch.rand(4):tolist(), after_6, "cuda.manual_seed(6) restarts manual_seed(6)'s stream")
end)

T.done_testing()
