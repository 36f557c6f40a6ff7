#!/bin/sh
# tests/sh/test_repl.sh -- the REPL as a person uses it: in a terminal
# (tmux, through tmux.sh). Every wait polls the screen with a time limit;
# nothing sleeps blindly. tmux gets a private socket in a private
# directory, dplua a private HOME, and both are removed at the end. TAP output; run by `make check` with top_builddir and
# top_srcdir set (both default to ".").
#
#   sh tests/sh/test_repl.sh          # from the build directory

. "$(dirname "$0")/tap.sh"

if ! command -v tmux >/dev/null 2>&1; then
    echo "1..0 # SKIP tmux not installed"
    exit 0
fi
need_dplua
absolute_dplua
[ -n "$DPLUA_LUA_PATH" ] || DPLUA_LUA_PATH=$(cd "$top_srcdir" && pwd)/lua

make_tmp repl
home="$tmp/home"
mkdir "$home" "$tmp/tmux"

. "$tap_dir/tmux.sh"

# interrupt CODE DELAY N: types CODE, presses Ctrl-C DELAY seconds later,
# and waits (5 s) for the Nth "interrupted!" line; a second Ctrl-C when
# the first came too early.
interrupt() {
    type_line "$1"
    sleep "$2"
    tx send-keys -t $repl C-c
    wait_for "interrupted!" "$3" 5 || { tx send-keys -t $repl C-c; wait_for "interrupted!" "$3" 5; }
}

# complete TEXT SHOWN: types TEXT, presses Tab, and waits for the line
# "> SHOWN" (TEXT completed).
complete() {
    wait_until 10 prompt_ready   # keys typed before the prompt is drawn land in the middle of it
    tx send-keys -t $repl -l "$1"
    tx send-keys -t $repl Tab
    wait_for "> $2"
}

# ---------------------------------------------------------------- a session

start
wait_for "?name prints help" && wait_for "> "
ok $? "the banner and the prompt appear"

type_line 'for i = 1, 2 do'
wait_for ">> "
ok $? "an unfinished statement continues with the >> prompt"
type_line 'print("iter" .. i * 10) end'
wait_for "iter20"
[ $? -eq 0 ] && [ "$(count iter10)" -eq 1 ]
ok $? "the continued statement runs when it is complete"

type_line 'torch.ones(2, 3)'
wait_for "tensor([[1., 1., 1.]," && wait_for "-- shape=[2, 3] dtype=torch.float32 device=cpu"
ok $? "an expression's tensor value prints with its shape, dtype and device"

type_line 'torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())'
wait_for "Sequential(" && wait_for "(0): Linear(in_features=4, out_features=3, bias=True)" &&
    wait_for "(1): ReLU()"
ok $? "a module prints as its tree"

type_line '("multi"):upper(), 6 * 7, nil'
match=-E
wait_for '^MULTI +42 +nil$'
ok $? "every value of an expression prints"
match=-F

if [ $has_libedit = yes ]; then
    complete 'torch.nn.Li' "torch.nn.Linear"
    ok $? "Tab completes torch.nn.Li to torch.nn.Linear"
    tx send-keys -t $repl Enter
    wait_for "<class Linear>"
    ok $? "the completed name evaluates"

    type_line 'x = torch.zeros(2); print("x" .. "set")'
    wait_for "xset"
    complete 'print("n=" .. x:nume' 'print("n=" .. x:numel'
    ok $? "Tab completes a tensor's methods"
    tx send-keys -t $repl -l '())'
    tx send-keys -t $repl Enter
    wait_for "n=2"
    ok $? "the completed method call runs"

    complete 'torch.op' "torch.optim"
    ok $? "Tab completes a submodule that is not loaded yet"
    tx send-keys -t $repl C-u

    type_line 'lin = torch.nn.Linear(2, 3); print("lin" .. "set")'
    wait_for "linset"
    complete 'lin.we' "lin.weight"
    ok $? "Tab completes a module's parameters"
    tx send-keys -t $repl C-u
