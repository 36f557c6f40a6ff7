-- test_gradcheck.lua -- torch.autograd.gradcheck (float64 central
-- differences against the backward of every differentiable op): every
-- tensor op of docs/API.md and the nn.functional ops. Inputs are seeded
-- random float64 tensors, kept away from kinks (0 for abs/relu/sign,
-- integers for floor/ceil/round, ties for max/min) where an op has one.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local dir = os.getenv("DPLUA_TEST_DIR") or (here .. "/..")
package.path = dir .. "/lua/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local F = torch.nn.functional
local gradcheck = torch.autograd.gradcheck

torch.manual_seed(1234)

local f64 = { dtype = torch.float64 }

-- A leaf float64 tensor requiring grad: randn, pushed at least 0.2 away from 0.
local function R(...)
  local x = torch.randn({ ... }, f64)
  x = torch.where(x:abs():lt(0.2), x:sign() * 0.2 + x + 0.2 * (x:eq(0):double()), x)
  return x:requires_grad_()
end
-- Positive values in [0.5, 2.5).
local function P(...) return (torch.rand({ ... }, f64) * 2 + 0.5):requires_grad_() end
local function I(values) return torch.tensor(values, { dtype = torch.int64 }) end

local function check(name, fn, inputs, opts)
  T.run(name, function()
    T.ok(gradcheck(fn, inputs, opts), name)
  end)
end

---------------------------------------------------------------- gradcheck itself

T.run("gradcheck reports a wrong gradient", function()
  local x = R(2, 3)
  T.raises(function() gradcheck(function(a) return a * a:detach() end, { x }) end,
           { "gradcheck", "input 1", "numerical", "analytical" }, "a half-detached product fails, naming input and values")
  local ok, msg = gradcheck(function(a) return a * a:detach() end, { x }, { raise_exception = false })
  T.ok(ok == false and type(msg) == "string", "raise_exception=false returns false and the message")
  T.raises(function() gradcheck(function(a) return a end, { torch.randn(2, { requires_grad = true }) }) end,
           "float64", "float32 inputs are refused")
  T.raises(function() gradcheck(function(a) return a end, { torch.randn(2, f64) }) end,
           "requires grad", "inputs without requires_grad are refused")
end)

---------------------------------------------------------------- unary ops

local general = { "neg", "exp", "tanh", "sigmoid", "sin", "cos", "square", "abs", "relu", "sign",
                  "floor", "ceil", "round", "expm1" }
for _, op in ipairs(general) do
  check("unary " .. op, function(a) return a[op](a) end, { R(2, 3) })
end
for _, op in ipairs({ "log", "sqrt", "rsqrt", "reciprocal", "log1p" }) do
  check("unary " .. op .. " (positive inputs)", function(a) return a[op](a) end, { P(2, 3) })
end
check("unary reciprocal (negative inputs)", function(a) return (-a):reciprocal() end, { P(3) })
check("split and chunk (views)", function(a)
  local p = a:split({ 1, 2 }, 1)
  local q = a:chunk(2)
  return p[1] * 2 + p[2]:sum(1, true) + q[2]:sum()
end, { R(2, 3) })
check("tril and triu", function(a) return a:tril(-1) * 3 + a:triu(1) end, { R(3, 4) })
check("norm (2, 1, 3, over a dim)", function(a) return a:norm() + a:norm(1) + a:norm(3, 1):sum() end, { R(3, 4) })
check("2-norm over each dim, keepdim", function(a) return a:norm(2, 0, true):sum() + a:norm(2, 1):sum() end, { R(3, 4) })
T.run("the 2-norm's gradient is 0 where the norm is 0 (PyTorch's subgradient)", function()
  local x = torch.tensor({ { 3, 4 }, { 0, 0 } }, { dtype = torch.float64, requires_grad = true })
  x:norm(2, 1):sum():backward()
  T.tensor_close(x.grad, { { 0.6, 0.8 }, { 0, 0 } }, 0, 1e-15, "x / norm, and 0 in the zero row")
end)
check("masked_fill (no gradient where filled)", function(a)
  return a:masked_fill(torch.tensor({ true, false, true }), 2.5) * a
end, { R(2, 3) })
check("gelu (erf)", function(a) return a:gelu() end, { R(2, 3) })
check("gelu (tanh)", function(a) return a:gelu("tanh") end, { R(2, 3) })
check("torch.NAME form: torch.exp", function(a) return torch.exp(a) end, { R(4) })
check("unary op on a non-contiguous view", function(a) return a:t():tanh() end, { R(3, 2) })

---------------------------------------------------------------- binary ops

-- shapes (3,1,4) and (2,4): both operands broadcast
for _, op in ipairs({ "add", "sub", "mul", "div", "maximum", "minimum", "atan2" }) do
  check("binary " .. op .. " with broadcasting on both sides", function(a, b) return a[op](a, b) end,
        { R(3, 1, 4), R(2, 4) })
