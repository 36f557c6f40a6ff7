-- test_lazy_ops.lua: the operations written as compositions (composite.lua,
-- special.lua) stay out of require("dplua") and load on the first use of a
-- method, a torch.NAME or a torch.Tensor.NAME they define; a name that
-- exists nowhere is still an error naming it.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")

T.is(package.loaded["dplua.composite"], nil, "require(\"dplua\") does not load the compositions")
T.is(package.loaded["dplua.special"], nil, "nor the special functions")
local x = torch.tensor({ 1.0, 2.0, 3.0 })
T.tensor_close(x * 2, torch.tensor({ 2.0, 4.0, 6.0 }), 0, 0, "the core ops work without them")
T.tensor_close(x:flip(0), torch.tensor({ 3.0, 2.0, 1.0 }), 0, 0, "a method of theirs loads them")
T.ok(package.loaded["dplua.composite"] ~= nil and package.loaded["dplua.special"] ~= nil, "both are loaded now")
T.ok(type(rawget(torch, "logsumexp")) == "function", "their torch.NAME functions are there")
T.ok(type(rawget(torch.Tensor, "erfinv")) == "function", "and their torch.Tensor.NAME ones")
T.is(torch._load_ops(), false, "_load_ops loads them once")
T.raises(function() return x:no_such_method() end, "Tensor has no method or field 'no_such_method'", "an unknown method")
T.is(torch.no_such_function, nil, "an unknown torch name is nil")
T.is(torch.arange(7):div(2, "floor"):tolist(), { 0, 0, 1, 1, 2, 2, 3 }, "div's rounding mode is a core op")

T.done_testing()