else
    for d in "Tab completes torch.nn.Li" "the completed name evaluates" \
             "Tab completes a tensor's methods" "the completed method call runs" \
             "Tab completes a submodule" "Tab completes a module's parameters"; do
        skip "$d" "built without libedit"
    done
fi

# The doc is the comment above `L.Linear = Module:extend("Linear")`.
doc=$(grep -B1 'extend("Linear")' "$top_srcdir/lua/dplua/nn/layers.lua" | head -n 1 | sed 's/^-- *//')
type_line '?torch.nn.Linear'
wait_for "torch.nn.Linear: class Linear" && wait_for "$doc"
ok $? "?torch.nn.Linear prints the library's own doc comment"

type_line '?torch.no.such_name'
wait_for "torch.no.such_name: nil (no such name)"
ok $? "? of a missing name says so"

type_line 'error("bo" .. "om")'
wait_for "stdin:1: boom"
ok $? "an error is printed"
type_line 'print("still" .. "here")'
wait_for "stillhere"
ok $? "the session goes on after an error"

interrupt 'while true do end' 0.2 1
ok $? "Ctrl-C interrupts while true do end"
type_line 'print("back" .. 1)'
wait_for "back1"
ok $? "the prompt returns after Ctrl-C"

interrupt 'y = torch.zeros(3); for i = 1, 1e9 do y = y + torch.ones(3) end' 0.5 2
ok $? "Ctrl-C interrupts a loop of tensor ops"
type_line 'print(y[0]:item() > 0 and "kept" .. "y" or "lost")'
wait_for "kepty"
ok $? "the variables the loop left are there"

tx send-keys -t $repl -l 'print("drop" .. "ped")'
wait_for '> print("drop" .. "ped")'
tx send-keys -t $repl C-c
type_line 'print("kept" .. "line")'
wait_for "keptline"
[ $? -eq 0 ] && [ "$(count dropped)" -eq 0 ]
ok $? "Ctrl-C at the prompt drops the line being typed"

type_line 'print(6*7)'
wait_for "42"
tx send-keys -t $repl C-d
exited && [ "$status" -eq 0 ]
ok $? "Ctrl-D ends the session with status 0"

if [ $has_libedit = yes ]; then
    grep -q -F -x 'print(6*7)' "$home/.dplua_history" 2>/dev/null
    ok $? "the history is saved in \$HOME/.dplua_history"

    start
    wait_for "> "
    tx send-keys -t $repl Up
    wait_for "> print(6*7)"
    ok $? "a new session recalls the last one's history with Up"
    tx send-keys -t $repl C-u C-d
    exited
else
    skip "the history is saved" "built without libedit"
    skip "a new session recalls history" "built without libedit"
fi

# ---------------------------------------------------------------- dplua -i

cat >"$tmp/script.lua" <<'EOF'
answer = 21
function twice(v) return 2 * v end
EOF
start -i "$tmp/script.lua"
wait_for "> "
type_line 'print("answer=" .. twice(answer))'
wait_for "answer=42"
ok $? "dplua -i script.lua continues with the script's globals"

if [ $has_libedit = yes ]; then
    complete 'twi' "twice"
    ok $? "Tab completes the script's globals"
else
    skip "Tab completes the script's globals" "built without libedit"
fi
tx send-keys -t $repl C-u C-d
exited && [ "$status" -eq 0 ]
ok $? "dplua -i exits 0 after a script that succeeded"

# ---------------------------------------------------------------- no history

home="$tmp/no/such/home"
start
wait_for "> "
type_line 'print("no" .. "home")'
wait_for "nohome"
ok $? "a HOME where no history can be written does not stop the REPL"
if [ $has_libedit = yes ]; then
    wait_for "cannot write history"
    ok $? "it says that the history is not saved"
else
    skip "it says that the history is not saved" "built without libedit"
fi
tx send-keys -t $repl C-d
exited && [ "$status" -eq 0 ]
ok $? "and the session still ends with status 0"

done_testing
