-- test_testing.lua: torch.testing.assert_close against what PyTorch's says
-- about the same pairs of tensors, word for word (tests/ref/testing.lua,
-- written by scripts/gen_testing_ref.py), its repr of floats; then what
-- only Lua has (paths into tables, numbers, booleans, strings), the options,
-- and make_tensor.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local tt = torch.testing
local ref = dofile(here .. "/../ref/testing.lua")

-- assert_close's message without the location raise puts before it, or nil
local function failure(...)
  local ok, err = pcall(tt.assert_close, ...)
  if ok then return nil end
  return T.strip_location(err)
end

for _, name in ipairs(T.sorted_keys(ref.cases)) do
  local c = ref.cases[name]
  T.run(name .. " says what PyTorch says", function()
    local a = torch.tensor(c.actual, { dtype = torch[c.actual_dtype] })
    local e = torch.tensor(c.expected, { dtype = torch[c.expected_dtype] })
    T.is(failure(a, e, c.options), c.message, c.message and "the message" or "they pass")
  end)
end

T.run("floats print as Python's repr", function()
  for _, r in ipairs(ref.reprs) do T.is(tt._py_float(r[1]), r[2], "repr of " .. r[2]) end
end)

T.run("tables: every element compared, the failing one's path named", function()
  local x = torch.tensor({ 1.0, 2.0 })
  T.is(failure({ x, { w = x, b = x } }, { x, { w = x, b = x } }), nil, "equal nested tables pass")
  local msg = failure({ x, { w = x * 2 } }, { x, { w = x } })
  T.ok(msg:find("^Tensor%-likes are not close!") ~= nil, "the tensors' message", msg)
  T.ok(msg:find("The failure occurred for item %[2%]%[\"w\"%]$") ~= nil, "and the path, Lua's indices", msg)
  T.is(failure({ x, x }, { x, x, x }), "The length of the sequences mismatch: 2 != 3", "lengths")
  T.is(failure({ a = x, c = x }, { b = x, c = x }),
       "The keys of the mappings do not match:\nMissing keys in the actual mapping: [\"b\"]\n"
       .. "Additional keys in the actual mapping: [\"a\"]", "keys")
  T.raises(function() tt.assert_close(x, 3) end, "cannot compare Tensor with number", "a tensor with a number")
end)

T.run("numbers, booleans, strings, nil", function()
  T.is(failure(1.0, 1.5), "Scalars are not close!\n\nAbsolute difference: 0.5 (up to 1e-07 allowed)\n"
       .. "Relative difference: 0.3333333333333333 (up to 1e-07 allowed)", "non-integral numbers: float64's tolerances")
  T.is(failure(1, 2), "Scalars are not equal!\n\nAbsolute difference: 1\nRelative difference: 0.5",
       "integral numbers compare exactly")
  T.is(failure(1, 1 + 1e-9), nil, "within float64's tolerances")
  T.is(failure(0 / 0, 0 / 0), "Scalars are not close!\n\nAbsolute difference: nan (up to 1e-07 allowed)\n"
       .. "Relative difference: nan (up to 1e-07 allowed)", "NaN is not NaN")
  T.is(failure(0 / 0, 0 / 0, { equal_nan = true }), nil, "unless equal_nan")
  T.is(failure(math.huge, math.huge), nil, "inf is inf")
  T.is(failure(true, false), "Booleans mismatch: true is not false", "booleans")
  T.is(failure("a", "b"), 'Strings mismatch: "a" is not "b"', "strings")
  T.is(failure(nil, nil), nil, "nil is nil")
end)

T.run("options", function()
  local a, e = torch.tensor({ 1.0, 2.0 }), torch.tensor({ 1.0, 2.1 })
  T.is(failure(a, e, { msg = "custom" }), "custom", "msg replaces the message")
  T.is(failure(a, e, { msg = function(m) return "prefix: " .. m:match("^[^\n]*") end }),
       "prefix: Tensor-likes are not close!", "a function of the message")
  T.is(failure(a, e, { rtol = 0.1, atol = 0 }), nil, "given tolerances")
  T.raises(function() tt.assert_close(a, e, { rtol = 0.1 }) end,
           "both 'rtol' and 'atol' must be either specified or omitted, but got no atol", "one tolerance alone")
  T.raises(function() tt.assert_close(a, e, { rtol = -1, atol = 0 }) end, "rtol must be a number >= 0", "a negative one")
  T.raises(function() tt.assert_close(a, e, 1e-3) end, "expected the options as a table", "positional tolerances")
  T.is(failure(a:requires_grad_(), a:detach()), nil, "requires_grad does not matter")
end)

T.run("make_tensor", function()
  torch.manual_seed(0)
  local f = tt.make_tensor({ 200, 5 })
  T.is(T.shape(f), { 200, 5 }, "shape")
  T.is(f.dtype, torch.get_default_dtype(), "the default dtype")
  T.ok(f:min():item() >= -9 and f:max():item() < 9, "floats in [-9, 9)")
  local i = tt.make_tensor({ 1000 }, { dtype = torch.int64 })
  T.ok(i:min():item() == -9 and i:max():item() == 9, "integers from -9 to 9")
  local u = tt.make_tensor({ 1000 }, { dtype = torch.uint8, high = 4 })
  T.ok(u:min():item() == 0 and u:max():item() == 3, "uint8 from 0, high exclusive")
  local d = tt.make_tensor({ 1000 }, { dtype = torch.float64, low = 2, high = 3, requires_grad = true })
  T.ok(d:min():item() >= 2 and d:max():item() < 3 and d.requires_grad, "low, high, requires_grad")
  local b = tt.make_tensor({ 100 }, { dtype = torch.bool })
  T.ok(b.dtype == torch.bool and b:any():item() and not b:all():item(), "bool: both values")
  T.raises(function() tt.make_tensor({ 2 }, { low = 3, high = 1 }) end, "low %(3%) must be less than high %(1%)", "low >= high")
end)

T.done_testing()
