#!/bin/sh
# tests/sh/test_torchstore.sh -- dp_store_open_torch (src/dist/torchstore.c)
# against a real PyTorch TCPStore server: keys set from Python are read by
# dplua and the other way round; add, compare_set, check, delete, wait and
# get timeouts. Needs Python with torch (Debian's python3-torch; set
# DPLUA_TEST_PYTHON to use another); skips without it. Loopback only.
#
#   sh tests/sh/test_torchstore.sh          # from the build directory

. "$(dirname "$0")/tap.sh"

python=${DPLUA_TEST_PYTHON:-/usr/bin/python3}

if ! "$python" -c "import torch.distributed as d; assert d.is_available()" >/dev/null 2>&1; then
    echo "1..0 # SKIP $python cannot import torch.distributed (install python3-torch)"
    exit 0
fi
need_dplua
make_tmp torchstore
server=
at_exit() {
    [ -n "$server" ] && kill "$server" 2>/dev/null
}

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
wait_file "$tmp/port" 60
port=$(cat "$tmp/port" 2>/dev/null)
if [ -z "$port" ]; then
    echo "Bail out! the PyTorch TCPStore server did not start: $(cat "$tmp/server.out")"
    exit 1
fi

# ---------------------------------------------------------------- dplua's side

# dp ARGS...: dplua with tests/sh/store.lua (an FFI client of dp_store_*)
# on its path, bounded in time.
dp_path=$tap_dir
dp_timeout=60
open="local s = require('store').open_torch($port)"

run -e "$open; io.write(s:get('from_py'), ' ', #s:get('bin'))"
[ $status -eq 0 ] && is_out "pyvalue 3"; ok $? "dplua reads keys that Python set"

run -e "$open; io.write(s:add('cnt', 7), ' ', s:add('cnt', 1))"
[ $status -eq 0 ] && is_out "7 8"; ok $? "add"

run -e "$open; io.write(s:cas('c2', '', 'v1'), ' ', s:cas('c2', 'no', 'v2'), ' ', s:cas('c2', 'v1', 'v3'))"
[ $status -eq 0 ] && is_out "v1 v1 v3"; ok $? "compare_set"

run -e "$open; io.write(tostring(s:check({'from_py'})), ' ', tostring(s:check({'from_py', 'nothing'})))"
[ $status -eq 0 ] && is_out "true false"; ok $? "check"

run -e "$open; s:set('tmp', 'x'); io.write(tostring(s:delete('tmp')), ' ', tostring(s:delete('tmp')))"
[ $status -eq 0 ] && is_out "true false"; ok $? "delete"

run -e "$open; local ok, err = pcall(s.get, s, 'nothing', 0.5); print(err); io.write(s:get('from_py'))"
[ $status -eq 0 ] && has out "timed out after 0.5 s waiting for key 'nothing' in PyTorch's TCPStore at 127.0.0.1:$port" \
    && has out "pyvalue"
ok $? "a get timeout names the key, and the client still works after it"

run -e "$open; local ok, err = pcall(s.wait, s, {'from_py', 'n1'}, 0.3); print(err); io.write(s:get('from_py'))"
[ $status -eq 0 ] && has out "waiting for key 'n1' in" && ! has out "'from_py'" && has out "pyvalue"
ok $? "a wait timeout names the missing key only"

dp_env=DPLUA_TORCH_STORE_PROTOCOL=1
run -e "$open; io.write(s:get('from_py'))"
[ $status -eq 0 ] && is_out "pyvalue"; ok $? "DPLUA_TORCH_STORE_PROTOCOL=1 skips the probe"

dp_env=DPLUA_TORCH_STORE_PROTOCOL=bogus
run -e "local ok, err = pcall(require('store').open_torch, $port); print(err)"
dp_env=
[ $status -eq 0 ] && has out "DPLUA_TORCH_STORE_PROTOCOL is 'bogus'"; ok $? "a bad DPLUA_TORCH_STORE_PROTOCOL is an error"

# get waits on the server until Python sets the key
dp -e "$open; io.write(s:get('py_done', 30))" >"$tmp/done" 2>&1 &
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
run -e "local ok, err = pcall(require('store').open_torch, $closed, 1); print(err)"
[ $status -eq 0 ] && has out "could not connect to the store at 127.0.0.1:$closed within 1 s"
ok $? "no server: a clear error within the timeout"

done_testing