end
check("binary pow (tensor ^ tensor, positive base)", function(a, b) return a:pow(b) end, { P(3, 1), R(1, 4) })
check("binary remainder", function(a, b) return a:remainder(b) end, { (torch.randn(2, 3, f64) * 3):requires_grad_(), P(3) })
check("operators + - * /", function(a, b) return (a + b) * a - b / a end, { R(2, 3), R(3) })
check("add with alpha", function(a, b) return a:add(b, 2.5) end, { R(2, 3), R(2, 3) })
check("sub with alpha", function(a, b) return a:sub(b, -0.5) end, { R(2, 3), R(1, 3) })
check("scalar on the right", function(a) return (a + 2) * 3 - 1 end, { R(2, 3) })
check("scalar on the left", function(a) return 2 - a end, { R(2, 3) })
check("scalar divided by tensor", function(a) return 2 / a end, { R(2, 3) })
check("tensor ^ scalar", function(a) return a ^ 3 end, { R(2, 3) })
check("tensor ^ 0.5 (positive)", function(a) return a ^ 0.5 end, { P(2, 3) })
check("scalar ^ tensor", function(a) return 2 ^ a end, { R(2, 3) })
check("unary minus", function(a) return -a end, { R(2, 3) })
check("maximum/minimum: the second operand", function(a, b) return a:maximum(b) + a:minimum(b) * 2 end,
      { R(4), R(4) })
check("torch.where with broadcasting", function(a, b)
  local cond = torch.tensor({ { true, false, true }, { false, true, false } })
  return torch.where(cond, a, b)
end, { R(2, 3), R(3) })
check("where with a scalar branch", function(a)
  return torch.where(torch.tensor({ true, false, true }), a, 0.5)
end, { R(3) })

check("clamp(min, max) (values away from bounds)", function(a) return a:clamp(-0.5, 0.5) end,
      { torch.tensor({ -1.3, -0.3, 0.1, 0.45, 0.9, 2 }, f64):requires_grad_() })
check("clamp_min", function(a) return a:clamp_min(0.1) end,
      { torch.tensor({ -1, 0.3, 0.05, 2 }, f64):requires_grad_() })
check("clamp_max", function(a) return a:clamp_max(0.1) end,
      { torch.tensor({ -1, 0.3, 0.05, 2 }, f64):requires_grad_() })
check("clamp with only a min table", function(a) return a:clamp({ min = 0 }) end,
      { torch.tensor({ -1, 0.3, -0.05, 2 }, f64):requires_grad_() })

check("addcmul with a value, broadcast", function(a, b, c) return torch.addcmul(a, b, c, { value = -1.5 }) end,
      { R(3, 1), R(1, 4), R(3, 4) })
check("addcdiv with a value, broadcast", function(a, b, c) return a:addcdiv(b, c, { value = 0.5 }) end,
      { R(4), R(3, 1), P(3, 4) })
check("lerp with a number weight on either side of 0.5", function(a, b) return a:lerp(b, 0.3) + a:lerp(b, 0.8) end,
      { R(2, 3), R(3) })
check("lerp with a tensor weight", function(a, b, w) return torch.lerp(a, b, w) end, { R(2, 3), R(2, 3), R(1, 3) })

---------------------------------------------------------------- reductions

for _, op in ipairs({ "sum", "mean", "prod", "amax", "amin" }) do
  check(op .. " over everything", function(a) return a[op](a) end, { R(2, 3, 2) })
  for d = 0, 2 do
    check(op .. " over dim " .. d, function(a) return a[op](a, d) end, { R(2, 3, 2) })
    check(op .. " over dim " .. d .. " keepdim", function(a) return a[op](a, d, true) end, { R(2, 3, 2) })
  end
  check(op .. " over dim -1", function(a) return a[op](a, -1) end, { R(2, 3) })
end
check("sum over a list of dims", function(a) return a:sum({ 0, 2 }) end, { R(2, 3, 2) })
check("max over everything", function(a) return a:max() end, { R(2, 3) })
check("min over everything", function(a) return a:min() end, { R(2, 3) })
for d = 0, 1 do
  for _, keep in ipairs({ false, true }) do
    check(("max(%d, keepdim=%s) values"):format(d, tostring(keep)), function(a) return (a:max(d, keep)) end, { R(3, 4) })
    check(("min(%d, keepdim=%s) values"):format(d, tostring(keep)), function(a) return (a:min(d, keep)) end, { R(3, 4) })
  end
end
for _, op in ipairs({ "var", "std" }) do
  for _, corr in ipairs({ 0, 1 }) do
    check(("%s correction=%d over everything"):format(op, corr), function(a) return a[op](a, nil, { correction = corr }) end,
          { R(3, 4) })
    for d = 0, 1 do
      check(("%s correction=%d over dim %d"):format(op, corr, d),
            function(a) return a[op](a, d, { correction = corr }) end, { R(3, 4) })
      check(("%s correction=%d over dim %d keepdim"):format(op, corr, d),
            function(a) return a[op](a, d, { correction = corr, keepdim = true }) end, { R(3, 4) })
    end
  end
