-- test_composite.lua: the operations of lua/dplua/composite.lua and
-- torch.einsum against PyTorch's answers (the "composite" group of
-- tests/ref/ops.lua, written by scripts/gen_reference.py); their
-- gradients by finite differences; random fills; bad input.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
torch.manual_seed(0)   -- random inputs, the same in every run

T.run_ref(torch, "composite")

local function f64(...) return torch.randn({ ... }, { dtype = torch.float64 }):requires_grad_() end
local function gradcheck(name, f, inputs)
  local ok, why = torch.autograd.gradcheck(f, inputs, { raise_exception = false })
  T.ok(ok, name .. ": gradcheck", why)
end

T.run("gradients by finite differences", function()
  local x, y = f64(3, 4), f64(3, 4)
  gradcheck("logsumexp", function(a) return a:logsumexp({ 0, 1 }) end, { x })
  gradcheck("logaddexp", function(a, b) return a:logaddexp(b) end, { x, y })
  gradcheck("flip, roll, rot90", function(a) return a:flip(1):roll(2, 0):rot90() * a:t() end, { f64(4, 4) })
  gradcheck("repeat and tile", function(a) return a["repeat"](a, 2, 1):tile({ 1, 2, 1 }) end, { x })
  gradcheck("repeat_interleave", function(a) return a:repeat_interleave(torch.tensor({ 2, 0, 1 }, { dtype = torch.int64 }), 0) end,
            { x })
  gradcheck("diagonal and diag", function(a) return a:diagonal(1):diag(1) end, { x })
  gradcheck("addmm", function(a, b, c) return a:addmm(b, c, { beta = 0.5, alpha = 2 }) end, { x, f64(3, 2), f64(2, 4) })
  gradcheck("tensordot", function(a, b) return a:tensordot(b, { { 1 }, { 0 } }) end, { x, f64(4, 2) })
  gradcheck("cumprod", function(a) return a:cumprod(1) end, { x })
  gradcheck("quantile", function(a) return a:quantile({ 0.2, 0.9 }, 1) end, { x })
  gradcheck("asin, acos, atanh", function(a) return a:asin() + a:acos() * a:atanh() end,
            { (torch.rand(5, { dtype = torch.float64 }) * 1.6 - 0.8):requires_grad_() })
  gradcheck("asinh, sinh, cosh, tan", function(a) return a:asinh() + a:sinh() * a:cosh() + a:tan() end, { f64(5) })
  gradcheck("cdist", function(a, b) return torch.cdist(a, b) end, { x, f64(2, 4) })
  gradcheck("erf (a native op)", function(a) return a:erf() end, { x })
  gradcheck("block_diag", function(a, b) return torch.block_diag(a, b) end, { x, f64(2) })
  gradcheck("einsum bilinear", function(a, b, c) return torch.einsum("bn,anm,bm->ba", a, b, c) end,
            { f64(2, 3), f64(4, 3, 5), f64(2, 5) })
  gradcheck("einsum diagonal", function(a) return torch.einsum("iij->ji", a) end, { f64(3, 3, 2) })
  gradcheck("cummax, logcumsumexp", function(a) return a:cummax(1) + a:logcumsumexp(1) end, { x })
  gradcheck("cross and kron", function(a, b) return a:cross(b, 1):kron(a) end, { f64(2, 3), f64(2, 3) })
  gradcheck("diag_embed", function(a) return a:diag_embed(1) end, { x })
  gradcheck("take_along_dim", function(a) return a:take_along_dim(torch.tensor({ { 0 }, { 3 }, { 1 } }, { dtype = torch.int64 }), 1) end,
            { x })
  gradcheck("diff and trapezoid", function(a, b) return a:diff(2, 1):sum(1) + torch.trapezoid(a, b:exp():cumsum(0)) end,
            { x, f64(4) })
  gradcheck("float_power and vander", function(a) return a:abs():float_power(1.5):sum() + torch.vander(a:reshape(-1), 3):sum() end,
            { x })
  gradcheck("fmod and heaviside", function(a) return a:fmod(0.7) * a:heaviside(torch.ones(1, { dtype = torch.float64 })) end, { x })
  local mean, std = f64(3), (torch.rand(3, { dtype = torch.float64 }) + 0.5):requires_grad_()
  local z = torch.normal(mean, std)
  z:sum():backward()
  T.tensor_close(mean.grad, torch.ones(3, { dtype = torch.float64 }), 0, 0, "normal: the gradient of mean is 1")
  T.tensor_close(std.grad, (z - mean) / std, 1e-12, 1e-12, "normal: the gradient of std is the draw of N(0, 1)")
end)

T.run("random fills", function()
  local t = torch.empty(1000, { dtype = torch.float64 })
  t:uniform_(-2, 3)
  T.ok(t:min():item() >= -2 and t:max():item() < 3, "uniform_ stays in [from, to)")
  T.close(t:mean():item(), 0.5, 0, 0.2, "uniform_'s mean")
  t:normal_(4, 0.5)
  T.close(t:mean():item(), 4, 0, 0.1, "normal_'s mean")
  T.close(t:std():item(), 0.5, 0, 0.1, "normal_'s std")
  local p = torch.full({ 2000 }, 0.25)
  local b = p:bernoulli()
  T.ok(b:eq(0):logical_or(b:eq(1)):all():item(), "bernoulli draws 0 and 1")
  T.close(b:mean():item(), 0.25, 0, 0.05, "bernoulli's frequency")
  torch.manual_seed(3)
  local u1 = torch.empty(5):uniform_()
  torch.manual_seed(3)
  T.tensor_close(u1, torch.rand(5), 0, 0, "uniform_ draws torch.rand's numbers")
  local leaf = torch.zeros(3):requires_grad_()
  T.raises(function() leaf:uniform_() end, "requires grad", "uniform_ of a leaf that requires grad")
  torch.no_grad(function() leaf:normal_() end)
  T.ok(leaf:abs():sum():item() > 0, "normal_ under no_grad")
end)

