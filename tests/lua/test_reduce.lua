-- test_reduce.lua -- sum, mean, prod, max, min, argmax, argmin, var, std, all,
-- any (over everything and over each dim, keepdim, negative dims) and
-- softmax / log_softmax, against PyTorch; plus checks by hand.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local dir = os.getenv("DPLUA_TEST_DIR") or (here .. "/..")
package.path = dir .. "/lua/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
torch.manual_seed(0)   -- random inputs, the same in every run

T.run_ref(torch, "reduce")

T.run("reductions by hand", function()
    local t = torch.ones(2, 3)
    T.is(t:sum():item(), 6, "ones(2, 3):sum() is 6")
    T.is(t:sum():dim(), 0, "sum() is 0-d")
    T.is(T.shape(t:sum(1)), {2}, "sum(1) drops the dim")
    T.is(T.shape(t:sum(1, true)), {2, 1}, "sum(1, true) keeps it")
    T.is(T.shape(t:sum(-2, true)), {1, 3}, "sum(-2, true)")
    local m = torch.tensor({{1, 5, 2}, {7, 0, 3}})
    local v, i = m:max(1)
    T.is(v:tolist(), {5, 7}, "max(1) values")
    T.is(i:tolist(), {1, 0}, "max(1) indices (0-based)")
    T.is(tostring(i.dtype), "torch.int64", "max(1) indices are int64")
    v, i = m:min(0, true)
    T.is(v:tolist(), {{1, 0, 2}}, "min(0, true) values")
    T.is(i:tolist(), {{0, 1, 0}}, "min(0, true) indices")
    T.is(m:max():item(), 7, "max() of everything")
    T.is(m:argmax():item(), 3, "argmax() is a flat index")
    T.is(torch.tensor({1, 3, 3, 2}):argmax():item(), 1, "argmax picks the first of ties")
    T.is(torch.tensor({2, 0, 0, 5}):argmin():item(), 1, "argmin picks the first of ties")
    local big = torch.ones(1000000)
    T.close(big:sum():item(), 1e6, 0, 0, "sum of a million float32 ones is exact")
    T.close(big:mean():item(), 1, 0, 1e-6, "mean of a million ones")
    local s = torch.arange(100):float()
    T.close(s:var():item(), 841.6666666666666, 1e-5, 0, "var of 0..99 (correction 1)")
    T.close(s:var(nil, {correction = 0}):item(), 833.25, 1e-5, 0, "var of 0..99 (correction 0)")
    T.close(s:std():item(), math.sqrt(841.6666666666666), 1e-5, 0, "std of 0..99")
    local off = torch.full({10000}, 1e4, {dtype = torch.float32}):add(torch.arange(10000):remainder(2))
    T.close(off:var(0, {correction = 0}):item(), 0.25, 1e-3, 0, "var with a large offset is stable")
    T.is(tostring(torch.arange(4):sum().dtype), "torch.int64", "int sum is int64")
    T.is(tostring(torch.ones({3}, {dtype = torch.bool}):sum().dtype), "torch.int64", "bool sum is int64")
    T.is(torch.tensor({true, false}):any():item(), true, "any() is a bool")
    T.is(torch.tensor({true, false}):all():item(), false, "all() is a bool")
    local sm = torch.tensor({{1000, 1001}}, {dtype = torch.float32})
    T.close(sm:softmax(1)[{0, 1}]:item(), 0.7310585786300049, 1e-6, 0, "softmax is stable for large values")
    local ls = torch.tensor({-1000, 0, 1000}, {dtype = torch.float32}):log_softmax(0)
    T.close(ls[0]:item(), -2000, 1e-6, 0, "log_softmax of -1000 next to 1000 is finite")
    T.close(torch.randn(4, 7):softmax(-1):sum(-1):sub(1):abs():max():item(), 0, 0, 1e-6,
            "softmax rows sum to 1")
end)

T.done_testing()