end
check("var default (unbiased) over dim 1", function(a) return a:var(1) end, { R(3, 4) })
for d = 0, 1 do
  check("softmax over dim " .. d, function(a) return a:softmax(d) end, { R(3, 4) })
  check("log_softmax over dim " .. d, function(a) return a:log_softmax(d) end, { R(3, 4) })
end
check("softmax over dim -1 of 3-D", function(a) return a:softmax(-1) end, { R(2, 2, 3) })

---------------------------------------------------------------- matmul

local mm_cases = {
  { "1-D . 1-D", { 4 }, { 4 } },
  { "2-D @ 1-D", { 3, 4 }, { 4 } },
  { "1-D @ 2-D", { 4 }, { 4, 3 } },
  { "2-D @ 2-D", { 2, 4 }, { 4, 3 } },
  { "3-D @ 3-D", { 2, 2, 3 }, { 2, 3, 2 } },
  { "3-D @ 2-D", { 2, 2, 3 }, { 3, 2 } },
  { "2-D @ 3-D", { 2, 3 }, { 2, 3, 2 } },
  { "1-D @ 3-D", { 3 }, { 2, 3, 2 } },
  { "3-D @ 1-D", { 2, 2, 3 }, { 3 } },
  { "4-D @ 3-D broadcast", { 2, 1, 2, 3 }, { 2, 3, 2 } },
}
for _, c in ipairs(mm_cases) do
  check("matmul " .. c[1], function(a, b) return a:matmul(b) end, { R(unpack(c[2])), R(unpack(c[3])) })
end
check("matmul with a transposed operand", function(a, b) return a:t():matmul(b) end, { R(4, 2), R(4, 3) })
check("mm", function(a, b) return a:mm(b) end, { R(2, 3), R(3, 4) })
check("bmm", function(a, b) return a:bmm(b) end, { R(2, 2, 3), R(2, 3, 2) })

---------------------------------------------------------------- views and indexing

local views = {
  { "view", function(a) return a:view(3, 4) end },
  { "view with -1", function(a) return a:view(-1) end },
  { "reshape", function(a) return a:reshape(4, 3) end },
  { "reshape of a transpose (copy)", function(a) return a:transpose(0, 1):reshape(-1) end },
  { "transpose", function(a) return a:transpose(0, 2) end },
  { "t", function(a) return a:view(4, 3):t() end },
  { "T", function(a) return a.T end },
  { "permute", function(a) return a:permute(2, 0, 1) end },
  { "contiguous", function(a) return a:permute(1, 0, 2):contiguous() end },
  { "squeeze", function(a) return a:view(2, 1, 6):squeeze() end },
  { "squeeze(d)", function(a) return a:view(2, 1, 6):squeeze(1) end },
  { "unsqueeze", function(a) return a:unsqueeze(1) end },
  { "expand", function(a) return a:narrow(0, 0, 1):expand(3, -1, -1) end },
  { "expand_as", function(a) return a:narrow(2, 0, 1):expand_as(a) end },
  { "narrow", function(a) return a:narrow(1, 1, 2) end },
  { "select", function(a) return a:select(1, 2) end },
  { "select negative", function(a) return a:select(-1, -1) end },
  { "flatten", function(a) return a:flatten() end },
  { "flatten(1)", function(a) return a:flatten(1) end },
  { "view_as", function(a) return a:view_as(torch.zeros(6, 2)) end },
  { "t[i]", function(a) return a[1] end },
  { "t[{{}, {1, 3}}]", function(a) return a[{ {}, { 1, 3 } }] end },
  { "t[{0, {}, {0, 2, 1}}]", function(a) return a[{ 0, {}, { 0, 2, 1 } }] end },
  { "stepped slice", function(a) return a[{ {}, { 0, 3, 2 } }] end },
  { "negative slice bounds", function(a) return a[{ { -1 }, { nil, -1 } }] end },
  { "to(float64) (no-op)", function(a) return a:to(torch.float64) * 2 end },
  { "clone", function(a) return a:clone() end },
}
for _, v in ipairs(views) do check("view op " .. v[1], v[2], { R(2, 3, 2) }) end

check("index_select dim 0 (repeated indices)", function(a) return a:index_select(0, I({ 2, 0, 2 })) end, { R(3, 4) })
check("index_select dim 1", function(a) return a:index_select(1, I({ 3, 1 })) end, { R(3, 4) })
check("gather dim 1", function(a) return a:gather(1, I({ { 0, 0, 2 }, { 1, 3, 3 } })) end, { R(2, 4) })
check("gather dim 0", function(a) return a:gather(0, I({ { 1, 0 }, { 1, 1 } })) end, { R(2, 2) })
check("sort dim 1 descending", function(a) return (a:sort(1, true)) end, { R(3, 4) })
check("topk 2 dim 0", function(a) return (a:topk(2, 0)) end, { R(3, 4) })
check("cumsum dim 1", function(a) return a:cumsum(1) end, { R(3, 4) })
check("cumsum dim 0", function(a) return a:cumsum(0) end, { R(3, 4) })
check("advanced index t[{{}, idx}]", function(a) return a[{ {}, I({ 3, 0, 3 }) }] end, { R(3, 4) })
check("cat dim 0", function(a, b) return torch.cat({ a, b }, 0) end, { R(2, 3), R(1, 3) })
check("cat dim 1 (three tensors)", function(a, b, c) return torch.cat({ a, b, c }, 1) end, { R(2, 1), R(2, 2), R(2, 3) })
check("stack dim 0", function(a, b) return torch.stack({ a, b }) end, { R(2, 3), R(2, 3) })
check("stack dim -1", function(a, b) return torch.stack({ a, b }, -1) end, { R(2, 3), R(2, 3) })
check("a tensor used twice (gradients accumulate)", function(a) return a * a:t():t() + a:sum() end, { R(2, 2) })
check("several outputs", function(a) return { a:exp(), a:sum(0) } end, { R(2, 3) })

