-- dplua.utils: torch.utils, loaded on first use of torch.utils.
--
--   local data = torch.utils.data      -- Dataset, TensorDataset, DataLoader, ...
--   torch.utils.progress.ProgressBar, torch.utils.metrics.MetricsLogger
--   torch.utils.tensorboard.SummaryWriter
--   torch.utils.checkpoint.checkpoint, checkpoint_sequential
--   torch.utils.benchmark.Timer, torch.utils.flop_counter.FlopCounterMode
local utils = {}

local submodules = { data = "dplua.utils.data", progress = "dplua.utils.progress", metrics = "dplua.utils.metrics",
                     tensorboard = "dplua.utils.tensorboard", checkpoint = "dplua.utils.checkpoint",
                     benchmark = "dplua.utils.benchmark", flop_counter = "dplua.utils.flop_counter" }
return setmetatable(utils, { __index = function(t, k)
  local name = submodules[k]
  if not name then return nil end
  local m = require(name)
  rawset(t, k, m)
  return m
end })
