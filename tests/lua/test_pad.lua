-- test_pad.lua: F.pad in every mode (constant with a value and with
-- negative pads, reflect, replicate, circular; pads of one, two and three
-- dims) against PyTorch's outputs and input gradients in float64
-- (tests/ref/pad.lua, written by scripts/gen_pad_ref.py); other dtypes
-- and the options table; bad pads as clear errors; nn.utils.rnn.pad_sequence.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local F = torch.nn.functional
local ref = dofile(here .. "/../ref/pad.lua")

-- the generator's input: x.flat[i] = sin(1 + 3i) of the case's shape
local function input(shape)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  local v = {}
  for i = 0, n - 1 do v[#v + 1] = math.sin(1 + 3 * i) end
  return torch.tensor(v, { dtype = torch.float64 }):reshape(shape)
end

for _, name in ipairs(T.sorted_keys(ref)) do
  local c = ref[name]
  T.run(name .. " against PyTorch", function()
    local x = input(c.input):requires_grad_()
    local y = c.mode == "constant" and F.pad(x, c.pad, "constant", c.value) or F.pad(x, c.pad, { mode = c.mode })
    T.is(T.shape(y), c.shape, "shape")
    T.tensor_close(y:reshape(-1), torch.tensor(c.y, { dtype = torch.float64 }), 0, 0, "values")
    local wt = torch.arange(0, y:numel(), { dtype = torch.float64 }):cos():reshape(y:size())
    local loss = (y * wt):sum()
    loss:backward()
    T.tensor_close(x.grad:reshape(-1), torch.tensor(c.dx, { dtype = torch.float64 }), 1e-14, 1e-14, "input gradient")
  end)
end

T.run("other dtypes keep theirs; the default mode is constant with 0", function()
  local x = torch.arange(0, 6):reshape(2, 3)
  local y = F.pad(x, { 1, 0 })
  T.is(y.dtype, torch.int64, "int64")
  T.is(y:tolist(), { { 0, 0, 1, 2 }, { 0, 3, 4, 5 } }, "zeros before")
  local b = F.pad(x:bfloat16(), { 0, 1 }, { value = 2 })
  T.is(b.dtype, torch.bfloat16, "bfloat16")
  T.is(b:float():tolist(), { { 0, 1, 2, 2 }, { 3, 4, 5, 2 } }, "value after")
  T.ok(rawequal(F.pad(x, { 0, 0 }), x), "no padding: the input itself")
end)

T.run("bad pads are clear errors", function()
  local x = torch.ones(2, 3, 4)
  T.raises(function() F.pad(x, { 1 }) end, "Padding length must be divisible by 2", "odd length")
  T.raises(function() F.pad(x, { 1, 1, 1, 1, 1, 1, 1, 1 }) end, "less than or equal to two times the input dimension",
           "more dims than the input")
  T.raises(function() F.pad(x, { 1, 1 }, "wrap") end, "expected mode to be", "unknown mode")
  T.raises(function() F.pad(x, { 4, 0 }, "reflect") end, "Padding size should be less than the corresponding input dimension",
           "reflect as wide as the dim")
  T.raises(function() F.pad(x, { 5, 0 }, "circular") end, "wrapping around more than once", "circular wider than the dim")
  T.raises(function() F.pad(x, { -1, 0 }, "replicate") end, "negative pads are taken in constant mode only",
           "negative replicate")
  T.raises(function() F.pad(x, { -3, -2 }) end, "crop more than", "cropping past the dim")
  T.raises(function() F.pad(x, { 1, 1 }, "reflect", 3) end, "doesn't take in value argument", "a value beside reflect")
  T.raises(function() F.pad(x, { 1.5, 1 }) end, "expected the pads to be integers", "a fractional pad")
end)

-- the values PyTorch's pad_sequence gives for these sequences
T.run("nn.utils.rnn.pad_sequence", function()
  local pad_sequence = torch.nn.utils.rnn.pad_sequence
  local a = torch.tensor({ { 1, 2 }, { 3, 4 }, { 5, 6 } }, { dtype = torch.float64 }):requires_grad_()
  local b = torch.tensor({ { 7, 8 } }, { dtype = torch.float64 }):requires_grad_()
  local y = pad_sequence({ a, b })
  T.is(T.shape(y), { 3, 2, 2 }, "(L_max, B, *)")
  T.is(y:tolist(), { { { 1, 2 }, { 7, 8 } }, { { 3, 4 }, { 0, 0 } }, { { 5, 6 }, { 0, 0 } } }, "time first, zeros after")
  local yb = pad_sequence({ a, b }, { batch_first = true, padding_value = -1 })
  T.is(yb:tolist(), { { { 1, 2 }, { 3, 4 }, { 5, 6 } }, { { 7, 8 }, { -1, -1 }, { -1, -1 } } }, "batch first, -1 after")
  local loss = (yb * torch.arange(1, 13, { dtype = torch.float64 }):reshape(2, 3, 2)):sum()
  loss:backward()
  T.is(a.grad:tolist(), { { 1, 2 }, { 3, 4 }, { 5, 6 } }, "each sequence gets its rows' gradient")
  T.is(b.grad:tolist(), { { 7, 8 } }, "the padding none")
  T.raises(function() pad_sequence({}) end, "non%-empty list", "no sequences")
  T.raises(function() pad_sequence({ a, torch.ones(2, 3) }) end, "same trailing dims", "trailing dims that differ")
  T.raises(function() pad_sequence({ a, torch.tensor(1.0) }) end, "at least 1 dim", "a 0-d tensor")
  -- unpad_sequence undoes it, as PyTorch's
  local unpad = torch.nn.utils.rnn.unpad_sequence
  local back = unpad(y, { 3, 1 })
  T.is({ back[1]:tolist(), back[2]:tolist() }, { a:tolist(), b:tolist() }, "unpad_sequence gives the sequences back")
  local back_b = unpad(yb, torch.tensor({ 3, 1 }, { dtype = torch.int64 }), true)
  T.is({ T.shape(back_b[1]), T.shape(back_b[2]) }, { { 3, 2 }, { 1, 2 } }, "batch first, lengths as a tensor")
  T.raises(function() unpad(y, { 3 }) end, "expected 2 lengths", "a length missing")
  T.raises(function() unpad(y, { 4, 1 }) end, "length 1 is 4, expected an integer in %[0, 3%]", "a length too long")
end)

T.done_testing()
