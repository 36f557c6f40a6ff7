-- Run under the launcher by tests/sh/test_dist_failures.sh: after one
-- all_reduce, rank arg[1] stops itself with SIGSTOP (as a debugger, a
-- full swap or a hung driver would stop it: its process and connections
-- stay, it says nothing), and the others all-reduce again. They must fail
-- within the group's timeout, arg[2] seconds, naming it as not responding.
local torch = require("dplua")
local dist = torch.distributed
local frozen, timeout = tonumber(arg[1]), tonumber(arg[2])
dist.init_process_group("gloo", { timeout = timeout })
dist.all_reduce(torch.ones(4))
if dist.get_rank() == frozen then
  os.execute("sleep 1")            -- a rank that has been running a while
  io.stdout:flush()
  os.execute("kill -STOP $PPID")   -- the shell's parent: this rank
end
dist.all_reduce(torch.ones(4))
print("rank " .. dist.get_rank() .. ": the second all_reduce returned (a bug)")
