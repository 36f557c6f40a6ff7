-- model.lua: GPT-2 as a dplua module, in nanoGPT's structure: token and
-- position embeddings (wte, wpe), blocks of LayerNorm, causal
-- self-attention (c_attn, c_proj), LayerNorm and an MLP (c_fc, tanh GELU,
-- c_proj), a final LayerNorm (ln_f), and the head (lm_head) tied to wte.
--
--   local gpt = dofile("examples/gpt2/model.lua")
--   local model = gpt.GPT({n_layer = 12, n_head = 12, n_embd = 768})   -- GPT-2 124M
--   local logits, loss = model(idx, targets)      -- idx, targets: (B, T) int64
--   local opt = model:configure_optimizers(0.1, 6e-4, {0.9, 0.95})
--
-- Parameter names are nanoGPT's without its "transformer." prefix
-- (wte.weight, blocks.0.attn.c_attn.weight, ..., lm_head.weight).
local torch = require("dplua")
local nn = torch.nn
local F = nn.functional

local M = {}

-- GPT-2 124M, with the vocabulary padded from 50257 to a multiple of 64.
M.defaults = { block_size = 1024, vocab_size = 50304, n_layer = 12, n_head = 12, n_embd = 768, dropout = 0.0,
               bias = true }

local function config_of(c)
  local cfg = {}
  for k, v in pairs(M.defaults) do cfg[k] = v end
  for k, v in pairs(c or {}) do
    if M.defaults[k] == nil then error("GPT: unknown config key '" .. tostring(k) .. "'", 3) end
    cfg[k] = v
  end
  if cfg.n_embd % cfg.n_head ~= 0 then
    error(string.format("GPT: n_embd (%d) must be divisible by n_head (%d)", cfg.n_embd, cfg.n_head), 3)
  end
  return cfg
end

---------------------------------------------------------------- attention

local CausalSelfAttention = nn.Module:extend("CausalSelfAttention")
M.CausalSelfAttention = CausalSelfAttention

function CausalSelfAttention:__init(cfg)
  self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, { bias = cfg.bias })
  self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, { bias = cfg.bias })
  self.resid_dropout = nn.Dropout(cfg.dropout)
  self.n_head, self.n_embd, self.dropout = cfg.n_head, cfg.n_embd, cfg.dropout
end

-- x (B, T, C). With a cache (generation), the keys and values of the T new
-- positions are written after the cache's earlier ones, and the queries
-- attend to all of them: each new token costs one position.
function CausalSelfAttention:forward(x, cache, layer)
  local B, T, C = x:size(0), x:size(1), x:size(2)
  local nh = self.n_head
  local q, k, v = unpack(self.c_attn(x):split(C, 2))
  q = q:view(B, T, nh, C / nh):transpose(1, 2)      -- (B, nh, T, hs)
  k = k:view(B, T, nh, C / nh):transpose(1, 2)
  v = v:view(B, T, nh, C / nh):transpose(1, 2)
  local y
  if cache == nil then
    y = F.scaled_dot_product_attention(q, k, v, { is_causal = true, dropout_p = self.training and self.dropout or 0 })
  else
    local past = cache.pos
    cache.k[layer]:narrow(2, past, T):copy_(k)
    cache.v[layer]:narrow(2, past, T):copy_(v)
    local keys, values = cache.k[layer]:narrow(2, 0, past + T), cache.v[layer]:narrow(2, 0, past + T)
    local opts = {}
    if past == 0 then opts.is_causal = true
    elseif T > 1 then
      -- new query i sits at position past + i and sees keys 0 .. past + i
      opts.attn_mask = torch.ones(T, past + T, { dtype = torch.bool, device = x.device }):tril(past)
    end
    y = F.scaled_dot_product_attention(q, keys, values, opts)
  end
  y = y:transpose(1, 2):reshape(B, T, C)
  return self.resid_dropout(self.c_proj(y))
end

---------------------------------------------------------------- block

local Block = nn.Module:extend("Block")
M.Block = Block

function Block:__init(cfg)
  self.ln_1 = nn.LayerNorm(cfg.n_embd, { bias = cfg.bias })
  self.attn = CausalSelfAttention(cfg)
  self.ln_2 = nn.LayerNorm(cfg.n_embd, { bias = cfg.bias })
  -- a Sequential, so that Linear and GELU run as one op where dplua fuses them
  local mlp = nn.Sequential()
  mlp:add_module("c_fc", nn.Linear(cfg.n_embd, 4 * cfg.n_embd, { bias = cfg.bias }))
  mlp:add_module("gelu", nn.GELU("tanh"))
  mlp:add_module("c_proj", nn.Linear(4 * cfg.n_embd, cfg.n_embd, { bias = cfg.bias }))
  mlp:add_module("dropout", nn.Dropout(cfg.dropout))
  self.mlp = mlp
