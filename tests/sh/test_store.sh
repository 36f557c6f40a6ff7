#!/bin/sh
# tests/sh/test_store.sh -- the rendezvous store (src/dist/socket.c,
# store_server.c, store_client.c) between processes:
# set/get/add/compare_set/wait/check/delete, server-side waits,
# timeouts that name the key, the job token, a connection that never says
# HELLO (closed after 5 s), a second HELLO for a live rank (refused), the
# cap on clients (world size + 64),
# malformed frames (rejected, logged once, the server keeps serving),
# port in use, an unreachable store, and dplua/dead/<rank> for a client
# that went away. Loopback only; ports are picked free at run time. TAP
# output.
#
#   sh tests/sh/test_store.sh          # from the build directory

. "$(dirname "$0")/tap.sh"

make_tmp store
server_pid=
at_exit() {
    [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null
}
need_dplua

# ---------------------------------------------------------------- helpers

# dp ARGS...: dplua with tests/sh/store.lua (an FFI client of dp_store_*) on
# its path, bounded in time ($dp_timeout s); every client below requires it.
dp_path=$tap_dir
dp_timeout=30

# raw.lua PORT HEX [HEX...] [-]: connects, sends the bytes of each HEX
# string (a pause between them), and prints "closed" when the server then
# closes the connection within 5 s, else "open"; with a last argument "-"
# it closes the connection itself at once and prints "sent".
cat >"$tmp/raw.lua" <<'EOF'
local ffi = require("ffi")
ffi.cdef[[
struct dpt_sin { uint16_t family; uint16_t port; uint32_t addr; uint8_t zero[8]; };
struct dpt_pollfd { int fd; short events; short revents; };
int socket(int, int, int);
int connect(int, const void *, uint32_t);
long write(int, const void *, size_t);
long read(int, void *, size_t);
int close(int);
int poll(struct dpt_pollfd *, unsigned long, int);
uint16_t htons(uint16_t);
uint32_t inet_addr(const char *);
int usleep(unsigned int);
]]
local fd = ffi.C.socket(2, 1, 0)
local a = ffi.new("struct dpt_sin")
a.family, a.port, a.addr = 2, ffi.C.htons(tonumber(arg[1])), ffi.C.inet_addr("127.0.0.1")
assert(ffi.C.connect(fd, a, ffi.sizeof(a)) == 0, "connect failed")
for i = 2, #arg do
    if arg[i] == "-" then ffi.C.close(fd) print("sent") os.exit(0) end
    local bytes = arg[i]:gsub("%x%x", function(h) return string.char(tonumber(h, 16)) end)
    ffi.C.write(fd, bytes, #bytes)
    ffi.C.usleep(100000)
end
local p = ffi.new("struct dpt_pollfd", { fd = fd, events = 1 })
local buf = ffi.new("char[4096]")
local deadline = os.time() + 6
while os.time() < deadline do
    if ffi.C.poll(p, 1, 5000) <= 0 then break end
    if ffi.C.read(fd, buf, 4096) <= 0 then print("closed") os.exit(0) end
end
print("open")
EOF

# le32 N: N as 8 hex digits, little-endian.
le32() {
    printf '%08x' "$1" | sed 's/\(..\)\(..\)\(..\)\(..\)/\4\3\2\1/'
}
# frame OP LEN: a frame header (magic "DPST", version 1, no flags, id 1).
frame() {
    printf '44505354%02x%02x0000%s%s' 1 "$1" "$(le32 1)" "$(le32 "$2")"
}

# ---------------------------------------------------------------- the server

# The server: rank 0 serves on a free port and stays until "shutdown".
cat >"$tmp/server.lua" <<'EOF'
local M = require("store")
local s = M.open(0, { server = true, rank = 0 })
local f = io.open(arg[1] .. ".tmp", "w")
f:write(s:port())
f:close()
os.rename(arg[1] .. ".tmp", arg[1])
s:get("shutdown", 120)
s:close()
EOF
dp_timeout=300
dp "$tmp/server.lua" "$tmp/port" </dev/null >"$tmp/server.out" 2>"$tmp/server.err" &
server_pid=$!
dp_timeout=30
wait_file "$tmp/port" 10
port=$(cat "$tmp/port" 2>/dev/null)
[ -n "$port" ]; status=$?; ok $status "a server starts on a free port (port $port)"
if [ -z "$port" ]; then
    echo "Bail out! the store server did not start"
    exit 1
fi

# ---------------------------------------------------------------- operations

run -e "local s = require('store').open($port, {rank = 1}); s:set('k1', 'v1'); s:set('bin', 'a\0b'); s:close()"
[ $status -eq 0 ]; ok $? "a client sets keys"

run -e "local s = require('store').open($port, {rank = 2}); io.write(s:get('k1'), ' ', #s:get('bin'))"
[ $status -eq 0 ] && is_out "v1 3"; ok $? "another process gets them (binary values too)"

# get waits on the server until the key is set
dp -e "local s = require('store').open($port); io.write(s:get('late', 15))" >"$tmp/late" 2>&1 &
getter=$!
sleep 0.5
run -e "local s = require('store').open($port); s:set('late', 'arrived')"
wait $getter
[ "$(cat "$tmp/late")" = "arrived" ]; ok $? "get blocks until another client sets the key"

# add from three processes at once
adders=
for c in 1 2 3; do
    dp -e "local s = require('store').open($port); for i = 1, 20 do s:add('counter', 1) end" &
    adders="$adders $!"
done
wait $adders
run -e "local s = require('store').open($port); io.write(s:get('counter'), ' ', s:add('counter', 0), ' ', s:add('counter', -60))"
[ $status -eq 0 ] && is_out "60 60 0"; ok $? "add from 3 processes: 60 increments, stored as text"

run -e "local s = require('store').open($port)
io.write(s:cas('cas', '', 'one'), ' ', s:cas('cas', 'wrong', 'two'), ' ', s:cas('cas', 'one', 'three'), ' [', s:cas('absent', 'x', 'y'), ']')"
[ $status -eq 0 ] && is_out "one one three []"; ok $? "compare_set: creates, refuses a wrong expected value, swaps"

dp -e "local s = require('store').open($port); s:wait({'w1', 'w2', 'w3'}, 15); io.write('all')" >"$tmp/wait" 2>&1 &
waiter=$!
run -e "local s = require('store').open($port); s:set('w1', '1'); s:add('w2', 1); s:cas('w3', '', 'x')"
wait $waiter
[ "$(cat "$tmp/wait")" = "all" ]; ok $? "wait on three keys returns once set, add and compare_set made them"

run -e "local s = require('store').open($port); io.write(tostring(s:check({'k1', 'w1'})), ' ', tostring(s:check({'k1', 'nope'})))"
[ $status -eq 0 ] && is_out "true false"; ok $? "check: all present, or not"

run -e "local s = require('store').open($port); io.write(tostring(s:delete('k1')), ' ', tostring(s:delete('k1')), ' ', tostring(s:check({'k1'})))"
[ $status -eq 0 ] && is_out "true false false"; ok $? "delete: true, then false; the key is gone"

run -e "local M = require('store'); local s = M.open($port); local v = string.rep('0123456789abcdef', 262144)
s:set('big', v); io.write(tostring(s:get('big') == v))"
[ $status -eq 0 ] && is_out "true"; ok $? "a 4 MiB value makes the round trip"

# ---------------------------------------------------------------- timeouts

run -e "local M = require('store'); local s = M.open($port); local t0 = M.now()
local ok, err = pcall(s.get, s, 'never', 0.5); print(ok, err); print(M.now() - t0 < 3)"
[ $status -eq 0 ] && has out "false" && has out "timed out after 0.5 s waiting for key 'never'" \
    && has out "127.0.0.1:$port" && has out "true"
ok $? "a get timeout is an error naming the key, the seconds and the store"

run -e "local s = require('store').open($port)
local ok, err = pcall(s.wait, s, {'k2x', 'w1', 'k3x'}, 0.3); print(err); io.write(s:get('w1'))"
[ $status -eq 0 ] && has out "waiting for keys 'k2x', 'k3x'" && ! has out "'w1'" && has out "1"
ok $? "a wait timeout names the missing keys only, and the client still works"

# ---------------------------------------------------------------- the token

run -e "local ok, err = pcall(require('store').open, $port, {token = 'wrong', timeout = 3}); print(err)"
[ $status -eq 0 ] && has out "refused this client: wrong job token"; ok $? "a wrong token is refused with a clear error"
sleep 0.2
[ "$(grep -c "wrong job token" "$tmp/server.err")" -eq 1 ]; ok $? "the server logs the wrong token once"

# ---------------------------------------------------------------- strangers and duplicates

# silent.lua PORT: connects, says nothing, and prints whether and after how
# many whole seconds the server closed the connection (at most 20 s).
cat >"$tmp/silent.lua" <<'EOF'
local ffi = require("ffi")
ffi.cdef[[
struct dpt_sin { uint16_t family; uint16_t port; uint32_t addr; uint8_t zero[8]; };
struct dpt_pollfd { int fd; short events; short revents; };
int socket(int, int, int);
int connect(int, const void *, uint32_t);
long read(int, void *, size_t);
int poll(struct dpt_pollfd *, unsigned long, int);
uint16_t htons(uint16_t);
uint32_t inet_addr(const char *);
]]
local fd = ffi.C.socket(2, 1, 0)
local a = ffi.new("struct dpt_sin")
a.family, a.port, a.addr = 2, ffi.C.htons(tonumber(arg[1])), ffi.C.inet_addr("127.0.0.1")
assert(ffi.C.connect(fd, a, ffi.sizeof(a)) == 0, "connect failed")
local p = ffi.new("struct dpt_pollfd", { fd = fd, events = 1 })
local t0 = os.time()
if ffi.C.poll(p, 1, 20000) > 0 and ffi.C.read(fd, ffi.new("char[8]"), 8) <= 0 then
    print("closed after " .. (os.time() - t0) .. " s")
else
    print("open")
end
EOF
run "$tmp/silent.lua" "$port"
[ $status -eq 0 ] && has out "closed after" && [ "$(sed 's/closed after \([0-9]*\) s/\1/' "$tmp/out")" -ge 4 ] \
    && has server.err "did not say HELLO within 5 s"
ok $? "a connection that never says HELLO is closed after 5 s, and logged"

dp -e "local M = require('store'); local s = M.open($port, {rank = 7}); s:set('rank7', 'up'); s:get('rank7.done', 30); s:set('rank7.still', 'yes')" \
    >/dev/null 2>&1 &
holder=$!
run -e "local M = require('store'); local s = M.open($port); s:get('rank7', 10)
local ok, err = pcall(M.open, $port, {rank = 7, timeout = 3}); print(err)
print(s:check({'dplua/dead/7'})); s:set('rank7.done', '1'); print(s:get('rank7.still', 10))"
wait $holder
[ $status -eq 0 ] && has out "refused this client: rank 7 is already connected (from 127.0.0.1 port" \
    && has out "false" && has out "yes" && has server.err "rank 7 is already connected"
ok $? "a second HELLO for a live rank is refused and logged; the rank stays alive and served"

# a store of a job of 2 ranks takes 2 + 64 clients at once
dp -e "local M = require('store'); local s = M.open(0, {server = true, world_size = 2})
local f = io.open('$tmp/cap.port', 'w'); f:write(s:port()); f:close(); s:get('cap.done', 60)" >/dev/null 2>&1 &
cap_server=$!
wait_file "$tmp/cap.port" 10
run -e "local M = require('store'); local held = {}
for i = 1, 65 do held[i] = M.open($(cat "$tmp/cap.port"), {timeout = 5}) end
local ok, err = pcall(M.open, $(cat "$tmp/cap.port"), {timeout = 5}); print(ok, err)
held[1]:close(); M.sleep(0.3); held[1] = M.open($(cat "$tmp/cap.port"), {timeout = 5}); print('reopened')
held[2]:set('cap.done', '1')"
wait $cap_server
[ $status -eq 0 ] && has out "false" && has out "the store already serves 66 clients, its limit" && has out "reopened"
ok $? "a store of 2 ranks serves 66 clients at once (its own included) and refuses the next; a freed place is taken again"

# ---------------------------------------------------------------- the generation

# a store of generation 1 (an init_process_group's) for 30 s
dp -e "local M = require('store'); local s = M.open(0, {server = true, generation = 1})
local f = io.open('$tmp/gen1.port', 'w'); f:write(s:port()); f:close(); M.sleep(30)" >/dev/null 2>&1 &
gen1_server=$!
for _ in $(seq 100); do [ -s "$tmp/gen1.port" ] && break; sleep 0.05; done
gen1_port=$(cat "$tmp/gen1.port")

run -e "local M = require('store'); local t0 = M.now()
local ok, err = pcall(M.open, $gen1_port, {generation = 2, timeout = 1}); print(err); print(M.now() - t0 > 0.9)"
[ $status -eq 0 ] && has out "refused this client: another generation: this store serves initialisation 1 of its job, the client's is 2" \
    && has out "a different number of times" && has out true
ok $? "a client of another generation retries until its timeout, then says why"

run -e "local s = require('store').open($gen1_port, {generation = 0, timeout = 3}); s:set('by_hand', 'in'); io.write(s:get('by_hand'))"
[ $status -eq 0 ] && is_out in; ok $? "a client of generation 0 (dist.TCPStore) joins a store of any"
kill "$gen1_server" 2>/dev/null; wait "$gen1_server" 2>/dev/null

# A peer that is no dplua store and closes each connection at once: a
# client of a generation (init_process_group's) tries again only a few
# times, then says so, long before its timeout.
cat >"$tmp/closer.lua" <<'EOF'
local ffi = require("ffi")
ffi.cdef[[
struct dpt_sin { uint16_t family; uint16_t port; uint32_t addr; uint8_t zero[8]; };
int socket(int, int, int);
int bind(int, const void *, uint32_t);
int listen(int, int);
int accept(int, void *, void *);
int close(int);
int getsockname(int, void *, uint32_t *);
uint16_t ntohs(uint16_t);
uint32_t inet_addr(const char *);
]]
local fd = ffi.C.socket(2, 1, 0)
local a = ffi.new("struct dpt_sin")
a.family, a.port, a.addr = 2, 0, ffi.C.inet_addr("127.0.0.1")
assert(ffi.C.bind(fd, a, ffi.sizeof(a)) == 0 and ffi.C.listen(fd, 16) == 0)
local len = ffi.new("uint32_t[1]", ffi.sizeof(a))
ffi.C.getsockname(fd, a, len)
local f = io.open(arg[1], "w"); f:write(ffi.C.ntohs(a.port)); f:close()
while true do local c = ffi.C.accept(fd, nil, nil); if c >= 0 then ffi.C.close(c) end end
EOF
dp "$tmp/closer.lua" "$tmp/closer.port" >/dev/null 2>&1 &
closer=$!
for _ in $(seq 100); do [ -s "$tmp/closer.port" ] && break; sleep 0.05; done
run -e "local M = require('store'); local t0 = M.now()
local ok, err = pcall(M.open, $(cat "$tmp/closer.port"), {generation = 1, timeout = 20}); print(err); print(M.now() - t0 < 5)"
kill "$closer" 2>/dev/null; wait "$closer" 2>/dev/null
[ $status -eq 0 ] && { has out "closed the connection during the handshake" || has out "lost the connection"; } && has out true
ok $? "a peer that closes every handshake: an error within seconds, not at the timeout"

# A store of generation 1 on a port, closed after 1 s and replaced by one of
# generation 2 (a rank 0 that re-initialised): a client of generation 2 that
# came first (it reached the old store) retries and joins the new one.
dp -e "local M = require('store'); local old = M.open(0, {server = true, generation = 1}); local p = old:port()
local f = io.open('$tmp/gen.port', 'w'); f:write(p); f:close(); M.sleep(1); old:close()
local new = M.open(p, {server = true, generation = 2}); io.write(new:get('joined', 20))" >"$tmp/gen.out" 2>&1 &
gen_server=$!
for _ in $(seq 100); do [ -s "$tmp/gen.port" ] && break; sleep 0.05; done
run -e "local s = require('store').open($(cat "$tmp/gen.port"), {generation = 2, timeout = 20}); s:set('joined', 'yes'); print('joined')"
wait $gen_server
[ $status -eq 0 ] && is_out joined && [ "$(cat "$tmp/gen.out")" = yes ]
ok $? "a client that reached the last generation's store joins the next one on the same port"

# ---------------------------------------------------------------- malformed frames

# expect_closed HEX...: the server closes the connection and logs one line.
expect_closed() {
    before=$(wc -l <"$tmp/server.err")
    run "$tmp/raw.lua" "$port" "$@"
    sleep 0.2
    after=$(wc -l <"$tmp/server.err")
    [ $status -eq 0 ] && { is_out closed || is_out sent; } && [ $((after - before)) -eq 1 ]
}

garbage=$(od -An -tx1 -N64 /dev/urandom | tr -d ' \n')
expect_closed "$garbage" && has server.err "bad magic"
ok $? "random bytes: the connection is closed and logged once (bad magic)"

expect_closed "$(frame 1 2147483647)" && has server.err "exceeds the limit"
ok $? "an absurd length is refused before anything is read or allocated"

expect_closed "$(frame 200 0)" && has server.err "unknown op 200"
ok $? "an unknown op is refused"

expect_closed "$(frame 2 0)" && has server.err "op 2 before HELLO"
ok $? "a request before HELLO is refused"

expect_closed "$(frame 1 8)" - && has server.err "truncated frame"
ok $? "a frame cut short is logged as truncated"

expect_closed "$(frame 1 4)ffffff7f" && has server.err "malformed HELLO"
ok $? "a field longer than its frame is refused (no over-read)"

printf '44505354020100000100000000000000' >"$tmp/v2"
expect_closed "$(cat "$tmp/v2")" && has server.err "protocol version 2"
ok $? "another protocol version is refused"

# a valid HELLO, then garbage: refused, and the rank is marked lost
tok=$(printf 'T0K' | od -An -tx1 | tr -d ' \n')
hello="$(frame 1 31)$(le32 3)${tok}$(le32 8)0900000000000000$(le32 8)0000000000000000"
expect_closed "$hello" "deadbeefdeadbeefdeadbeefdeadbeef" && has server.err "bad magic"
ok $? "garbage after a valid HELLO closes that connection"

run -e "local s = require('store').open($port); io.write(s:get('dplua/dead/9', 5), ' ', s:get('w1'))"
[ $status -eq 0 ] && is_out "lost 1"; ok $? "the server keeps serving after all of that (and marked rank 9 lost)"

# ---------------------------------------------------------------- dead ranks

# (the pid of dplua itself: $! is timeout's)
dp -e "local M = require('store'); local s = M.open($port, {rank = 5}); M.pidfile('$tmp/victim'); s:set('rank5', 'up'); M.sleep(30)" &
victim=$!
run -e "local s = require('store').open($port); io.write(s:get('rank5', 10))"
kill -9 "$(cat "$tmp/victim")"
wait $victim 2>/dev/null
run -e "local s = require('store').open($port); io.write(s:get('dplua/dead/5', 10))"
[ $status -eq 0 ] && is_out "lost"; ok $? "kill -9 of a client with rank 5 sets dplua/dead/5 = lost"

run -e "local s = require('store').open($port, {rank = 6}); s:close()"
run -e "local s = require('store').open($port); io.write(s:get('dplua/dead/6', 10))"
[ $status -eq 0 ] && is_out "exited"; ok $? "a client that closes cleanly sets dplua/dead/6 = exited"

# ---------------------------------------------------------------- connecting

run -e "local ok, err = pcall(require('store').open, $port, {server = true, rank = 0}); print(err)"
[ $status -eq 0 ] && has out "port $port is already in use on 127.0.0.1; pick another MASTER_PORT"
ok $? "a second server on the port: a clear error"

closed=$(dp -e "local s = require('store').open(0, {server = true}); io.write(s:port()); s:close()")
run -e "local M = require('store'); local t0 = M.now()
local ok, err = pcall(M.open, $closed, {timeout = 1}); print(err); print(M.now() - t0 < 4)"
[ $status -eq 0 ] && has out "could not connect to the store at 127.0.0.1:$closed within 1 s: Connection refused" \
    && has out "true"
ok $? "nothing on the port: a clear error within the timeout"

dp -e "local s = require('store').open($closed, {rank = 1, timeout = 15}); io.write(s:get('hi', 10))" \
    >"$tmp/early" 2>&1 &
early=$!
sleep 1
dp -e "local s = require('store').open($closed, {server = true, rank = 0}); s:set('hi', 'there'); s:get('dplua/dead/1', 15); s:close()" \
    >/dev/null 2>&1
wait $early
[ "$(cat "$tmp/early")" = "there" ]; ok $? "a client started before its server retries until it comes"

# the serving process dies: a waiting client fails fast, naming it
dp -e "local M = require('store'); local s = M.open($closed, {server = true, rank = 0}); M.pidfile('$tmp/doomed'); s:set('up', '1'); M.sleep(30)" &
doomed=$!
run -e "local s = require('store').open($closed); s:get('up', 10)"
dp -e "local M = require('store'); local s = M.open($closed); local t0 = M.now()
local ok, err = pcall(s.get, s, 'never', 60); print(err); print(M.now() - t0 < 10)" >"$tmp/out" 2>"$tmp/err" &
client=$!
sleep 0.5
kill -9 "$(cat "$tmp/doomed")"
wait $client
wait $doomed 2>/dev/null
has out "lost the connection to the store at 127.0.0.1:$closed" && has out "true"
ok $? "a client waiting when the serving process dies fails at once, not at its timeout"

# ---------------------------------------------------------------- misuse

run -e "local ffi = require('ffi'); local C = require('dplua').C
local out = ffi.new('dp_store *[1]')
print(C.dp_store_open(out, '127.0.0.1', 70000, 0, -1, 0, 'x', 0, 1), ffi.string(C.dp_last_error()))
print(C.dp_store_set(nil, 'k', 'v', 1), ffi.string(C.dp_last_error()))
print(C.dp_store_wait(nil, nil, 0, 1) ~= 0)"
[ $status -eq 0 ] && has out "port 70000 is out of range" && has out "the store is NULL" && has out "true"
ok $? "bad arguments are errors, not crashes"

# ---------------------------------------------------------------- shutdown

run -e "local s = require('store').open($port); s:set('shutdown', '1')"
wait $server_pid
status=$?
server_pid=
[ $status -eq 0 ]; ok $status "the server exits cleanly"

done_testing