---------------------------------------------------------------- nn.functional

check("linear with bias", function(x, w, b) return F.linear(x, w, b) end, { R(3, 4), R(2, 4), R(2) })
check("linear without bias", function(x, w) return F.linear(x, w) end, { R(3, 4), R(2, 4) })
check("linear on 3-D input", function(x, w, b) return F.linear(x, w, b) end, { R(2, 2, 3), R(2, 3), R(2) })
check("linear on 1-D input", function(x, w, b) return F.linear(x, w, b) end, { R(3), R(2, 3), R(2) })

local target = I({ 0, 2, 1, 2 })
for _, red in ipairs({ "mean", "sum", "none" }) do
  check("cross_entropy reduction=" .. red, function(x) return F.cross_entropy(x, target, { reduction = red }) end,
        { R(4, 3) })
  -- the class weight takes no gradient, as in PyTorch
  check("cross_entropy with weight, reduction=" .. red, function(x)
    return F.cross_entropy(x, target, { weight = torch.tensor({ 0.3, 1.5, 0.8 }, f64), reduction = red })
  end, { R(4, 3) })
  check("cross_entropy ignore_index, reduction=" .. red, function(x)
    return F.cross_entropy(x, I({ 0, -100, 1, 2 }), { reduction = red })
  end, { R(4, 3) })
  check("cross_entropy label_smoothing=0.1, reduction=" .. red, function(x)
    return F.cross_entropy(x, target, { label_smoothing = 0.1, reduction = red })
  end, { R(4, 3) })
  check("cross_entropy weight + ignore_index=1 + label_smoothing, reduction=" .. red, function(x)
    return F.cross_entropy(x, target, { weight = torch.tensor({ 0.5, 2, 1 }, f64), ignore_index = 1,
                                        label_smoothing = 0.2, reduction = red })
  end, { R(4, 3) })
  check("nll_loss reduction=" .. red, function(x) return F.nll_loss(x:log_softmax(1), target, { reduction = red }) end,
        { R(4, 3) })
  check("nll_loss with weight and ignore_index, reduction=" .. red, function(x)
    return F.nll_loss(x, I({ 0, 2, 1, 1 }), { weight = torch.tensor({ 0.5, 2, 1 }, f64), ignore_index = 2, reduction = red })
  end, { R(4, 3) })
  -- nll_loss's backward takes log_softmax's into its own pass when it is
  -- the log-probabilities' only consumer; with a second one it does not
  check("nll_loss of log_softmax with weight and ignore_index, reduction=" .. red, function(x)
    return F.nll_loss(x:log_softmax(1), I({ 0, 2, 1, 1 }), { weight = torch.tensor({ 0.5, 2, 1 }, f64),
                                                             ignore_index = 2, reduction = red })
  end, { R(4, 3) })
  check("nll_loss of log_softmax used twice, reduction=" .. red, function(x)
    local lp = x:log_softmax(1)
    return F.nll_loss(lp, target, { reduction = red }):sum() + (lp * lp):sum()
  end, { R(4, 3) })
end
check("cross_entropy of one sample (C)", function(x) return F.cross_entropy(x, I(1)) end, { R(3) })
check("cross_entropy (N, C, d) input", function(x)
  return F.cross_entropy(x, I({ { 0, 2 }, { 1, 1 } }), { reduction = "none" })
end, { R(2, 3, 2) })
check("cross_entropy with probability targets", function(x)
  local p = torch.tensor({ { 0.2, 0.3, 0.5 }, { 1, 0, 0 } }, f64)
  return F.cross_entropy(x, p, { label_smoothing = 0.1 })
end, { R(2, 3) })

local function unfold(k, s, p, d)
  return function(x) return torch._unfold(x, k, s, p, d, 0) end
end
check("unfold 2x2", unfold({ 2, 2 }, { 1, 1 }, { 0, 0 }, { 1, 1 }), { R(1, 2, 3, 3) })
check("unfold 3x2 stride 2 padding 1", unfold({ 3, 2 }, { 2, 1 }, { 1, 1 }, { 1, 1 }), { R(2, 1, 4, 3) })
check("unfold dilation 2", unfold({ 2, 2 }, { 1, 1 }, { 0, 1 }, { 2, 2 }), { R(1, 1, 4, 4) })
check("conv2d with bias", function(x, w, b) return F.conv2d(x, w, b) end, { R(2, 2, 4, 4), R(3, 2, 3, 3), R(3) })
check("conv2d stride 2 padding 1 no bias", function(x, w) return F.conv2d(x, w, nil, 2, 1) end,
      { R(1, 2, 4, 4), R(2, 2, 3, 3) })
