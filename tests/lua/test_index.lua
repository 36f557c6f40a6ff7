-- test_index.lua -- 0-based indexing, assignment, index_select, gather, cat and
-- stack against PyTorch, plus hand-computed checks.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local dir = os.getenv("DPLUA_TEST_DIR") or (here .. "/..")
package.path = dir .. "/lua/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
torch.manual_seed(0)   -- random inputs, the same in every run

T.run_ref(torch, "index")

local function long(v) return torch.tensor(v, {dtype = torch.int64}) end

T.run("indexing is 0-based", function()
    local t = torch.arange(5)
    T.is(t[0]:item(), 0, "arange(5)[0] is 0")
    T.is(t[4]:item(), 4, "arange(5)[4] is 4")
    T.is(t[-1]:item(), 4, "arange(5)[-1] is 4")
    T.is(t[-5]:item(), 0, "arange(5)[-5] is 0")
    T.is(t[2]:dim(), 0, "t[i] of 1-d is 0-d")
    local m = torch.arange(12):reshape(3, 4)
    T.is(m[0]:tolist(), {0, 1, 2, 3}, "m[0] is the first row")
    T.is(m[{{}, {1, 3}}]:tolist(), {{1, 2}, {5, 6}, {9, 10}}, "m[{{}, {1, 3}}] is m[:, 1:3]")
    T.is(m:narrow(0, 2, 1):tolist(), {{8, 9, 10, 11}}, "narrow(0, 2, 1) starts at the third row")
    T.is(m:select(1, 0):tolist(), {0, 4, 8}, "select(1, 0) is the first column")
    local sum = 0
    for i = 0, #m - 1 do sum = sum + m[i][0]:item() end
    T.is(sum, 12, "loop over rows 0 .. #m - 1")
end)

T.run("assignment", function()
    local t = torch.zeros(3, 4)
    t[1] = 5
    T.is(t:tolist(), {{0, 0, 0, 0}, {5, 5, 5, 5}, {0, 0, 0, 0}}, "t[1] = 5 fills row 1")
    t[{0, 2}] = -1
    T.is(t[0]:tolist(), {0, 0, -1, 0}, "t[{0, 2}] = -1")
    t[{{}, 3}] = torch.tensor({7, 8, 9})
    T.is(t:select(1, 3):tolist(), {7, 8, 9}, "t[{{}, 3}] = tensor")
    t[2] = torch.tensor({1, 2, 3, 4})
    T.is(t[2]:tolist(), {1, 2, 3, 4}, "t[2] = row tensor")
    t[{{0, 2}, {0, 2}}] = torch.tensor({10, 20})
    T.is(t:tolist(), {{10, 20, -1, 7}, {10, 20, 5, 8}, {1, 2, 3, 4}}, "t[{{0, 2}, {0, 2}}] = broadcast row")
    t[-1] = 0
    T.is(t[2]:tolist(), {0, 0, 0, 0}, "t[-1] = 0")
    local i = torch.zeros({3}, {dtype = torch.int64})
    i[1] = 7
    T.is(i:tolist(), {0, 7, 0}, "int64 assignment")
    local b = torch.zeros({2}, {dtype = torch.bool})
    b[0] = true
    T.is(b:tolist(), {true, false}, "bool assignment")
    local d = torch.zeros({4}, {dtype = torch.float64})
    d[{{1, 3}}] = torch.tensor({0.1, 0.2}, {dtype = torch.float64})
    T.is(d:tolist(), {0, 0.1, 0.2, 0}, "float64 assignment keeps doubles exact")
end)

T.run("index_select / gather / cat / stack", function()
    local m = torch.arange(12):reshape(3, 4)
    T.is(m:index_select(0, long({2, 0})):tolist(), {{8, 9, 10, 11}, {0, 1, 2, 3}}, "index_select rows")
    T.is(m:index_select(1, long({3})):tolist(), {{3}, {7}, {11}}, "index_select a column")
    T.is(tostring(m:index_select(0, long({0})).dtype), "torch.int64", "index_select keeps dtype")
    T.is(m:gather(1, long({{0}, {3}, {1}})):tolist(), {{0}, {7}, {9}}, "gather(1)")
    T.is(m:gather(0, long({{2, 1, 0, 0}})):tolist(), {{8, 5, 2, 3}}, "gather(0)")
    local a, b = torch.ones(2, 2), torch.zeros(1, 2)
    T.is(torch.cat({a, b}):tolist(), {{1, 1}, {1, 1}, {0, 0}}, "cat default dim 0")
    T.is(T.shape(torch.cat({a, a, a}, 1)), {2, 6}, "cat three along 1")
    T.is(T.shape(torch.stack({a, a})), {2, 2, 2}, "stack default dim 0")
    T.is(T.shape(torch.stack({a, a, a}, 2)), {2, 2, 3}, "stack dim 2")
    T.is(T.shape(torch.stack({a, a, a}, -1)), {2, 2, 3}, "stack dim -1")
    local s = torch.stack({torch.tensor({1, 2}), torch.tensor({3, 4})}, 1)
    T.is(s:tolist(), {{1, 3}, {2, 4}}, "stack 1-d along 1")
    local c = torch.cat({a, b})
    c:fill_(9)
    T.is(a:sum():item(), 4, "cat copies its inputs")
end)

-- Long lists: a model's 300 parameters, a depthwise convolution's 300
-- groups (both stack or cat internally), a batch of 1000 samples.
T.run("cat and stack of long lists", function()
  local l = {}
  for i = 1, 1000 do l[i] = torch.full({2}, i) end
  local s, c = torch.stack(l), torch.cat(l)
  T.is(T.shape(s), {1000, 2}, "stack of 1000")
  T.is({ s[0][0]:item(), s[999][1]:item() }, { 1, 1000 }, "stack of 1000: first and last")
  T.is({ T.shape(c)[1], c[1999]:item() }, { 2000, 1000 }, "cat of 1000")
  local x = {}
  for i = 1, 700 do x[i] = torch.full({3}, i, { dtype = torch.float32 }):requires_grad_() end
  torch.stack(x):mul(torch.arange(700):view(700, 1)):sum():backward()
  T.is({ x[1].grad:tolist(), x[700].grad:tolist() }, { { 0, 0, 0 }, { 699, 699, 699 } }, "stack of 700: each gets its gradient")
  local ps = {}
  for i = 1, 300 do ps[i] = torch.nn.Parameter(torch.ones(2)); ps[i].grad = torch.ones(2) end
  T.is(torch.nn.utils.parameters_to_vector(ps):sum():item(), 600, "parameters_to_vector of 300 parameters")
  T.close(torch.nn.utils.clip_grad_norm_(ps, 1.0):item(), math.sqrt(600), 1e-6, 0, "clip_grad_norm_ of 300 parameters: the norm")
  local conv = torch.nn.Conv2d(300, 300, 3, { groups = 300 })
  local input = torch.randn(1, 300, 5, 5)
  local y = conv(input)
  local expect = torch.nn.functional.conv2d(input:narrow(1, 299, 1), conv.weight:narrow(0, 299, 1), conv.bias:narrow(0, 299, 1))
  T.is(T.shape(y), {1, 300, 3, 3}, "a convolution of 300 groups")
  T.tensor_close(y:narrow(1, 299, 1), expect, 1e-5, 1e-6, "its last group as a convolution of its own")
end)

T.done_testing()
