-- sweep_curve.lua: a fake training script for tests/sh/test_sweep_prune.sh.
-- Its accuracy at epoch e is a * e / 4 for the hyperparameter a, reported
-- for epochs 1..4 with a pause after each, long enough for the sweep
-- driver to read the report and stop the trial before the next one.
local torch = require("dplua")
local ffi = require("ffi")
ffi.cdef [[ int dplua_tc_poll(void *fds, unsigned long n, int timeout) __asm__("poll"); ]]

local hp = torch.hparams{a = 0.5, pause = 0.4}
for e = 1, 4 do
  torch.report{epoch = e, acc = hp.a * e / 4}
  print(("epoch %d reported"):format(e))
  io.stdout:flush()
  ffi.C.dplua_tc_poll(nil, 0, math.floor(hp.pause * 1000))
end
