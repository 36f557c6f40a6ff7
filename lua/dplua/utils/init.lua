-- dplua.utils: torch.utils, loaded on first use of torch.utils.
--
--   local data = torch.utils.data      -- Dataset, TensorDataset, DataLoader, ...
local utils = {}

local submodules = { data = "dplua.utils.data" }
return setmetatable(utils, { __index = function(t, k)
  local name = submodules[k]
  if not name then return nil end
  local m = require(name)
  rawset(t, k, m)
  return m
end })
