-- dplua.json: a small, strict JSON encoder and decoder (RFC 8259).
--
--   local json = require("dplua.json")
--   json.encode({lr = 1e-3, batch = 64})       --> {"batch":64,"lr":0.001}
--   local v, err = json.decode('{"a":[1,2,null]}')
--   v.a[3] == json.null                        --> true
--
-- It serves the files that sweeps, torch.report and the metrics logger
-- write (one JSON value per line), so it favours exactness over speed:
--
-- * Numbers are written as integers when they are integers (up to 2^53),
--   else with 15, 16 or 17 digits, the first that reads back to the same
--   double, so a
--   value survives encode -> decode -> encode unchanged. NaN and the
--   infinities have no JSON form: they are written as null (as JavaScript's
--   JSON.stringify does).
-- * A table is an array when its keys are exactly 1..n (n > 0), and an
--   object when all its keys are strings. An empty table is an object `{}`
--   unless it is json.array({}). Object keys come out sorted, so the same
--   table always gives the same text; opts.order lists keys to put first
--   in the outermost object.
-- * Strings are bytes; invalid UTF-8 is replaced by U+FFFD when encoding,
--   and rejected when decoding. Control characters are escaped.
-- * decode() accepts exactly one JSON value (surrounding whitespace aside):
--   no comments, trailing commas, single quotes, NaN, leading zeros or
--   unescaped control characters. On bad input it returns nil and a message
--   with the line and column. null becomes json.null (a sentinel), so that
--   arrays keep their length.
local json = {}

local byte, char, sub, find, format = string.byte, string.char, string.sub, string.find, string.format
local concat, sort = table.concat, table.sort
local floor, huge = math.floor, math.huge
local tostring, tonumber, type, pairs, next = tostring, tonumber, type, pairs, next

-- The value that stands for JSON null inside decoded tables.
json.null = setmetatable({}, { __tostring = function() return "null" end,
                               __newindex = function() error("json.null is read-only", 2) end })

local array_mt = { __jsontype = "array" }
-- Marks t (default: a new table) to be written as an array even when empty.
function json.array(t) return setmetatable(t or {}, array_mt) end

---------------------------------------------------------------- encoding

local escapes = {
  ['"'] = '\\"', ["\\"] = "\\\\", ["\b"] = "\\b", ["\f"] = "\\f",
  ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t",
}
for i = 0, 31 do
  local c = char(i)
  if not escapes[c] then escapes[c] = format("\\u%04x", i) end
end
escapes["\127"] = "\\u007f"

