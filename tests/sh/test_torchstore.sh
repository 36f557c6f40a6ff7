#!/bin/sh
# tests/sh/test_torchstore.sh -- dp_store_open_torch (src/dist/torchstore.c)
# against a real PyTorch TCPStore server: keys set from Python are read by
# dplua and the other way round; add, compare_set, check, delete, wait and
# get timeouts. Needs Python with torch (Debian's python3-torch; set
# DPLUA_TEST_PYTHON to use another); skips without it. Loopback only.
#
#   sh tests/sh/test_torchstore.sh          # from the build directory

top_builddir=${top_builddir:-.}
dplua="$top_builddir/dplua"
python=${DPLUA_TEST_PYTHON:-/usr/bin/python3}

if ! "$python" -c "import torch.distributed as d; assert d.is_available()" >/dev/null 2>&1; then
    echo "1..0 # SKIP $python cannot import torch.distributed (install python3-torch)"
    exit 0
fi
if [ ! -x "$dplua" ]; then
    echo "Bail out! no program at $dplua (build it first)"
    exit 1
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dplua-torchstore.XXXXXX") || {
    echo "1..0 # SKIP cannot make a temporary directory"
    exit 0
}
server=
cleanup() {
    [ -n "$server" ] && kill "$server" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

n=0
ok() {
    n=$((n + 1))
    if [ "$1" -eq 0 ]; then
        echo "ok $n - $2"
    else
        echo "not ok $n - $2"
        sed 's/^/# stdout: /' "$tmp/out" 2>/dev/null
        sed 's/^/# stderr: /' "$tmp/err" 2>/dev/null
        echo "# exit status: $status"
    fi
}
has() { grep -F -q -e "$2" "$tmp/$1"; }

# ---------------------------------------------------------------- Python's side

cat >"$tmp/server.py" <<'EOF'
import datetime, os, sys
import torch.distributed as dist

portfile, results = sys.argv[1], sys.argv[2]
s = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=60))
s.set("from_py", "pyvalue")
s.set("bin", b"a\x00b")
with open(portfile + ".tmp", "w") as f:
    f.write(str(s.port))
os.rename(portfile + ".tmp", portfile)
s.wait(["from_lua"])
with open(results, "w") as f:
    for key in ("from_lua", "cnt", "c2"):
        f.write("%s=%r\n" % (key, s.get(key)))
    f.write("tmp_still_there=%r\n" % s.delete_key("tmp"))
s.set("py_done", "1")
s.wait(["bye"])
EOF

