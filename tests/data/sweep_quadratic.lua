-- sweep_quadratic.lua: a fake training script for tests/sh/test_sweep.sh.
-- Its "loss" is (x - 1)^2 + (y + 2)^2, best at x = 1, y = -2. It sleeps a
-- little so that concurrent trials overlap, and x = 3 fails on purpose:
-- with a Lua error when y = -2, killed by SIGKILL when y = 0. sleep = N
-- sleeps N seconds (the timeout test).
local torch = require("dplua")
local ffi = require("ffi")
ffi.cdef [[
  int dplua_tq_poll(void *fds, unsigned long n, int timeout) __asm__("poll");
  int dplua_tq_kill(int pid, int sig) __asm__("kill");
  int dplua_tq_getpid(void) __asm__("getpid");
]]

local hp = torch.hparams{x = 0, y = 0, sleep = 0.25}
print(("trial %s: x = %g, y = %g"):format(os.getenv("DPLUA_TRIAL_ID"), hp.x, hp.y))
torch.report{step = 0, loss = 100}
ffi.C.dplua_tq_poll(nil, 0, math.floor(hp.sleep * 1000))
if hp.x == 3 and hp.y == -2 then error("deliberate crash for x = 3") end
if hp.x == 3 then ffi.C.dplua_tq_kill(ffi.C.dplua_tq_getpid(), 9) end
torch.report{step = 1, loss = (hp.x - 1) ^ 2 + (hp.y + 2) ^ 2, x_seen = hp.x}
if arg[1] then torch.report{arg1 = arg[1]} end
