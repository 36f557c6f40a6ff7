-- dplua.optim: PyTorch's torch.optim for dplua (reached as torch.optim).
--
--   local opt = torch.optim.SGD(model:parameters(), {lr=0.1, momentum=0.9})
--   local sched = torch.optim.lr_scheduler.StepLR(opt, {step_size=30})
--   opt:zero_grad(); loss:backward(); opt:step(); sched:step()
--
-- Parameters live in flat buffers per group (see optimizer.lua): step() is
-- one fused C call per bucket (Adamax, NAdam, RAdam, ASGD and Rprop: a few
-- tensor ops per bucket).
local torch = require("dplua")
local adam = require("dplua.optim.adam")
local more = require("dplua.optim.more")

local optim = {
  Optimizer = require("dplua.optim.optimizer"),
  SGD = require("dplua.optim.sgd"),
  Adam = adam.Adam,
  AdamW = adam.AdamW,
  RMSprop = require("dplua.optim.rmsprop"),
  Adagrad = require("dplua.optim.adagrad"),
  Adadelta = require("dplua.optim.adadelta"),
  Adamax = more.Adamax,
  NAdam = more.NAdam,
  RAdam = more.RAdam,
  ASGD = more.ASGD,
  Rprop = more.Rprop,
  LBFGS = require("dplua.optim.lbfgs"),
  Adafactor = require("dplua.optim.adafactor"),
  define = require("dplua.optim.define"),
  lr_scheduler = require("dplua.optim.lr_scheduler"),
}
-- torch.optim.optimizer: PyTorch's module of the base class and the hooks
-- of every optimizer's step
optim.optimizer = {
  Optimizer = optim.Optimizer,
  register_optimizer_step_pre_hook = optim.Optimizer.register_optimizer_step_pre_hook,
  register_optimizer_step_post_hook = optim.Optimizer.register_optimizer_step_post_hook,
}
-- swa_utils loads on first use
return torch._lazy(optim, { swa_utils = function() return require("dplua.optim.swa_utils") end })