end

function Block:forward(x, cache, layer)
  x = x + self.attn(self.ln_1(x), cache, layer)
  return x + self.mlp(self.ln_2(x))
end

-- The same block on the residual stream x given with h = ln_1(x), each
-- residual add run fused with the LayerNorm that reads its sum
-- (torch._add_layer_norm: one pass over the rows, one kernel on a GPU):
-- returns the new stream and next_ln of it (the next block's ln_1, or
-- the model's ln_f).
function Block:forward_fused(x, h, next_ln, cache, layer)
  local ln_2 = self.ln_2
  x, h = torch._add_layer_norm(x, self.attn(h, cache, layer), ln_2.weight, ln_2.bias, ln_2.eps)
  return torch._add_layer_norm(x, self.mlp(h), next_ln.weight, next_ln.bias, next_ln.eps)
end

---------------------------------------------------------------- GPT

local GPT = nn.Module:extend("GPT")
M.GPT = GPT

function GPT:__init(c)
  local cfg = config_of(c)
  self.config = cfg
  self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
  self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
  self.drop = nn.Dropout(cfg.dropout)
  local blocks = nn.ModuleList()
  for _ = 1, cfg.n_layer do blocks:append(Block(cfg)) end
  self.blocks = blocks
  self.ln_f = nn.LayerNorm(cfg.n_embd, { bias = cfg.bias })
  self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, { bias = false })
  self.lm_head.weight = self.wte.weight   -- weight tying: one parameter, listed once (as wte.weight)
  self:_init_weights()
end

-- GPT-2's initialisation: every Linear and Embedding weight normal(0, 0.02),
-- biases zero, and the projections back into the residual stream
-- (c_proj) scaled by 1/sqrt(2 * n_layer), since each block adds two.
function GPT:_init_weights()
  local std_proj = 0.02 / math.sqrt(2 * self.config.n_layer)
  torch.no_grad(function()
    for name, p in self:named_parameters() do
      if name:match("c_proj%.weight$") then nn.init.normal_(p, 0, std_proj)
      elseif name:match("%.bias$") then nn.init.zeros_(p)
      elseif p:dim() == 2 then nn.init.normal_(p, 0, 0.02) end
    end
  end)
end

