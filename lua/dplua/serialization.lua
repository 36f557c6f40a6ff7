-- dplua.serialization: torch.save / torch.load of checkpoints in the
-- safetensors format or in PyTorch's own (the zip archive of torch.save),
-- and torch.get_rng_state / torch.set_rng_state.
--
--   torch.save({model = model:state_dict(), optimizer = opt:state_dict(),
--               scheduler = sched:state_dict(), rng = torch.get_rng_state(),
--               step = step}, "ckpt.safetensors")
--   local ck = torch.load("ckpt.safetensors")
--   model:load_state_dict(ck.model); opt:load_state_dict(ck.optimizer)
--   sched:load_state_dict(ck.scheduler); torch.set_rng_state(ck.rng)
--
-- The object is a (nested) table of tensors and plain values. Every tensor
-- is stored as a safetensors tensor under its dotted path ("model.fc1.weight",
-- "optimizer.state.0.exp_avg"; a tensor at the root is "tensor"), so
-- Python's safetensors.torch.load_file reads them, and a model state dict
-- saved on its own loads with PyTorch's model.load_state_dict(load_file(p)).
-- Everything else goes into the header's __metadata__ as JSON, under the
-- key "dplua": the object with each tensor replaced by {"__tensor__": key}.
-- See docs/CHECKPOINTS.md for the encoding and its guarantees.
--
-- Writes are atomic (C: a temporary file, fsync, rename, fsync of the
-- directory). A file without the "dplua" key (e.g. written by PyTorch)
-- loads as an ordered state dict name -> tensor, in the file's order.
--
-- PyTorch's format (torch.save(obj, "x.pt"), or {format = "torch"}) is
-- written and read by src/io/torchfile.c; the object goes through the C
-- pickler and comes back from its restricted unpickler as a tree of
-- values that is rebuilt here. torch.load tells the formats apart by the
-- file's first bytes, never by its name.
local ffi = require("ffi")
local torch = require("dplua")
local json = require("dplua.json")

local C = torch.C
local raise = torch._raise
local is_tensor = torch.is_tensor

local M = {}

local FORMAT_VERSION = "1"
local RESERVED = "^__"          -- string keys that force the general table form

local function check(st)
  if st ~= 0 then raise(ffi.string(C.dp_last_error())) end
end

local function typename(x) return is_tensor(x) and "Tensor" or type(x) end

---------------------------------------------------------------- ordered dicts

-- Module:state_dict() returns a table whose key order lives beside it
-- (dplua.nn.module); it is recognised by its keys/items methods.
local function ordered_keys(t)
  local mt = getmetatable(t)
  local idx = mt and mt.__index
  if type(idx) == "table" and type(idx.keys) == "function" and type(idx.items) == "function" then
    local ok, keys = pcall(idx.keys, t)
    if ok and type(keys) == "table" then
      for _, k in ipairs(keys) do if type(k) ~= "string" then return nil end end
      return keys
    end
  end
  return nil
end

-- A new ordered dict (the kind Module:state_dict() returns) or, when
-- dplua.nn cannot be loaded, a plain table.
local function new_ordered()
  local ok, m = pcall(require, "dplua.nn.module")
  if ok and type(m) == "table" and m.ordered_dict then return m.ordered_dict() end
  return {}
end

---------------------------------------------------------------- encoding

local function utf8_valid(s)
  if not s:find("[\128-\255]") then return true end
  local i, n = 1, #s
  while i <= n do
    local c = s:byte(i)
    local len, min
    if c < 0x80 then len = 1
    elseif c >= 0xC2 and c <= 0xDF then len, min = 2, 0x80
    elseif c >= 0xE0 and c <= 0xEF then len, min = 3, 0x800
    elseif c >= 0xF0 and c <= 0xF4 then len, min = 4, 0x10000
    else return false end
    if len > 1 then
      if i + len - 1 > n then return false end
      local cp = c % (2 ^ (7 - len))
      for j = i + 1, i + len - 1 do
        local b = s:byte(j)
        if b < 0x80 or b > 0xBF then return false end
        cp = cp * 64 + (b - 0x80)
      end
      if cp < min or cp > 0x10FFFF or (cp >= 0xD800 and cp <= 0xDFFF) then return false end
    end
    i = i + len
  end
  return true
