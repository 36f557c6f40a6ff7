-- test_token_shards.lua: token files (src/io/tokens.c) and
-- torch.utils.data.TokenShards. Files written by NumPy
-- (tests/ref/tokens_*, scripts/gen_token_ref.py) read back, and
-- TokenWriter's files equal them byte for byte; batches are the windows
-- they should be, y is x one token on; across ranks and epochs the
-- windows cover the data without overlap; wrong magic, wrong version and
-- truncated files give clear errors.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local data = torch.utils.data

local REF = here .. "/../ref/"
local function expected(n, modulus)
  local t = {}
  for i = 0, n - 1 do t[i + 1] = (i * 7919) % modulus end
  return t
end

---------------------------------------------------------------- reading and writing

T.is(data.load_tokens(REF .. "tokens_u16.bin"):tolist(), expected(1000, 50257), "a uint16 .bin shard (version 1)")
T.is(data.load_tokens(REF .. "tokens_u32.bin"):tolist(), expected(777, 100003), "a uint32 .bin shard (version 2)")
T.is(data.load_tokens(REF .. "tokens_u2.npy"):tolist(), expected(500, 50257), "a '<u2' .npy file")
T.is(data.load_tokens(REF .. "tokens_i8.npy"):tolist(), expected(300, 100003), "an '<i8' .npy file")
T.is(data.load_tokens(REF .. "tokens_u16.bin").dtype, torch.int64, "tokens come back as int64")

local tmp = T.temp_dir("tokens")