timeout 120 "$python" "$tmp/server.py" "$tmp/port" "$tmp/results" >"$tmp/server.out" 2>&1 &
server=$!
i=0
while [ ! -s "$tmp/port" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
port=$(cat "$tmp/port" 2>/dev/null)
if [ -z "$port" ]; then
    echo "Bail out! the PyTorch TCPStore server did not start: $(cat "$tmp/server.out")"
    exit 1
fi

# ---------------------------------------------------------------- dplua's side

cat >"$tmp/ts.lua" <<'EOF'
local ffi = require("ffi")
local C = require("dplua").C
local M = {}
local function check(st) if st ~= 0 then error(ffi.string(C.dp_last_error()), 0) end end
local S = {}
S.__index = S
function M.open(port, timeout)
    local out = ffi.new("dp_store *[1]")
    check(C.dp_store_open_torch(out, "127.0.0.1", port, timeout or 10))
    return setmetatable({ s = out[0] }, S)
end
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
return M
EOF

run() {
    timeout 60 "$dplua" -e "package.path = '$tmp/?.lua;' .. package.path" "$@" </dev/null >"$tmp/out" 2>"$tmp/err"
    status=$?
}
open="local s = require('ts').open($port)"

run -e "$open; io.write(s:get('from_py'), ' ', #s:get('bin'))"
[ $status -eq 0 ] && [ "$(cat "$tmp/out")" = "pyvalue 3" ]; ok $? "dplua reads keys that Python set"

run -e "$open; io.write(s:add('cnt', 7), ' ', s:add('cnt', 1))"
[ $status -eq 0 ] && [ "$(cat "$tmp/out")" = "7 8" ]; ok $? "add"

run -e "$open; io.write(s:cas('c2', '', 'v1'), ' ', s:cas('c2', 'no', 'v2'), ' ', s:cas('c2', 'v1', 'v3'))"
[ $status -eq 0 ] && [ "$(cat "$tmp/out")" = "v1 v1 v3" ]; ok $? "compare_set"

run -e "$open; io.write(tostring(s:check({'from_py'})), ' ', tostring(s:check({'from_py', 'nothing'})))"
[ $status -eq 0 ] && [ "$(cat "$tmp/out")" = "true false" ]; ok $? "check"

run -e "$open; s:set('tmp', 'x'); io.write(tostring(s:delete('tmp')), ' ', tostring(s:delete('tmp')))"
[ $status -eq 0 ] && [ "$(cat "$tmp/out")" = "true false" ]; ok $? "delete"

run -e "$open; local ok, err = pcall(s.get, s, 'nothing', 0.5); print(err); io.write(s:get('from_py'))"
[ $status -eq 0 ] && has out "timed out after 0.5 s waiting for key 'nothing' in PyTorch's TCPStore at 127.0.0.1:$port" \
    && has out "pyvalue"
ok $? "a get timeout names the key, and the client still works after it"

run -e "$open; local ok, err = pcall(s.wait, s, {'from_py', 'n1'}, 0.3); print(err); io.write(s:get('from_py'))"
[ $status -eq 0 ] && has out "waiting for key 'n1' in" && ! has out "'from_py'" && has out "pyvalue"
ok $? "a wait timeout names the missing key only"

with_proto() {  # with_proto VALUE ARGS...: run with DPLUA_TORCH_STORE_PROTOCOL=VALUE
    p=$1
    shift
    DPLUA_TORCH_STORE_PROTOCOL=$p timeout 60 "$dplua" -e "package.path = '$tmp/?.lua;' .. package.path" "$@" \
        </dev/null >"$tmp/out" 2>"$tmp/err"
    status=$?
}
with_proto 1 -e "$open; io.write(s:get('from_py'))"
[ $status -eq 0 ] && [ "$(cat "$tmp/out")" = "pyvalue" ]; ok $? "DPLUA_TORCH_STORE_PROTOCOL=1 skips the probe"

with_proto bogus -e "local ok, err = pcall(require('ts').open, $port); print(err)"
[ $status -eq 0 ] && has out "DPLUA_TORCH_STORE_PROTOCOL is 'bogus'"; ok $? "a bad DPLUA_TORCH_STORE_PROTOCOL is an error"

# get waits on the server until Python sets the key
timeout 60 "$dplua" -e "package.path = '$tmp/?.lua;' .. package.path" \
    -e "$open; io.write(s:get('py_done', 30))" >"$tmp/done" 2>&1 &
getter=$!
run -e "$open; s:set('from_lua', 'luavalue')"
wait $getter
[ "$(cat "$tmp/done")" = "1" ]; ok $? "get waits until Python sets the key"

has results "from_lua=b'luavalue'" && has results "cnt=b'8'" && has results "c2=b'v3'" \
    && has results "tmp_still_there=False"
status=$?
cp "$tmp/results" "$tmp/out" 2>/dev/null
ok $status "Python reads what dplua set, added, swapped and deleted"

run -e "$open; s:set('bye', '1')"
wait $server
status=$?
server=
[ $status -eq 0 ]; ok $status "the PyTorch server exits cleanly"

closed=$port
run -e "local ok, err = pcall(require('ts').open, $closed, 1); print(err)"
[ $status -eq 0 ] && has out "could not connect to the store at 127.0.0.1:$closed within 1 s"
ok $? "no server: a clear error within the timeout"

echo "1..$n"
