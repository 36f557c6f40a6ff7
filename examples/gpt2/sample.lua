-- sample.lua: text from a checkpoint of train.lua: the prompt's GPT-2
-- tokens continued by top-k sampling, each new token one position of
-- work through the model's KV cache (model.lua's generate).
--
--   dplua examples/gpt2/sample.lua --ckpt=gpt2.safetensors --prompt="The jury said" --top_k=50
--   dplua examples/gpt2/sample.lua --help
local torch = require("dplua")

local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local gpt = dofile(here .. "/model.lua")
local options = dofile(here .. "/options.lua")

local OPTIONS = {
  { "ckpt", "", "checkpoint written by train.lua" },
  { "prompt", "\n", "the text to continue" },
  { "num_samples", 3, "samples to draw (one batch)" },
  { "max_new_tokens", 200, "tokens to generate per sample" },
  { "temperature", 0.8, "divides the logits: below 1 sharper, above 1 flatter" },
  { "top_k", 200, "draw from the k likeliest tokens only (0: from all)" },
  { "device", "auto", "cpu, cuda, or auto (cuda when available)" },
  { "seed", 1337, "random seed" },
}

local opt = options.parse("sample.lua", OPTIONS, arg)
if opt.ckpt == "" then options.fail("sample.lua", "give the checkpoint: --ckpt=PATH") end
options.positive_ints("sample.lua", opt, { "num_samples", "max_new_tokens" })
if opt.temperature <= 0 then options.fail("sample.lua", "--temperature must be above 0") end
local device = (opt.device == "cuda" or (opt.device == "auto" and torch.cuda.is_available())) and "cuda" or "cpu"
torch.manual_seed(opt.seed)

local ck = torch.load(opt.ckpt, { map_location = device })
if type(ck.config) ~= "table" or ck.model == nil then
  options.fail("sample.lua", opt.ckpt .. " is no checkpoint of train.lua (it has no model and config)")
end
local model = gpt.GPT(ck.config)
model:load_state_dict(ck.model)
model:to(device):eval()

local enc = torch.utils.data.GPT2Tokenizer()
local ids = enc:encode(opt.prompt)
if #ids == 0 then ids = { enc.eot_token } end
local idx = torch.tensor(ids, { dtype = torch.int64 }):view(1, #ids):expand(opt.num_samples, #ids):contiguous():to(device)
local out = model:generate(idx, opt.max_new_tokens, { temperature = opt.temperature,
                                                      top_k = opt.top_k > 0 and opt.top_k or nil,
                                                      n_vocab = enc.n_vocab })
for i = 0, opt.num_samples - 1 do
  print(enc:decode(out[i]:cpu()))
  print("---------------")
end