check("conv2d dilation 2", function(x, w) return F.conv2d(x, w, nil, { dilation = 2, padding = 1 }) end,
      { R(1, 1, 5, 5), R(2, 1, 2, 2) })
check("conv2d groups=2", function(x, w, b) return F.conv2d(x, w, b, { groups = 2 }) end,
      { R(1, 4, 3, 3), R(2, 2, 2, 2), R(2) })
check("conv2d unbatched (C, H, W)", function(x, w) return F.conv2d(x, w) end, { R(1, 3, 3), R(2, 1, 2, 2) })
check("max_pool2d 2x2", function(x) return F.max_pool2d(x, 2) end, { R(2, 2, 4, 4) })
check("max_pool2d 3x3 stride 2 padding 1", function(x) return F.max_pool2d(x, 3, 2, 1) end, { R(1, 2, 5, 5) })
check("max_pool2d overlapping windows (stride 1)", function(x) return F.max_pool2d(x, 2, 1) end, { R(1, 1, 3, 3) })
check("layer_norm with affine", function(x, w, b) return F.layer_norm(x, { 4 }, w, b) end, { R(3, 4), R(4), R(4) })
check("layer_norm without affine", function(x) return F.layer_norm(x, 4) end, { R(2, 4) })
check("layer_norm over two dims", function(x, w, b) return F.layer_norm(x, { 2, 3 }, w, b, 1e-5) end,
      { R(2, 2, 3), R(2, 3), R(2, 3) })
check("batch_norm, the batch's statistics", function(x, w, b) return F.batch_norm(x, nil, nil, w, b, true) end,
      { R(3, 2, 2, 2), R(2), R(2) })
check("batch_norm, running statistics", function(x, w, b)
  return F.batch_norm(x, torch.tensor({ 0.2, -0.1 }, f64), torch.tensor({ 0.7, 1.5 }, f64), w, b, false)
end, { R(3, 2, 3), R(2), R(2) })
check("batch_norm (N, C) without affine", function(x) return F.batch_norm(x, nil, nil, nil, nil, true) end, { R(4, 3) })
check("embedding (repeated indices)", function(w) return F.embedding(I({ { 0, 2 }, { 2, 3 } }), w) end, { R(4, 3) })
T.run("embedding with padding_idx: the padding row gets no gradient", function()
  local w = R(4, 2)
  local out = F.embedding(I({ 0, 1, 1, 3 }), w, 1)
  T.tensor_close(out, w:detach():index_select(0, I({ 0, 1, 1, 3 })), 0, 0, "values are the rows, padding row included")
  local loss = (out * torch.arange(8, f64):view(4, 2)):sum()
  loss:backward()
  T.tensor_close(w.grad, { { 0, 1 }, { 0, 0 }, { 0, 0 }, { 6, 7 } }, 0, 0, "gradient rows; none for the padding row")
end)
check("dropout in eval mode", function(x) return F.dropout(x, 0.5, false) end, { R(2, 3) })
check("dropout p=0", function(x) return F.dropout(x, 0) end, { R(2, 3) })
T.run("dropout in training mode: gradient is the mask", function()
  local x = R(50)
  local y = F.dropout(x, 0.4, true)
  y:sum():backward()
  local ok = true
  local yv, gv = y:tolist(), x.grad:tolist()
  for i, v in ipairs(yv) do
    local g = gv[i]
    if v == 0 then ok = ok and g == 0 else ok = ok and math.abs(g - 1 / 0.6) < 1e-12 end
  end
  T.ok(ok, "dropout's gradient is 0 where dropped and 1/(1-p) where kept")
end)
-- The fused op against its definition: the mask is the draw rand_like(x)
-- would make from the same state of the stream (>= p keeps), the output
-- x * 1/(1-p) there (the scale in float for float32 and bfloat16), and the
-- backward, which makes the mask again, the same mask times the gradient.
T.run("dropout is rand_like(x) >= p, applied and made again by the backward", function()
  for _, dt in ipairs({ torch.float64, torch.float32, torch.bfloat16 }) do
    local x = torch.randn(7, 9):to(dt):t():requires_grad_()   -- strided: drawn in x's row-major order
    local state = torch.get_rng_state()
    local y = F.dropout(x, 0.35)
    T.is(y.grad_fn and y.grad_fn.name, "NativeDropoutBackward0", tostring(dt) .. ": one node")
    local after = torch.get_rng_state()
    torch.set_rng_state(state)
    local keep = torch.rand_like(x):ge(0.35)
    T.ok(torch.equal(torch.get_rng_state(), after), tostring(dt) .. ": the stream moves as rand_like's draw")
    local acc = dt == torch.float64 and dt or torch.float32   -- the arithmetic's dtype
    local scale = dt == torch.float64 and 1 / 0.65 or torch.tensor(1 / 0.65):item()
    local function masked(t) return (t:to(acc) * keep:to(acc) * scale):to(dt):double() end
    T.tensor_close(y:double(), masked(x:detach()), 0, 0, tostring(dt) .. ": the kept elements scaled, the rest 0")
    local g = torch.randn(9, 7):to(dt)
    y:backward(g)
    T.tensor_close(x.grad:double(), masked(g), 0, 0, tostring(dt) .. ": the gradient through the same mask")
  end
  -- p = 0.7 is 0.69921875 in bfloat16, which a bfloat16 draw hits for about
  -- 1 element in 256: kept, as rand_like(x):ge(0.7) keeps it
  local x = torch.randn(20000):bfloat16()
  local state = torch.get_rng_state()
  local y = F.dropout(x, 0.7)
  torch.set_rng_state(state)
  T.ok(torch.equal(y:ne(0), torch.rand_like(x):ge(0.7):logical_and(x:ne(0))),
       "bfloat16: the draw and p compared in bfloat16, as rand_like(x):ge(p) does")
  T.raises(function() F.dropout(torch.ones(3, { dtype = torch.int64 }), 0.5) end,
           "expected a float32, float64 or bfloat16 input, got int64", "an integer input")
  T.raises(function() torch._native_dropout(torch.ones(3), 1) end, "expected a probability p in %[0, 1%), got 1",
           "p = 1 in the C op (F.dropout gives zeros itself)")
end)
for _, red in ipairs({ "mean", "sum", "none" }) do
  check("mse_loss reduction=" .. red, function(x, y) return F.mse_loss(x, y, { reduction = red }) end, { R(2, 3), R(2, 3) })
  check("binary_cross_entropy_with_logits reduction=" .. red, function(x)
    local t = torch.tensor({ { 0, 1, 0.3 }, { 1, 0, 0.8 } }, f64)
    return F.binary_cross_entropy_with_logits(x, t, { reduction = red })
  end, { R(2, 3) })
