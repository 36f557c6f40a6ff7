-- dplua.optim: PyTorch's torch.optim for dplua (reached as torch.optim).
--
--   local opt = torch.optim.SGD(model:parameters(), {lr=0.1, momentum=0.9})
--   local sched = torch.optim.lr_scheduler.StepLR(opt, {step_size=30})
--   opt:zero_grad(); loss:backward(); opt:step(); sched:step()
--
-- Parameters live in flat buffers per group (see optimizer.lua): step() is
-- one fused C call per bucket, for every optimizer here.
local adam = require("dplua.optim.adam")

return {
  Optimizer = require("dplua.optim.optimizer"),
  SGD = require("dplua.optim.sgd"),
  Adam = adam.Adam,
  AdamW = adam.AdamW,
  RMSprop = require("dplua.optim.rmsprop"),
  Adagrad = require("dplua.optim.adagrad"),
  Adadelta = require("dplua.optim.adadelta"),
  define = require("dplua.optim.define"),
  lr_scheduler = require("dplua.optim.lr_scheduler"),
}
