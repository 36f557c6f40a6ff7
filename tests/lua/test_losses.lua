-- test_losses.lua: F.binary_cross_entropy, smooth_l1_loss, huber_loss,
-- kl_div, soft_margin_loss, cosine_embedding_loss, margin_ranking_loss,
-- hinge_embedding_loss, poisson_nll_loss, gaussian_nll_loss, the triplet
-- losses, multi_margin_loss, multilabel_margin_loss,
-- multilabel_soft_margin_loss, ctc_loss (tests/ref/ctc.lua), their modules, and torch.addcmul, addcdiv and lerp
-- (functions, methods, in-place forms) against PyTorch's values and
-- gradients in float64 and float32 (tests/ref/losses.lua, written by
-- scripts/gen_loss_ref.py): every reduction and option, edge values,
-- broadcasting; float64 gradcheck; bad input.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local nn, F = torch.nn, torch.nn.functional
local ref = dofile(here .. "/../ref/losses.lua")

local MODULE = {
  binary_cross_entropy = "BCELoss", smooth_l1_loss = "SmoothL1Loss", huber_loss = "HuberLoss",
  kl_div = "KLDivLoss", soft_margin_loss = "SoftMarginLoss", cosine_embedding_loss = "CosineEmbeddingLoss",
  margin_ranking_loss = "MarginRankingLoss", hinge_embedding_loss = "HingeEmbeddingLoss",
  poisson_nll_loss = "PoissonNLLLoss", gaussian_nll_loss = "GaussianNLLLoss", triplet_margin_loss = "TripletMarginLoss",
  triplet_margin_with_distance_loss = "TripletMarginWithDistanceLoss", multi_margin_loss = "MultiMarginLoss",
  multilabel_margin_loss = "MultiLabelMarginLoss", multilabel_soft_margin_loss = "MultiLabelSoftMarginLoss",
}
-- the distance functions the generator names
local DISTANCE = { cosine = function(a, b) return 1 - F.cosine_similarity(a, b) end }
local TOL = { float64 = { 1e-12, 1e-12 }, float32 = { 2e-5, 1e-5 }, int64 = { 0, 0 } }

local function tensor(a, dtype)
  return torch.tensor(a.values, { dtype = torch[a.dtype or dtype] }):reshape(a.shape)
end

-- A case's arguments and options in dtype; with grad, the arguments the
-- case names require grad.
local function inputs(c, dtype, grad)
  local args, opts = {}, {}
  for i, a in ipairs(c.args) do args[i] = type(a) == "table" and tensor(a, dtype) or a end
  if grad then
    for _, i in ipairs(c.grad) do args[i]:requires_grad_() end
  end
  for k, v in pairs(c.opts) do opts[k] = type(v) == "table" and tensor(v, dtype) or DISTANCE[v] or v end
  return args, opts
end

-- f(args..., opts), opts left out when empty (lerp takes none).
local function call(f, args, opts)
  local n = #args
  local a = { unpack(args, 1, n) }
  if next(opts) ~= nil then a[n + 1] = opts end
  return f(unpack(a, 1, n + 1))
end

local function weights(y)
  return (torch.arange(y:numel(), { dtype = torch.float64 }) + 1):cos():to(y.dtype):reshape(y:size())
end

local function check_value(y, r, dtype, what)
  T.is(y.dtype.name, dtype, what .. ": dtype")
  T.is(T.shape(y), r.shape, what .. ": shape")
  T.values_close(y:detach():reshape(-1), r.y, TOL[dtype][1], TOL[dtype][2], what .. ": values")
end

local function fn_of(c) return F[c.fn] or torch[c.fn] end

for _, name in ipairs(T.sorted_keys(ref)) do
  local c = ref[name]
  for _, dtype in ipairs({ "float64", "float32", "int64" }) do
    local r = c[dtype]
    if r then
      T.run(name .. " " .. dtype .. " against PyTorch", function()
        local what = name .. " " .. dtype
        local args, opts = inputs(c, dtype, true)
        local y = call(fn_of(c), args, opts)
        check_value(y, r, dtype, what)
        if #c.grad > 0 then
          if y:dim() > 0 then (y * weights(y)):sum():backward() else y:backward() end
          for _, i in ipairs(c.grad) do
            T.values_close(args[i].grad:reshape(-1), r.dx[i], TOL[dtype][1], TOL[dtype][2],
                           what .. ": the gradient of argument " .. i)
          end
        end
      end)
    end
  end