end
check("binary_cross_entropy, smooth_l1_loss, huber_loss, kl_div, soft_margin_loss", function(x, y)
  local p = x:sigmoid()
  return F.binary_cross_entropy(p, y:sigmoid(), { weight = torch.tensor({ 1, 2, 0.5 }, f64) })
         + F.smooth_l1_loss(x, y, { beta = 0.7 }) + F.huber_loss(x, y, { delta = 0.4 })
         + F.kl_div(x:log_softmax(1), y:softmax(1), { reduction = "batchmean" }) + F.soft_margin_loss(x, y:sign())
end, { R(2, 3), R(2, 3) })
check("cosine_embedding_loss, margin_ranking_loss, hinge_embedding_loss", function(a, b)
  local y = torch.tensor({ 1, -1 }, f64)
  return F.cosine_embedding_loss(a, b, y, { margin = 0.1 }) + F.margin_ranking_loss(a[0], b[1], a[1]:sign())
         + F.hinge_embedding_loss(a, y:view(2, 1), { margin = 0.5 })
end, { R(2, 3), R(2, 3) })
check("binary_cross_entropy_with_logits with pos_weight and weight", function(x, pw)
  local t = torch.tensor({ { 0, 1, 0.3 }, { 1, 0, 0.8 } }, f64)
  return F.binary_cross_entropy_with_logits(x, t, { pos_weight = pw, weight = torch.tensor({ 1, 2, 0.5 }, f64) })
end, { R(2, 3), P(3) })
-- at 0 the stable forms' abs and relu both have a zero gradient: the
-- composite must still give softplus's 1/2
check("binary_cross_entropy_with_logits at 0", function(x)
  return F.binary_cross_entropy_with_logits(x, torch.tensor({ 0, 1, 0.3 }, f64), { reduction = "none" })
end, { torch.zeros(3, f64):requires_grad_() })
check("relu, gelu, softmax, log_softmax, silu (functional)", function(x)
  return F.relu(x) + F.gelu(x) + F.softmax(x, 1) + F.log_softmax(x, 1) + F.silu(x)
end, { R(2, 3) })

-- GELU, not ReLU: with ReLU this seed puts a pre-activation 4e-7 from the
-- kink, where PyTorch's gradcheck fails too.
-- The implicit gradient of a 0-d loss is shared between backward calls:
-- accumulating into a 0-d leaf must not change it.
T.run("the implicit gradient of a scalar stays 1", function()
  local a = torch.tensor(2.0, { dtype = torch.float64 }):requires_grad_()
  a:backward()
  a:backward()
  T.is(a.grad:item(), 2, "a 0-d leaf's own backward accumulates 1 + 1")
  a.grad:mul_(10)
  local b = torch.tensor(3.0, { dtype = torch.float64 }):requires_grad_()
  local loss = b * b
  loss:backward()
  T.is(b.grad:item(), 6, "a later loss still starts from 1 (d(b*b)/db = 2b)")
  a:backward()
  T.is(a.grad:item(), 21, "and so does the leaf's next backward")
end)

