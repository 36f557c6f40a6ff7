-- tests/sh/store.lua -- a small FFI client of dp_store_* for
-- test_store.sh (dplua's own store, src/dist/store_server.c and store_client.c) and test_torchstore.sh
-- (PyTorch's TCPStore, src/dist/torchstore.c); the Lua bindings are not what
-- those test. They put this folder first on package.path (tap.sh's dp_path)
-- and require("store").
local ffi = require("ffi")
local C = require("dplua").C
local M = {}
local function check(st)
    if st ~= 0 then error(ffi.string(C.dp_last_error()), 0) end
end
local S = {}
S.__index = S
-- M.open(port, opts): a client of dplua's store (its server with opts.server)
function M.open(port, opts)
    opts = opts or {}
    local out = ffi.new("dp_store *[1]")
    check(C.dp_store_open(out, opts.host or "127.0.0.1", port, opts.server and 1 or 0,
                          opts.rank or -1, opts.world_size or 0, opts.token or "T0K", opts.generation or 0,
                          opts.timeout or 10))
    return setmetatable({ s = out[0] }, S)
end
-- M.open_torch(port, timeout): a client of PyTorch's TCPStore on 127.0.0.1
function M.open_torch(port, timeout)
    local out = ffi.new("dp_store *[1]")
    check(C.dp_store_open_torch(out, "127.0.0.1", port, timeout or 10))
    return setmetatable({ s = out[0] }, S)
end
function S:port() return C.dp_store_port(self.s) end
function S:set(k, v) check(C.dp_store_set(self.s, k, v, #v)) end
function S:get(k, t)
    local v, n = ffi.new("void *[1]"), ffi.new("size_t[1]")
    check(C.dp_store_get(self.s, k, v, n, t or 0))
    local r = ffi.string(v[0], n[0])
    C.dp_free(v[0])
    return r
end
function S:add(k, d)
    local r = ffi.new("int64_t[1]")
    check(C.dp_store_add(self.s, k, d, r))
    return tonumber(r[0])
end
function S:cas(k, e, d)
    local v, n = ffi.new("void *[1]"), ffi.new("size_t[1]")
    check(C.dp_store_compare_set(self.s, k, e, #e, d, #d, v, n))
    local r = ffi.string(v[0], n[0])
    C.dp_free(v[0])
    return r
end
local function keyarr(keys)
    local a = ffi.new("const char *[?]", #keys)
    for i, k in ipairs(keys) do a[i - 1] = k end
    return a
end
function S:wait(keys, t) check(C.dp_store_wait(self.s, keyarr(keys), #keys, t or 0)) end
function S:check(keys)
    local r = ffi.new("int[1]")
    check(C.dp_store_check(self.s, keyarr(keys), #keys, r))
    return r[0] ~= 0
end
function S:delete(k)
    local r = ffi.new("int[1]")
    check(C.dp_store_delete(self.s, k, r))
    return r[0] ~= 0
end
function S:close() C.dp_store_close(self.s) end
-- M.pidfile(path): writes this process's pid (for kill -9 by pid)
function M.pidfile(path)
    local pid = io.open("/proc/self/stat"):read("*l"):match("^(%d+)")
    local f = io.open(path .. ".tmp", "w")
    f:write(pid)
    f:close()
    os.rename(path .. ".tmp", path)
end
ffi.cdef("struct dpt_ts { long s, ns; }; int clock_gettime(int, struct dpt_ts *); int usleep(unsigned);")
function M.sleep(s) ffi.C.usleep(s * 1e6) end
function M.now()
    local ts = ffi.new("struct dpt_ts")
    ffi.C.clock_gettime(1, ts)
    return tonumber(ts.s) + tonumber(ts.ns) * 1e-9
end
return M
