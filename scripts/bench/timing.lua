-- scripts/bench/timing.lua: what the Lua benches share (timing.py is the
-- same for their PyTorch sides). Each bench prints "name value" lines
-- that scripts/bench/compare.sh lines up with PyTorch's.
--   local T = dofile(here .. "/timing.lua")
local torch = require("dplua")
local clock = torch.utils.progress.clock
local T = {}

-- row(name, f [, digits=2]): runs f and prints "name value"; an error
-- prints "name error: ..." on one line instead, and the bench goes on.
function T.row(name, f, digits)
  local ok, v = pcall(f)
  if ok then
    print(string.format("%s %." .. (digits or 2) .. "f", name, v))
  else
    local msg = tostring(v):gsub("%s*\n%s*", " | ")
    if #msg > 300 then msg = msg:sub(1, 300) .. "..." end
    print(string.format("%s error: %s", name, msg))
  end
  collectgarbage(); collectgarbage()
end

-- host_us(f): µs per call of 2000 calls in a loop, after 50 untimed,
-- timed up to the last call's return (the GPU then trails by at most
-- its queue).
function T.host_us(f)
  for _ = 1, 50 do f() end
  torch.cuda.synchronize()
  local n, t = 2000, clock()
  for _ = 1, n do f() end
  local us = (clock() - t) / n * 1e6
  torch.cuda.synchronize()
  return us
end

-- gpu_ms(f [, calls=5]): ms per call by CUDA events around `calls` calls,
-- after as many untimed ones (each call may make a result that Lua frees
-- later, and the memory pool must have grown to hold them).
function T.gpu_ms(f, calls)
  calls = calls or 5
  for _ = 1, calls do f() end
  torch.cuda.synchronize()
  local e0, e1 = torch.cuda.Event({ enable_timing = true }), torch.cuda.Event({ enable_timing = true })
  e0:record()
  for _ = 1, calls do f() end
  e1:record()
  e1:synchronize()
  return e0:elapsed_time(e1) / calls
end

-- cpu_ms(f, n): ms per call of f by the process's CPU time, the best of
-- 5 repeats of n calls after 2 untimed (CPU time and the best of several
-- are what a loaded, shared machine inflates least).
function T.cpu_ms(f, n)
  f(); f()
  local best = math.huge
  for _ = 1, 5 do
    local t0 = os.clock()
    for _ = 1, n do f() end
    best = math.min(best, (os.clock() - t0) / n)
  end
  return best * 1e3
end

return T
