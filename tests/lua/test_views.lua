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

T.run("itemsize, nbytes, layout and the kinds dplua has none of", function()
  local t = torch.ones(2, 3, { dtype = torch.float64 })
  T.is({ t.itemsize, t.nbytes }, { 8, 48 }, "float64: 8 bytes an element, 48 in all (PyTorch's)")
  local b = torch.ones(5, { dtype = torch.bfloat16 })
  T.is({ b.itemsize, b.nbytes, t:narrow(1, 0, 2).nbytes }, { 2, 10, 32 }, "bfloat16; a view counts its own elements")
  T.is(tostring(t.layout), "torch.strided", "layout")
  T.ok(t.layout == torch.strided, "the one layout")
  T.is({ t.is_sparse, t.is_quantized, t.is_meta, t.is_mkldnn }, { false, false, false, false }, "no other kinds")
end)

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

T.run("split and chunk: how many views, and that they are views", function()
    local x = torch.arange(10, {dtype = torch.float32})
    T.is(#x:split(3), 4, "split(3) of 10: four pieces")
    T.is(#x:chunk(4), 4, "chunk(4) of 10: four pieces of 3, 3, 3, 1")
    T.is(#torch.arange(6):chunk(4), 3, "chunk(4) of 6: three pieces of 2")
    T.is(#torch.empty(0):chunk(3), 3, "chunk(3) of nothing: three empty pieces")
    x:split(3)[2]:fill_(-1)
    T.is(x[3]:item(), -1, "a piece shares the tensor's storage")
    T.raises(function() return x:split({3, 3}) end, {"split", "6", "10"}, "sizes that do not add up")
    T.raises(function() return x:split({2 ^ 62, 2 ^ 62, 2 ^ 62, 2 ^ 62, 10}) end, {"split", "add up to 18446744073709551616", "size 10"},
             "sizes whose int64 sum would wrap around to the size")
    T.raises(function() return x:split(0) end, {"split", "positive"}, "a zero split size")
    T.raises(function() return x:chunk(0) end, {"chunk", "positive"}, "zero chunks")
    T.raises(function() return x:split(2, 1) end, {"split", "dim"}, "a dim out of range")
    T.raises(function() return x:tril() end, {"tril", "2 dims"}, "tril of a vector")
    T.raises(function() return torch.tensor(3):split(1) end, {"split", "0%-d"}, "split of a 0-d tensor")
    T.raises(function() return torch.tensor(3):chunk(2) end, {"chunk", "0%-d"}, "chunk of a 0-d tensor")
end)

-- Writes whose inputs share memory with the output, as PyTorch rules
-- them: an input that is the output itself is fine, one that is a part,
-- a transpose or a broadcast of it is refused (written element by element,
-- t:add_(t:t()) would read elements already overwritten and give
-- [[0,4,8],[7,8,12],[14,19,16]]), and so is a write into an expanded view
-- (several elements in one location).
T.run("in-place writes and overlapping memory", function()
    local shared, expanded = "refer to a single memory location", "expanded view"
    local t = torch.arange(9, {dtype = torch.float32}):view(3, 3)
    T.raises(function() t:add_(t:t()) end, {"add_", shared}, "add_ of its own transpose")
    T.is(t:tolist(), {{0, 1, 2}, {3, 4, 5}, {6, 7, 8}}, "and t is left as it was")
    T.is(t:clone():add_(t:t()):tolist(), {{0, 4, 8}, {4, 8, 12}, {8, 12, 16}}, "into a clone: the sum")
    T.raises(function() t:add_(t[0]) end, {"add_", shared}, "add_ of its own first row, broadcast")
    local a = torch.arange(5, {dtype = torch.float32})
    T.raises(function() a:narrow(0, 1, 4):copy_(a:narrow(0, 0, 4)) end, {"copy_", shared}, "copy_ from a shifted view")
    T.lives(function() a:narrow(0, 1, 4):clamp_(0, 1) end, "clamp_ of a view: its input is the view itself")
    local e = torch.zeros(3)
    T.raises(function() e:view(1, 3):expand(4, 3):add_(1) end, {"add_", expanded}, "add_ into an expanded view")
    T.raises(function() e:view(1, 3):expand(4, 3):copy_(torch.ones(4, 3)) end, {"copy_", expanded}, "copy_ into it")
    T.raises(function() e:expand(2, 3):masked_fill_(torch.ones(2, 3):gt(0), 1) end, {"masked_fill_", expanded},
             "masked_fill_ into it")
    T.is(e:tolist(), {0, 0, 0}, "and the tensor is left as it was")
    local x = torch.ones(3, 3)
    x:add_(x)
    x:t():mul_(x:t())
    x:copy_(x)
    T.is(x:sum():item(), 36, "an input that is the output itself: add_, mul_ of a transposed view, copy_")
    local z = torch.arange(4, {dtype = torch.float32})
    z:narrow(0, 0, 2):copy_(z:narrow(0, 2, 2))
    z[3] = z[0]
    T.is(z:tolist(), {2, 3, 2, 2}, "disjoint parts of one storage: copy_ and index assignment")
    -- strided views that interleave without sharing an element are fine (PyTorch
    -- calls an overlap only between dense tensors)
    local m = torch.arange(6, {dtype = torch.float32}):view(2, 3)
    m[{{}, 0}] = m[{{}, 1}]
    m:select(1, 2):add_(m:select(1, 1))
    T.is(m:tolist(), {{1, 1, 3}, {4, 4, 9}}, "columns of one matrix: copied and added into each other")
    local w = torch.arange(6, {dtype = torch.float32})
    w[{{0, 6, 2}}] = w[{{1, 6, 2}}]
    T.is(w:tolist(), {1, 1, 3, 3, 5, 5}, "every other element from the ones between")
    -- with no elements no two of them share a location
    local none = torch.zeros(1, 0, 3):expand(2, 0, 3)
    T.lives(function() none:add_(1) end, "an expanded view with no elements may be written")
    T.is(T.shape(none:copy_(torch.ones(2, 0, 3))), {2, 0, 3}, "copy_ into it too, and it keeps its shape")
end)

-- A window's backward adds into the gradient its input has gathered so far
-- (split's pieces, overlapping narrows, a loop of selects) or writes into
-- zeros. The gradient of sum(c * piece) over the pieces is each piece's
-- coefficient tensor placed back in its window and summed where windows
-- overlap: expected values are built by hand below, element by element.
T.run("the gradients of windows: split, overlapping narrows, selects, and the whole used too", function()
    local function coef(n, m, k) return torch.arange(n * m, {dtype = torch.float64}):view(n, m):add(k) end
    local x = torch.randn(6, 4, {dtype = torch.float64, requires_grad = true})
    local p = x:split(2)
    local loss = (p[1] * coef(2, 4, 1)):sum() + (p[3] * coef(2, 4, 100)):sum()   -- p[2] unused
    loss:backward()
    local g = x.grad:tolist()
    local want = {}
    for i = 1, 6 do
        want[i] = {}
        for j = 1, 4 do
            local k = (i - 1) % 2 * 4 + (j - 1)
            want[i][j] = i <= 2 and k + 1 or i >= 5 and k + 100 or 0
        end
    end
    T.is(g, want, "split: used pieces get their coefficients, the unused one zeros")

    -- through a non-leaf base, which is also used whole, with overlapping windows
    local y = torch.randn(5, 3, {dtype = torch.float64, requires_grad = true})
    local b = y * 2
    local l2 = b:narrow(0, 0, 3):sum() + (b:narrow(0, 1, 3) * 3):sum() + (b * 5):sum()
    for i = 0, 4 do l2 = l2 + b:select(0, i):select(0, 1) * 7 end
    l2:backward()
    local gy = y.grad:tolist()
    local ok = true
    for i = 1, 5 do
        for j = 1, 3 do
            local w = 5 + (i <= 3 and 1 or 0) + ((i >= 2 and i <= 4) and 3 or 0) + (j == 2 and 7 or 0)
            ok = ok and math.abs(gy[i][j] - 2 * w) < 1e-12
        end
    end
    T.ok(ok, "overlapping narrows, a loop of selects and the whole base: each element's gradient is 2 x its uses")

    -- the pieces of one tensor given to add, whose backward shares one gradient between its inputs
    local z = torch.randn(4, 2, {dtype = torch.float64, requires_grad = true})
    local c = z + 0
    local q = c:chunk(2)
    local s = q[1] + q[2]
    s:sum():backward()
    T.is(z.grad:tolist(), {{1, 1}, {1, 1}, {1, 1}, {1, 1}}, "two chunks added: every element once")
    z.grad = nil
    local u = z * 1
    local h = u:chunk(2)
    local both = (h[1] + h[2]) * 3 + u:sum()   -- (2, 2): u's sum is added to each of its 4 elements
    both:sum():backward()
    T.is(z.grad:tolist(), {{7, 7}, {7, 7}, {7, 7}, {7, 7}}, "and the whole used beside them: 3 + 4")
end)

T.run("as_strided and resize_: bad input", function()
  local x = torch.arange(10.0)
  T.raises(function() x:as_strided({ 4, 4 }, { 3, 1 }) end, "reaches element 12 of the storage, which holds 10",
           "a view past the storage")
  T.raises(function() x:as_strided({ 2 }, { -1 }) end, "expected non%-negative ones", "a negative stride")
  T.raises(function() x:as_strided({ 2, 2 }, { 1 }) end, "mismatch in length of strides and shape", "lengths that differ")
  T.raises(function() x:as_strided({ 2 }, { 1 }, -1) end, "storage offset %-1 is negative", "a negative offset")
  T.raises(function() x:as_strided({ 2 ^ 40, 2 ^ 40 }, { 2 ^ 40, 2 ^ 40 }) end, "overflows int64", "an extent past int64")
  T.raises(function() torch.ones(3, { requires_grad = true }):as_strided({ 2 }, { 1 }) end,
           "as_strided of a tensor that requires grad is not supported", "a tensor that requires grad")
  local v = torch.no_grad(function() return torch.ones(3, { requires_grad = true }):as_strided({ 2 }, { 1 }) end)
  T.ok(not v.requires_grad and v:numel() == 2, "under no_grad: a view that does not require grad")
  T.is(T.shape(x:as_strided({ 0, 5 }, { 100, 100 })), { 0, 5 }, "an empty view reaches nothing")
  T.raises(function() torch.ones(3, { requires_grad = true }):resize_(2) end, "cannot resize a tensor that requires grad",
           "resize_ of a tensor that requires grad")
  T.raises(function() torch.ones(3):resize_(-2) end, "resize_", "resize_ to a negative size")
  T.raises(function() torch.zeros(0):chunk(2 ^ 53) end, "at most 2%^20", "chunk of an empty dim into 2^53 pieces")
  T.is(#torch.zeros(0):chunk(3), 3, "chunk of an empty dim: as many empty pieces, as PyTorch")
  local base = torch.arange(4.0):double()
  local view = base:view(2, 2)
  base:resize_(3, 3)
  T.is(view:tolist(), { { 0, 1 }, { 2, 3 } }, "resize_ past the storage: other views keep the old one")
end)

T.done_testing()
