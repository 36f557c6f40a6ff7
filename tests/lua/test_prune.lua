-- test_prune.lua: nn.utils.prune: the masks of l1_unstructured,
-- ln_structured (iterated, combined as PyTorch's PruningContainer),
-- importance scores, Python's rounding of fractions and
-- global_unstructured against PyTorch (tests/ref/prune.lua from
-- scripts/gen_prune_ref.py), the output and gradients of a pruned module,
-- remove; the random methods by their counts; a method of one's own;
-- state dict keys; errors.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local nn = torch.nn
local prune = nn.utils.prune
local ref = dofile(here .. "/../ref/prune.lua")
local f64 = { dtype = torch.float64 }

-- the generator's module and input
local function built(make, xshape) return T.fixed_module(torch, make, xshape) end
local function flat(t) return t:detach():reshape(-1):tolist() end
local function linear(i, o) return function(opts) return nn.Linear(i, o, opts) end end
local function conv(opts) return nn.Conv2d(2, 4, 3, opts) end

T.run("iterative pruning against PyTorch", function()
  local r = ref.iterative
  local m, x = built(linear(4, 6), { 2, 4 })
  local w = m.weight
  T.is(prune.l1_unstructured(m, "weight", 0.3), m, "returns the module")
  T.is(flat(m.weight_mask), r.mask1, "l1_unstructured(0.3): 7 of 24 smallest magnitudes")
  T.is(m.weight_orig, w, "the Parameter moved to weight_orig")
  T.is(T.sorted_keys(m:state_dict()), { "bias", "weight_mask", "weight_orig" }, "PyTorch's state dict keys")
  T.ok(not nn.is_parameter(m.weight), "weight is a computed tensor")
  T.is(#m:parameters(), 2, "weight_orig and bias")
  prune.l1_unstructured(m, "weight", { amount = 3 })
  T.is(flat(m.weight_mask), r.mask2, "then 3 more of what is left")
  prune.ln_structured(m, "weight", 0.34, 2, 0)
  T.is(flat(m.weight_mask), r.mask3, "then 2 rows of the smallest 2-norm")
  local y = m(x)
  T.output_and_grad(torch, y, x, r, 1e-12, "pruned: ")
  T.values_close(flat(m.weight_orig.grad), r.d_weight_orig, 1e-12, 1e-12, "weight_orig's gradient: masked")
  torch.no_grad(function() m.weight_orig:add_(1) end)
  m(x)
  T.tensor_close(m.weight, m.weight_orig * m.weight_mask, 0, 0, "the forward pre-hook recomputes the weight")
  torch.no_grad(function() m.weight_orig:sub_(1) end)
  T.ok(prune.is_pruned(nn.Sequential(nn.ReLU(), m)), "is_pruned sees a pruned module inside")
  T.is(prune.remove(m, "weight"), m, "remove returns the module")
  T.values_close(flat(m.weight), r.weight_removed, 1e-15, 1e-15, "remove: the pruned values, for good")
  T.is(m.weight, w, "in the same Parameter")
  T.is(T.sorted_keys(m:state_dict()), { "bias", "weight" }, "a plain Linear again")
  T.ok(not prune.is_pruned(m), "not pruned")
end)

T.run("ln_structured of a convolution against PyTorch", function()
  local m = built(conv, { 1, 2, 3, 3 })
  prune.ln_structured(m, "weight", 1, 1, 1)
  T.is(flat(m.weight_mask), ref.conv.mask1, "one input channel of the smallest 1-norm")
  prune.ln_structured(m, "weight", { amount = 0.5, n = math.huge, dim = 0 })
  T.is(flat(m.weight_mask), ref.conv.mask2, "then half the output channels by the max norm")
end)

T.run("fractions round half to even, importance scores rank in the tensor's place", function()
  for _, amount in ipairs({ 0.25, 0.35 }) do
    local m = built(linear(5, 2), { 1, 5 })
    prune.l1_unstructured(m, "weight", amount)
    T.is(flat(m.weight_mask), ref.rounding["mask_" .. math.floor(amount * 100 + 0.5)], "amount " .. amount)
  end
  local m = built(linear(4, 6), { 1, 4 })
  local scores = T.filled(torch, { 6, 4 }, function(k) return math.cos(0.9 * k) end)
  prune.l1_unstructured(m, "weight", 5, scores)
  T.is(flat(m.weight_mask), ref.importance.mask, "importance_scores")
end)

T.run("global_unstructured against PyTorch", function()
  local lin, conv2d = built(linear(4, 6), { 1, 4 }), built(conv, { 1, 2, 3, 3 })
  prune.l1_unstructured(lin, "weight", 4)
  prune.global_unstructured({ { lin, "weight" }, { lin, "bias" }, { conv2d, "weight" } }, prune.L1Unstructured,
                            { amount = 0.25 })
  T.is(flat(lin.weight_mask), ref.global.lin_weight, "the Linear's weight (pruned before)")
  T.is(flat(lin.bias_mask), ref.global.lin_bias, "its bias")
  T.is(flat(conv2d.weight_mask), ref.global.conv_weight, "the convolution's weight")
  T.is(tostring(lin._attrs._pruning_hooks.weight.method),
       "PruningContainer(L1Unstructured(), CustomFromMask())", "the Linear's weight holds both methods")
end)

T.run("random pruning by its counts; identity; custom_from_mask", function()
  torch.manual_seed(3)
  local m = nn.Linear(5, 8)
  prune.random_unstructured(m, "weight", 0.5)
  T.is(m.weight_mask:eq(0):sum():item(), 20, "random_unstructured(0.5): 20 of 40")
  prune.random_unstructured(m, "weight", 7)
  T.is(m.weight_mask:eq(0):sum():item(), 27, "then 7 of the 20 left")
  prune.random_structured(m, "weight", 2, 1)
  local zero_columns = m.weight_mask:sum(0):eq(0):sum():item()
  T.ok(zero_columns >= 2, "random_structured: 2 more input channels all zero", zero_columns)
  T.tensor_close(m.weight, m.weight_orig * m.weight_mask, 0, 0, "the weight is masked")
  local c = nn.Linear(2, 2)
  prune.identity(c, "bias")
  T.is(c.bias_mask:tolist(), { 1, 1 }, "identity: a mask of ones")
  prune.custom_from_mask(c, "weight", torch.tensor({ { 1, 0 }, { 0, 1 } }))
  T.is(c.weight:eq(0):tolist(), { { false, true }, { true, false } }, "custom_from_mask")
end)

T.run("a pruning method of one's own", function()
  local EveryOther = prune.BasePruningMethod:extend("EveryOther")
  EveryOther.PRUNING_TYPE = "unstructured"
  function EveryOther:compute_mask(_, default_mask)
    local mask = default_mask:clone()
    mask:view(-1):index_fill_(0, torch.arange(0, mask:numel(), 2), 0)
    return mask
  end
  local m = nn.Linear(3, 2)
  EveryOther:apply(m, "bias")
  T.is(m.bias_mask:tolist(), { 0, 1 }, "its mask")
  EveryOther:apply(m, "bias")
  T.is(m.bias_mask:tolist(), { 0, 0 }, "again: on what is left")
end)

T.run("errors", function()
  local m = nn.Linear(3, 2)
  T.raises(function() prune.l1_unstructured(m, "weight", -1) end, "fraction in %[0, 1%) or a non%-negative whole number",
           "a negative amount")
  T.raises(function() prune.l1_unstructured(m, "weight", 1.5) end, "fraction in", "a fraction above 1")
  T.raises(function() prune.l1_unstructured(m, "weight", 7) end, "amount=7 should be smaller than the number of parameters to prune=6",
           "more than there are")
  T.ok(nn.is_parameter(m.weight), "a failed pruning leaves the parameter as it was")
  local twice = nn.Linear(3, 2)
  prune.l1_unstructured(twice, "weight", 1)
  prune.l1_unstructured(twice, "weight", 1)
  local mask = twice.weight_mask:clone()
  T.raises(function() prune.l1_unstructured(twice, "weight", 100) end, "should be smaller", "a third, failing")
  T.raises(function() prune.l1_unstructured(twice, "weight", 1, torch.ones(2)) end, "importance_scores", "and another")
  T.is(tostring(twice._attrs._pruning_hooks.weight.method), "PruningContainer(L1Unstructured(), L1Unstructured())",
       "failed prunings leave the container as it was")
  T.ok(torch.equal(twice.weight_mask, mask), "and the mask")
  T.raises(function() prune.l1_unstructured(m, "kernel", 1) end, "no parameter named 'kernel'", "a missing name")
  T.raises(function() prune.ln_structured(m, "bias", 1, 2, 0) end, "multidimensional tensors", "structured on a vector")
  T.raises(function() prune.ln_structured(m, "weight", 1, 2, 2) end, "invalid dim 2", "a dim out of range")
  T.raises(function() prune.ln_structured(m, "weight", 1, 2) end, "expected dim", "no dim")
  T.raises(function() prune.l1_unstructured(m, "weight", 1, torch.ones(3)) end, "importance_scores should have the shape",
           "scores of another shape")
  T.raises(function() prune.remove(m, "weight") end, "has to be pruned before pruning can be removed", "remove unpruned")
  T.raises(function() prune.global_unstructured({ { m, "weight" } }, prune.LnStructured, { amount = 1 }) end,
           'only "unstructured"', "a structured method globally")
  T.raises(function() prune.custom_from_mask(m, "weight", torch.ones(3)) end, "mask of the tensor's shape", "a mask's shape")
end)

T.done_testing()
