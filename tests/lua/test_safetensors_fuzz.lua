--[==[
test_safetensors_fuzz.lua -- the safetensors reader against malformed files.

    ./dplua tests/lua/test_safetensors_fuzz.lua [CASES [SEED]]

  DPLUA_ST_FUZZ_CASES  random cases (default 10000; the argument wins)
  DPLUA_ST_FUZZ_SEED   seed (default a fixed one, so that CI is repeatable;
                       printed either way)
  DPLUA_ST_FUZZ_KEEP=DIR  keep every failing case's file in DIR

First a list of hand-made files, each a specific defect with the words its
error must contain (or a valid edge case that must load). Then random
cases mutated from valid files (a torch.save checkpoint, PyTorch's file of
every dtype, a hand-made one): truncations, bit flips, bogus header
lengths (0, small, the file size +-1, 2^63, 2^64-1), header edits (numbers
replaced by huge, negative, fractional or overflowing ones; dtypes replaced;
bytes deleted; JSON tokens, invalid UTF-8, lone surrogates and NULs
inserted; entries duplicated; offsets swapped; deep nesting), bytes
appended, random files, and edits of the "dplua" metadata that torch.load
decodes. Each case must either load or fail with a Lua error that names
the file; anything else (a crash, an error from inside the library's
code, a tensor larger than the file) fails the batch and is listed.

When a `dplua-asan` built from this source is there (top_builddir, or
beside the dplua running this), the random cases run once more under it
(AddressSanitizer and UBSan), so an over-read is a failure even where it
does not crash.
--]==]
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local ffi = require("ffi")
local C = torch.C

local cases = tonumber(arg and arg[1] or os.getenv("DPLUA_ST_FUZZ_CASES") or 10000)
local seed = tonumber(arg and arg[2] or os.getenv("DPLUA_ST_FUZZ_SEED") or 20240917)
local keep_dir = os.getenv("DPLUA_ST_FUZZ_KEEP")
local is_child = os.getenv("DPLUA_ST_FUZZ_CHILD") ~= nil
local BATCH = 500

local tmp = T.temp_dir("stfuzz")
local path = tmp .. "/case.safetensors"

local function write_bytes(file, s)
  -- a new file each time: truncating one makes ext4 flush it on close
  os.remove(file)
  T.write_file(file, s)
end

-- 8 little-endian bytes of n (a number or a uint64_t).
local function u64le(n)
  n = ffi.new("uint64_t", n)
  local out = {}
  for i = 1, 8 do
    out[i] = string.char(tonumber(n % 256))
    n = n / 256
  end
  return table.concat(out)
end