T.run("TokenWriter writes llm.c's layout", function()
  for _, c in ipairs({ { "tokens_u16.bin", 1000, 50257, "uint16" }, { "tokens_u32.bin", 777, 100003, "uint32" } }) do
    local path = tmp .. "/" .. c[1]
    local w = data.TokenWriter(path, { dtype = c[4] })
    local ids = expected(c[2], c[3])
    local half = math.floor(#ids / 2)
    w:write({ unpack(ids, 1, half) })
    w:write(torch.tensor({ unpack(ids, half + 1) }, { dtype = torch.int64 }))
    w:close()
    T.is(w.count, c[2], c[4] .. ": the count")
    T.ok(T.read_file(path) == T.read_file(REF .. c[1]), c[4] .. ": the same bytes as NumPy's file")
  end
  local w = data.TokenWriter(tmp .. "/big.bin")
  T.raises(function() w:write({ 70000 }) end, "the id 70000 does not fit uint16 tokens %(version 1%); write version 2",
           "an id past uint16")
  w:close()
  T.is(data.load_tokens(tmp .. "/big.bin"):numel(), 0, "a shard of no tokens")
  T.raises(function() data.TokenWriter(tmp .. "/no/such/dir/x.bin") end,
           "cannot write token file '.-/no/such/dir/x.bin': No such file or directory", "a bad output path")
  T.raises(function() data.TokenWriter(tmp .. "/x.bin", { dtype = "int8" }) end, "dtype 'int8', expected \"uint16\" or \"uint32\"",
           "a bad dtype")
end)

---------------------------------------------------------------- bad files

local function header(magic, version, count)
  local ints = { magic, version, count }
  local b = {}
  for i = 1, 256 do
    local v = ints[i] or 0
    if v < 0 then v = v + 4294967296 end
    b[i] = string.char(v % 256, math.floor(v / 256) % 256, math.floor(v / 65536) % 256, math.floor(v / 16777216) % 256)
  end
  return table.concat(b)
end
local function bad(name, bytes)
  local p = tmp .. "/" .. name
  T.write_file(p, bytes)
  return p
end
local u16 = T.read_file(REF .. "tokens_u16.bin")
local npy = T.read_file(REF .. "tokens_u2.npy")
local bad_files = {
  { "wrong magic", bad("magic.bin", header(20240326, 1, 0)), "has the magic number 20240326, expected 20240520" },
  { "wrong version", bad("version.bin", header(20240520, 3, 0)), "has version 3, expected 1 %(uint16 tokens%) or 2 %(uint32 tokens%)" },
  { "truncated tokens", bad("short.bin", u16:sub(1, #u16 - 1)),
    "is truncated: its header promises 1000 uint16 tokens %(3024 bytes in all%), the file has 3023 bytes" },
  { "truncated header", bad("head.bin", u16:sub(1, 100)), "is truncated: 100 bytes, shorter than the 1024%-byte header" },
  { "too long", bad("long.bin", u16 .. "xx"), "is too long: its header promises 1000 uint16 tokens" },
  { "empty", bad("empty.bin", ""), "is empty" },
  { "missing", tmp .. "/absent.bin", "cannot open token file '.-/absent.bin': No such file or directory" },
  { "a directory", tmp, "is a directory" },
  { "truncated .npy", bad("short.npy", npy:sub(1, #npy - 2)), "is truncated: its .npy header promises 500 tokens" },
  { "a float .npy", bad("f4.npy", (npy:gsub("<u2", "<f4"))), ".npy dtype '<f4' is not a token dtype" },
  { "a 2-D .npy", bad("2d.npy", (npy:gsub("%(500,%)", "(25, 20)"))), "has shape %(25, 20%), expected one dimension" },
}
for _, c in ipairs(bad_files) do
  T.raises(function() data.load_tokens(c[2]) end, c[3], "load_tokens: " .. c[1])
end
T.raises(function() data.TokenShards{ files = { REF .. "tokens_u16.bin", bad_files[1][2] }, block_size = 4, batch_size = 2 } end,
         "TokenShards: token file '.-magic.bin' has the magic number", "TokenShards names the bad file")

---------------------------------------------------------------- batches

T.run("sequential batches read the text straight through", function()
  local ds = data.TokenShards{ files = REF .. "tokens_u16.bin", block_size = 16, batch_size = 4 }
  local all = expected(1000, 50257)
  T.is(#ds, math.floor(math.floor(999 / 16) / 4), "#ds: batches of 4 windows of 16 (+1) tokens")
  local x, y = ds:__getitem(2)
  T.is({ x:size()[1], x:size()[2] }, { 4, 16 }, "x is (B, T)")
  T.is(x.dtype, torch.int64, "x is int64")
  local ok = true
  for b = 0, 3 do
    for t = 0, 15 do
      local pos = (2 * 4 + b) * 16 + t
      if x[b][t]:item() ~= all[pos + 1] or y[b][t]:item() ~= all[pos + 2] then ok = false end
    end
  end
  T.ok(ok, "batch 2 holds windows 8..11, and y is x one token on")
  local n = 0
  for xb, yb in ds:iter() do
    n = n + 1
    T.is({ xb:size()[1], xb:size()[2], yb:size()[1] }, { 4, 16, 4 }, "iter batch " .. n .. " has its shape")
    if n == 1 then T.is(yb[0][0]:item(), all[2], "the first target is token 1") end
  end
  T.is(n, #ds, "iter gives #ds batches")
end)

-- Every window start (file, token) that the ranks read in one epoch.
local function starts_of(opts, world, epoch)
  local seen, count, dup = {}, 0, false
  for rank = 0, world - 1 do
    local o = {}
    for k, v in pairs(opts) do o[k] = v end
    o.rank, o.world_size = rank, world
    local ds = data.TokenShards(o)
    ds:set_epoch(epoch)
    for x in ds:iter() do
      for b = 0, x:size(0) - 1 do
        local key = x[b][0]:item()   -- each token of the files is unique
        if seen[key] then dup = true end
        seen[key] = rank
        count = count + 1
      end
    end
  end
  return seen, count, dup
end

T.run("ranks share the windows without overlap", function()
  local files, sizes = {}, { 1000, 777, 500 }
  for k, n in ipairs(sizes) do   -- file k holds k * 10000 + i: every token is unique
    files[k] = tmp .. "/unique" .. k .. ".bin"
    local w = data.TokenWriter(files[k])
    w:write(torch.arange(n) + k * 10000)
    w:close()
  end
  local T_, B, W = 8, 3, 3
  local windows = math.floor(999 / T_) + math.floor(776 / T_) + math.floor(499 / T_)
  for _, shuffle in ipairs({ false, true }) do
    local opts = { files = files, block_size = T_, batch_size = B, shuffle = shuffle, seed = 7 }
    local seen, count, dup = starts_of(opts, W, 0)
    T.ok(not dup, "shuffle=" .. tostring(shuffle) .. ": no window twice across " .. W .. " ranks")
    T.is(count, math.floor(windows / (B * W)) * B * W, "shuffle=" .. tostring(shuffle) .. ": every full round of windows is read")
    local ds = data.TokenShards(opts)
    T.is(ds.num_windows, windows, "num_windows: windows never cross files")
  end
  local opts = { files = files, block_size = T_, batch_size = B, shuffle = true, seed = 7, rank = 0, world_size = 1 }
  local a = data.TokenShards(opts)
  local b = data.TokenShards(opts)
  T.is(a:__getitem(0):tolist(), b:__getitem(0):tolist(), "the same seed and epoch give the same batches")
  b:set_epoch(1)
  local differs = false
  for j = 0, 3 do if a:__getitem(j)[0][0]:item() ~= b:__getitem(j)[0][0]:item() then differs = true end end
  T.ok(differs, "another epoch gives another order")
  -- in order, rank r of 2 reads windows 2j+r... of B each
  local r1 = data.TokenShards{ files = REF .. "tokens_u16.bin", block_size = 10, batch_size = 2, rank = 1, world_size = 2 }
  T.is(r1:__getitem(0)[0][0]:item(), expected(1000, 50257)[2 * 10 + 1], "rank 1's first batch starts after rank 0's")
end)

T.raises(function() data.TokenShards{ files = REF .. "tokens_u16.bin", block_size = 1000, batch_size = 1 } end,
         "the files hold 0 windows of 1000 tokens %(plus one target%), fewer than one batch of 1 for each of 1 ranks",
         "too few tokens for one batch")
T.raises(function() data.TokenShards{ files = REF .. "tokens_u16.bin", block_size = 0, batch_size = 1 } end,
         "expected block_size to be a positive integer, got 0", "block_size 0")
T.raises(function() data.TokenShards{ files = REF .. "tokens_u16.bin", block_size = 4, batch_size = 1, rank = 2, world_size = 2 } end,
         "invalid rank 2, expected an integer in %[0, 1%]", "rank out of range")
T.raises(function() data.TokenShards{ files = {}, block_size = 4, batch_size = 1 } end,
         "expected files to be a token file path or a non%-empty list", "no files")
T.raises(function() data.TokenShards{ files = REF .. "tokens_u16.bin", block_size = 4, batch_size = 1, shufle = true } end,
         "unknown option 'shufle'", "a misspelt option")
T.raises(function()
  local ds = data.TokenShards{ files = REF .. "tokens_u16.bin", block_size = 4, batch_size = 1 }
  return ds:__getitem(#ds)
end, "batch 249 is out of range %(this rank has 249 batches an epoch%)", "a batch past the epoch")

os.execute("rm -rf " .. T.sh_quote(tmp))
T.done_testing()