-- The number of parameters; without the position embeddings unless
-- non_embedding == false (nanoGPT's count: the token embeddings are the
-- head's weights too).
function GPT:get_num_params(non_embedding)
  local n = self:num_parameters()
  if non_embedding ~= false then n = n - self.wpe.weight:numel() end
  return n
end

-- ln_f of the blocks over the residual stream x, each block after the
-- first starting from the LayerNorm its predecessor fused
-- (Block:forward_fused): the values of x = blk(x) block after block,
-- then ln_f(x).
function GPT:_blocks_ln_f(x, cache)
  local blocks, n = self.blocks, self.blocks:len()
  if self.call_blocks then   -- (FullyShardedDataParallel: each block's parameters exist only inside its call)
    for i, blk in ipairs(blocks) do x = blk(x, cache, i) end
    return self.ln_f(x)
  end
  if n == 0 then return self.ln_f(x) end
  local h = blocks[0].ln_1(x)
  for i, blk in ipairs(blocks) do
    x, h = blk:forward_fused(x, h, i < n and blocks[i].ln_1 or self.ln_f, cache, i)   -- blocks[i]: the (i + 1)-th
  end
  return h
end

-- forward(idx [, targets]): idx (B, T) int64 token ids, T <= block_size.
-- With targets (B, T), the logits (B, T, vocab) and the mean cross-entropy
-- (targets of -1 are ignored); without, the logits of the last position
-- only (B, 1, vocab), which is all that generation reads.
function GPT:forward(idx, targets)
  local B, T = idx:size(0), idx:size(1)
  if T > self.config.block_size then
    error(string.format("GPT: cannot forward a sequence of length %d, the block size is only %d", T,
                        self.config.block_size), 2)
  end
  local pos = torch.arange(0, T, { dtype = torch.int64, device = idx.device })
  local x = self:_blocks_ln_f(self.drop(self.wte(idx) + self.wpe(pos)))
  if targets == nil then return self.lm_head(x:narrow(1, T - 1, 1)), nil end
  local logits = self.lm_head(x)
  local loss = F.cross_entropy(logits:view(B * T, -1), targets:reshape(B * T), { ignore_index = -1 })
  return logits, loss
end

-- A KV cache for batch B: per layer, keys and values of block_size
-- positions (B, n_head, block_size, head_dim), of which the first pos are filled.
function GPT:new_cache(B, device, dtype)
  local cfg = self.config
  local shape = { B, cfg.n_head, cfg.block_size, cfg.n_embd / cfg.n_head }
  local opts = { device = device or self.wte.weight.device, dtype = dtype or self.wte.weight.dtype }
  local cache = { pos = 0, k = {}, v = {} }
  for i = 1, cfg.n_layer do cache.k[i], cache.v[i] = torch.empty(shape, opts), torch.empty(shape, opts) end
  return cache
end

-- forward_cached(idx, cache): the logits (B, T, vocab) of T new tokens at
-- positions cache.pos .. cache.pos + T - 1, attending to the cached ones;
-- their keys and values join the cache. Call it under torch.no_grad.
function GPT:forward_cached(idx, cache)
  local T = idx:size(1)
  if cache.pos + T > self.config.block_size then
    error(string.format("GPT: the cache holds %d positions and %d more do not fit the block size %d", cache.pos, T,
                        self.config.block_size), 2)
  end
  local pos = torch.arange(cache.pos, cache.pos + T, { dtype = torch.int64, device = idx.device })
  local x = self:_blocks_ln_f(self.drop(self.wte(idx) + self.wpe(pos)), cache)
  cache.pos = cache.pos + T
  return self.lm_head(x)
end

-- generate(idx, max_new_tokens [, {temperature=1, top_k=, n_vocab=}]):
-- idx (B, T) continued by max_new_tokens sampled tokens, one position of
-- work each through the KV cache; only the first n_vocab ids are drawn
-- (the padded vocabulary's last ids are no tokens). When the context
-- fills the block, the cache is rebuilt from the last half block of
-- tokens. Returns (B, T + max_new_tokens).
function GPT:generate(idx, max_new_tokens, opts)
  opts = opts or {}
  local temperature, top_k = opts.temperature or 1.0, opts.top_k
  local n_vocab = math.min(opts.n_vocab or self.config.vocab_size, self.config.vocab_size)
  local block = self.config.block_size
  return torch.no_grad(function()
    local cache = self:new_cache(idx:size(0))
    local ctx = idx:size(1) > block and idx:narrow(1, idx:size(1) - block, block) or idx
    local logits = self:forward_cached(ctx, cache)
    local out = idx
    for _ = 1, max_new_tokens do
      local last = logits:select(1, logits:size(1) - 1):narrow(1, 0, n_vocab):float() / temperature  -- (B, n_vocab)
      if top_k then
        local v = torch.topk(last, math.min(top_k, last:size(-1)))
        local kth = v:narrow(1, v:size(1) - 1, 1)
        last = last:masked_fill(last:lt(kth), -math.huge)
      end
      local nxt = torch.multinomial(F.softmax(last, -1), 1)   -- (B, 1)
      out = torch.cat({ out, nxt }, 1)
      if cache.pos == block then
        cache.pos = 0
        logits = self:forward_cached(out:narrow(1, out:size(1) - block / 2, block / 2), cache)
      else
        logits = self:forward_cached(nxt, cache)
      end
    end
    return out
  end)
end

-- AdamW with weight decay on the matrices (every parameter of 2 dims or
-- more: the Linear and Embedding weights) and none on biases and
-- LayerNorm parameters, as nanoGPT.
function GPT:configure_optimizers(weight_decay, learning_rate, betas, extra)
  local decay, no_decay = {}, {}
  for _, p in ipairs(self:parameters()) do
    if p.requires_grad then
      if p:dim() >= 2 then decay[#decay + 1] = p else no_decay[#no_decay + 1] = p end
    end
  end
  local opts = { lr = learning_rate, betas = betas or { 0.9, 0.95 } }
  for k, v in pairs(extra or {}) do opts[k] = v end
  return torch.optim.AdamW({
    { params = decay, weight_decay = weight_decay },
    { params = no_decay, weight_decay = 0.0 },
  }, opts)
end

-- FLOPs of one token's forward and backward at sequence length T: 6 per
-- parameter (without the position embeddings, which are looked up) plus
-- the attention's two products, 2 * 2 * T * n_embd a layer forward and
-- twice that backward (PaLM's appendix B, as nanoGPT counts; the half
-- that causal masking skips is counted too).
function GPT:flops_per_token(T)
  local cfg = self.config
  return 6 * self:get_num_params() + 12 * cfg.n_layer * (T or cfg.block_size) * cfg.n_embd
end

-- Peak dense bfloat16 TFLOP/s of the GPUs known by name (NVIDIA's data
-- sheets), the denominator of MFU; nil for others.
M.PEAK_BF16_TFLOPS = { { "H100 PCIe", 756 }, { "H100 NVL", 835 }, { "H100", 989 }, { "H200", 989 }, { "A100", 312 } }
function M.peak_bf16_tflops(device_name)
  for _, e in ipairs(M.PEAK_BF16_TFLOPS) do
    if device_name:find(e[1], 1, true) then return e[2] end
  end
  return nil
end

return M