local function file_of(header, data) return u64le(#header) .. header .. (data or "") end

local function header_length(s)
  local n = 0
  for i = 8, 1, -1 do n = n * 256 + s:byte(i) end
  return n
end

---------------------------------------------------------------- one case

-- Every tensor in a loaded object, for the size invariant.
local function each_tensor(v, fn, seen)
  seen = seen or {}
  if torch.is_tensor(v) then return fn(v) end
  if type(v) ~= "table" or seen[v] then return end
  seen[v] = true
  for _, x in pairs(v) do each_tensor(x, fn, seen) end
end

-- Loads bytes as a file: "ok", or "error" and the message, or "bad" and
-- why it breaks the contract.
local function try(bytes)
  write_bytes(path, bytes)
  local ok, res = pcall(torch.load, path)
  if ok then
    local too_big
    each_tensor(res, function(t)
      if t:numel() * t.dtype.itemsize > #bytes then too_big = tostring(t:size()) end
    end)
    if too_big then return "bad", "a loaded tensor " .. too_big .. " is larger than the file" end
    return "ok"
  end
  if type(res) ~= "string" or res == "" then return "bad", "an error that is not a message: " .. tostring(res) end
  local msg = T.strip_location(res)
  if not msg:find(path, 1, true) then return "bad", "the error does not name the file: " .. res end
  if not (msg:find("^safetensors: ") or msg:find("^torch%.load: ")) then
    return "bad", "an error from elsewhere: " .. res
  end
  if res:find("serialization%.lua:%d+: ") and not res:find("malformed") then
    return "bad", "an error raised inside the library: " .. res
  end
  return "error", msg
end

---------------------------------------------------------------- hand-made files

local F32x2 = string.rep("\0", 8)
local function one(entry, data) return file_of('{"t":' .. entry .. '}', data) end
local deep = string.rep("[", 200) .. string.rep("]", 200)

-- { name, bytes, expected error words (nil: must load) }
local handmade = {
  { "an empty file", "", { "too short" } },
  { "7 bytes", "\8\0\0\0\0\0\0", { "too short" } },
  { "a header length past the end", u64le(100) .. "{}", { "header length 100", "larger than the 2 bytes" } },
  { "a header length of 2^64-1", u64le(0ULL - 1) .. "{}", { "header length 18446744073709551615" } },
  { "a header length of 0", u64le(0) .. "{}", { "too small" } },
  { "a header that is not an object", file_of("[1,2]"), { "does not start with '{'" } },
  { "leading whitespace", file_of(" {}"), { "does not start with '{'" } },
  { "an unterminated object", file_of('{"t":{}'), { "malformed header JSON", "unterminated object" } },
  { "a trailing comma", file_of('{"__metadata__":{"a":"b"},}'), { "malformed header JSON", "string key" } },
  { "garbage after the object", file_of('{} x'), { "after the header object" } },
  { "a duplicate key", file_of('{"__metadata__":{"a":"b","a":"c"}}'), { "duplicate key a" } },
  { "a single-quoted string", file_of("{'a':1}"), { "malformed header JSON" } },
  { "a comment", file_of('{/* x */}'), { "malformed header JSON" } },
  { "a leading zero", one('{"dtype":"F32","shape":[02],"data_offsets":[0,8]}', F32x2), { "leading zero" } },
  { "a bare minus", one('{"dtype":"F32","shape":[-],"data_offsets":[0,8]}', F32x2), { "malformed number" } },
  { "a control character in a string", file_of('{"__metadata__":{"a":"b\1"}}'), { "control character" } },
  { "a bad escape", file_of('{"__metadata__":{"a":"\\x41"}}'), { "invalid escape" } },
  { "a lone low surrogate", file_of('{"__metadata__":{"a":"\\udc00"}}'), { "lone low surrogate" } },
  { "a high surrogate alone", file_of('{"__metadata__":{"a":"\\ud800x"}}'), { "without its low surrogate" } },
  { "a short \\u escape", file_of('{"__metadata__":{"a":"\\u12"}}'), { "hex digit" } },
  { "invalid UTF-8", file_of('{"__metadata__":{"a":"\255"}}'), { "invalid UTF%-8" } },
  { "an overlong UTF-8 NUL", file_of('{"__metadata__":{"a":"\192\128"}}'), { "invalid UTF%-8" } },
  { "a UTF-8 surrogate", file_of('{"__metadata__":{"a":"\237\160\128"}}'), { "invalid UTF%-8" } },
  { "nesting 200 deep", file_of('{"__metadata__":' .. deep .. '}'), { "nesting deeper than 64" } },
  { "metadata that is not an object", file_of('{"__metadata__":[]}'), { "__metadata__", "expected an object" } },
  { "a metadata value that is not a string", file_of('{"__metadata__":{"step":5}}'), { "\"step\" is a number", "expected a string" } },
  { "a NUL in a metadata value", file_of('{"__metadata__":{"a":"x\\u0000y"}}'), { "NUL" } },
  { "a NUL in a tensor name", file_of('{"a\\u0000b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', F32x2), { "NUL" } },
  { "a tensor that is not an object", one('5'), { "tensor \"t\" is a number" } },
  { "a missing dtype", one('{"shape":[2],"data_offsets":[0,8]}', F32x2), { "missing \"dtype\"" } },
  { "a missing shape", one('{"dtype":"F32","data_offsets":[0,8]}', F32x2), { "missing \"shape\"" } },
  { "missing data_offsets", one('{"dtype":"F32","shape":[2]}', F32x2), { "missing \"data_offsets\"" } },
  { "a field name with a NUL", one('{"dtype\\u0000":"F32","shape":[2],"data_offsets":[0,8]}', F32x2), { "unexpected field \"dtype\\x00\"" } },
  { "an unexpected field", one('{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}', F32x2), { "unexpected field \"x\"" } },
  { "an unknown dtype", one('{"dtype":"F33","shape":[2],"data_offsets":[0,8]}', F32x2), { "unknown dtype \"F33\"" } },
  { "a lowercase dtype", one('{"dtype":"f32","shape":[2],"data_offsets":[0,8]}', F32x2), { "unknown dtype" } },
  { "F16 (not in dplua)", one('{"dtype":"F16","shape":[4],"data_offsets":[0,8]}', F32x2), { "F16 is not supported by dplua" } },
  { "a dtype that is a number", one('{"dtype":1,"shape":[2],"data_offsets":[0,8]}', F32x2), { "\"dtype\" is a number" } },
  { "a negative size", one('{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}', F32x2), { "not a non%-negative integer" } },
  { "a fractional size", one('{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}', F32x2), { "not a non%-negative integer" } },
  { "a size past int64", one('{"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,8]}', F32x2), { "too large" } },
  { "9 dims", one('{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]}', "\0"), { "9 dims", "at most 8" } },
  { "a shape that is not an array", one('{"dtype":"F32","shape":2,"data_offsets":[0,8]}', F32x2), { "\"shape\" is a number" } },
  { "a shape too big for its bytes", one('{"dtype":"F32","shape":[3],"data_offsets":[0,8]}', F32x2), { "needs 12 bytes", "hold 8" } },
  { "a shape whose product overflows", one('{"dtype":"F64","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,8]}', F32x2), { "needs more than 2^63 bytes" } },
  { "a zero size with bytes", one('{"dtype":"F32","shape":[0,5],"data_offsets":[0,8]}', F32x2), { "needs 0 bytes" } },
  { "offsets that end before they begin", one('{"dtype":"F32","shape":[2],"data_offsets":[8,0]}', F32x2), { "end before they begin" } },
  { "offsets past the end", one('{"dtype":"F32","shape":[2],"data_offsets":[8,16]}', F32x2), { "run past the end" } },
  { "an offset past int64", one('{"dtype":"F32","shape":[2],"data_offsets":[0,18446744073709551616]}', F32x2), { "too large" } },
  { "three offsets", one('{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}', F32x2), { "two integers" } },
  { "negative offsets", one('{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}', F32x2), { "non%-negative" } },
  { "overlapping tensors", file_of('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}', string.rep("\0", 12)),
    { "\"a\"", "\"b\"", "overlap" } },
  { "two tensors on the same bytes", file_of('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}}', F32x2),
    { "overlap" } },
  { "a hole", file_of('{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', F32x2), { "bytes 0 to 4", "belong to no tensor" } },
  { "trailing bytes", one('{"dtype":"F32","shape":[2],"data_offsets":[0,8]}', F32x2 .. "junk"), { "trailing bytes" } },
  { "data but no tensor", file_of('{}', "xyz"), { "no tensor but 3 bytes" } },
  { "a BOOL byte that is not 0 or 1", one('{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}', "\1\0\2"), { "BOOL", "0x02 at element 2" } },
  -- valid edge cases
  { "an empty header", file_of('{}'), nil },
  { "only metadata", file_of('{"__metadata__":{"a":"b"}}'), nil },
  { "padding with spaces", file_of('{}      '), nil },
  { "padding with JSON whitespace", file_of('{ "t" : { "dtype" : "F32" , "shape" : [ 2 ] , "data_offsets" : [ 0 , 8 ] } }\n\t\r ', F32x2), nil },
  { "escapes in a name", file_of('{"\\u00fc\\ud83d\\ude00\\n\\"":{"dtype":"U8","shape":[],"data_offsets":[0,1]}}', "\7"), nil },
  { "an empty tensor", one('{"dtype":"F64","shape":[0,3],"data_offsets":[0,0]}'), nil },
  { "empty tensors between others", file_of('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"e":{"dtype":"F32","shape":[0],"data_offsets":[1,1]},"b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', "\1\2"), nil },
}

local function check_handmade(c)
  local name, bytes, words = c[1], c[2], c[3]
  local kind, msg = try(bytes)
  if words == nil then
    return T.ok(kind == "ok", "loads: " .. name, msg)
  end
  local good = kind == "error"
  for _, w in ipairs(words) do good = good and msg:find(w) ~= nil end
  T.ok(good, "clear error: " .. name, ("got %s: %s\nexpected the words: %s"):format(kind, tostring(msg), table.concat(words, " | ")))
end

if not is_child then
  for _, c in ipairs(handmade) do check_handmade(c) end

  -- the loaded values of one valid edge case
  local sd = torch.load((function()
    write_bytes(path, file_of('{"\\u00fc\\ud83d\\ude00":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}}', "\1\0\0\0\255\255\255\255"))
    return path
  end)())
  T.is(sd["ü😀"] and sd["ü😀"]:tolist(), { 1, -1 }, "escaped names decode to UTF-8; values read little-endian")

  -- a header length over the 100 MB limit, in a sparse file
  local f = assert(io.open(path, "wb"))
  f:write(u64le(100000001) .. "{")
  f:seek("set", 8 + 100000001)
  f:write("x")
  f:close()
  local ok, err = pcall(torch.load, path)
  T.ok(not ok and tostring(err):find("over the limit"), "a 100 MB header is refused before it is read", tostring(err))
  os.remove(path)
end

---------------------------------------------------------------- mutations

math.randomseed(seed)
local random = math.random

local function pick(list) return list[random(#list)] end

local base_files = {}
do
  -- a checkpoint as torch.save writes it (with the "dplua" metadata)
  torch.manual_seed(5)
  local model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
  local opt = torch.optim.SGD(model:parameters(), { lr = 0.1, momentum = 0.9 })
  model(torch.randn(2, 3)):sum():backward()
  opt:step()
  torch.save({ model = model:state_dict(), optimizer = opt:state_dict(), step = 3, rng = torch.get_rng_state(),
               flags = { true, false }, b = torch.tensor({ true, false }), name = "x\1y", bytes = "\255",
               i = torch.tensor({ 1, 2 }, { dtype = torch.int64 }), h = torch.tensor({ 1.5 }):bfloat16() }, path)
  base_files[1] = T.read_file(path)
  base_files[2] = T.read_file(T.test_dir() .. "/ref/safetensors_torch_dtypes.safetensors")
  base_files[3] = file_of('{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},'
                          .. '"b":{"dtype":"U8","shape":[3],"data_offsets":[16,19]}}', string.rep("\63", 19))
end

local function split(s)
  local n = header_length(s)
  return s:sub(9, 8 + n), s:sub(9 + n)
end

local function rand_bytes(n)
  local t = {}
  for i = 1, n do t[i] = string.char(random(0, 255)) end
  return table.concat(t)
end

local BOGUS_NUMBERS = { "18446744073709551616", "18446744073709551615", "9223372036854775807", "9223372036854775808",
                        "-1", "1.5", "1e3", "007", "", "-0", "4294967296", "99999999999999999999999999", "0", "1",
                        "2147483648", "1E400" }
local TOKENS = { "{", "}", "[", "]", ",", ":", '"', "\\", "\\u", "\\ud800", "\\udc00", "null", "true", "false",
                 "1e999", "\0", "\255", "\192\128", "\237\160\128", " ", "\n", '"__metadata__"', '""', "-", "{}",
                 "[]", '"dtype"', '"F32"', "\\u0000" }
local DTYPES = { '"F32"', '"F64"', '"I64"', '"I32"', '"U8"', '"BOOL"', '"BF16"', '"F16"', '"I8"', '"X"', '""',
                 '"f32"', '"F32 "', "1", "null", "[]" }

-- Replaces the k-th match of pattern in s (a random one) by repl.
local function replace_random(s, pattern, repl)
  local spots = {}
  local init = 1
  while true do
    local a, b = s:find(pattern, init)
    if not a then break end
    spots[#spots + 1] = { a, b }
    init = b + 1
  end
  if #spots == 0 then return s end
  local sp = pick(spots)
  return s:sub(1, sp[1] - 1) .. repl .. s:sub(sp[2] + 1)
end

local header_edits = {
  number = function(h) return replace_random(h, "%-?%d+", pick(BOGUS_NUMBERS)) end,
  dtype = function(h) return replace_random(h, '"[A-Z][A-Z0-9_]*"', pick(DTYPES)) end,
  delete = function(h)
    local a = random(1, math.max(1, #h))
    return h:sub(1, a - 1) .. h:sub(a + random(1, 8))
  end,
  insert = function(h)
    local a = random(1, #h + 1)
    return h:sub(1, a - 1) .. pick(TOKENS) .. h:sub(a)
  end,
  duplicate = function(h)
    local a, b = h:find('"[^"]*":{"dtype":[^}]*}')
    if not a then return h end
    return h:sub(1, b) .. "," .. h:sub(a, b) .. h:sub(b + 1)
  end,
  swap_offsets = function(h)
    local spots, init = {}, 1
    while true do
      local a, b = h:find('"data_offsets":%[%d+,%d+%]', init)
      if not a then break end
      spots[#spots + 1] = { a, b }
      init = b + 1
    end
    if #spots < 2 then return h end
    local i = random(1, #spots - 1)
    local x, y = spots[i], spots[random(i + 1, #spots)]
    return h:sub(1, x[1] - 1) .. h:sub(y[1], y[2]) .. h:sub(x[2] + 1, y[1] - 1) .. h:sub(x[1], x[2]) .. h:sub(y[2] + 1)
  end,
  shape = function(h)
    local shapes = { "[]", "[9223372036854775807]", "[0]", "[1,1,1,1,1,1,1,1,1]", "[4294967296,4294967296]",
                     "[-1]", "[1.5]", "[null]", "{}", '"2"', "[2,2,2,2,2,2,2,2]" }
    return replace_random(h, '"shape":%[[^%]]*%]', '"shape":' .. pick(shapes))
  end,
  deep = function(h)
    local d = random(1, 300)
    return replace_random(h, '"format":"pt"', '"format":' .. string.rep("[", d) .. string.rep("]", d))
  end,
  tail = function(h) return h .. pick({ "x", "}", ",", " {}", "\0", "\n\n" }) end,
  truncate = function(h) return h:sub(1, random(0, #h)) end,
}
local header_edit_names = {}
for k in pairs(header_edits) do header_edit_names[#header_edit_names + 1] = k end
table.sort(header_edit_names)

-- Edits of the "dplua" skeleton that torch.load decodes.
local skeleton_edits = {
  function(s) return replace_random(s, '"__tensor__":"[^"]*"', pick({ '"__tensor__":"nope"', '"__tensor__":5', '"__tensor__":null', '"__tensor__":{}' })) end,
  function(s) return replace_random(s, '"__[a-z0-9]+__"', pick({ '"__what__"', '"__bytes__"', '"__odict__"', '"__table__"', '"__int64__"', '"__float__"', '"__dtype__"', '"__device__"', '"__tensor__"' })) end,
  function(s) return replace_random(s, "%[", pick({ "{", "[[", '"x"', "5", "[null," })) end,
  function(s) return replace_random(s, "%-?%d+", pick({ "1e999", "-1e999", "0.5", "-0", '"3"', "{}", "[]" })) end,
  function(s) return replace_random(s, '"[^"]*"', pick({ '{"__bytes__":"zz"}', '{"__bytes__":"abc"}', '{"__int64__":"x"}', '{"__float__":"nope"}', '{"__dtype__":"nope"}', '{"__device__":"tpu"}', '{"__odict__":5}', '{"__table__":[[1]]}', '{"__table__":[[{},1]]}' })) end,
  function(s)
    local a = random(1, #s)
    return s:sub(1, a - 1) .. s:sub(a + random(1, 4))
  end,
}

-- The file with its "dplua" metadata replaced (only the skeleton is wrong;
-- the header is re-encoded by dplua.json, tensors keep their offsets).
local json = require("dplua.json")
local function with_skeleton(bytes, skeleton)
  local h, data = split(bytes)
  local header = assert(json.decode(h))
  header.__metadata__.dplua = skeleton
  return file_of(json.encode(header), data)
end

local function skeleton_of(bytes)
  write_bytes(path, bytes)
  local _, meta = torch.load(path)
  return meta.dplua
end
local base_skeleton = skeleton_of(base_files[1])

local mutators = {
  truncate = function(s) return s:sub(1, random(0, #s - 1)) end,
  bitflip = function(s)
    local b = { s:byte(1, -1) }
    local hl = math.min(#b, 8 + header_length(s))
    for _ = 1, random(1, 8) do
      local i = random() < 0.7 and random(1, math.max(1, hl)) or random(1, #b)
      b[i] = bit.bxor(b[i], bit.lshift(1, random(0, 7)))
    end
    return string.char(unpack(b))
  end,
  header_length = function(s)
    local n = header_length(s)
    local choices = { 0, 1, 2, n - 1, n + 1, n + random(2, 64), #s - 8, #s - 7, #s, 2 ^ 32, 2 ^ 53,
                      2ULL ^ 63, 0ULL - 1, ffi.new("uint64_t", random(0, 2 ^ 31)) * 2 ^ 32 + random(0, 2 ^ 31) }
    local c = pick(choices)
    if type(c) == "number" and c < 0 then c = 0 end
    return u64le(c) .. s:sub(9)
  end,
  header_edit = function(s)
    local h, data = split(s)
    local name = pick(header_edit_names)
    for _ = 1, random(1, 3) do h = header_edits[name](h) end
    if random() < 0.85 then return file_of(h, data) end
    return s:sub(1, 8) .. h .. data   -- the old length
  end,
  append = function(s) return s .. rand_bytes(random(1, 64)) end,
  random_file = function()
    if random() < 0.5 then return rand_bytes(random(0, 80)) end
    local h = "{" .. rand_bytes(random(0, 40)) .. "}"
    return file_of(h, rand_bytes(random(0, 32)))
  end,
  skeleton = function(s)
    local sk = base_skeleton
    for _ = 1, random(1, 3) do sk = pick(skeleton_edits)(sk) end
    return with_skeleton(base_files[1], sk)
  end,
}
local mutator_names = {}
for k in pairs(mutators) do mutator_names[#mutator_names + 1] = k end
table.sort(mutator_names)

local stats = {}
for _, k in ipairs(mutator_names) do stats[k] = { ok = 0, error = 0 } end
local bad_list = {}

io.write(("# %d random cases, seed %d%s\n"):format(cases, seed, is_child and " (under dplua-asan)" or ""))
local batch_bad = {}
for i = 1, cases do
  local mname = mutator_names[(i - 1) % #mutator_names + 1]
  local src = base_files[random(#base_files)]
  local mut = mutators[mname](src)
  local kind, msg = try(mut)
  if kind == "bad" then
    batch_bad[#batch_bad + 1] = ("case %d (%s): %s"):format(i, mname, msg)
    if keep_dir then write_bytes(("%s/case-%d.safetensors"):format(keep_dir, i), mut) end
  else
    stats[mname][kind] = stats[mname][kind] + 1
  end
  if i % BATCH == 0 or i == cases then
    T.ok(#batch_bad == 0, ("random cases %d to %d: each a valid load or a clear error"):format(i - (i - 1) % BATCH, i),
         table.concat(batch_bad, "\n"))
    for _, b in ipairs(batch_bad) do bad_list[#bad_list + 1] = b end
    batch_bad = {}
  end
end
for _, k in ipairs(mutator_names) do
  io.write(("# %-14s %5d loaded, %5d refused\n"):format(k, stats[k].ok, stats[k].error))
end
if cases >= #mutator_names * 20 then
  local silent = {}
  for _, k in ipairs(mutator_names) do if stats[k].error == 0 then silent[#silent + 1] = k end end
  T.is(silent, {}, "every kind of mutation produced refused files")
end

---------------------------------------------------------------- under ASan

local function asan_binary()
  local candidates = {}
  local bd = os.getenv("top_builddir")
  if bd and bd ~= "" then candidates[#candidates + 1] = bd .. "/dplua-asan" end
  local exe = arg and arg[-1]
  if exe then candidates[#candidates + 1] = (exe:match("^(.*)/[^/]*$") or ".") .. "/dplua-asan" end
  for _, c in ipairs(candidates) do
    local f = io.open(c, "rb")
    if f then f:close(); return c end
  end
end

if not is_child then
  local asan = asan_binary()
  if not asan then
    T.skip("no dplua-asan built (make dplua-asan)", "the random cases under AddressSanitizer")
  else
    local env = "DPLUA_ST_FUZZ_CHILD=1 ASAN_OPTIONS=detect_leaks=0:abort_on_error=0 "
      .. "UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 DPLUA_TEST_DIR=" .. T.sh_quote(T.test_dir()) .. " "
    local n = math.min(cases, tonumber(os.getenv("DPLUA_ST_FUZZ_ASAN_CASES") or 4000))
    local cmd = ("%s%s %s %d %d 2>&1; echo \"exit=$?\""):format(env, T.sh_quote(asan),
      T.sh_quote(here .. "/test_safetensors_fuzz.lua"), n, seed + 1)
    local pp = io.popen(cmd)
    local out = pp:read("*a")
    pp:close()
    -- a sanitizer report is a bug wherever it comes from, so any one fails
    local report = out:match("(ERROR: AddressSanitizer[^\n]*)") or out:match("([^\n]*runtime error:[^\n]*)")
    local good = out:find("\nexit=0\n?$") ~= nil and not out:find("\nnot ok") and report == nil
    T.ok(good, ("%d random cases under dplua-asan: no over-read, no undefined behaviour"):format(n),
         not good and ((report and report .. "\n" or "") .. out:sub(-6000)) or nil)
  end
end

os.execute("rm -rf " .. T.sh_quote(tmp))
T.done_testing()
