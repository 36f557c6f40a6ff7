-- tests/sh/siege.lua PORT TOKEN N -- a stranger and a token holder at a
-- store (test_store_siege.sh). Opens N idle connections and N that send
-- half of a HELLO frame, a few at a time, closing each once the server
-- has closed it; then, with the token, a HELLO for rank 1 (alive in the
-- job: refused) and one with a wrong token (refused). Prints what the
-- server answered to each HELLO, and how many connections it made.
local ffi = require("ffi")
ffi.cdef[[
struct dps_sin { uint16_t family; uint16_t port; uint32_t addr; uint8_t zero[8]; };
struct dps_pollfd { int fd; short events; short revents; };
int socket(int, int, int);
int connect(int, const void *, uint32_t);
long write(int, const void *, size_t);
long read(int, void *, size_t);
int close(int);
int poll(struct dps_pollfd *, unsigned long, int);
uint16_t htons(uint16_t);
uint32_t inet_addr(const char *);
]]
local C = ffi.C
local port, token, n = tonumber(arg[1]), arg[2], tonumber(arg[3])
local HOLD = 300   -- connections this process holds at once

local function connect()
  local fd = C.socket(2, 1, 0)
  assert(fd >= 0, "socket failed")
  local a = ffi.new("struct dps_sin")
  a.family, a.port, a.addr = 2, C.htons(port), C.inet_addr("127.0.0.1")
  if C.connect(fd, a, ffi.sizeof(a)) ~= 0 then C.close(fd) return nil end
  return fd
end
local function le32(v)
  return string.char(v % 256, math.floor(v / 256) % 256, math.floor(v / 65536) % 256, math.floor(v / 16777216) % 256)
end
local function le64(v) return le32(v) .. le32(0) end
local function field(s) return le32(#s) .. s end
local function hello(tok, rank)
  local body = field(tok) .. field(le64(rank)) .. field(le64(0))
  return "DPST" .. string.char(1, 1, 0, 0) .. le32(1) .. le32(#body) .. body
end
local function send(fd, s) return C.write(fd, s, #s) == #s end

-- connections open now; those the server closed are closed here too
local open = {}
local function reap(wait_ms)
  if #open == 0 then return end
  local p = ffi.new("struct dps_pollfd[?]", #open)
  for i, fd in ipairs(open) do p[i - 1].fd, p[i - 1].events = fd, 1 end
  C.poll(p, #open, wait_ms)
  local buf, keep = ffi.new("char[64]"), {}
  for i, fd in ipairs(open) do
    if p[i - 1].revents ~= 0 and C.read(fd, buf, 64) <= 0 then C.close(fd) else keep[#keep + 1] = fd end
  end
  open = keep
end

local made, half = 0, "DPST" .. string.char(1, 1, 0, 0) .. le32(1) .. le32(8000) .. string.rep("x", 100)
for i = 1, 2 * n do
  while #open >= HOLD do reap(100) end
  local fd = connect()
  if fd then
    made = made + 1
    if i % 2 == 0 then send(fd, half) end
    open[#open + 1] = fd
  end
  if i % 50 == 0 then reap(0) end
end

-- what the server answers to a HELLO: its ERROR's message, "ok", or "closed"
local function answer(tok, rank)
  local fd = connect()
  if not fd then return "no connection" end
  send(fd, hello(tok, rank))
  local p = ffi.new("struct dps_pollfd[1]")
  p[0].fd, p[0].events = fd, 1
  local got, buf = "", ffi.new("char[4096]")
  while C.poll(p, 1, 10000) > 0 do
    local r = C.read(fd, buf, 4096)
    if r <= 0 then break end
    got = got .. ffi.string(buf, r)
    if #got >= 16 then
      local len = got:byte(13) + 256 * got:byte(14)
      if #got >= 16 + len then break end
    end
  end
  C.close(fd)
  if #got < 16 then return "closed" end
  if got:byte(6) == 0x80 then return "ok" end
  return got:sub(21)
end
print("made " .. made .. " connections")
print("duplicate rank 1: " .. answer(token, 1))
print("wrong token: " .. answer(token .. "x", 2))
for _, fd in ipairs(open) do C.close(fd) end
