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
local raise = require("dplua")._raise

local nn = {
  Module = module.Module,
  Parameter = module.Parameter,
  Buffer = module.Buffer,
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

-- nn.attention.sdpa_kernel(backends, fn, ...): fn(...) with only the
-- given SDPBackend(s) enabled for F.scaled_dot_product_attention (flash:
-- the fused kernel; math: the composite), the previous switches back
-- afterwards, as PyTorch's context manager.
local SDPBackend = { FLASH_ATTENTION = "flash", EFFICIENT_ATTENTION = "mem_efficient", MATH = "math",
                     CUDNN_ATTENTION = "cudnn" }
nn.attention = { SDPBackend = SDPBackend }
function nn.attention.sdpa_kernel(backends, fn, ...)
  local cuda = require("dplua").backends.cuda
  local list = type(backends) == "table" and backends or { backends }
  local want = {}
  for i, b in ipairs(list) do
    if cuda["enable_" .. tostring(b) .. "_sdp"] == nil then
      raise(string.format("sdpa_kernel: expected SDPBackend values, got %s at position %d", tostring(b), i))
    end
    want[b] = true
  end
  if type(fn) ~= "function" then raise("sdpa_kernel: expected a function to run, got " .. type(fn)) end
  local saved = {}
  for _, name in pairs(SDPBackend) do
    saved[name] = cuda[name .. "_sdp_enabled"]()
    cuda["enable_" .. name .. "_sdp"](want[name] == true)
  end
  return require("dplua")._finally(function()
    for name, on in pairs(saved) do cuda["enable_" .. name .. "_sdp"](on) end
  end, nil, pcall(fn, ...))
end

-- (a name starting with "_" is a helper its file shares, not a layer)
for _, file in ipairs({ "dplua.nn.layers", "dplua.nn.loss", "dplua.nn.transformer", "dplua.nn.rnn", "dplua.nn.containers" }) do
  for name, cls in pairs(require(file)) do
    if name:sub(1, 1) ~= "_" then nn[name] = cls end
  end
end

return nn
