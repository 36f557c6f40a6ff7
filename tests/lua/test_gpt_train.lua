-- test_gpt_train.lua -- examples/gpt2/model.lua's GPT against PyTorch:
-- PyTorch's initial weights of a small GPT (tests/ref/gpt_small.safetensors,
-- written by scripts/gen_gpt_ref.py) loaded into the model, then 20 steps
-- of AdamW (weight decay on the matrices only) with clip_grad_norm_(1.0)
-- on the reference's batches in float32 on the CPU: every loss and
-- gradient norm within 1e-4 of PyTorch's. Also: the parameters, the
-- tying of lm_head to wte, ipairs over the blocks, the KV cache's logits
-- against the full forward, GPT-2's initialisation, the optimizer's groups.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local dir = os.getenv("DPLUA_TEST_DIR") or (here .. "/..")
package.path = dir .. "/lua/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local gpt = dofile(dir .. "/../examples/gpt2/model.lua")
local ref = dofile(dir .. "/ref/gpt_small.lua")

local function ids(r) return T.ref_tensor(torch, r, torch.int64) end

local function reference_model()
  local model = gpt.GPT(ref.config)
  model:load_state_dict(torch.load(dir .. "/ref/gpt_small.safetensors"))
  return model
end

T.run("20 AdamW steps with clipping match PyTorch's losses (float32, CPU)", function()
  local model = reference_model()
  local opt = model:configure_optimizers(ref.weight_decay, ref.lr, ref.betas)
  local worst = 0
  for step, b in ipairs(ref.batches) do
    local seq = ids(b)
    local T_ = seq:size(1) - 1
    opt:zero_grad()
    local _, loss = model(seq:narrow(1, 0, T_), seq:narrow(1, 1, T_))
    loss:backward()
    local norm = torch.nn.utils.clip_grad_norm_(model:parameters(), ref.clip):item()
    opt:step()
    T.close(loss:item(), ref.losses[step], 0, 1e-4, "loss at step " .. step)
    T.close(norm, ref.norms[step], 1e-4, 1e-4, "gradient norm at step " .. step)
    worst = math.max(worst, math.abs(loss:item() - ref.losses[step]))
  end
  T.diag(string.format("largest loss difference: %.3g", worst))
  T.ok(ref.losses[#ref.losses] < ref.losses[1] - 1, "the loss falls")
end)

T.run("parameters, tying and blocks", function()
  local model = reference_model()
  local names = {}
  for n in model:named_parameters() do names[#names + 1] = n end
  T.is(#names, 4 + 12 * ref.config.n_layer, "every block's parameters, lm_head listed once (as wte.weight)")
  T.ok(rawequal(model.lm_head.weight, model.wte.weight), "lm_head.weight is wte.weight")
  local n = 0
  for i, blk in ipairs(model.blocks) do
    n = i
    T.ok(blk.attn ~= nil and blk.mlp ~= nil, "block " .. i .. " via ipairs")
  end
  T.is(n, ref.config.n_layer, "ipairs over the ModuleList sees every block")
  -- the model's forward fuses each residual add into the LayerNorm after it;
  -- Block:forward is the same block unfused, as nanoGPT writes it
  local x = torch.randn(2, 5, ref.config.n_embd, { dtype = torch.float64 })
  local model64 = reference_model():double()
  local plain = x
  for _, blk in ipairs(model64.blocks) do plain = blk(plain) end
  T.tensor_close(model64:_blocks_ln_f(x), model64.ln_f(plain), 1e-12, 1e-12,
                 "fused residual adds and LayerNorms: the values of Block:forward block after block")
  local opt = model:configure_optimizers(0.1, 1e-3)
  T.is(#opt.param_groups[1].params, 2 + 4 * ref.config.n_layer, "decay: the matrices")
  T.is(opt.param_groups[1].weight_decay, 0.1, "decay group's weight_decay")
  T.is(#opt.param_groups[2].params, 2 + 8 * ref.config.n_layer, "no decay: biases and LayerNorms")
  T.is(opt.param_groups[2].weight_decay, 0, "no-decay group's weight_decay")
  T.is(opt.param_groups[1].betas, { 0.9, 0.95 }, "betas")
end)

T.run("the KV cache gives the full forward's logits", function()
  local model = reference_model()
  local seq = ids(ref.batches[1]):narrow(1, 0, 20)
  local full = model(seq, seq)
  torch.no_grad(function()
    local cache = model:new_cache(seq:size(0))
    local parts = {}
    for _, span in ipairs({ { 0, 7 }, { 7, 1 }, { 8, 5 }, { 13, 1 }, { 14, 6 } }) do
      parts[#parts + 1] = model:forward_cached(seq:narrow(1, span[1], span[2]), cache)
    end
    T.is(cache.pos, 20, "the cache holds every position")
    T.tensor_close(torch.cat(parts, 1), full, 1e-4, 1e-5, "prompt, then one and several tokens at a time")
    T.raises(function() model:forward_cached(seq:narrow(1, 0, 13), cache) end, "do not fit the block size",
             "a cache past the block size")
  end)
  local last = model(seq)
  T.is({ last:size(0), last:size(1), last:size(2) }, { seq:size(0), 1, ref.config.vocab_size }, "without targets: the last position only")
  T.tensor_close(last:squeeze(1), full:select(1, 19), 1e-5, 1e-5, "the last position's logits")
end)

T.run("generate: greedy decoding through the cache equals argmax of the full forward", function()
  if not (torch.topk and torch.multinomial) then
    T.skip("needs torch.topk and torch.multinomial", "generate")
    return
  end
  local model = reference_model()
  local prompt = ids(ref.batches[2]):narrow(1, 0, 8)
  local out = model:generate(prompt, 24, { top_k = 1 })
  T.is({ out:size(0), out:size(1) }, { prompt:size(0), 32 }, "the prompt and 24 tokens")
  local ctx = prompt
  torch.no_grad(function()
    for _ = 1, 24 do
      local logits = model(ctx)
      ctx = torch.cat({ ctx, logits:squeeze(1):argmax(1):view(-1, 1) }, 1)
    end
  end)
  T.tensor_close(out, ctx, 0, 0, "the same tokens")
  local long = model:generate(prompt, 40, { top_k = 5, n_vocab = 50 })
  T.is(long:size(1), 48, "past the block size: the cache is rebuilt")
  T.ok(long:narrow(1, 8, 40):max():item() < 50, "only ids below n_vocab are drawn")
end)

T.run("GPT-2's initialisation", function()
  torch.manual_seed(0)
  local model = gpt.GPT({ n_layer = 4, n_head = 4, n_embd = 128, vocab_size = 1000, block_size = 64 })
  local function std(t) return t:std():item() end
  T.close(std(model.wte.weight), 0.02, 0.05, 0, "wte std 0.02")
  T.close(std(model.blocks[0].attn.c_attn.weight), 0.02, 0.05, 0, "c_attn std 0.02")
  T.close(std(model.blocks[0].mlp.c_proj.weight), 0.02 / math.sqrt(8), 0.05, 0, "c_proj std 0.02/sqrt(2 n_layer)")
  T.is(model.blocks[1].mlp.c_fc.bias:abs():sum():item(), 0, "biases zero")
  T.is(model.ln_f.weight:sum():item(), 128, "LayerNorm weights one")
  T.raises(function() model(torch.zeros(1, 65, { dtype = torch.int64 })) end, "the block size is only 64", "too long")
  T.raises(function() gpt.GPT({ n_embd = 100, n_head = 3 }) end, "must be divisible by n_head", "bad heads")
  T.raises(function() gpt.GPT({ n_embed = 100 }) end, "unknown config key 'n_embed'", "bad key")
end)

T.done_testing()
