-- test_nonzero_static.lua: torch.nonzero_static against PyTorch's
-- (tests/ref/nonzero_static.lua, written by
-- scripts/gen_nonzero_static_ref.py): sizes below, at and above the count
-- of non-zeros, fill values, NaN and -0.0, bool, 0-d and empty inputs; and
-- its bad arguments.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local ref = dofile(here .. "/../ref/nonzero_static.lua")

local function input(name)
  local r = ref.inputs[name]
  return torch.tensor(r.values, { dtype = torch.float64 }):view(r.shape):to(torch[r.dtype])
end

T.run("nonzero_static against PyTorch", function()
  for _, c in ipairs(ref.cases) do
    local label = string.format("%s, size %d, fill_value %d", c.input, c.size, c.fill_value)
    local got = torch.nonzero_static(input(c.input), { size = c.size, fill_value = c.fill_value })
    T.is(got.dtype, torch.int64, label .. ": int64")
    T.is(got:size(), c.shape, label .. ": the shape")
    T.is(got:reshape(-1):tolist(), c.values, label .. ": the coordinates")
  end
  local t = input("matrix")
  T.is(t:nonzero_static({ size = 4 }):tolist(), torch.nonzero_static(t, { size = 4 }):tolist(), "the method form")
end)

T.run("bad arguments are clear errors", function()
  local t = input("matrix")
  T.raises(function() torch.nonzero_static(t) end, "expected an options table {size=", "no size")
  T.raises(function() torch.nonzero_static(t, { size = -1 }) end, "size to be a non%-negative integer, got %-1",
           "a negative size")
  T.raises(function() torch.nonzero_static(t, { size = 1.5 }) end, "non%-negative integer, got 1.5", "a fraction")
  T.raises(function() torch.nonzero_static(t, { size = 2, fill_value = "x" }) end,
           "expected fill_value to be an integer", "a string fill")
end)

T.done_testing()