-- s with every invalid UTF-8 sequence replaced by U+FFFD.
local function fix_utf8(s)
  if not find(s, "[\128-\255]") then return s end
  local out, i, n = {}, 1, #s
  while i <= n do
    local c = byte(s, i)
    local len, min = 1, 0
    if c >= 0xF0 and c <= 0xF4 then len, min = 4, 0x10000
    elseif c >= 0xE0 then len, min = 3, 0x800
    elseif c >= 0xC2 and c < 0xE0 then len, min = 2, 0x80
    elseif c >= 0x80 then len = 0 end
    local cp, ok = c, len > 0
    if len > 1 then
      cp = c % (2 ^ (7 - len))
      for k = 1, len - 1 do
        local d = byte(s, i + k)
        if not d or d < 0x80 or d > 0xBF then ok = false; break end
        cp = cp * 64 + d % 64
      end
      ok = ok and cp >= min and cp <= 0x10FFFF and not (cp >= 0xD800 and cp <= 0xDFFF)
    end
    if ok then
      out[#out + 1] = sub(s, i, i + len - 1)
      i = i + len
    else
      out[#out + 1] = "\239\191\189"
      i = i + 1
    end
  end
  return concat(out)
end

local function encode_string(s)
  return '"' .. fix_utf8(s):gsub('[%c"\\]', escapes) .. '"'
end

-- A decimal that reads back as x: the shortest of 15, 16, 17 digits.
local function encode_number(x)
  if x ~= x or x == huge or x == -huge then return "null" end
  if x == floor(x) and x >= -2^53 and x <= 2^53 then
    if x == 0 and 1 / x < 0 then return "-0" end
    return format("%d", x)
  end
  for digits = 15, 17 do
    local s = format("%." .. digits .. "g", x)
    if tonumber(s) == x then return s end
  end
  return format("%.17g", x)
end
json.number = encode_number

-- sorted_keys(t): t's keys in a stable order (by their string forms), as
-- listings and tables shown to people want them.
function json.sorted_keys(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  return keys
end

local function is_array(t)
  local n = #t
  if n == 0 then return getmetatable(t) == array_mt and next(t) == nil end
  local count = 0
  for k in pairs(t) do
    if type(k) ~= "number" or k < 1 or k > n or k ~= floor(k) then return false end
    count = count + 1
  end
  return count == n
end

local encode_value

-- The deepest nesting decode takes, and so encode writes (seen.depth: the
-- tables open around the one being written).
local MAX_DEPTH = 200

local function encode_table(t, opts, seen, path, out)
  if seen[t] then error("json.encode: " .. path .. " contains itself (a cycle)", 0) end
  if seen.depth >= MAX_DEPTH then error("json.encode: " .. path .. " is nested deeper than " .. MAX_DEPTH, 0) end
  seen[t] = true
  seen.depth = seen.depth + 1
  local rank = opts.rank
  opts.rank = nil            -- opts.order applies to the outermost object only
  if is_array(t) then
    out[#out + 1] = "["
    for i = 1, #t do
      if i > 1 then out[#out + 1] = "," end
      encode_value(t[i], opts, seen, path .. "[" .. i .. "]", out)
    end
    out[#out + 1] = "]"
  else
    local keys = {}
    for k in pairs(t) do
      if type(k) ~= "string" then
        error(format("json.encode: %s has a key of type %s (%s); objects need string keys, arrays keys 1..n",
                     path, type(k), tostring(k)), 0)
      end
      keys[#keys + 1] = k
    end
    if rank then
      sort(keys, function(a, b)
        local ra, rb = rank[a] or huge, rank[b] or huge
        if ra ~= rb then return ra < rb end
        return a < b
      end)
    else
      sort(keys)
    end
    out[#out + 1] = "{"
    for i, k in ipairs(keys) do
      if i > 1 then out[#out + 1] = "," end
      out[#out + 1] = encode_string(k)
      out[#out + 1] = ":"
      encode_value(t[k], opts, seen, path .. "." .. k, out)
    end
    out[#out + 1] = "}"
  end
  opts.rank = rank
  seen[t] = nil
  seen.depth = seen.depth - 1
end

-- The functions that walk tables with pairs run interpreted: Debian 12's
-- LuaJIT (2.1.0-beta3, git 2022-03-20) has the bug of LuaJIT issue 827,
-- where a pairs loop whose trace is blacklisted can end early under the
-- JIT, so that a table is written with keys missing (seen: `{}` for a
-- one-key table in about one run in five of a DataLoader stress test).
-- Writing JSON is not where a program's time goes.
jit.off(is_array)
jit.off(encode_table)
jit.off(json.sorted_keys)

function encode_value(v, opts, seen, path, out)
  local ty = type(v)
  if v == nil or v == json.null then
    out[#out + 1] = "null"
  elseif ty == "boolean" then
    out[#out + 1] = v and "true" or "false"
  elseif ty == "number" then
    out[#out + 1] = encode_number(v)
  elseif ty == "string" then
    out[#out + 1] = encode_string(v)
  elseif ty == "table" then
    encode_table(v, opts, seen, path, out)
  elseif ty == "cdata" and tonumber(v) then   -- 64-bit integers, numbers from C
    out[#out + 1] = encode_number(tonumber(v))
  else
    error(format("json.encode: %s is a %s, which JSON cannot hold", path, ty), 0)
  end
end

-- The JSON text of v on one line. opts.order: a list of keys to put first
-- in the outermost object (in that order); the others, and the keys of
-- nested objects, follow sorted.
function json.encode(v, opts)
  local o = {}
  if opts and opts.order then
    o.rank = {}
    for i, k in ipairs(opts.order) do o.rank[k] = i end
  end
  local out = {}
  encode_value(v, o, { depth = 0 }, "value", out)
  return concat(out)
end

---------------------------------------------------------------- decoding

-- Decoding errors carry the position; they are raised inside and turned
-- into nil, message by json.decode.
local function position(s, i)
  local line, col = 1, 1
  local last = 1
  while true do
    local nl = find(s, "\n", last, true)
    if not nl or nl >= i then break end
    line, last = line + 1, nl + 1
  end
  col = i - last + 1
  return line, col
end

local function fail(s, i, what)
  local line, col = position(s, i)
  local near = i <= #s and format(" near %q", sub(s, i, i + 9)) or " at the end of the text"
  error({ json_error = format("line %d column %d: %s%s", line, col, what, near) }, 0)
end

local function skip_ws(s, i)
  return (find(s, "[^ \t\r\n]", i)) or #s + 1
end

local unescape = { ['"'] = '"', ["\\"] = "\\", ["/"] = "/", b = "\b", f = "\f", n = "\n", r = "\r", t = "\t" }

local function utf8_char(cp)
  if cp < 0x80 then return char(cp) end
  if cp < 0x800 then return char(0xC0 + floor(cp / 64), 0x80 + cp % 64) end
  if cp < 0x10000 then
    return char(0xE0 + floor(cp / 4096), 0x80 + floor(cp / 64) % 64, 0x80 + cp % 64)
  end
  return char(0xF0 + floor(cp / 262144), 0x80 + floor(cp / 4096) % 64, 0x80 + floor(cp / 64) % 64, 0x80 + cp % 64)
end

local function decode_string(s, i)
  -- s:sub(i, i) is the opening quote
  local parts, j = {}, i + 1
  while true do
    local k = find(s, '["\\%c]', j)
    if not k then fail(s, i, "unterminated string") end
    if k > j then parts[#parts + 1] = sub(s, j, k - 1) end
    local c = sub(s, k, k)
    if c == '"' then
      local str = concat(parts)
      if fix_utf8(str) ~= str then fail(s, i, "string is not valid UTF-8") end
      return str, k + 1
    elseif c == "\\" then
      local e = sub(s, k + 1, k + 1)
      if unescape[e] then
        parts[#parts + 1] = unescape[e]
        j = k + 2
      elseif e == "u" then
        local hex = sub(s, k + 2, k + 5)
        if not find(hex, "^%x%x%x%x$") then fail(s, k, "bad \\u escape") end
        local cp = tonumber(hex, 16)
        j = k + 6
        if cp >= 0xD800 and cp <= 0xDBFF then
          local lo = sub(s, j, j + 1) == "\\u" and sub(s, j + 2, j + 5)
          local lcp = lo and find(lo, "^%x%x%x%x$") and tonumber(lo, 16)
          if not lcp or lcp < 0xDC00 or lcp > 0xDFFF then fail(s, k, "unpaired surrogate in \\u escape") end
          cp = 0x10000 + (cp - 0xD800) * 1024 + (lcp - 0xDC00)
          j = j + 6
        elseif cp >= 0xDC00 and cp <= 0xDFFF then
          fail(s, k, "unpaired surrogate in \\u escape")
        end
        parts[#parts + 1] = utf8_char(cp)
      else
        fail(s, k, "bad escape in string")
      end
    else
      fail(s, k, "control character in string (escape it)")
    end
  end
end

local decode_value

local function decode_number(s, i)
  local a, b = find(s, "^-?%d+", i)
  if not a then fail(s, i, "unexpected character") end
  local int = sub(s, a, b)
  if find(int, "^-?0%d") then fail(s, i, "number with a leading zero") end
  local j = b + 1
  local frac = find(s, "^%.", j)
  if frac then
    local _, fe = find(s, "^%.%d+", j)
    if not fe then fail(s, j, "digits expected after the decimal point") end
    j = fe + 1
  end
  if find(s, "^[eE]", j) then
    local _, ee = find(s, "^[eE][-+]?%d+", j)
    if not ee then fail(s, j, "digits expected in the exponent") end
    j = ee + 1
  end
  return tonumber(sub(s, i, j - 1)), j
end

-- After an array element or an object member: the position past the
-- closing bracket and true, or past the ',' and the space after it and false.
local function after_item(s, i, close, expected)
  i = skip_ws(s, i)
  local c = sub(s, i, i)
  if c == close then return i + 1, true end
  if c ~= "," then fail(s, i, expected) end
  return skip_ws(s, i + 1), false
end

local function decode_array(s, i, depth)
  local t, n = {}, 0
  i = skip_ws(s, i + 1)
  if sub(s, i, i) == "]" then return json.array(t), i + 1 end
  while true do
    local v
    v, i = decode_value(s, i, depth)
    n = n + 1
    t[n] = v
    local closed
    i, closed = after_item(s, i, "]", "',' or ']' expected in array")
    if closed then return t, i end
  end
end

local function decode_object(s, i, depth)
  local t = {}
  i = skip_ws(s, i + 1)
  if sub(s, i, i) == "}" then return t, i + 1 end
  while true do
    if sub(s, i, i) ~= '"' then fail(s, i, "string key expected in object") end
    local k
    k, i = decode_string(s, i)
    i = skip_ws(s, i)
    if sub(s, i, i) ~= ":" then fail(s, i, "':' expected after object key") end
    i = skip_ws(s, i + 1)
    t[k], i = decode_value(s, i, depth)
    local closed
    i, closed = after_item(s, i, "}", "',' or '}' expected in object")
    if closed then return t, i end
  end
end

function decode_value(s, i, depth)
  local c = sub(s, i, i)
  if c == "{" or c == "[" then
    if depth >= MAX_DEPTH then fail(s, i, "nested deeper than " .. MAX_DEPTH) end
    if c == "{" then return decode_object(s, i, depth + 1) end
    return decode_array(s, i, depth + 1)
  elseif c == '"' then
    return decode_string(s, i)
  elseif c == "t" and sub(s, i, i + 3) == "true" then
    return true, i + 4
  elseif c == "f" and sub(s, i, i + 4) == "false" then
    return false, i + 5
  elseif c == "n" and sub(s, i, i + 3) == "null" then
    return json.null, i + 4
  elseif not find(c, "^[-%d]") then
    fail(s, i, "value expected")
  end
  return decode_number(s, i)
end

-- The value of the JSON text s, or nil and a message saying where and why
-- it is not JSON.
function json.decode(s)
  if type(s) ~= "string" then
    return nil, "json.decode: expected a string, got " .. type(s)
  end
  local ok, v, i = pcall(function()
    local v, j = decode_value(s, skip_ws(s, 1), 0)
    j = skip_ws(s, j)
    if j <= #s then fail(s, j, "text after the JSON value") end
    return v, j
  end)
  if ok then return v end
  if type(v) == "table" and v.json_error then return nil, v.json_error end
  error(v, 0)
end

-- Every line of the file at path decoded (blank lines skipped). Returns the
-- list of values and a list of "path:line: message" for lines that are not
-- JSON (a line cut short by a crash, say); nil and a message when the file
-- cannot be read.
function json.read_lines(path)
  local f, err = io.open(path, "r")
  if not f then return nil, err end
  local values, bad, n = {}, {}, 0
  for line in f:lines() do
    n = n + 1
    if find(line, "%S") then
      local v, why = json.decode(line)
      if v == nil then
        bad[#bad + 1] = format("%s:%d: %s", path, n, why)
      else
        values[#values + 1] = v
      end
    end
  end
  f:close()
  return values, bad
end

return json