end

T.run("the modules give the functions' values", function()
  for _, name in ipairs(T.sorted_keys(ref)) do
    local c = ref[name]
    if MODULE[c.fn] then
      local args, opts = inputs(c, "float64")
      local m = nn[MODULE[c.fn]](next(opts) ~= nil and opts or nil)
      T.values_close(m(unpack(args)):reshape(-1), c.float64.y, 1e-12, 1e-12, name .. ": nn." .. MODULE[c.fn])
    end
  end
end)

T.run("the tensor ops as methods and in place", function()
  for _, name in ipairs(T.sorted_keys(ref)) do
    local c = ref[name]
    if not MODULE[c.fn] then
      for _, dtype in ipairs({ "float64", "float32", "int64" }) do
        local r = c[dtype]
        if r then
          local args, opts = inputs(c, dtype)
          local x = args[1]
          local rest = { unpack(args, 2) }
          check_value(call(function(...) return x[c.fn](x, ...) end, rest, opts), r, dtype,
                      name .. " " .. dtype .. " as a method")
          if table.concat(T.shape(x), ",") == table.concat(r.shape, ",") then
            local inplace = x:clone()
            local out = call(function(...) return inplace[c.fn .. "_"](inplace, ...) end, rest, opts)
            T.ok(rawequal(out, inplace) or out:data_ptr() == inplace:data_ptr(), name .. ": " .. c.fn .. "_ returns its tensor")
            check_value(inplace, r, dtype, name .. " " .. dtype .. " in place")
          end
        end
      end
    end
  end
end)