---------------------------------------------------------------- a ReLU's backward inside a Linear's

-- When a ReLU's output feeds a Linear layer and nothing else, the Linear's
-- backward applies the ReLU's mask as it writes dx and the ReLU's own
-- backward passes the gradient through; otherwise each does its own part.
local function lin(x, w, b) return torch._linear(x, w, b) end
check("linear, relu, linear (the mask in the second linear's backward)", function(x, w1, b1, w2, b2)
  return lin(lin(x, w1, b1):relu(), w2, b2)
end, { R(5, 4), R(3, 4), R(3), R(2, 3), R(2) })
check("fused linear+relu twice, then linear (the masks in the backwards after them)", function(x, w1, w2, b2, w3)
  return lin(torch._linear_act(torch._linear_act(x, w1, nil, "relu"), w2, b2, "relu"), w3)
end, { R(6, 4), R(5, 4), R(3, 5), R(3), R(2, 3) })
check("the relu's output also used elsewhere (the relu masks its own)", function(x, w1, b1, w2, b2)
  local h = lin(x, w1, b1):relu()
  return lin(h, w2, b2):sum() + h:sum() * 3   -- a gradient that is not 0 where h is
end, { R(5, 4), R(3, 4), R(3), R(2, 3), R(2) })
check("the relu's output read by two linears", function(x, w1, w2, w3)
  local h = torch._linear_act(x, w1, nil, "relu")
  return lin(h, w2):sum() * 2 + lin(h, w3):sum()
end, { R(5, 4), R(3, 4), R(2, 3), R(2, 3) })
check("a relu before a linear on 3-D input (no direct path)", function(x, w1, w2)
  return lin(lin(x, w1):relu(), w2)
end, { R(2, 3, 4), R(3, 4), R(2, 3) })

check("fused linear+gelu (erf), then linear", function(x, w1, b1, w2)
  return lin(torch._linear_act(x, w1, b1, "gelu"), w2)
end, { R(5, 4), R(3, 4), R(3), R(2, 3) })
check("fused linear+gelu (tanh form) without bias", function(x, w1)
  return torch._linear_act(x, w1, nil, "gelu_tanh")
end, { R(5, 4), R(3, 4) })

-- The fused op is the two ops in one node: the same values and gradients
-- as linear then gelu (whose values tests/lua/test_elementwise.lua compares
-- with PyTorch's, tests/ref/ops.lua), and nn.Sequential takes it for Linear then GELU.
T.run("fused linear+activation equals linear, then the activation", function()
  for _, case in ipairs({ { "gelu", "none" }, { "gelu_tanh", "tanh" }, { "relu" } }) do
    local act, approximate = case[1], case[2]
    local x, w, b = R(6, 5), R(4, 5), R(4)
    local function run(fused)
      local p = { x:detach():requires_grad_(), w:detach():requires_grad_(), b:detach():requires_grad_() }
      local y
      if fused then
        y = torch._linear_act(p[1], p[2], p[3], act)
      else
        local z = lin(p[1], p[2], p[3])
        y = act == "relu" and z:relu() or z:gelu(approximate)
      end
      y:square():sum():backward()
      return { y, p[1].grad, p[2].grad, p[3].grad }
    end
    local fused, own = run(true), run(false)
    for i = 1, 4 do
      T.ok(torch.allclose(fused[i], own[i], 1e-14, 1e-14), act .. ": value " .. i .. " matches the two ops")
    end
  end
  local x = torch.randn(3, 5, f64)
  for _, approximate in ipairs({ "none", "tanh" }) do
    local m = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.GELU(approximate)):double()
    local h = m(x)
    T.ok(torch.allclose(h, m[0](x):gelu(approximate), 1e-14, 1e-14),
         "Sequential(Linear, GELU('" .. approximate .. "')) values")
    T.is(torch._grad_fn_name(h), "GeluBackward0", "named as PyTorch names the GELU's node")
  end
  T.raises(function() torch._linear_act(x, torch.randn(4, 5, f64), nil, "tanh") end,
           { "relu", "gelu", "gelu_tanh", "tanh" }, "an unknown activation is named with the ones there are")
end)