T.run("bad input names the problem", function()
  local x = torch.randn(3, 4)
  T.raises(function() x:diff(-1) end, "diff: expected n to be an integer >= 0, got %-1", "a negative n")
  T.raises(function() torch.zeros({}):diff() end, "expected at least a 1%-dimensional tensor", "diff of a 0-d tensor")
  T.raises(function() x:fmod("a") end, "fmod: expected other to be a tensor or a number", "fmod of a string")
  T.raises(function() torch.normal(0, 1) end, "with a number mean and std, expected a size", "normal without a size")
  T.raises(function() torch.normal(x, -1) end, "expected std >= 0", "a negative std")
  T.raises(function() torch.combinations(x) end, "combinations: expected a 1%-D tensor, got 2 dims", "combinations of a matrix")
  T.raises(function() torch.vander(x) end, "vander: expected a 1%-D tensor", "vander of a matrix")
  T.raises(function() torch.histogram(x, torch.ones(1)) end, "at least 2 edges", "one edge")
  T.raises(function() torch.histogram(x, 3, { range = { 1, 0 } }) end, "expected range with min <= max", "a reversed range")
  T.raises(function() x:mode(2) end, "mode: dim 2 is out of range", "mode's dim")
  T.raises(function() torch.set_printoptions({ precison = 2 }) end, "unknown option 'precison'", "a misspelt print option")
  T.raises(function() torch.set_printoptions({ profile = "long" }) end, 'expected profile "default", "short" or "full"',
           "an unknown profile")
  T.is(torch.as_tensor(x), x, "as_tensor of a tensor is the tensor")
  T.is(torch.as_tensor({ 1, 2 }, { dtype = torch.int64 }).dtype, torch.int64, "as_tensor of a list")
  T.is(T.shape(torch.combinations(torch.arange(3), 4)), { 0, 4 }, "more than there are: no combinations")
  T.raises(function() torch.einsum("ij,jk", x) end, "the equation names 2 operands but 1 were given", "operand count")
  T.raises(function() torch.einsum("ijk", x) end, "operand 0 has 2 dims but its term names 3", "term length")
  T.raises(function() torch.einsum("ij,jk", x, torch.randn(5, 2)) end, "label 'j' has size 5 in operand 1 but 4",
           "sizes differ")
  T.raises(function() torch.einsum("ij->k", x) end, "output label 'k' names no operand's dim", "an unknown output")
  T.raises(function() torch.einsum("ij->ii", x) end, "output label 'i' appears twice", "a repeated output label")
  T.raises(function() torch.einsum("i-j", x) end, "expected letters and '...'", "a stray character")
  T.raises(function() torch.einsum(x, x) end, "expected the equation as the first argument", "no equation")
  T.raises(function() x:logsumexp() end, "expected dim", "logsumexp without a dim")
  T.raises(function() x:flip(2) end, "dim 2 is out of range", "flip's dim")
  T.raises(function() x:roll({ 1, 2 }, 0) end, "expected as many shifts as dims", "roll's shifts")
  T.raises(function() x["repeat"](x, 2) end, "expected at least as many sizes as dims %(2%)", "repeat with too few sizes")
  T.raises(function() x:diagonal(0, 1, 1) end, "two different dims", "diagonal of one dim")
  T.raises(function() torch.randn(2, 3, 4):trace() end, "trace: expected a matrix", "trace of a 3-D tensor")
  T.raises(function() x:tensordot(torch.randn(5, 2), 1) end, "contracted dims differ in size", "tensordot sizes")
  T.raises(function() x:quantile(1.5) end, "expected q in %[0, 1%]", "quantile out of range")
  T.raises(function() torch.arange(4):log2() end, "expected a floating point tensor, got int64", "log2 of integers")
  T.raises(function() torch.broadcast_shapes({ 2, 3 }, { 4 }) end, "do not broadcast", "broadcast_shapes")
  T.raises(function() x:masked_select(x) end, "expected a bool mask", "masked_select of a float mask")
  T.raises(function() x:kthvalue(5, 1) end, "expected k in %[1, 4%]", "kthvalue's k")
  T.raises(function() torch.randn(2, 4):cross(torch.randn(2, 4)) end, "no dim of size 3", "cross without a dim of 3")
  T.raises(function() x:bitwise_and(x) end, "expected integer or bool tensors", "bitwise of floats")
  T.raises(function() torch.tensor({ 1, -2 }, { dtype = torch.int64 }):bincount() end, "expected non%-negative values",
           "bincount of a negative value")
  T.raises(function() x:bincount() end, "expected a 1%-D tensor of non%-negative integers", "bincount of floats")
  T.raises(function() x:histc(4, 2, 1) end, "max must be larger than min", "histc's range")
  T.raises(function() x:repeat_interleave(torch.tensor({ 1, 2 }, { dtype = torch.int64 }), 0) end,
           "expected one count or 3 counts", "repeat_interleave counts")
end)

T.done_testing()