end

local function tohex(s) return (s:gsub(".", function(c) return ("%02x"):format(c:byte()) end)) end
local function fromhex(h) return (h:gsub("..", function(x) return string.char(tonumber(x, 16)) end)) end

-- A key as it appears in a dotted tensor name.
local function key_text(k)
  if type(k) == "number" and k == k and k ~= math.huge and k ~= -math.huge then return json.number(k) end
  return tostring(k)
end

-- A tensor name must be valid UTF-8 without NULs (the C layer takes C
-- strings): other bytes are written as \xHH.
local function tensor_name(key)
  if not key:find("%z") and utf8_valid(key) then return key end
  return (key:gsub("[%z\128-\255]", function(c) return ("\\x%02x"):format(c:byte()) end))
end

-- Sorts mixed keys: numbers first (by value), then strings.
local function key_less(a, b)
  local ta, tb = type(a), type(b)
  if ta ~= tb then return ta == "number" end
  return a < b
end

-- Where a value sits in the saved object, for messages.
local function where(path) return path == "" and "the root" or ("'" .. path .. "'") end

local function is_list(t)
  local n = #t
  if n == 0 then return false end
  local count = 0
  for k in pairs(t) do
    if type(k) ~= "number" or k < 1 or k > n or k % 1 ~= 0 then return false end
    count = count + 1
  end
  return count == n
end

local dtype_mt = torch.dtype_mt
local device_mt = getmetatable(torch.device("cpu"))

-- A module, an optimizer, a scheduler: PyTorch pickles objects, a
-- checkpoint here holds data.
local function refuse_object(v, path)
  if getmetatable(v) == nil then return end
  local ok, sd = pcall(function() return v.state_dict end)
  if ok and type(sd) == "function" then
    local okn, name = pcall(function()
      if type(v._get_name) == "function" then return v:_get_name() end
      return v.__name
    end)
    raise(("torch.save: cannot save the %s at %s itself: save its :state_dict()"):format(
      okn and type(name) == "string" and name or "object", where(path)))
  end
end

local function cannot_save(v, path)
  raise(("torch.save: cannot save a %s (at %s): a checkpoint holds tensors, numbers, strings, "
         .. "booleans and tables of them"):format(type(v), where(path)))
end

