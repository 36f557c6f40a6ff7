-- The data readers beside IDX: .npy (files written by NumPy, see
-- scripts/gen_npy_ref.py), CSV, and DistributedSampler's index shares
-- (PyTorch's padding and striding rule, worked out by hand below).
local dir = os.getenv("DPLUA_TEST_DIR") or (debug.getinfo(1, "S").source:match("^@(.*)/lua/") or "tests")
package.path = dir .. "/lua/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local data = torch.utils.data
local ref = dir .. "/ref/"

-- .npy ------------------------------------------------------------------
local a = data.load_npy(ref .. "npy_f32.npy")
T.is(tostring(a.dtype), "torch.float32", "npy f4 -> float32")
T.tensor_close(a, { { -1.25, -1, -0.75, -0.5 }, { -0.25, 0, 0.25, 0.5 }, { 0.75, 1, 1.25, 1.5 } }, 0, 0, "npy f4 values")
local b = data.load_npy(ref .. "npy_i64.npy")
T.is(tostring(b.dtype), "torch.int64", "npy i8 -> int64")
T.is(b[{ 1, 1 }]:item(), 2 ^ 40, "npy int64 keeps large values")
T.is(b[{ 0, 1 }]:item(), -2, "npy int64 keeps signs")
local c = data.load_npy(ref .. "npy_bool.npy")
T.is(tostring(c.dtype), "torch.bool", "npy b1 -> bool")
T.is(c[2]:item(), true, "npy bool values")
local d = data.load_npy(ref .. "npy_u8_0d.npy")
T.is(d:dim(), 0, "npy 0-d array")
T.is(d:item(), 7, "npy 0-d value")
local e = data.load_npy(ref .. "npy_f64_empty.npy")
T.is(table.concat(e:size(), "x"), "0x3", "npy empty array keeps its shape")
T.raises(function() data.load_npy(ref .. "npy_fortran.npy") end, "Fortran", "Fortran order is refused")
T.raises(function() data.load_npy(ref .. "npy_big_endian.npy") end, "unsupported dtype", "big-endian is refused")
T.raises(function() data.load_npy(ref .. "does_not_exist.npy") end, "does_not_exist", "a missing file names it")

local tmp = os.tmpname()
local function write(bytes) local f = assert(io.open(tmp, "wb")); f:write(bytes); f:close() end
local good = assert(io.open(ref .. "npy_f32.npy", "rb")):read("*a")
write(good:sub(1, #good - 5))
T.raises(function() data.load_npy(tmp) end, "data bytes", "a truncated file is an error naming the byte counts")
write(good .. "xx")
T.raises(function() data.load_npy(tmp) end, "data bytes", "trailing bytes are an error")
write("PK\3\4 not numpy at all")
T.raises(function() data.load_npy(tmp) end, "magic", "another format is refused")
write(good:sub(1, 12))
T.raises(function() data.load_npy(tmp) end, "truncated", "a cut header is refused")

-- CSV -------------------------------------------------------------------
write("x,y,label\n1,2.5,0\n-3,4e-1,1\n\n5,6,2\n")
local t, names = data.load_csv(tmp, { header = true })
T.is(table.concat(names, "|"), "x|y|label", "csv header names")
T.tensor_close(t, { { 1, 2.5, 0 }, { -3, 0.4, 1 }, { 5, 6, 2 } }, 1e-6, 0, "csv values (a blank line is skipped)")
write("1;2\n3;4\n")
T.tensor_close(data.load_csv(tmp, { delimiter = ";", dtype = torch.float64 }), { { 1, 2 }, { 3, 4 } }, 0, 0, "csv delimiter and dtype")
write("1,2\n3\n")
T.raises(function() data.load_csv(tmp) end, "line 2 has 1 fields, expected 2", "a ragged row names its line")
write("1,2\n3,abc\n")
T.raises(function() data.load_csv(tmp) end, "'abc' is not a number", "a non-number names its field")
T.raises(function() data.load_csv(tmp, { delimeter = ";" }) end, "delimeter", "a misspelt option is an error")
os.remove(tmp)

-- DistributedSampler ----------------------------------------------------
-- PyTorch: indices padded with their first ones to a multiple of
-- num_replicas (or cut with drop_last), then rank r takes r, r+R, ...
local ds = data.TensorDataset(torch.arange(10))
local expect = { [0] = { 0, 3, 6, 9 }, { 1, 4, 7, 0 }, { 2, 5, 8, 1 } }
for r = 0, 2 do
  local s = data.DistributedSampler(ds, { num_replicas = 3, rank = r, shuffle = false })
  T.is(#s, 4, "rank " .. r .. " of 3 gets ceil(10/3) samples")
  T.is(table.concat(s:index_tensor():tolist(), ","), table.concat(expect[r], ","), "rank " .. r .. " of 3, unshuffled, padded")
end
local seen = {}
for r = 0, 2 do
  local s = data.DistributedSampler(ds, { num_replicas = 3, rank = r, drop_last = true, seed = 5 })
  T.is(#s, 3, "drop_last: rank " .. r .. " gets floor(10/3) samples")
  for _, i in ipairs(s:index_tensor():tolist()) do seen[#seen + 1] = i end
end
table.sort(seen)
local distinct = true
for i = 2, #seen do if seen[i] == seen[i - 1] then distinct = false end end
T.ok(#seen == 9 and distinct, "drop_last: the ranks' shares are disjoint")
local s1 = data.DistributedSampler(ds, { num_replicas = 2, rank = 0, seed = 1 })
local e0 = table.concat(s1:index_tensor():tolist(), ",")
T.is(table.concat(s1:index_tensor():tolist(), ","), e0, "the same epoch gives the same permutation")
s1:set_epoch(1)
T.ok(table.concat(s1:index_tensor():tolist(), ",") ~= e0, "set_epoch changes the permutation")
local s2 = data.DistributedSampler(ds, { num_replicas = 2, rank = 1, seed = 1 })
local union = {}
for _, i in ipairs(data.DistributedSampler(ds, { num_replicas = 2, rank = 0, seed = 1 }):index_tensor():tolist()) do union[i] = true end
for _, i in ipairs(s2:index_tensor():tolist()) do union[i] = true end
local all = true
for i = 0, 9 do all = all and union[i] end
T.ok(all, "shuffled shares of all ranks cover the dataset")
local n = 0
for x in data.DataLoader(ds, { batch_size = 2, sampler = data.DistributedSampler(ds, { num_replicas = 2, rank = 1, shuffle = false }) }):iter() do
  n = n + x:numel()
end
T.is(n, 5, "a DataLoader takes a DistributedSampler")
T.raises(function() data.DistributedSampler(ds, { num_replicas = 2, rank = 2 }) end, "invalid rank 2", "rank out of range")
T.raises(function() data.DistributedSampler(ds) end, "init_process_group", "without a process group it asks for num_replicas and rank")
T.done_testing()
