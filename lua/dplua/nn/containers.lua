-- dplua.nn.containers: nn.ParameterList and nn.ParameterDict, modules
-- that hold parameters the way ModuleList and ModuleDict hold modules.
--
--   self.scales = nn.ParameterList({ nn.Parameter(torch.ones(4)), nn.Parameter(torch.zeros(4)) })
--   self.scales[0], self.scales:len(), ipairs(self.scales)
--   self.tables = nn.ParameterDict({ user = nn.Parameter(torch.randn(10, 3)) })
--   self.tables.user, self.tables["user"], self.tables:keys()
--
-- As in PyTorch, the parameters are registered under their position
-- ("0", "1", ...) or key, so that state_dict() names them
-- "scales.0", "tables.user"; a plain tensor given to either becomes an
-- nn.Parameter.
local torch = require("dplua")
local module = require("dplua.nn.module")
local raise = torch._raise
local is_tensor = torch.is_tensor
local Module = module.Module

local C = {}

local function as_parameter(v, fn)
  if not is_tensor(v) then raise(fn .. ": expected a tensor or an nn.Parameter, got " .. type(v)) end
  if module.is_parameter(v) then return v end
  return module.Parameter(v)
end

-- ParameterList([list]): l:append(p), l:extend(list), l[i] (0-based, as
-- ModuleList), l:len(), ipairs(l).
C.ParameterList = Module:extend("ParameterList")
function C.ParameterList:__init(list)
  if list ~= nil then self:extend(list) end
end
C.ParameterList.__iterable = "parameters"
function C.ParameterList:len() return #self._parameters.keys end
function C.ParameterList:__getitem(i)
  local n = #self._parameters.keys
  if type(i) ~= "number" then raise("ParameterList: expected a number index, got " .. type(i)) end
  if i < 0 then i = i + n end
  if i < 0 or i >= n or i % 1 ~= 0 then
    raise(string.format("ParameterList: index %s is out of range (expected 0..%d)", tostring(i), n - 1))
  end
  return self._parameters.map[self._parameters.keys[i + 1]]
end
function C.ParameterList:append(p)
  self:register_parameter(tostring(#self._parameters.keys), as_parameter(p, "ParameterList.append"))
  return self
end
function C.ParameterList:extend(list)
  if type(list) ~= "table" or is_tensor(list) then
    raise("ParameterList.extend: expected a list of tensors, got " .. (is_tensor(list) and "a tensor" or type(list)))
  end
  for _, p in ipairs(list) do self:append(p) end
  return self
end
function C.ParameterList:forward() raise("ParameterList has no forward: use its parameters instead") end

-- ParameterDict([{name = p, ...} or {{name, p}, ...}]): d.name, d["name"],
-- d:keys(), d:values(), d:items(), d:len(), d:contains(name),
-- d:update(...). A table's names are taken sorted (a Lua table keeps no
-- order), a list of pairs in its order.
C.ParameterDict = Module:extend("ParameterDict")
function C.ParameterDict:__init(params)
  if params ~= nil then self:update(params) end
end
function C.ParameterDict:update(params)
  local fn = "ParameterDict.update"
  if type(params) ~= "table" or is_tensor(params) or module.is_module(params) then
    raise(fn .. ": expected a table of name = tensor or a list of {name, tensor} pairs, got " .. type(params))
  end
  local list = {}
  if params[1] ~= nil then
    for i, p in ipairs(params) do
      if type(p) ~= "table" or is_tensor(p) or #p ~= 2 then
        raise(string.format("%s: entry %d is not a {name, tensor} pair", fn, i))
      end
      list[i] = p
    end
  else
    local names = {}
    for k in pairs(params) do
      if type(k) ~= "string" then raise(fn .. ": parameter names must be strings, got " .. type(k)) end
      names[#names + 1] = k
    end
    table.sort(names)
    for i, k in ipairs(names) do list[i] = { k, params[k] } end
  end
  for _, p in ipairs(list) do
    if type(p[1]) ~= "string" then raise(fn .. ": parameter names must be strings, got " .. type(p[1])) end
    local v = as_parameter(p[2], fn)
    if self._parameters.has[p[1]] then
      self._parameters.map[p[1]] = v
    else
      self:register_parameter(p[1], v)
    end
  end
  return self
end
function C.ParameterDict:keys()
  local out = {}
  for i, k in ipairs(self._parameters.keys) do out[i] = k end
  return out
end
function C.ParameterDict:values()
  local out = {}
  for i, k in ipairs(self._parameters.keys) do out[i] = self._parameters.map[k] end
  return out
end
function C.ParameterDict:items()
  local out = {}
  for i, k in ipairs(self._parameters.keys) do out[i] = { k, self._parameters.map[k] } end
  return out
end
function C.ParameterDict:len() return #self._parameters.keys end
function C.ParameterDict:contains(name) return self._parameters.map[name] ~= nil end
function C.ParameterDict:forward() raise("ParameterDict has no forward: use its parameters by name instead") end

return C
