-- The kernel profile (torch.cuda.profile_kernels, cuda/profile.cu): every
-- launch of ours and every cuBLASLt product inside the function is
-- counted once under its kernel's name, with a positive time; nothing
-- outside it is; errors stop the profile.
local dir = os.getenv("DPLUA_TEST_DIR") or (debug.getinfo(1, "S").source:match("^@(.*)/gpu/") or "tests")
package.path = dir .. "/lua/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
if not torch.cuda.is_available() then T.skip_all("no CUDA device") end

local dev = "cuda:0"
local function find(prof, pattern)
  for _, r in ipairs(prof) do if r.name:find(pattern) then return r end end
end

T.run("launches are counted by kernel, products by shape", function()
  local a, b = torch.randn(256, 512, { device = dev }), torch.randn(512, 384, { device = dev })
  local x = torch.randn(1000, { device = dev })
  local _ = x + 1   -- before the profile: not counted
  local prof, answer = torch.cuda.profile_kernels(function(k)
    for _ = 1, 5 do x = x + 1 end
    for _ = 1, k do local _ = a:matmul(b) end
    return "done"
  end, 3)
  T.is(answer, "done", "fn's results follow the profile")
  local calls = 0
  for i, r in ipairs(prof) do
    calls = calls + r.calls
    T.ok(r.ms > 0 and r.calls > 0, "row " .. r.name .. " has calls and a positive time")
    if i > 1 then T.ok(prof[i - 1].ms >= r.ms, "rows are by total time, descending") end
  end
  local mm = find(prof, "^cublasLt f32 NN 256x384x512$") or find(prof, "^cublasLt") or find(prof, "gemm")
  T.ok(mm ~= nil and mm.calls == 3, "the three products are one row of three calls")
  T.is(calls, 8, "five additions and three products, nothing else")
  T.ok(prof.total_ms > 0 and prof.span_ms >= prof.total_ms * 0.5, "total and span are measured")
  T.is(prof.dropped, 0, "nothing was dropped")
  T.is(#prof, 2, "two kernels: the addition's and the product's")
  T.ok(tostring(prof):find("ms in 2 kernels", 1, true) ~= nil, "the table prints")
end)

T.run("an error in fn stops the profile and is raised", function()
  T.raises(function() torch.cuda.profile_kernels(function() error("boom") end) end, "boom", "fn's error")
  local prof = torch.cuda.profile_kernels(function() end)
  T.is(#prof, 0, "a new profile starts empty after the failed one")
  T.raises(function()
    torch.cuda.profile_kernels(function() torch.cuda.profile_kernels(function() end) end)
  end, "profiles do not nest", "profiles do not nest")
end)

T.done_testing()
