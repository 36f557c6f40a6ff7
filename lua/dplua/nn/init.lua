-- dplua.nn: PyTorch's torch.nn for dplua (reached as torch.nn).
--
--   local torch = require("dplua")
--   local nn = torch.nn
--   local Net = nn.Module:extend("Net")
--   function Net:__init() self.fc = nn.Linear(10, 2) end
--   function Net:forward(x) return self.fc(x) end
--
-- nn.Module and nn.Parameter are in dplua/nn/module.lua, the layers in
-- layers.lua, the attention and transformer modules in transformer.lua, the
-- recurrent layers in rnn.lua, the losses in loss.lua, ParameterList and
-- ParameterDict in containers.lua; nn.functional, nn.init and nn.utils
-- are tables of functions (functional.lua, init_.lua, utils.lua).
local module = require("dplua.nn.module")

local nn = {
  Module = module.Module,
  Parameter = module.Parameter,
  is_parameter = module.is_parameter,
  is_module = module.is_module,
  isinstance = module.isinstance,
  functional = require("dplua.nn.functional"),
  init = require("dplua.nn.init_"),
  utils = require("dplua.nn.utils"),
}

-- nn.parallel.DistributedDataParallel lives with the process groups in
-- dplua.distributed; it is loaded on first use.
nn.parallel = setmetatable({}, { __index = function(t, k)
  if k ~= "DistributedDataParallel" then return nil end
  local cls = require("dplua.distributed")._ddp_class()
  rawset(t, k, cls)
  return cls
end })

-- (a name starting with "_" is a helper its file shares, not a layer)
for _, file in ipairs({ "dplua.nn.layers", "dplua.nn.loss", "dplua.nn.transformer", "dplua.nn.rnn", "dplua.nn.containers" }) do
  for name, cls in pairs(require(file)) do
    if name:sub(1, 1) ~= "_" then nn[name] = cls end
  end
end

return nn
