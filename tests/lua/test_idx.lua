-- test_idx.lua: torch.utils.data.load_idx (src/io/idx.c) on the real
-- Fashion-MNIST files, on small files of every element type, plain and
-- gzip-compressed, and on malformed files, which must give an error that
-- names the file and the problem — never a crash or a huge allocation.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local ffi = require("ffi")
local data = torch.utils.data
local load_idx = data.load_idx

local DIR = "/usr/share/datasets/fashion-mnist/"

---------------------------------------------------------------- helpers

-- CRC-32 (the one of gzip and zlib), over n bytes at p.
local crc_table = {}
for i = 0, 255 do
  local c = i
  for _ = 1, 8 do
    if bit.band(c, 1) ~= 0 then c = bit.bxor(0xEDB88320, bit.rshift(c, 1)) else c = bit.rshift(c, 1) end
  end
  crc_table[i] = c
end
local function crc32(p, n)
  local c = -1
  for i = 0, n - 1 do
    c = bit.bxor(crc_table[bit.band(bit.bxor(c, p[i]), 0xFF)], bit.rshift(c, 8))
  end
  c = bit.bnot(c)
  return c < 0 and c + 4294967296 or c
end
local function crc32_str(s) return crc32(ffi.cast("const uint8_t *", s), #s) end
local function crc32_tensor(t)
  t = t:contiguous()
  return crc32(ffi.cast("const uint8_t *", t:data_ptr()), t:numel() * t:element_size())
end

local function be32(n)
  return string.char(bit.band(bit.rshift(n, 24), 255), bit.band(bit.rshift(n, 16), 255),
                     bit.band(bit.rshift(n, 8), 255), bit.band(n, 255))
end
local function le32(n) return be32(n):reverse() end
local function le16(n) return string.char(n % 256, math.floor(n / 256) % 256) end

-- An IDX header: type code, dims.
local function header(code, dims)
  local s = { string.char(0, 0, code, #dims) }
  for _, d in ipairs(dims) do s[#s + 1] = be32(d) end
  return table.concat(s)
end

-- Big-endian bytes of numbers as a C type.
local function be_values(ctype, values)
  local size = ffi.sizeof(ctype)
  local buf = ffi.new(ctype .. "[1]")
  local out = {}
  for i, v in ipairs(values) do
    buf[0] = v
    out[i] = ffi.string(buf, size):reverse()
  end
  return table.concat(out)
end

-- A valid gzip file made of deflate "stored" blocks (no compression).
local function gzip(s)
  local out = { string.char(0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff) }
  local pos = 1
  repeat
    local chunk = s:sub(pos, pos + 65534)
    pos = pos + #chunk
    local final = pos > #s
    out[#out + 1] = string.char(final and 1 or 0) .. le16(#chunk) .. le16(65535 - #chunk) .. chunk
  until final
  out[#out + 1] = le32(crc32_str(s)) .. le32(#s % 4294967296)
  return table.concat(out)
end

local tmpfiles = {}
local function write_tmp(bytes)
  local path = os.tmpname()
  T.write_file(path, bytes)
  tmpfiles[#tmpfiles + 1] = path
  return path
end

local function shape(t) return T.shape(t) end

---------------------------------------------------------------- the real files

-- Expected values computed independently with Python's gzip, struct and zlib:
--   b = gzip.open(path).read(); nd = b[3]
--   dims = struct.unpack('>' + 'I' * nd, b[4:4 + 4 * nd]); data = b[4 + 4 * nd:]
--   sum(data), zlib.crc32(data), im = data[:784]: sum(im),
--   sum((k + 1) * v for k, v in enumerate(im)), list(im[14 * 28:15 * 28])
local real = {
  { file = "train-images-idx3-ubyte.gz", shape = { 60000, 28, 28 }, sum = 3431114169, crc = 2925911245,
    first_sum = 76247, first_weighted = 35954273, last_sum = 16684,
    row14 = { 0, 0, 1, 4, 6, 7, 2, 0, 0, 0, 0, 0, 237, 226, 217, 223, 222, 219, 222, 221, 216, 223, 229,
              215, 218, 255, 77, 0 } },
  { file = "t10k-images-idx3-ubyte.gz", shape = { 10000, 28, 28 }, sum = 573469082, crc = 309494841,
    first_sum = 33456, first_weighted = 16008570, last_sum = 24390,
    row14 = { 0, 0, 0, 0, 0, 0, 2, 4, 1, 0, 0, 0, 98, 136, 110, 109, 110, 162, 135, 144, 149, 159, 167,
              144, 158, 169, 119, 0 } },
  { file = "train-labels-idx1-ubyte.gz", shape = { 60000 }, sum = 270000, crc = 785835114,
    first = { 9, 0, 0, 3, 0, 2, 7, 2, 5, 5, 0, 9 }, last = { 5, 1, 3, 0, 5 } },
  { file = "t10k-labels-idx1-ubyte.gz", shape = { 10000 }, sum = 45000, crc = 606848831,
    first = { 9, 2, 1, 1, 6, 1, 4, 6, 5, 7, 4, 5 }, last = { 9, 1, 8, 1, 5 } },
}

local have_data = io.open(DIR .. "train-labels-idx1-ubyte.gz", "rb")
if have_data then have_data:close() end

for _, r in ipairs(real) do
  local name = r.file
  if not have_data then
    T.skip("no " .. DIR .. " (Debian package dataset-fashion-mnist)", name)
  else
    T.run(name, function()
      local t = load_idx(DIR .. name)
      T.is(shape(t), r.shape, name .. ": shape")
      T.is(tostring(t.dtype), "torch.uint8", name .. ": dtype")
      T.ok(t:is_contiguous(), name .. ": contiguous")
      T.is(t:sum():item(), r.sum, name .. ": sum of every element")
      T.is(crc32_tensor(t), r.crc, name .. ": CRC-32 of the data")
      if r.row14 then
        local img = t[0]:long()
        T.is(img:sum():item(), r.first_sum, name .. ": first image sum")
        local w = torch.arange(1, 785):view(28, 28)
        T.is((img * w):sum():item(), r.first_weighted, name .. ": first image position-weighted sum")
        T.is(t[0][14]:tolist(), r.row14, name .. ": first image, row 14")
        T.is(t[-1]:long():sum():item(), r.last_sum, name .. ": last image sum")
      else
        T.is(t:narrow(0, 0, 12):tolist(), r.first, name .. ": first labels")
        T.is(t:narrow(0, r.shape[1] - 5, 5):tolist(), r.last, name .. ": last labels")
        local counts = {}
        for c = 0, 9 do counts[c + 1] = t:eq(c):sum():item() end
        local each = r.shape[1] / 10
        T.is(counts, { each, each, each, each, each, each, each, each, each, each }, name .. ": balanced classes")
      end
    end)
  end
end

---------------------------------------------------------------- every element type

local types = {
  { code = 0x08, name = "uint8", ctype = "uint8_t", dtype = "torch.uint8", values = { 0, 1, 127, 128, 200, 255 } },
  { code = 0x09, name = "int8", ctype = "int8_t", dtype = "torch.int32", values = { 0, 1, -1, 127, -128, -5 } },
  { code = 0x0B, name = "int16", ctype = "int16_t", dtype = "torch.int32", values = { 0, 300, -300, 32767, -32768, -1 } },
  { code = 0x0C, name = "int32", ctype = "int32_t", dtype = "torch.int32",
    values = { 0, 70000, -70000, 2147483647, -2147483648, -1 } },
  { code = 0x0D, name = "float32", ctype = "float", dtype = "torch.float32", values = { 0, 1.5, -2.25, 1e-3, 3e38, -0.0 } },
  { code = 0x0E, name = "float64", ctype = "double", dtype = "torch.float64", values = { 0, 1.5, -2.25, 0.1, 1e300, -1e-300 } },
}

for _, ty in ipairs(types) do
  local bytes = header(ty.code, { 2, 3 }) .. be_values(ty.ctype, ty.values)
  -- float32 values as float32 rounds them
  local expect = {}
  local f = ffi.new(ty.ctype .. "[1]")
  for i, v in ipairs(ty.values) do f[0] = v; expect[i] = tonumber(f[0]) end
  local rows = { { expect[1], expect[2], expect[3] }, { expect[4], expect[5], expect[6] } }
  for _, form in ipairs({ "plain", "gzip" }) do
    local name = ty.name .. " (" .. form .. ")"
    T.run(name, function()
      local t = load_idx(write_tmp(form == "gzip" and gzip(bytes) or bytes))
      T.is(shape(t), { 2, 3 }, name .. ": shape")
      T.is(tostring(t.dtype), ty.dtype, name .. ": dtype")
      T.is(t:tolist(), rows, name .. ": values, byte order and sign")
    end)
  end
end

T.run("one dim, zero-sized dims, large gzip", function()
  local t = load_idx(write_tmp(header(0x08, { 4 }) .. "\1\2\3\4"))
  T.is(t:tolist(), { 1, 2, 3, 4 }, "1-D uint8")
  t = load_idx(write_tmp(header(0x0D, { 0, 5 })))
  T.is(shape(t), { 0, 5 }, "a zero-sized dim gives an empty tensor")
  t = load_idx(write_tmp(gzip(header(0x0C, { 0, 4000000000 }))))
  T.is(shape(t), { 0, 4000000000 }, "a zero-sized dim with a huge one is still empty")
  -- more than one stored block and more than zlib's read buffer
  local n = 300000
  local body = {}
  for i = 0, n - 1 do body[#body + 1] = string.char(i % 251) end
  t = load_idx(write_tmp(gzip(header(0x08, { 3, n / 3 }) .. table.concat(body))))
  T.is(shape(t), { 3, n / 3 }, "300000-byte gzip: shape")
  T.is(crc32_tensor(t), crc32_str(table.concat(body)), "300000-byte gzip: data")
end)

---------------------------------------------------------------- malformed files

-- Each bad file must raise an error naming the path and the problem.
local function bad(name, bytes, pattern)
  local path = type(bytes) == "table" and bytes.path or write_tmp(bytes)
  T.raises(function() return load_idx(path) end, { "load_idx", path:gsub("%p", "%%%0"), pattern }, name)
end

bad("missing file", { path = "/nonexistent/dir/train-images-idx3-ubyte.gz" }, "No such file")
bad("a directory", { path = here }, "is a directory")
bad("empty file", "", "is empty")
bad("empty gzip file", gzip(""), "is empty")
bad("two bytes", "\0\0", "truncated header")
bad("bad magic (text)", "hello, world: not an IDX file\n", { "bad magic", "0x68656c6c" })
bad("bad magic (gzip of text)", gzip("hello, world\n"), "bad magic")
bad("unknown element type", string.char(0, 0, 0x07, 1) .. be32(1) .. "x", "unknown element type 0x07")
bad("too many dims", string.char(0, 0, 8, 9) .. string.rep(be32(1), 9) .. "x", "9 dims")
bad("truncated dims", string.char(0, 0, 8, 3) .. be32(10) .. be32(10), "truncated header")
bad("huge dims (plain)", header(0x08, { 65535, 65535, 65535 }) .. "abc", { "more than the file can hold", "%[65535, 65535, 65535%]" })
bad("huge dims (gzip)", gzip(header(0x0E, { 100000, 100000 }) .. "abcdefgh"), { "more than the file can hold", "gzip" })
bad("dims whose product overflows", header(0x0E, { 4294967295, 4294967295, 4294967295, 4294967295 }) .. "x",
    "more than the file can hold")
bad("truncated data (plain)", header(0x0C, { 10 }) .. string.rep("\0", 39), "more than the file can hold")
bad("truncated data (gzip)", gzip(header(0x0C, { 10 }) .. string.rep("\0", 39)), { "truncated", "39 of 40" })
bad("data left over (plain)", header(0x08, { 3 }) .. "abcd", "more data than the dims describe")
bad("data left over (gzip)", gzip(header(0x08, { 3 }) .. "abcd"), "more data than the dims describe")

if have_data then
  local real_gz = T.read_file(DIR .. "t10k-labels-idx1-ubyte.gz")
  bad("truncated gzip stream", real_gz:sub(1, 3000), "truncated")
  local body = real_gz:sub(1, 1000) .. string.rep("\255", 500) .. real_gz:sub(1501)
  bad("corrupted gzip stream", body, "read error")
  local img = T.read_file(DIR .. "t10k-images-idx3-ubyte.gz")
  bad("a prefix of the image file", img:sub(1, math.floor(#img / 2)), "truncated")
else
  T.skip("no " .. DIR, "truncated gzip stream")
  T.skip("no " .. DIR, "corrupted gzip stream")
  T.skip("no " .. DIR, "a prefix of the image file")
end

T.raises(function() return load_idx(nil) end, "load_idx: expected a path string", "load_idx(nil)")
T.raises(function() return load_idx(42) end, "load_idx: expected a path string, got number", "load_idx(42)")

T.check("a good file still loads after the errors", function()
  return load_idx(write_tmp(header(0x08, { 2 }) .. "\7\9")):tolist()
end, { 7, 9 })

for _, p in ipairs(tmpfiles) do os.remove(p) end
T.done_testing()