-- Finite differences in float64 at each case's inputs, but where a
-- derivative is not one: probabilities of 0 and 1 (PyTorch's gradient is
-- a bound there), |d| at 0, and a zero row (the 1e-12 inside the
-- cosine's norms), and a var clamped to eps (its gradient passes through
-- the clamp, as PyTorch's).
local not_differentiable = { bce_edges = true, smooth_l1_beta_0_at_0 = true, cosine_embedding_zero_row = true,
                             gaussian_nll_clamped = true }
T.run("float64 gradcheck", function()
  for _, name in ipairs(T.sorted_keys(ref)) do
    local c = ref[name]
    if #c.grad > 0 and c.float64 and not not_differentiable[name] then
      local args, opts = inputs(c, "float64", true)
      local grads = {}
      for j, i in ipairs(c.grad) do grads[j] = args[i] end
      local f = function(...)
        local a = { unpack(args, 1, #args) }
        for j, i in ipairs(c.grad) do a[i] = select(j, ...) end
        return call(fn_of(c), a, opts)
      end
      local ok, why = torch.autograd.gradcheck(f, grads, { raise_exception = false })
      T.ok(ok, name .. ": gradcheck", why)
    end
  end
end)

T.run("state, printing, defaults", function()
  local w = torch.tensor({ 1, 2, 3 })
  local bce = nn.BCELoss({ weight = w })
  T.is(bce:state_dict():keys(), { "weight" }, "BCELoss's weight is a buffer, as in PyTorch")
  T.is(tostring(nn.HuberLoss()), "HuberLoss()", "HuberLoss prints as PyTorch's")
  T.is(nn.SmoothL1Loss().beta, 1, "SmoothL1Loss: beta = 1 by default")
  T.is(nn.HuberLoss().delta, 1, "HuberLoss: delta = 1 by default")
  T.is(nn.KLDivLoss().reduction, "mean", "KLDivLoss: reduction = mean by default")
  T.is(nn.KLDivLoss("batchmean").reduction, "batchmean", "KLDivLoss takes batchmean")
  T.is(nn.HingeEmbeddingLoss().margin, 1, "HingeEmbeddingLoss: margin = 1 by default")
  T.is(nn.CosineEmbeddingLoss().margin, 0, "CosineEmbeddingLoss: margin = 0 by default")
  T.is(nn.MultiMarginLoss({ weight = w }):state_dict():keys(), { "weight" }, "MultiMarginLoss's weight is a buffer")
  local tm = nn.TripletMarginLoss({ swap = true })
  T.is({ tm.margin, tm.p, tm.eps, tm.swap }, { 1, 2, 1e-6, true }, "TripletMarginLoss: PyTorch's defaults")
  T.is({ nn.PoissonNLLLoss().log_input, nn.PoissonNLLLoss().eps }, { true, 1e-8 }, "PoissonNLLLoss: defaults")
  T.is(tostring(nn.MultiLabelMarginLoss()), "MultiLabelMarginLoss()", "MultiLabelMarginLoss prints as PyTorch's")
  local x, t = torch.tensor({ 0.2, 0.9, 0.5 }), torch.tensor({ 0.0, 1.0, 0.5 })
  T.is(F.binary_cross_entropy(x, t, "sum"):item(), F.binary_cross_entropy(x, t, { reduction = "sum" }):item(),
       "a reduction string stands for {reduction=}")
  T.is(torch.addcmul(x, x, t, 2):tolist(), torch.addcmul(x, x, t, { value = 2 }):tolist(),
       "addcmul: a number stands for {value=}")
  -- a broadcast target warns (on stderr) and computes
  T.lives(function() F.smooth_l1_loss(torch.zeros(2, 3), torch.zeros(3)) end, "smooth_l1_loss broadcasts a target")
end)

T.run("in place under no_grad and on tensors without grad", function()
  local x = torch.tensor({ 1.0, 2.0 }):requires_grad_()
  torch.no_grad(function() x:lerp_(torch.tensor({ 3.0, 6.0 }), 0.5) end)
  T.is(x:detach():tolist(), { 2, 4 }, "lerp_ of a leaf requiring grad under no_grad")
  local e = torch.zeros(2)
  e:addcmul_(torch.tensor({ 1.0, 2.0 }), torch.tensor({ 3.0, 4.0 }), { value = 0.5 })
  T.is(e:tolist(), { 1.5, 4 }, "addcmul_ into a plain tensor")
end)

-- CTC against PyTorch (tests/ref/ctc.lua, scripts/gen_ctc_ref.py): the
-- loss of log_softmax(logits) and the logits' gradient
local ctc = dofile(here .. "/../ref/ctc.lua")
for _, name in ipairs(T.sorted_keys(ctc)) do
  T.run("ctc_loss " .. name .. " against PyTorch", function()
    local c = ctc[name]
    local logits = T.filled(torch, c.shape, function(k) return math.sin(1 + 0.37 * k) * 3 end):requires_grad_()
    local targets = torch.tensor(c.targets, { dtype = torch.int64 })
    local loss = F.ctc_loss(logits:log_softmax(-1), targets, c.input_lengths, c.target_lengths, c.opts)
    T.values_close(loss:detach():reshape(-1):tolist(), c.loss, 1e-10, 1e-12, name .. ": loss")
    local wt = torch.arange(0, loss:numel(), { dtype = torch.float64 }):cos():reshape(loss:size())
    ;(loss * wt):sum():backward()
    T.values_close(logits.grad:reshape(-1):tolist(), c.dlogits, 1e-9, 1e-12, name .. ": the logits' gradient")
    -- the module, with lengths as tensors
    local m = nn.CTCLoss(c.opts)
    local l2 = m(logits:detach():log_softmax(-1), targets, torch.tensor(c.input_lengths, { dtype = torch.int64 }),
                 torch.tensor(c.target_lengths, { dtype = torch.int64 }))
    T.values_close(l2:reshape(-1):tolist(), c.loss, 1e-10, 1e-12, name .. ": nn.CTCLoss")
  end)
end

T.run("ctc_loss: an impossible alignment, float32, gradcheck, errors", function()
  local lp = torch.randn(3, 1, 4, { dtype = torch.float64 }):log_softmax(2)
  local t = torch.tensor({ { 1, 1 } }, { dtype = torch.int64 })
  local fits = F.ctc_loss(lp, t, { 3 }, { 2 }, "none"):item()
  T.close(fits, -(lp[{ 0, 0, 1 }] + lp[{ 1, 0, 0 }] + lp[{ 2, 0, 1 }]):item(), 1e-12, 0,
          "three frames fit 1, blank, 1 in one way only")
  T.ok(F.ctc_loss(lp, t, { 2 }, { 2 }, "none"):item() == math.huge, "two frames do not: inf, as PyTorch")
  local lp32 = torch.randn(5, 2, 3):log_softmax(2)
  local tt = torch.tensor({ { 1, 2 }, { 2, 0 } }, { dtype = torch.int64 })
  T.close(F.ctc_loss(lp32, tt, { 5, 4 }, { 2, 1 }):item(),
          F.ctc_loss(lp32:double(), tt, { 5, 4 }, { 2, 1 }):item(), 1e-5, 0, "float32 against float64")
  local x = torch.randn(5, 2, 3, { dtype = torch.float64 }):requires_grad_()
  T.ok(torch.autograd.gradcheck(function(a) return F.ctc_loss(a, tt, { 5, 4 }, { 2, 1 }) end, { x }),
       "gradcheck with respect to log_probs")
  T.raises(function() F.ctc_loss(lp32, tt, { 5 }, { 2, 1 }) end, "expected input_lengths to hold 2 lengths", "lengths")
  T.raises(function() F.ctc_loss(lp32, tt, { 6, 4 }, { 2, 1 }) end, "input length 6 of sequence 0 is not within %[0, 5%]",
           "an input longer than log_probs")
  T.raises(function() F.ctc_loss(lp32, tt, { 5, 4 }, { 2, 2 }) end, "not a class in %[0, 3%) other than blank 0",
           "a blank in the targets")
  T.raises(function() F.ctc_loss(lp32, tt:double(), { 5, 4 }, { 2, 1 }) end, "expected integer targets", "float targets")
  T.raises(function() F.ctc_loss(lp32, tt, { 5, 4 }, { 2, 1 }, { blank = 3 }) end, "blank 3 is not a class index",
           "blank out of range")
  T.raises(function() F.ctc_loss(lp32, torch.tensor({ 1 }, { dtype = torch.int64 }), { 5, 4 }, { 1, 1 }) end,
           "targets hold fewer labels than target_lengths", "too few concatenated targets")
end)

T.run("bad input", function()
  local p, q = torch.tensor({ 0.2, 0.7 }), torch.tensor({ 1.0, 0.0 })
  T.raises(function() F.binary_cross_entropy(torch.tensor({ 1.2, 0.5 }), q) end,
           "binary_cross_entropy: all elements of input should be between 0 and 1", "BCE: an input above 1")
  T.raises(function() F.binary_cross_entropy(torch.tensor({ -0.1, 0.5 }), q) end,
           "input should be between 0 and 1", "BCE: an input below 0")
  T.raises(function() F.binary_cross_entropy(torch.tensor({ 0 / 0, 0.5 }), q) end,
           "input should be between 0 and 1", "BCE: a NaN input")
  T.raises(function() F.binary_cross_entropy(p, torch.tensor({ 1.5, 0 })) end,
           "binary_cross_entropy: all elements of target should be between 0 and 1", "BCE: a target above 1")
  T.raises(function() F.binary_cross_entropy(p, torch.tensor({ 1.0 })) end,
           { "binary_cross_entropy", "target size %(%[1%]%)", "input size %(%[2%]%)" }, "BCE: shapes differ")
  T.raises(function() F.binary_cross_entropy(p, q:double()) end, { "binary_cross_entropy", "float32", "float64" },
           "BCE: target of another dtype")
  T.raises(function() F.binary_cross_entropy(p, q, { weight = torch.ones(3) }) end,
           { "weight of shape %[3%]", "input's shape %[2%]" }, "BCE: a weight that does not broadcast")
  T.raises(function() F.binary_cross_entropy(p, q, { weight = torch.ones(2, 1) }) end,
           "weight of shape %[2, 1%]", "BCE: a weight that would grow the loss")
  T.raises(function() F.binary_cross_entropy(p, q, "average") end,
           'binary_cross_entropy: reduction must be "none", "mean" or "sum", got average', "BCE: a bad reduction")
  T.raises(function() F.binary_cross_entropy(p, q, { weights = p }) end, "binary_cross_entropy: unknown option 'weights'",
           "BCE: a misspelt option")
  T.raises(function() F.binary_cross_entropy(torch.tensor({ 0, 1 }, { dtype = torch.int64 }), q) end,
           "expected input to be a floating point tensor", "BCE: integer input")
  T.raises(function() nn.BCELoss("bad") end, "BCELoss: reduction must be", "BCELoss: a bad reduction")

  local a, b = torch.randn(2, 3), torch.randn(2, 3)
  T.raises(function() F.smooth_l1_loss(a, b, { beta = -1 }) end, "smooth_l1_loss: beta must be non%-negative, got %-1",
           "smooth_l1_loss: a negative beta")
  T.raises(function() F.smooth_l1_loss(a, b, { beta = "1" }) end, "smooth_l1_loss: expected beta to be a number",
           "smooth_l1_loss: a beta that is not a number")
  T.raises(function() F.smooth_l1_loss(a, torch.randn(4)) end,
           "smooth_l1_loss: target of shape %[4%] does not broadcast with input of shape %[2, 3%]",
           "smooth_l1_loss: shapes that do not broadcast")
  T.raises(function() F.smooth_l1_loss(a, b, { delta = 1 }) end, "smooth_l1_loss: unknown option 'delta'",
           "smooth_l1_loss: huber's option")
  T.raises(function() nn.SmoothL1Loss({ beta = -0.5 }) end, "SmoothL1Loss: beta must be non%-negative",
           "SmoothL1Loss: a negative beta")
  T.raises(function() F.huber_loss(a, b, { delta = 0 }) end, "huber_loss: delta must be positive, got 0",
           "huber_loss: delta 0")
  T.raises(function() nn.HuberLoss({ delta = -1 }) end, "HuberLoss: delta must be positive", "HuberLoss: a negative delta")
  T.raises(function() F.huber_loss(a, b, "avg") end, "huber_loss: reduction must be", "huber_loss: a bad reduction")
  T.raises(function() F.mse_loss(a, torch.randn(4)) end, "mse_loss: target of shape %[4%] does not broadcast",
           "mse_loss: shapes that do not broadcast")

  T.raises(function() F.kl_div(a, b, { reduction = "batch" }) end,
           'kl_div: reduction must be "none", "mean", "sum" or "batchmean", got batch', "kl_div: a bad reduction")
  T.raises(function() nn.KLDivLoss("batch") end, 'KLDivLoss: reduction must be "none", "mean", "sum" or "batchmean"',
           "KLDivLoss: a bad reduction")
  T.raises(function() F.kl_div(a, b, { log_target = 1 }) end, "kl_div: expected log_target to be a boolean",
           "kl_div: log_target not a boolean")
  T.raises(function() F.kl_div(a, b:long()) end, "kl_div: expected target to be a floating point tensor",
           "kl_div: an integer target")

  T.raises(function() F.soft_margin_loss(torch.randn(3, 1), torch.ones(2)) end,
           "soft_margin_loss: target of shape %[2%] does not broadcast to the input's shape %[3, 1%]",
           "soft_margin_loss: a target that would grow the loss")

  local y = torch.tensor({ 1, -1 })
  T.raises(function() F.cosine_embedding_loss(a, b, torch.ones(2, 1)) end,
           "cosine_embedding_loss: expected a 0%-d or 1%-D target, got shape %[2, 1%]", "cosine: a 2-D target")
  T.raises(function() F.cosine_embedding_loss(a, torch.randn(3), y) end,
           { "cosine_embedding_loss", "1%-D target expects 2%-D", "input2 %[3%]" }, "cosine: inputs of the wrong dims")
  T.raises(function() F.cosine_embedding_loss(torch.randn(3), torch.randn(3), y) end,
           "a 1%-D target expects 2%-D", "cosine: a 1-D target for one pair")
  T.raises(function() F.cosine_embedding_loss(a, b, torch.ones(3)) end,
           { "cosine_embedding_loss", "target of shape %[3%]", "2 pairs" }, "cosine: a target of another length")
  T.raises(function() F.cosine_embedding_loss(a, b, y, { margin = "0" }) end,
           "cosine_embedding_loss: expected margin to be a number", "cosine: a margin that is not a number")
  T.raises(function() F.margin_ranking_loss(torch.randn(3), torch.randn(3), torch.ones(3, 1)) end,
           { "margin_ranking_loss", "one number of dims", "%[3%], %[3%] and %[3, 1%]" },
           "margin_ranking_loss: a target of other dims")
  T.raises(function() nn.MarginRankingLoss({ margin = "x" }) end, "MarginRankingLoss: expected margin to be a number",
           "MarginRankingLoss: a margin that is not a number")
  T.raises(function() F.hinge_embedding_loss(torch.randn(3), torch.ones(3), { reduction = "x" }) end,
           "hinge_embedding_loss: reduction must be", "hinge_embedding_loss: a bad reduction")
  T.raises(function() F.hinge_embedding_loss(3, torch.ones(3)) end,
           "hinge_embedding_loss: expected input to be a tensor, got number", "hinge_embedding_loss: a number input")

  local i1, i2 = torch.tensor({ 1, 2 }, { dtype = torch.int64 }), torch.tensor({ 3, 4 }, { dtype = torch.int64 })
  T.raises(function() torch.addcdiv(i1, i1, i2) end, { "addcdiv: integer division is not supported", "int64" },
           "addcdiv of integer tensors")
  T.raises(function() torch.addcmul(i1, i1, i2, { value = 0.5 }) end,
           "addcmul: for integer tensors, value must be an integer, got 0.5", "addcmul: a fractional value for integers")
  T.raises(function() torch.addcmul(a, a, b, { alpha = 2 }) end, "addcmul: unknown option 'alpha'",
           "addcmul: an unknown option")
  T.raises(function() torch.addcmul(a, a, b, "2") end, "addcmul: expected value to be a number", "addcmul: a string value")
  T.raises(function() torch.addcmul(a, a) end, "addcmul: expected tensor2 to be a tensor, got nil",
           "addcmul: a missing tensor")
  T.raises(function() torch.addcmul(a, a, torch.randn(4)) end,
           "addcmul: shape %[2, 3%] does not broadcast with %[4%]", "addcmul: shapes that do not broadcast, named")
  T.raises(function() torch.randn(3):addcmul_(torch.randn(2, 1), torch.randn(3)) end,
           "addcmul_: output with shape %[3%] doesn't match the broadcast shape %[2, 3%]", "addcmul_ may not grow its tensor")
  T.raises(function() i1:clone():addcdiv_(torch.ones(2), torch.ones(2)) end,
           "addcdiv_: result type float32 can't be cast to the desired output type int64", "addcdiv_ into integers")
  local leaf = torch.randn(2):requires_grad_()
  T.raises(function() leaf:addcmul_(torch.ones(2), torch.ones(2)) end,
           "addcmul_: a tensor that requires grad is being used in an in%-place operation", "addcmul_ on a leaf requiring grad")
  T.raises(function() leaf:addcdiv_(torch.ones(2), torch.ones(2)) end, "addcdiv_: a tensor that requires grad",
           "addcdiv_ on a leaf requiring grad")
  T.raises(function() leaf:lerp_(torch.ones(2), 0.5) end, "lerp_: a tensor that requires grad", "lerp_ on a leaf requiring grad")
  T.raises(function() torch.lerp(i1, i2, 0.5) end, "lerp: expected floating point tensors, got int64", "lerp of integers")
  T.raises(function() torch.lerp(a, b:double(), 0.5) end, "lerp: expected end of the input's dtype float32, got float64",
           "lerp: end of another dtype")
  T.raises(function() torch.lerp(a, b, b:double()) end, "lerp: expected weight of the input's dtype float32, got float64",
           "lerp: weight of another dtype")
  T.raises(function() torch.lerp(a, b, "0.5") end, "lerp: expected weight to be a number or a tensor, got string",
           "lerp: a string weight")
  T.raises(function() torch.lerp(a, torch.randn(4), 0.5) end, "lerp: shape", "lerp: shapes that do not broadcast, named")
  T.raises(function() torch.randn(3):lerp_(torch.randn(2, 3), 0.5) end,
           "lerp_: output with shape %[3%] doesn't match the broadcast shape %[2, 3%]", "lerp_ may not grow its tensor")
  T.raises(function() torch.lerp(3, a, 0.5) end, "lerp: expected a tensor as the first argument, got number",
           "torch.lerp of a number")
  local x, t = torch.randn(3, 4), torch.tensor({ 0, 1, 3 }, { dtype = torch.int64 })
  T.raises(function() F.multi_margin_loss(x, t:double()) end, "multi_margin_loss: expected an int64 target, got float64",
           "multi_margin_loss: a float target")
  T.raises(function() F.multi_margin_loss(x, t, { p = 3 }) end, "only p = 1 and p = 2", "multi_margin_loss: p = 3")
  T.raises(function() F.multi_margin_loss(x, t:narrow(0, 0, 2)) end, "expected input %(N, C%) with target %(N%)",
           "multi_margin_loss: rows and targets differ")
  T.raises(function() F.multi_margin_loss(x, torch.tensor({ 0, 4, 1 }, { dtype = torch.int64 })) end,
           "index 4 is out of bounds", "multi_margin_loss: a class out of range")
  T.raises(function() F.multi_margin_loss(x, t, { weight = torch.ones(3) }) end,
           "expected weight to be a tensor of 4 entries", "multi_margin_loss: a weight of the wrong size")
  T.raises(function() nn.MultiMarginLoss({ margn = 1 }) end, "MultiMarginLoss: unknown option 'margn'", "misspelt option")
  T.raises(function() F.multilabel_margin_loss(x, torch.zeros(3, 4, { dtype = torch.int64 }):fill_(4)) end,
           "target values must be %-1 or class indices in %[0, 4%)", "multilabel_margin_loss: a class out of range")
  T.raises(function() F.multilabel_margin_loss(x, t) end, "a target of its shape", "multilabel_margin_loss: target shape")
  T.raises(function() F.gaussian_nll_loss(x, x, torch.ones(4)) end,
           "var of shape %[4%] does not fit the input's %[3, 4%]", "gaussian_nll_loss: var's shape")
  T.raises(function() F.gaussian_nll_loss(x, x, -torch.ones(3, 4)) end, "var has negative entries",
           "gaussian_nll_loss: negative var")
  T.raises(function() F.triplet_margin_loss(x, x, torch.randn(4)) end,
           "expected anchor, positive and negative of one number of dims, got %[3, 4%], %[3, 4%] and %[4%]",
           "triplet_margin_loss: dims")
  T.raises(function() F.triplet_margin_with_distance_loss(x, x, x, { margin = 0 }) end,
           "expected margin to be greater than 0, got 0", "triplet_margin_with_distance_loss: margin 0")
  T.raises(function() F.triplet_margin_with_distance_loss(x, x, x, { distance_function = "l2" }) end,
           "expected distance_function to be a function, got string", "triplet_margin_with_distance_loss: a string")
end)

T.run("AdaptiveLogSoftmaxWithLoss against PyTorch", function()
  local asm_ref = dofile(here .. "/../ref/asm.lua")
  for _, name in ipairs({ "plain", "head_bias" }) do
    local r = asm_ref[name]
    local m = nn.AdaptiveLogSoftmaxWithLoss(8, 20, { 5, 12 }, { div_value = 2.0, head_bias = name == "head_bias",
                                                                dtype = torch.float64 })
    local names = {}
    for k, pair in ipairs(m:named_parameters()) do
      names[k] = pair[1]
      torch.no_grad(function()
        pair[2]:copy_(T.filled(torch, T.shape(pair[2]), function(j) return 0.3 * math.sin(1 + 0.7 * j + (k - 1)) end))
      end)
    end
    T.is(names, r.names, name .. ": PyTorch's parameter names, in its order")
    local x = T.filled(torch, { 6, 8 }, function(j) return math.cos(0.4 * j) end):requires_grad_()
    local target = torch.tensor({ 0, 4, 5, 11, 12, 19 }, { dtype = torch.int64 })
    local output, loss = m(x, target)
    T.values_close(output:tolist(), r.output, 1e-12, 1e-12, name .. ": output")
    T.close(loss:item(), r.loss, 1e-12, 1e-12, name .. ": loss")
    loss:backward()
    T.values_close(x.grad:reshape(-1):tolist(), r.dx, 1e-12, 1e-12, name .. ": input gradient")
    for _, pair in ipairs(m:named_parameters()) do
      T.values_close(pair[2].grad:reshape(-1):tolist(), r["d_" .. pair[1]:gsub("%.", "_")], 1e-12, 1e-12,
                     name .. ": the gradient of " .. pair[1])
    end
    T.values_close(m:log_prob(x):reshape(-1):tolist(), r.log_prob, 1e-12, 1e-12, name .. ": log_prob")
    T.is(m:predict(x):tolist(), r.predict, name .. ": predict")
  end
  local m = nn.AdaptiveLogSoftmaxWithLoss(4, 10, { 3 })
  T.raises(function() m(torch.randn(2, 4), torch.tensor({ 1, 10 }, { dtype = torch.int64 })) end,
           "Target values should be in %[0, 9%]", "a target out of range")
  T.raises(function() nn.AdaptiveLogSoftmaxWithLoss(4, 10, { 3, 3 }) end, "cutoffs should be a sequence of unique",
           "repeated cutoffs")
  T.raises(function() m(torch.randn(2, 5), torch.tensor({ 1, 2 }, { dtype = torch.int64 })) end,
           "expected input of 4 features, got 5", "input features")
end)

T.done_testing()
