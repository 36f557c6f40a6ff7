-- scripts/bench/data_workers.lua: a pass over a dataset whose samples cost
-- work to make (a 128x128 product and a tanh per sample, on one thread),
-- batch 64, loaded with 0 and 2 worker processes: a map-style Dataset of
-- 4096 samples and the same as an IterableDataset split by
-- get_worker_info(). Milliseconds a pass (the best of 3 after one untimed),
-- workers started with each pass. data_workers.py is the same on PyTorch.
local torch = require("dplua")
local data = torch.utils.data
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local T = dofile(here .. "/timing.lua")
local clock = torch.utils.progress.clock
torch.set_num_threads(1)

local N, B = 4096, 64
local base = torch.linspace(-1, 1, 128 * 128):view(128, 128)
local function sample(i)
  local x = base + i / N
  return (x:mm(x) / 128):tanh():sum(0), i % 10
end

local Map = data.Dataset:extend("Map")
function Map:__len() return N end
function Map:__getitem(i) return sample(i) end

local Stream = data.IterableDataset:extend("Stream")
function Stream:__iter()
  local info, lo, hi = data.get_worker_info(), 0, N
  if info then
    local per = math.ceil(N / info.num_workers)
    lo, hi = info.id * per, math.min(info.id * per + per, N)
  end
  local i = lo - 1
  return function()
    i = i + 1
    if i < hi then return sample(i) end
  end
end

local function pass_s(dataset, workers)
  local loader = data.DataLoader(dataset, { batch_size = B, num_workers = workers })
  local best = math.huge
  for round = 0, 3 do
    local t, n = clock(), 0
    for x in loader:iter() do n = n + x:size(0) end
    assert(n == N, "a pass saw " .. n .. " samples")
    if round > 0 then best = math.min(best, (clock() - t) * 1000) end
  end
  return best
end

print("version dplua " .. torch.__version__)
for _, w in ipairs({ 0, 2 }) do
  T.row("map_w" .. w, function() return pass_s(Map(), w) end, 3)
  T.row("stream_w" .. w, function() return pass_s(Stream(), w) end, 3)
end