T.run("a relu's backward is folded where it may be, and only there", function()
  local folds = torch.autograd._activation_backwards_folded
  local function count(f, ...)
    local before = folds()
    f(...):sum():backward()
    return folds() - before
  end
  local x, w1, b1, w2, w3 = R(5, 4), R(3, 4), R(3), R(2, 3), R(2, 3)
  T.is(count(function() return lin(lin(x, w1, b1):relu(), w2) end), 1, "linear, relu, linear: folded")
  T.is(count(function() return lin(torch._linear_act(torch._linear_act(x, w1, b1, "relu"), R(3, 3), nil, "relu"), w2) end), 2,
       "fused linear+relu twice, then linear: both folded")
  T.is(count(function() local h = lin(x, w1, b1):relu(); return lin(h, w2):sum() + h:sum() end), 0,
       "the relu's output also summed: not folded")
  T.is(count(function() local h = lin(x, w1):relu(); return lin(h, w2):sum() + lin(h, w3):sum() end), 0,
       "the relu's output read by two linears: not folded")
  T.is(count(function() return lin(lin(x, w1):relu() * 1, w2) end), 0, "a mul between: not folded")
  T.is(count(function() return lin(lin(R(2, 3, 4), w1):relu(), w2) end), 1, "3-D input (one node, no views): folded")
  T.is(count(function() return lin(torch._linear_act(x, w1, b1, "gelu_tanh"), w2) end), 1,
       "fused linear+gelu (tanh), then linear: folded")
  T.is(count(function() return lin(torch._linear_act(x, w1, b1, "gelu"), w2) end), 0,
       "fused linear+gelu (erf), then linear: not folded (its derivative has no epilogue)")
  T.is(count(function() local h = torch._linear_act(x, w1, b1, "gelu_tanh"); return lin(h, w2):sum() + h:sum() end),
       0, "the gelu's output also summed: not folded")
  T.is(count(function() return lin(lin(x, w1):relu():detach(), w2) end), 0, "detached: nothing to fold")
end)

T.run("a folded tanh GELU gives the gradients of its own backward, 2-D and 3-D", function()
  for _, dt in ipairs({ torch.float64, torch.float32 }) do
    for _, shape in ipairs({ { 9, 6 }, { 3, 4, 6 } }) do
      torch.manual_seed(11)
      local x = torch.randn(shape, { dtype = dt })
      local w1, b1 = torch.randn(7, 6, { dtype = dt }), torch.randn(7, { dtype = dt })
      local w2, b2 = torch.randn(3, 7, { dtype = dt }), torch.randn(3, { dtype = dt })
      local function grads(between)
        local p = {}
        for i, t in ipairs({ x, w1, b1, w2, b2 }) do p[i] = t:clone():requires_grad_() end
        local y = lin(between(torch._linear_act(p[1], p[2], p[3], "gelu_tanh")), p[4], p[5])
        y:square():sum():backward()
        return { p[1].grad, p[2].grad, p[3].grad, p[4].grad, p[5].grad }
      end
      local before = torch.autograd._activation_backwards_folded()
      local folded = grads(function(h) return h end)
      local label = string.format("%s, %d-D", dt.name, #shape)
      T.is(torch.autograd._activation_backwards_folded() - before, 1, label .. ": folded")
      local own = grads(function(h) return h * 1 end)
      for i = 1, #folded do
        T.is(folded[i]:reshape(-1):tolist(), own[i]:reshape(-1):tolist(), label .. ": gradient " .. i)
      end
    end
  end
end)

T.run("the folded mask gives the same gradients as the relu's own backward", function()
  for _, dt in ipairs({ torch.float64, torch.float32 }) do
    torch.manual_seed(7)
    local x = torch.randn(9, 6, { dtype = dt })
    local w1, b1 = torch.randn(7, 6, { dtype = dt }), torch.randn(7, { dtype = dt })
    local w2, b2 = torch.randn(3, 7, { dtype = dt }), torch.randn(3, { dtype = dt })
    local function grads(between)
      local p = {}
      for i, t in ipairs({ x, w1, b1, w2, b2 }) do p[i] = t:clone():requires_grad_() end
      local h = between(lin(p[1], p[2], p[3]):relu())
      local y = lin(h, p[4], p[5])
      y:square():sum():backward({ retain_graph = true })
      local first = p[1].grad:clone()
      y:square():sum():backward()   -- a second backward through the same graph folds again
      return { first, p[1].grad, p[2].grad, p[3].grad, p[4].grad, p[5].grad }
    end
    local folded = grads(function(h) return h end)
    local own = grads(function(h) return h * 1 end)   -- the mul node stands between: no folding
    for i = 1, #folded do
      T.is(folded[i]:reshape(-1):tolist(), own[i]:reshape(-1):tolist(), dt.name .. " gradient " .. i)
    end
    T.is(folded[2]:reshape(-1):tolist(), (folded[1] * 2):reshape(-1):tolist(),
         dt.name .. ": the second backward adds the same again")
  end
end)

T.run("a relu output changed in place after use is still refused", function()
  local x, w1, w2 = R(4, 3), R(5, 3), R(2, 5)
  local h = lin(x, w1):relu()
  local y = lin(h, w2):sum()
  torch.no_grad(function() h:mul_(2) end)
  T.raises(function() y:backward() end, "modified by an in%-place operation", "backward names the in-place change")
end)

T.run("a whole model in float64", function()
  local nn = torch.nn
  local m = nn.Sequential(nn.Conv2d(1, 2, 3, { padding = 1 }), nn.GELU(), nn.MaxPool2d(2), nn.Flatten(),
                          nn.LayerNorm(8), nn.Linear(8, 3)):double()
  local params = m:parameters()
  local x = R(2, 1, 4, 4)
  local function f(input, ...) return F.cross_entropy(m(input), I({ 0, 2 })) end
  T.ok(gradcheck(f, { x, unpack(params) }), "conv -> gelu -> pool -> flatten -> layernorm -> linear -> loss")
end)

T.done_testing()