-- Turns obj into a JSON-able skeleton, collecting its tensors.
local function encoder()
  local names, tensors, key_of, used = {}, {}, {}, {}
  local visiting = {}
  local enc

  local function add_tensor(t, path)
    local key = key_of[t]
    if key then return key end
    key = path ~= "" and tensor_name(path) or "tensor"
    if used[key] then
      local i = 2
      while used[key .. "~" .. i] do i = i + 1 end
      key = key .. "~" .. i
    end
    used[key] = true
    key_of[t] = key
    names[#names + 1] = key
    tensors[#tensors + 1] = t
    return key
  end

  local function child(path, k) return path == "" and key_text(k) or (path .. "." .. key_text(k)) end

  local function pairs_list(t, keys, path)
    local out = {}
    for i, k in ipairs(keys) do
      local ek = k
      if type(k) == "string" and not utf8_valid(k) then ek = { __bytes__ = tohex(k) } end
      if k == math.huge or k == -math.huge then ek = enc(k, path) end
      out[i] = { ek, enc(t[k], child(path, k)) }
    end
    return out
  end

  local function enc_table(v, path)
    if visiting[v] then raise("torch.save: the object contains itself (a cycle) at " .. where(path)) end
    if getmetatable(v) == dtype_mt then return { __dtype__ = v.name } end
    if getmetatable(v) == device_mt then return { __device__ = tostring(v) } end
    refuse_object(v, path)
    visiting[v] = true
    local out
    local okeys = ordered_keys(v)
    if okeys then
      out = { __odict__ = json.array(pairs_list(v, okeys, path)) }
    elseif next(v) == nil then
      out = {}
    elseif is_list(v) then
      out = json.array({})
      for i = 1, #v do out[i] = enc(v[i], child(path, i)) end
    else
      local keys, plain = {}, true
      for k in pairs(v) do
        local tk = type(k)
        if tk ~= "string" and not (tk == "number" and k == k) then
          raise(("torch.save: a table at %s has a key of type %s; keys must be strings or numbers"):format(
            where(path), tk))
        end
        if tk ~= "string" or k:find(RESERVED) or not utf8_valid(k) then plain = false end
        keys[#keys + 1] = k
      end
      table.sort(keys, key_less)
      if plain then
        out = {}
        for _, k in ipairs(keys) do out[k] = enc(v[k], child(path, k)) end
      else
        out = { __table__ = json.array(pairs_list(v, keys, path)) }
      end
    end
    visiting[v] = nil
    return out
  end

  enc = function(v, path)
    local tv = type(v)
    if is_tensor(v) then return { __tensor__ = add_tensor(v, path) } end
    if tv == "number" then
      if v ~= v then return { __float__ = "nan" } end
      if v == math.huge then return { __float__ = "inf" } end
      if v == -math.huge then return { __float__ = "-inf" } end
      return v
    elseif tv == "boolean" then
      return v
    elseif tv == "string" then
      if utf8_valid(v) then return v end
      return { __bytes__ = tohex(v) }
    elseif tv == "table" then
      return enc_table(v, path)
    elseif tv == "cdata" and ffi.istype("int64_t", v) then
      return { __int64__ = tostring(v):gsub("LL$", "") }
    elseif tv == "cdata" and ffi.istype("uint64_t", v) then
      return { __uint64__ = tostring(v):gsub("ULL$", "") }
    end
    cannot_save(v, path)
  end

  return enc, names, tensors
end

---------------------------------------------------------------- save

local function check_path(fn, path)
  if type(path) ~= "string" then raise(("%s: expected a file path (a string), got %s"):format(fn, typename(path))) end
  if path == "" then raise(fn .. ": expected a file path, got an empty string") end
end

-- The safetensors form: the tensors under their dotted paths, the rest
-- as JSON in the metadata.
local function save_safetensors(obj, path)
  local enc, names, tensors = encoder()
  local skeleton = json.encode(enc(obj, ""))
  local n = #names
  local cnames = ffi.new("const char *[?]", n + 1)
  local cts = ffi.new("dp_tensor *[?]", n + 1)
  for i = 1, n do
    cnames[i - 1] = names[i]
    cts[i - 1] = tensors[i].p
  end
  local mkeys = { "format", "dplua_format", "dplua_version", "dplua" }
  local mvals = { "pt", FORMAT_VERSION, torch.__version__, skeleton }
  local ck = ffi.new("const char *[4]", mkeys)
  local cv = ffi.new("const char *[4]", mvals)
  check(C.dp_safetensors_save(path, n, cnames, cts, 4, ck, cv))
  -- names, tensors, mkeys and mvals stay referenced until here
end

local INT_LIMIT = 2 ^ 53     -- integral numbers below it are Python ints
local INT64_MAX = 0x7fffffffffffffffULL

-- PyTorch's form: obj pickled as torch.save pickles the same Python value
-- (a Lua list is a list, a Module:state_dict() an OrderedDict, any other
-- table a dict; integral numbers are ints, others floats).
local function save_torch(obj, path)
  local wp = ffi.new("dp_torchwriter *[1]")
  check(C.dp_torchwriter_new(wp))
  local w = ffi.gc(wp[0], C.dp_torchwriter_free)
  local visiting = {}
  local put

  local function child(p, k) return p == "" and key_text(k) or (p .. "." .. key_text(k)) end

  local function put_key(k, p)
    if type(k) == "string" then return put(k, p) end
    if type(k) == "number" and k == k then return put(k, p) end
    raise(("torch.save: a table at %s has a key of type %s; keys must be strings or numbers"):format(where(p), type(k)))
  end

  local function put_table(v, p)
    if visiting[v] then raise("torch.save: the object contains itself (a cycle) at " .. where(p)) end
    if getmetatable(v) == dtype_mt then return check(C.dp_torchwriter_dtype(w, v.id)) end
    if getmetatable(v) == device_mt then return check(C.dp_torchwriter_device(w, v.type, v.index or -1)) end
    refuse_object(v, p)
    visiting[v] = true
    local okeys = ordered_keys(v)
    if okeys then
      check(C.dp_torchwriter_begin(w, C.DP_PY_ODICT))
      for _, k in ipairs(okeys) do put(k, p); put(v[k], child(p, k)) end
    elseif is_list(v) then
      check(C.dp_torchwriter_begin(w, C.DP_PY_LIST))
      for i = 1, #v do put(v[i], child(p, i)) end
    else
      local keys = {}
      for k in pairs(v) do keys[#keys + 1] = k end
      for _, k in ipairs(keys) do
        if type(k) ~= "string" and not (type(k) == "number" and k == k) then put_key(k, p) end
      end
      table.sort(keys, key_less)
      check(C.dp_torchwriter_begin(w, C.DP_PY_DICT))
      for _, k in ipairs(keys) do put_key(k, p); put(v[k], child(p, k)) end
    end
    check(C.dp_torchwriter_end(w))
    visiting[v] = nil
  end

  put = function(v, p)
    local tv = type(v)
    if is_tensor(v) then
      check(C.dp_torchwriter_tensor(w, v.p))
    elseif tv == "number" then
      if v % 1 == 0 and math.abs(v) < INT_LIMIT and (v ~= 0 or 1 / v > 0) then
        check(C.dp_torchwriter_int(w, v))
      else
        check(C.dp_torchwriter_float(w, v))
      end
    elseif tv == "boolean" then
      check(C.dp_torchwriter_bool(w, v and 1 or 0))
    elseif tv == "string" then
      if not utf8_valid(v) then
        raise(("torch.save: the string at %s is not valid UTF-8, which a Python str must be; "
               .. "save it in the safetensors format"):format(where(p)))
      end
      check(C.dp_torchwriter_str(w, v, #v))
    elseif tv == "table" then
      put_table(v, p)
    elseif tv == "cdata" and ffi.istype("int64_t", v) then
      check(C.dp_torchwriter_int(w, v))
    elseif tv == "cdata" and ffi.istype("uint64_t", v) then
      if v > INT64_MAX then raise(("torch.save: the uint64 at %s is over 2^63-1"):format(where(p))) end
      check(C.dp_torchwriter_int(w, v))
    else
      cannot_save(v, p)
    end
  end

  put(obj, "")
  check(C.dp_torchwriter_save(w, path))
end

local FORMATS = { safetensors = save_safetensors, torch = save_torch }

-- The format a path's name asks for: PyTorch's for .pt and .pth (what
-- PyTorch users load with torch.load), safetensors for anything else.
local function default_format(path)
  local ext = path:match("%.([%w]+)$")
  ext = ext and ext:lower()
  if ext == "pt" or ext == "pth" then return "torch" end
  return "safetensors"
end

-- torch.save(obj, path [, {format = "torch" | "safetensors"}]): obj a
-- tensor, or a table of tensors and plain values (nested), written
-- atomically to path.
function M.save(obj, path, opts)
  check_path("torch.save", path)
  if obj == nil then raise("torch.save: expected an object to save, got nil") end
  if opts ~= nil and type(opts) ~= "table" then
    raise("torch.save: expected options as a table ({format = \"torch\"}), got " .. typename(opts))
  end
  local format = opts and opts.format or default_format(path)
  local save = FORMATS[format]
  if not save then
    raise(("torch.save: unknown format %s (expected \"torch\" or \"safetensors\")"):format(tostring(format)))
  end
  save(obj, path)
  return nil
end

---------------------------------------------------------------- load

-- Reads every tensor and the metadata of a safetensors file.
local function read_file(path)
  local pp = ffi.new("dp_safetensors *[1]")
  check(C.dp_safetensors_open(pp, path))
  local f = ffi.gc(pp[0], C.dp_safetensors_close)
  local names, by_name, meta = {}, {}, {}
  local ok, err = pcall(function()
    for i = 0, C.dp_safetensors_metadata_count(f) - 1 do
      meta[ffi.string(C.dp_safetensors_metadata_key(f, i))] = ffi.string(C.dp_safetensors_metadata_value(f, i))
    end
    local out = ffi.new("dp_tensor *[1]")
    for i = 0, C.dp_safetensors_count(f) - 1 do
      local name = ffi.string(C.dp_safetensors_name(f, i))
      check(C.dp_safetensors_tensor(out, f, i))
      names[#names + 1] = name
      by_name[name] = torch._wrap(out[0])
    end
  end)
  ffi.gc(f, nil)
  C.dp_safetensors_close(f)
  if not ok then error(err, 0) end
  return names, by_name, meta
end

-- Rebuilds the object from the skeleton; anything unexpected in it is a
-- "malformed" error naming the file.
local function decoder(path, by_name)
  local dec
  local function bad(what) error(what, 0) end
  local function hex(x)
    if type(x) ~= "string" or #x % 2 ~= 0 or x:find("[^%x]") then bad("a malformed __bytes__") end
    return fromhex(x)
  end
  local function dec_key(k)
    if type(k) == "table" then k = dec(k) end   -- {"__bytes__": ...} or {"__float__": ...}
    if type(k) ~= "string" and type(k) ~= "number" or k ~= k then bad("a table key that is " .. type(k)) end
    return k
  end
  local function dec_pairs(list, into)
    if type(list) ~= "table" then bad("a pair list that is not a list") end
    for _, kv in ipairs(list) do
      if type(kv) ~= "table" or #kv ~= 2 then bad("a key-value pair that is not a pair") end
      local k = dec_key(kv[1])
      into[k] = dec(kv[2])
    end
    return into
  end
  dec = function(v)
    if v == json.null then return nil end
    if type(v) ~= "table" then return v end
    local tag = next(v)
    if type(tag) == "string" and next(v, tag) == nil and tag:find(RESERVED) then
      local x = v[tag]
      if tag == "__tensor__" then
        local t = by_name[x]
        if t == nil then bad(("it refers to tensor '%s', which the file does not hold"):format(tostring(x))) end
        return t
      elseif tag == "__float__" then
        if x == "nan" then return 0 / 0 elseif x == "inf" then return math.huge elseif x == "-inf" then return -math.huge end
        bad("an unknown __float__ " .. tostring(x))
      elseif tag == "__int64__" or tag == "__uint64__" then
        if type(x) ~= "string" or not x:find("^%-?%d+$") then bad("a malformed " .. tag) end
        local neg = x:sub(1, 1) == "-"
        -- its digits against the type's limit, so that none wraps around
        local digits = x:gsub("^%-", ""):gsub("^0+(%d)", "%1")
        local limit = tag == "__uint64__" and (neg and "0" or "18446744073709551615")
                      or (neg and "9223372036854775808" or "9223372036854775807")
        if #digits > #limit or (#digits == #limit and digits > limit) then
          bad(("a %s out of range: %s"):format(tag, x))
        end
        local r = tag == "__int64__" and ffi.new("int64_t", 0) or ffi.new("uint64_t", 0)
        for d in x:gmatch("%d") do r = r * 10 + tonumber(d) end
        return neg and -r or r
      elseif tag == "__bytes__" then
        return hex(x)
      elseif tag == "__dtype__" then
        local d = type(x) == "string" and rawget(torch, x)
        if getmetatable(d) ~= dtype_mt then bad("an unknown dtype " .. tostring(x)) end
        return d
      elseif tag == "__device__" then
        local ok, d = pcall(torch.device, x)
        if not ok then bad("an unknown device " .. tostring(x)) end
        return d
      elseif tag == "__odict__" then
        return dec_pairs(x, new_ordered())
      elseif tag == "__table__" then
        return dec_pairs(x, {})
      end
      bad("an unknown tag " .. tag)
    end
    local out = {}
    for k, x in pairs(v) do out[k] = dec(x) end
    return out
  end
  return dec
end

-- A safetensors file: the object, and the file's __metadata__.
local function load_safetensors(path, device)
  local names, by_name, meta = read_file(path)
  if device ~= nil then
    for _, name in ipairs(names) do by_name[name] = by_name[name]:to(device) end
  end
  local skeleton = meta.dplua
  if skeleton == nil then
    local sd = new_ordered()
    for _, name in ipairs(names) do sd[name] = by_name[name] end
    return sd, meta
  end
  local tree, err = json.decode(skeleton)
  if tree == nil then
    raise(("torch.load: '%s': the \"dplua\" metadata is not valid JSON: %s"):format(path, tostring(err)))
  end
  local ok, obj = pcall(decoder(path, by_name), tree)
  if not ok then
    raise(("torch.load: '%s': the \"dplua\" metadata is malformed: %s"):format(path, tostring(obj)))
  end
  return obj, meta
end

local MAX_DEPTH = 1000
local K = {}
for _, name in ipairs({ "NONE", "BOOL", "INT", "FLOAT", "STR", "BYTES", "LIST", "TUPLE", "DICT", "ODICT",
                        "TENSOR", "DTYPE", "DEVICE" }) do
  K[tonumber(C["DP_PY_" .. name])] = name
end

-- Python's values as Lua's: None is nil, lists and tuples are lists,
-- dicts with string keys ordered dicts (their order kept), other dicts
-- tables; ints beyond 2^53 stay int64 cdata so that none is rounded.
local function rebuild(f, path, device)
  local memo, depth = {}, 0
  local value
  local function bad(what) raise(("torch.load: '%s': %s"):format(path, what)) end

  local function scalar(n, kind)
    if kind == "BOOL" then return C.dp_torchfile_int(f, n) ~= 0 end
    if kind == "INT" then
      local i = C.dp_torchfile_int(f, n)
      if i >= -INT_LIMIT and i <= INT_LIMIT then return tonumber(i) end
      return i
    end
    if kind == "FLOAT" then return C.dp_torchfile_float(f, n) end
    local len = ffi.new("size_t[1]")
    local s = ffi.string(C.dp_torchfile_str(f, n, len), len[0])
    if kind == "DTYPE" then
      local d = rawget(torch, s)
      if getmetatable(d) ~= dtype_mt then bad(("it holds the dtype torch.%s, which dplua lacks"):format(s)) end
      return d
    end
    if kind == "DEVICE" then return torch.device(s) end
    return s
  end

  local function dict(n, kind)
    local len, all_str = C.dp_torchfile_len(f, n), true
    for i = 0, len - 1 do
      local kk = K[C.dp_torchfile_kind(f, C.dp_torchfile_item(f, n, 2 * i))]
      if kk ~= "STR" then all_str = false end
      if kk ~= "STR" and kk ~= "INT" and kk ~= "FLOAT" and kk ~= "BOOL" and kk ~= "BYTES" then
        bad(("it holds a dict whose key is a %s; keys must be strings or numbers"):format((kk or "?"):lower()))
      end
    end
    local t = all_str and (len > 0 or kind == "ODICT") and new_ordered() or {}
    memo[n] = t
    for i = 0, len - 1 do
      local k = value(C.dp_torchfile_item(f, n, 2 * i))
      if k ~= k then bad("it holds a dict whose key is NaN") end
      t[k] = value(C.dp_torchfile_item(f, n, 2 * i + 1))
    end
    return t
  end

  value = function(n)
    local kind = K[C.dp_torchfile_kind(f, n)]
    if kind == nil then bad("the pickle holds a value that torch.load does not know") end
    if kind == "NONE" then return nil end
    if memo[n] ~= nil then return memo[n] end
    if kind == "TENSOR" then
      local out = ffi.new("dp_tensor *[1]")
      local st = C.dp_torchfile_tensor(out, f, n)
      if st ~= 0 then raise("torch.load: " .. ffi.string(C.dp_last_error())) end
      local t = torch._wrap(out[0])
      if device ~= nil then t = t:to(device) end
      memo[n] = t
      return t
    end
    if kind ~= "LIST" and kind ~= "TUPLE" and kind ~= "DICT" and kind ~= "ODICT" then return scalar(n, kind) end
    depth = depth + 1
    if depth > MAX_DEPTH then bad(("it nests containers more than %d deep"):format(MAX_DEPTH)) end
    local t
    if kind == "DICT" or kind == "ODICT" then
      t = dict(n, kind)
    else
      t = {}
      memo[n] = t
      for i = 0, C.dp_torchfile_len(f, n) - 1 do t[i + 1] = value(C.dp_torchfile_item(f, n, i)) end
    end
    depth = depth - 1
    return t
  end

  return value(C.dp_torchfile_root(f))
end

local function load_torch(path, device)
  local pp = ffi.new("dp_torchfile *[1]")
  if C.dp_torchfile_open(pp, path) ~= 0 then raise("torch.load: " .. ffi.string(C.dp_last_error())) end
  local f = ffi.gc(pp[0], C.dp_torchfile_close)
  local ok, obj = pcall(rebuild, f, path, device)
  ffi.gc(f, nil)
  C.dp_torchfile_close(f)
  if not ok then error(obj, 0) end
  return obj
end

-- torch.load(path [, map_location | {map_location = device}]): the saved
-- object, in whichever format the file is. A safetensors file without
-- dplua's metadata gives an ordered state dict name -> tensor, and its
-- __metadata__ (string -> string) as a second result.
function M.load(path, opts)
  check_path("torch.load", path)
  local device
  if type(opts) == "table" and getmetatable(opts) ~= device_mt then
    device = opts.map_location
  elseif opts ~= nil then
    device = opts
  end
  if device ~= nil and type(device) ~= "string" and getmetatable(device) ~= device_mt then
    raise("torch.load: expected map_location to be a device (\"cpu\", \"cuda\", \"cuda:N\"), got " .. typename(device))
  end
  if device ~= nil then device = torch.device(device) end
  if C.dp_torchfile_sniff(path) ~= 0 then return load_torch(path, device) end
  return load_safetensors(path, device)
end

---------------------------------------------------------------- RNG state

-- The state of the (counter-based) generator: a uint8 tensor of 16 bytes,
-- the 64-bit seed then the 64-bit offset, little-endian; like PyTorch's
-- get_rng_state() it is a ByteTensor, so it fits in a checkpoint.
local u64pair = ffi.new("uint64_t[2]")
function M.get_rng_state()
  C.dp_rng_get_state(u64pair, u64pair + 1)
  local t = torch.empty(16, { dtype = torch.uint8 })
  ffi.copy(C.dp_tensor_data(t.p), u64pair, 16)
  return t
end

function M.set_rng_state(state)
  if not is_tensor(state) or state.dtype ~= torch.uint8 or state:numel() ~= 16 then
    raise(("set_rng_state: expected the uint8 tensor of 16 bytes that get_rng_state returns, got %s"):format(
      is_tensor(state) and (tostring(state.dtype) .. " " .. tostring(state:size())) or typename(state)))
  end
  local c = state:cpu():contiguous()
  ffi.copy(u64pair, C.dp_tensor_data(c.p), 16)
  C.dp_rng_set_state(u64pair[0], u64pair[1])
end

return M
