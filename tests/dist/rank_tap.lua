-- tests/dist/rank_tap.lua: TAP for the tests that run on several ranks
-- (loaded with dofile): every rank checks; rank 0 prints every result and
-- any other rank only what fails. tap.n counts the checks, tap.failed says
-- whether one failed on this rank.
local rank = tonumber(os.getenv("RANK") or "0")
local tap = { n = 0, failed = false }

function tap.ok(cond, name)
  tap.n = tap.n + 1
  if not cond then tap.failed = true end
  if rank == 0 or not cond then print((cond and "ok " or "not ok ") .. tap.n .. " - " .. name) end
end

-- fn() must raise an error containing `pattern` (plain text)
function tap.raises(fn, pattern, name)
  local good, err = pcall(fn)
  tap.ok(not good and tostring(err):find(pattern, 1, true) ~= nil, name .. (good and "" or ": " .. tostring(err)))
end

return tap
