-- dplua.objects: the bytes that the object collectives of
-- dplua.distributed (all_gather_object, broadcast_object_list,
-- gather_object, scatter_object_list) send for a Lua value.
--
--   local bytes = objects.encode({ step = 3, name = "x", t = torch.ones(2) })
--   local value = objects.decode(bytes)
--
-- A value is nil, a boolean, a number, a string, a CPU or CUDA tensor
-- (received on the CPU, as its dtype, shape and contents) or a table of
-- such values (keys too), nested; a table with a metatable, a cycle, a
-- function, a coroutine, userdata or cdata is refused by name. Decoding
-- reads the format below and nothing else: received bytes are data, never
-- code, and malformed bytes are an error that says where.
--
-- Format: one tag byte per value, then
--   "0" nil, "f" false, "t" true
--   "d" a number: 8 bytes of a double (the sender's byte order: the ranks
--       of one job share one)
--   "s" a string: its length as a decimal, ":", the bytes
--   "T" a table: its number of pairs as a decimal, ":", key, value, ...
--   "X" a tensor: the dtype's name as a string value, the number of dims
--       as a decimal, ":", each size as a decimal followed by ":", then
--       the contiguous bytes of the data as a string value
local ffi = require("ffi")
local torch = require("dplua")
local raise = torch._raise
local is_tensor = torch.is_tensor
local C = torch.C

local M = {}

local double_box = ffi.new("double[1]")

local function kind_of(v) return is_tensor(v) and "a tensor" or "a " .. type(v) end

local function encode_into(out, v, path, seen)
  local t = type(v)
  if v == nil then out[#out + 1] = "0"
  elseif t == "boolean" then out[#out + 1] = v and "t" or "f"
  elseif t == "number" then
    double_box[0] = v
    out[#out + 1] = "d" .. ffi.string(double_box, 8)
  elseif t == "string" then out[#out + 1] = "s" .. #v .. ":" .. v
  elseif is_tensor(v) then
    local c = v:detach():cpu():contiguous()
    local dims = c:size()
    out[#out + 1] = "X"
    encode_into(out, c.dtype.name, path, seen)
    out[#out + 1] = #dims .. ":"
    for _, d in ipairs(dims) do out[#out + 1] = d .. ":" end
    local n = c:numel() * c:element_size()
    encode_into(out, n > 0 and ffi.string(C.dp_tensor_data(c.p), n) or "", path, seen)
  elseif t == "table" then
    if getmetatable(v) ~= nil then
      raise(string.format("objects: %s is a table with a metatable (a class instance or a module), which cannot be " ..
                          "sent; send its plain fields (e.g. a state_dict's tensors) instead", path))
    end
    if seen[v] then raise(string.format("objects: %s refers back to a table that contains it (a cycle)", path)) end
    seen[v] = true
    local n = 0
    for _ in pairs(v) do n = n + 1 end
    out[#out + 1] = "T" .. n .. ":"
    for k, x in pairs(v) do
      local sub = path .. "[" .. (type(k) == "string" and string.format("%q", k) or tostring(k)) .. "]"
      encode_into(out, k, sub .. " (its key)", seen)
      encode_into(out, x, sub, seen)
    end
    seen[v] = nil
  else
    raise(string.format("objects: %s is %s, which cannot be sent (expected nil, a boolean, a number, a string, a " ..
                        "tensor or a table of those)", path, kind_of(v)))
  end
end

-- encode(value): the bytes of value, as a Lua string.
function M.encode(v)
  local out = {}
  encode_into(out, v, "the object", {})
  return table.concat(out)
end

local function decoder(s)
  local pos = 1
  local function bad(what) raise(string.format("objects: malformed bytes at offset %d of %d: %s", pos - 1, #s, what)) end
  local function count()
    local digits = s:match("^%d+", pos)
    if not digits or s:sub(pos + #digits, pos + #digits) ~= ":" or #digits > 15 then bad("expected a count") end
    pos = pos + #digits + 1
    return tonumber(digits)
  end
  local value
  local function take(n)
    if pos + n - 1 > #s then bad("expected " .. n .. " more bytes") end
    local chunk = s:sub(pos, pos + n - 1)
    pos = pos + n
    return chunk
  end
  local function string_value()
    if take(1) ~= "s" then pos = pos - 1; bad("expected a string") end
    return take(count())
  end
  function value(depth)
    if depth > 200 then bad("nested more than 200 tables deep") end
    local tag = take(1)
    if tag == "0" then return nil
    elseif tag == "f" then return false
    elseif tag == "t" then return true
    elseif tag == "d" then
      ffi.copy(double_box, take(8), 8)
      return double_box[0]
    elseif tag == "s" then return take(count())
    elseif tag == "T" then
      local t, n = {}, count()
      for _ = 1, n do
        local k = value(depth + 1)
        if k == nil or k ~= k then bad("a table key that is nil or NaN") end
        t[k] = value(depth + 1)
      end
      return t
    elseif tag == "X" then
      local name = string_value()
      local dtype = torch[name]
      if type(name) ~= "string" or not name:match("^%l[%w]*$") or getmetatable(dtype) == nil or
         getmetatable(dtype) ~= getmetatable(torch.float32) then
        bad("unknown dtype '" .. tostring(name) .. "'")
      end
      local ndim = count()
      if ndim > 64 then bad("a tensor of " .. ndim .. " dims") end
      local shape = {}
      for i = 1, ndim do shape[i] = count() end
      local data = string_value()
      local t = torch.empty(shape, { dtype = dtype })
      if #data ~= t:numel() * t:element_size() then bad("a tensor whose data does not match its shape and dtype") end
      if #data > 0 then ffi.copy(C.dp_tensor_data(t.p), data, #data) end
      return t
    end
    pos = pos - 1
    bad("unknown tag " .. string.format("%q", tag))
  end
  return function()
    local v = value(0)
    if pos <= #s then bad("bytes left after the object") end
    return v
  end
end

-- decode(bytes): the value that encode turned into bytes.
function M.decode(s)
  if type(s) ~= "string" then raise("objects.decode: expected a string of bytes, got " .. type(s)) end
  return decoder(s)()
end

return M
