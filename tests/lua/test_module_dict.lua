-- test_module_dict.lua: nn.ModuleDict, PyTorch's container of named
-- children: construction from a table (names sorted) and from a list of
-- pairs (order kept), access by name, keys/values/items/len/contains,
-- update replacing a child, parameters and state_dict keys as PyTorch
-- names them ("name.weight"), printing, bad input; and nn.isinstance,
-- PyTorch's isinstance(m, nn.Linear).
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local nn = torch.nn

T.run("construction and access", function()
  local relu, lin = nn.ReLU(), nn.Linear(2, 3)
  local d = nn.ModuleDict({ b = lin, a = relu })
  T.is(d:keys(), { "a", "b" }, "a table's names, sorted")
  T.ok(d.a == relu and d["b"] == lin, "children by field and by index")
  T.is(d:len(), 2, "len")
  T.ok(d:contains("a") and not d:contains("c"), "contains")
  local items = d:items()
  T.ok(items[1][1] == "a" and items[1][2] == relu and items[2][2] == lin, "items in order")
  T.ok(d:values()[2] == lin, "values in order")
  local e = nn.ModuleDict({ { "z", nn.Linear(1, 1) }, { "y", nn.Linear(1, 2) } })
  T.is(e:keys(), { "z", "y" }, "a list of pairs keeps its order")
  T.is(tostring(d), "ModuleDict(\n  (a): ReLU()\n  (b): Linear(in_features=2, out_features=3, bias=True)\n)", "printing")
end)

T.run("parameters, state_dict and update", function()
  local e = nn.ModuleDict({ { "z", nn.Linear(1, 1) }, { "y", nn.Linear(1, 2) } })
  T.is(#e:parameters(), 4, "every child's parameters")
  T.is(T.sorted_keys(e:state_dict()), { "y.bias", "y.weight", "z.bias", "z.weight" }, "state_dict keys as PyTorch's")
  e:update({ z = nn.Linear(1, 5) })
  T.is(e.z.out_features, 5, "update replaces a child of the same name")
  T.is(e:keys(), { "z", "y" }, "and keeps its place")
  e.x = nn.Tanh()
  T.is(e:keys(), { "z", "y", "x" }, "assignment adds a child")
  local outer = nn.Sequential(nn.Linear(2, 2))
  outer.heads = nn.ModuleDict({ cls = nn.Linear(2, 3) })
  T.ok(outer:state_dict()["heads.cls.weight"] ~= nil, "nested: heads.cls.weight")
end)

T.run("errors", function()
  T.raises(function() nn.ModuleDict({ a = 3 }) end, "'a' is a number, not a Module", "a value that is not a module")
  T.raises(function() nn.ModuleDict(5) end, "expected a table of name = module", "not a table")
  T.raises(function() nn.ModuleDict({ { "a" } }) end, "entry 1 is not a {name, module} pair", "a broken pair")
  T.raises(function() nn.ModuleDict({ { "a.b", nn.ReLU() } }) end, "can't contain", "a dotted name")
  T.raises(function() nn.ModuleDict({ a = nn.ReLU() })(1) end, "ModuleDict has no forward", "calling it")
end)

T.run("isinstance", function()
  local Base = nn.Module:extend("Base")
  local Derived = Base:extend("Derived")
  local d, lin = Derived(), nn.Linear(1, 1)
  T.ok(nn.isinstance(lin, nn.Linear), "a Linear is a Linear")
  T.ok(not nn.isinstance(lin, nn.ReLU), "a Linear is not a ReLU")
  T.ok(d:isinstance(Base) and d:isinstance(Derived), "a class extended from Base is a Base")
  T.ok(not nn.Module():isinstance(Base), "a plain Module is not a Base")
  T.ok(nn.isinstance(d, nn.Module) and nn.isinstance(lin, nn.Module), "every module is a Module")
  T.ok(not nn.isinstance(3, nn.Linear) and not nn.isinstance(torch.zeros(1), nn.Linear), "non-modules are not")
  T.raises(function() nn.isinstance(lin, "Linear") end, "expected a module class", "a name instead of a class")
end)

T.done_testing()
