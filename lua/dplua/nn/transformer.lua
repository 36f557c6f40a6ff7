-- dplua.nn.transformer: nn.MultiheadAttention, the Transformer encoder and
-- decoder layers and stacks, and nn.Transformer, with PyTorch's parameter
-- names, options and masks, so that a PyTorch state dict loads into them
-- as it is.
--
--   local mha = nn.MultiheadAttention(512, 8, {batch_first = true})
--   local out, weights = mha(x, x, x, {key_padding_mask = pad})
--   local enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(512, 8, {batch_first = true}), 6)
--   local y = enc(x, {is_causal = true})
--   local model = nn.Transformer(512, 8, {batch_first = true})
--   local out = model(src, tgt, {tgt_mask = nn.Transformer.generate_square_subsequent_mask(tgt:size(1))})
--
-- Attention without weights to return goes through
-- F.scaled_dot_product_attention, so that a GPU runs the flash kernels
-- when no mask is given.
local torch = require("dplua")
local module = require("dplua.nn.module")
local F = require("dplua.nn.functional")
local init = require("dplua.nn.init_")
local L = require("dplua.nn.layers")
local raise = torch._raise
local Module, Parameter = module.Module, module.Parameter
local is_tensor, shape_str = torch.is_tensor, F._shape_str

local T = {}

---------------------------------------------------------------- helpers

-- layers.lua's and functional.lua's checks and constructors
local check_opts, make, want_float = L._check_opts, L._make, F._want_float
local function want_int(v, fn, what) return L._want_int(v, fn, what, 1) end
local function empty(shape, opts) return make("empty", shape, opts) end

local function want_prob(p, fn)
  if type(p) ~= "number" or p < 0 or p > 1 then
    raise(string.format("%s: expected dropout to be a probability in [0, 1], got %s", fn, tostring(p)))
  end
  return p
end

-- PyTorch's masks: a bool mask is true where attention is NOT allowed (the
-- opposite of F.scaled_dot_product_attention's), a float mask is added to
-- the scores. Either becomes an additive float mask of the query's dtype.
local function additive(mask, like, fn, what)
  if not is_tensor(mask) then raise(string.format("%s: expected %s to be a tensor, got %s", fn, what, type(mask))) end
  if mask.dtype == torch.bool then
    return torch.zeros(mask:size(), { dtype = like.dtype, device = like.device }):masked_fill(mask, -math.huge)
  end
  if not mask:is_floating_point() then
    raise(string.format("%s: expected %s to be a bool or floating point tensor, got %s", fn, what, tostring(mask.dtype)))
  end
  return mask
end

-- The causal rule as PyTorch's bool attn_mask: key j is masked out of query i's row when j > i.
local function causal_mask(L_, S, device)
  return torch.ones(L_, S, { dtype = torch.bool, device = device }):triu(1)
end
T._causal_mask = causal_mask

---------------------------------------------------------------- MultiheadAttention

-- MultiheadAttention(embed_dim, num_heads [, {dropout=0, bias=true,
-- add_bias_kv=false, add_zero_attn=false, batch_first=false,
-- kdim=embed_dim, vdim=embed_dim, dtype=, device=}]): in_proj_weight (3E,
-- E) when kdim == vdim == E, else q_proj_weight, k_proj_weight and
-- v_proj_weight; in_proj_bias (3E); out_proj a Linear; with add_bias_kv,
-- bias_k and bias_v (1, 1, E), a key and a value appended to every
-- sequence; add_zero_attn appends a zero one. Weights xavier_uniform_
-- (bias_k and bias_v xavier_normal_), biases zero, as PyTorch.
T.MultiheadAttention = Module:extend("MultiheadAttention")
-- out_proj's class is named as PyTorch names it, so that printing matches.
T.NonDynamicallyQuantizableLinear = L.Linear:extend("NonDynamicallyQuantizableLinear")

local mha_opts = { dropout = true, bias = true, batch_first = true, kdim = true, vdim = true, dtype = true, device = true,
                   add_bias_kv = true, add_zero_attn = true }
function T.MultiheadAttention:__init(embed_dim, num_heads, opts)
  local fn = "MultiheadAttention"
  opts = check_opts(opts or {}, fn, mha_opts)
  want_int(embed_dim, fn, "embed_dim")
  want_int(num_heads, fn, "num_heads")
  if embed_dim % num_heads ~= 0 then
    raise(string.format("%s: embed_dim must be divisible by num_heads, got embed_dim=%d and num_heads=%d",
                        fn, embed_dim, num_heads))
  end
  self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim / num_heads
  self.kdim = opts.kdim and want_int(opts.kdim, fn, "kdim") or embed_dim
  self.vdim = opts.vdim and want_int(opts.vdim, fn, "vdim") or embed_dim
  self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
  self.dropout = want_prob(opts.dropout or 0, fn)
  self.batch_first = opts.batch_first == true
  local bias = opts.bias ~= false
  if self._qkv_same_embed_dim then
    self.in_proj_weight = Parameter(empty({ 3 * embed_dim, embed_dim }, opts))
    self:register_parameter("q_proj_weight", nil)
    self:register_parameter("k_proj_weight", nil)
    self:register_parameter("v_proj_weight", nil)
  else
    self.q_proj_weight = Parameter(empty({ embed_dim, embed_dim }, opts))
    self.k_proj_weight = Parameter(empty({ embed_dim, self.kdim }, opts))
    self.v_proj_weight = Parameter(empty({ embed_dim, self.vdim }, opts))
    self:register_parameter("in_proj_weight", nil)
  end
  if bias then self.in_proj_bias = Parameter(empty({ 3 * embed_dim }, opts))
  else self:register_parameter("in_proj_bias", nil) end
  self.out_proj = T.NonDynamicallyQuantizableLinear(embed_dim, embed_dim,
                                                    { bias = bias, dtype = opts.dtype, device = opts.device })
  if opts.add_bias_kv then
    self.bias_k = Parameter(empty({ 1, 1, embed_dim }, opts))
    self.bias_v = Parameter(empty({ 1, 1, embed_dim }, opts))
  else
    self:register_parameter("bias_k", nil)
    self:register_parameter("bias_v", nil)
  end
  self.add_zero_attn = opts.add_zero_attn == true
  self:_reset_parameters()
end

function T.MultiheadAttention:_reset_parameters()
  if self._qkv_same_embed_dim then
    init.xavier_uniform_(self.in_proj_weight)
  else
    init.xavier_uniform_(self.q_proj_weight)
    init.xavier_uniform_(self.k_proj_weight)
    init.xavier_uniform_(self.v_proj_weight)
  end
  if self.in_proj_bias ~= nil then
    init.constant_(self.in_proj_bias, 0)
    init.constant_(self.out_proj.bias, 0)
  end
  if self.bias_k ~= nil then
    init.xavier_normal_(self.bias_k)
    init.xavier_normal_(self.bias_v)
  end
end

-- add_bias_kv's learnt key and value, and add_zero_attn's zero ones,
-- appended to each sequence of keys (N, H, S, D) and values; the mask
-- (additive, broadcasting to (N, H, L, S)) gets a zero column for each.
function T.MultiheadAttention:_extra_keys(k, v, mask)
  local N, H, D = k:size(0), self.num_heads, self.head_dim
  local extra = 0
  if self.bias_k ~= nil then
    k = torch.cat({ k, self.bias_k:view(1, H, 1, D):expand(N, H, 1, D) }, 2)
    v = torch.cat({ v, self.bias_v:view(1, H, 1, D):expand(N, H, 1, D) }, 2)
    extra = extra + 1
  end
  if self.add_zero_attn then
    local z = torch.zeros(N, H, 1, D, { dtype = k.dtype, device = k.device })
    k, v = torch.cat({ k, z }, 2), torch.cat({ v, z }, 2)
    extra = extra + 1
  end
  if mask ~= nil and extra > 0 then mask = F.pad(mask, { 0, extra }) end
  return k, v, mask
end

-- q, k and v projected, each (N, len, E). Self-attention (one tensor as
-- query, key and value) takes one product of in_proj_weight.
function T.MultiheadAttention:_in_projection(query, key, value, same)
  local E, b = self.embed_dim, self.in_proj_bias
  local bq, bk, bv
  if b ~= nil then bq, bk, bv = b:narrow(0, 0, E), b:narrow(0, E, E), b:narrow(0, 2 * E, E) end
  if not self._qkv_same_embed_dim then
    return F.linear(query, self.q_proj_weight, bq), F.linear(key, self.k_proj_weight, bk),
           F.linear(value, self.v_proj_weight, bv)
  end
  local w = self.in_proj_weight
  if same then return unpack(F.linear(query, w, b):split(E, -1)) end
  return F.linear(query, w:narrow(0, 0, E), bq), F.linear(key, w:narrow(0, E, E), bk),
         F.linear(value, w:narrow(0, 2 * E, E), bv)
end

-- attn_mask (L, S) or (N * num_heads, L, S) and key_padding_mask (N, S),
-- merged into one additive mask that broadcasts to (N, H, L, S), or nil.
function T.MultiheadAttention:_merged_mask(attn_mask, key_padding_mask, N, L_, S, like, batched)
  local fn, H = "MultiheadAttention", self.num_heads
  local mask
  if attn_mask ~= nil then
    mask = additive(attn_mask, like, fn, "attn_mask")
    if mask:dim() == 2 then
      if mask:size(0) ~= L_ or mask:size(1) ~= S then
        raise(string.format("%s: the shape of the 2-D attn_mask is %s, but should be [%d, %d]", fn, shape_str(mask), L_, S))
      end
      mask = mask:view(1, 1, L_, S)
    elseif mask:dim() == 3 then
      if mask:size(0) ~= N * H or mask:size(1) ~= L_ or mask:size(2) ~= S then
        raise(string.format("%s: the shape of the 3-D attn_mask is %s, but should be [%d, %d, %d]",
                            fn, shape_str(mask), N * H, L_, S))
      end
      mask = mask:view(N, H, L_, S)
    else
      raise(string.format("%s: attn_mask's dimension %d is not supported (expected 2 or 3)", fn, mask:dim()))
    end
  end
  if key_padding_mask ~= nil then
    local kpm = additive(key_padding_mask, like, fn, "key_padding_mask")
    local want = batched and string.format("[%d, %d]", N, S) or string.format("[%d]", S)
    if shape_str(kpm) ~= want then
      raise(string.format("%s: expected key_padding_mask of shape %s (batch, source length), got %s",
                          fn, want, shape_str(kpm)))
    end
    kpm = kpm:view(N, 1, 1, S)
    mask = mask == nil and kpm or mask + kpm
  end
  return mask
end

-- forward(query, key, value [, {key_padding_mask=, need_weights=true,
-- attn_mask=, average_attn_weights=true, is_causal=false}]): query (L, N, E)
-- ((N, L, E) with batch_first, (L, E) unbatched), key (S, N, kdim), value
-- (S, N, vdim). Returns the output and the attention weights, averaged
-- over the heads (N, L, S) or per head (N, H, L, S) -- nil with
-- need_weights=false. is_causal: with an attn_mask, a hint that the mask
-- is the causal one (used as PyTorch uses it: when neither weights nor a
-- padding mask are needed the fused causal attention runs instead of the
-- mask); without one, the causal mask itself.
local fwd_opts = { key_padding_mask = true, need_weights = true, attn_mask = true, average_attn_weights = true,
                   is_causal = true }
function T.MultiheadAttention:forward(query, key, value, opts)
  local fn = "MultiheadAttention"
  opts = check_opts(opts or {}, fn, fwd_opts)
  want_float(query, fn, "query")
  want_float(key, fn, "key")
  want_float(value, fn, "value")
  local need_weights = opts.need_weights ~= false
  local is_causal = opts.is_causal == true
  local batched = query:dim() == 3
  if (query:dim() ~= 2 and not batched) or key:dim() ~= query:dim() or value:dim() ~= query:dim() then
    raise(string.format("%s: expected query, key and value all 3-D (batched) or all 2-D (unbatched), got %s, %s and %s",
                        fn, shape_str(query), shape_str(key), shape_str(value)))
  end
  local same = rawequal(query, key) and rawequal(key, value)
  if not batched then
    query, key, value = query:unsqueeze(0), key:unsqueeze(0), value:unsqueeze(0)
  elseif not self.batch_first then
    query, key, value = query:transpose(0, 1), key:transpose(0, 1), value:transpose(0, 1)
  end
  -- from here on (N, L, E), (N, S, kdim), (N, S, vdim)
  local N, L_, S = query:size(0), query:size(1), key:size(1)
  local E, H, D = self.embed_dim, self.num_heads, self.head_dim
  if query:size(2) ~= E or key:size(2) ~= self.kdim or value:size(2) ~= self.vdim
     or key:size(0) ~= N or value:size(0) ~= N or value:size(1) ~= S then
    raise(string.format("%s: query %s, key %s and value %s do not fit embed_dim=%d, kdim=%d, vdim=%d%s",
                        fn, shape_str(query), shape_str(key), shape_str(value), E, self.kdim, self.vdim,
                        batched and (self.batch_first and " (batch_first: (N, L, E))" or " ((L, N, E); batch_first=true takes (N, L, E))") or ""))
  end
  local q, k, v = self:_in_projection(query, key, value, same)
  q = q:view(N, L_, H, D):transpose(1, 2)           -- (N, H, L, D)
  k = k:view(N, S, H, D):transpose(1, 2)            -- (N, H, S, D)
  v = v:view(N, S, H, D):transpose(1, 2)
  local attn_mask, kpm = opts.attn_mask, opts.key_padding_mask
  local sdpa_causal = false
  local extra_keys = self.bias_k ~= nil or self.add_zero_attn
  if is_causal and kpm == nil and not need_weights and not extra_keys then
    attn_mask, sdpa_causal = nil, true
  elseif is_causal and attn_mask == nil then
    attn_mask = causal_mask(L_, S, query.device)
  end
  local mask = self:_merged_mask(attn_mask, kpm, N, L_, S, query, batched)
  k, v, mask = self:_extra_keys(k, v, mask)
  local p = self.training and self.dropout or 0
  local out, weights
  if need_weights then
    local scores = q:matmul(k:transpose(-2, -1)) * (1 / math.sqrt(D))
    if mask ~= nil then scores = scores + mask end
    weights = F.softmax(scores, -1)
    if p > 0 then weights = F.dropout(weights, p, true) end
    out = weights:matmul(v)
    if opts.average_attn_weights ~= false then weights = weights:mean(1) end
    if not batched then weights = weights:squeeze(0) end
  else
    out = F.scaled_dot_product_attention(q, k, v, { attn_mask = mask, dropout_p = p, is_causal = sdpa_causal })
  end
  out = self.out_proj(out:transpose(1, 2):reshape(N, L_, E))
  if not batched then out = out:squeeze(0)
  elseif not self.batch_first then out = out:transpose(0, 1) end
  return out, weights
end

-- F.multi_head_attention_forward(query, key, value, embed_dim_to_check,
-- num_heads, in_proj_weight, in_proj_bias, bias_k, bias_v, add_zero_attn,
-- dropout_p, out_proj_weight, out_proj_bias [, {training = true,
-- key_padding_mask, need_weights = true, attn_mask, use_separate_proj_weight,
-- q_proj_weight, k_proj_weight, v_proj_weight, average_attn_weights,
-- is_causal}]): MultiheadAttention's forward with the weights given, inputs
-- (L, N, E) (or unbatched), as PyTorch's functional form; returns the
-- output and the attention weights (nil without need_weights).
function F.multi_head_attention_forward(query, key, value, embed_dim, num_heads, in_proj_weight, in_proj_bias, bias_k,
                                        bias_v, add_zero_attn, dropout_p, out_proj_weight, out_proj_bias, opts)
  local fn = "multi_head_attention_forward"
  opts = torch._options(opts, fn)
  if opts.static_k ~= nil or opts.static_v ~= nil then raise(fn .. ": static_k and static_v are not supported") end
  want_float(query, fn, "query")
  want_float(key, fn, "key")
  want_float(value, fn, "value")
  for _, a in ipairs({ { "embed_dim_to_check", embed_dim }, { "num_heads", num_heads } }) do
    if type(a[2]) ~= "number" or a[2] % 1 ~= 0 or a[2] < 1 then
      raise(string.format("%s: expected %s to be a positive integer, got %s", fn, a[1], tostring(a[2])))
    end
  end
  if query:size(-1) ~= embed_dim then
    raise(string.format("%s: was expecting embedding dimension of %d, but got %d", fn, embed_dim, query:size(-1)))
  end
  if embed_dim % num_heads ~= 0 then raise(string.format("%s: embed_dim %d not divisible by num_heads %d", fn, embed_dim, num_heads)) end
  local separate = opts.use_separate_proj_weight == true
  local proxy = setmetatable({
    embed_dim = embed_dim, num_heads = num_heads, head_dim = embed_dim / num_heads,
    kdim = key:size(-1), vdim = value:size(-1), _qkv_same_embed_dim = not separate,
    in_proj_weight = not separate and in_proj_weight or nil, in_proj_bias = in_proj_bias,
    q_proj_weight = opts.q_proj_weight, k_proj_weight = opts.k_proj_weight, v_proj_weight = opts.v_proj_weight,
    bias_k = bias_k, bias_v = bias_v, add_zero_attn = add_zero_attn == true, dropout = dropout_p or 0,
    training = opts.training ~= false, batch_first = false,
    out_proj = function(x) return F.linear(x, out_proj_weight, out_proj_bias) end,
  }, { __index = T.MultiheadAttention })
  return T.MultiheadAttention.forward(proxy, query, key, value, {
    key_padding_mask = opts.key_padding_mask, need_weights = opts.need_weights, attn_mask = opts.attn_mask,
    average_attn_weights = opts.average_attn_weights, is_causal = opts.is_causal })
end

---------------------------------------------------------------- the layers

local activations = { relu = F.relu, gelu = F.gelu }

-- What the encoder and decoder layers share: their options resolved, and
-- the option tables of their parts.
local layer_opts = { dim_feedforward = true, dropout = true, activation = true, layer_norm_eps = true,
                     batch_first = true, norm_first = true, bias = true, dtype = true, device = true }
local function layer_settings(fn, d_model, nhead, opts)
  opts = check_opts(opts or {}, fn, layer_opts)
  want_int(d_model, fn, "d_model")
  want_int(nhead, fn, "nhead")
  local p = opts.dropout
  if p == nil then p = 0.1 end
  local s = { ff = want_int(opts.dim_feedforward or 2048, fn, "dim_feedforward"), p = want_prob(p, fn),
              norm_first = opts.norm_first == true }
  local bias, dt, dev = opts.bias ~= false, opts.dtype, opts.device
  s.attn = { dropout = p, bias = bias, batch_first = opts.batch_first, dtype = dt, device = dev }
  s.linear = { bias = bias, dtype = dt, device = dev }
  s.norm = { eps = opts.layer_norm_eps or 1e-5, bias = bias, dtype = dt, device = dev }
  local act = opts.activation or "relu"
  if type(act) == "string" then
    if not activations[act] then raise(fn .. ': activation should be "relu" or "gelu" (or a function), not ' .. act) end
    s.activation_name, act = act, activations[act]
  elseif type(act) ~= "function" and not module.is_module(act) then
    raise(fn .. ': activation should be "relu", "gelu", a function or a module, got ' .. type(act))
  end
  s.activation = act
  return s
end

-- PyTorch's trailing forward arguments, positionally in the order of names
-- or as one options table; those named *is_causal become booleans.
local function forward_args(fn, names, ...)
  local a, out = ..., {}
  if type(a) == "table" and not is_tensor(a) then
    local allowed = {}
    for _, name in ipairs(names) do allowed[name] = true end
    local o = check_opts(a, fn, allowed)
    for i, name in ipairs(names) do out[i] = o[name] end
  else
    for i = 1, #names do out[i] = (select(i, ...)) end
  end
  for i, name in ipairs(names) do
    if name:match("is_causal$") then out[i] = out[i] == true end
  end
  return unpack(out, 1, #names)
end

-- The attention of x to kv, without weights, then dropout.
local function attention_block(attn, dropout, x, kv, mask, kpm, is_causal)
  return dropout(attn(x, kv, kv, { attn_mask = mask, key_padding_mask = kpm, need_weights = false,
                                   is_causal = is_causal }))
end

---------------------------------------------------------------- TransformerEncoderLayer

-- TransformerEncoderLayer(d_model, nhead [, {dim_feedforward=2048,
-- dropout=0.1, activation="relu" | "gelu" | function, layer_norm_eps=1e-5,
-- batch_first=false, norm_first=false, bias=true, dtype=, device=}]):
-- self-attention then a feed-forward block, each with dropout and a
-- residual, LayerNorm after each (or before, with norm_first), as PyTorch.
T.TransformerEncoderLayer = Module:extend("TransformerEncoderLayer")
function T.TransformerEncoderLayer:__init(d_model, nhead, opts)
  local s = layer_settings("TransformerEncoderLayer", d_model, nhead, opts)
  self.self_attn = T.MultiheadAttention(d_model, nhead, s.attn)
  self.linear1 = L.Linear(d_model, s.ff, s.linear)
  self.dropout = L.Dropout(s.p)
  self.linear2 = L.Linear(s.ff, d_model, s.linear)
  self.norm_first = s.norm_first
  self.norm1 = L.LayerNorm(d_model, s.norm)
  self.norm2 = L.LayerNorm(d_model, s.norm)
  self.dropout1 = L.Dropout(s.p)
  self.dropout2 = L.Dropout(s.p)
  self.activation_name, self.activation = s.activation_name, s.activation
end

function T.TransformerEncoderLayer:_ff_block(x)
  return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))
end

-- forward(src [, {src_mask=, src_key_padding_mask=, is_causal=false}]) or
-- forward(src, src_mask, src_key_padding_mask, is_causal).
function T.TransformerEncoderLayer:forward(src, ...)
  local mask, kpm, is_causal = forward_args("TransformerEncoderLayer",
                                            { "src_mask", "src_key_padding_mask", "is_causal" }, ...)
  want_float(src, "TransformerEncoderLayer", "src")
  local x, sa, drop = src, self.self_attn, self.dropout1
  if self.norm_first then
    local h = self.norm1(x)
    x = x + attention_block(sa, drop, h, h, mask, kpm, is_causal)
    x = x + self:_ff_block(self.norm2(x))
  else
    x = self.norm1(x + attention_block(sa, drop, x, x, mask, kpm, is_causal))
    x = self.norm2(x + self:_ff_block(x))
  end
  return x
end

---------------------------------------------------------------- TransformerDecoderLayer

-- TransformerDecoderLayer(d_model, nhead [, options as the encoder
-- layer's]): self-attention, attention to the encoder's output (memory),
-- then the feed-forward block, each with dropout and a residual and a
-- LayerNorm after (or before, with norm_first), as PyTorch.
T.TransformerDecoderLayer = Module:extend("TransformerDecoderLayer")
function T.TransformerDecoderLayer:__init(d_model, nhead, opts)
  local s = layer_settings("TransformerDecoderLayer", d_model, nhead, opts)
  self.self_attn = T.MultiheadAttention(d_model, nhead, s.attn)
  self.multihead_attn = T.MultiheadAttention(d_model, nhead, s.attn)
  self.linear1 = L.Linear(d_model, s.ff, s.linear)
  self.dropout = L.Dropout(s.p)
  self.linear2 = L.Linear(s.ff, d_model, s.linear)
  self.norm_first = s.norm_first
  self.norm1 = L.LayerNorm(d_model, s.norm)
  self.norm2 = L.LayerNorm(d_model, s.norm)
  self.norm3 = L.LayerNorm(d_model, s.norm)
  self.dropout1 = L.Dropout(s.p)
  self.dropout2 = L.Dropout(s.p)
  self.dropout3 = L.Dropout(s.p)
  self.activation_name, self.activation = s.activation_name, s.activation
end

function T.TransformerDecoderLayer:_ff_block(x)
  return self.dropout3(self.linear2(self.dropout(self.activation(self.linear1(x)))))
end

local decoder_names = { "tgt_mask", "memory_mask", "tgt_key_padding_mask", "memory_key_padding_mask",
                        "tgt_is_causal", "memory_is_causal" }

-- forward(tgt, memory [, {tgt_mask=, memory_mask=, tgt_key_padding_mask=,
-- memory_key_padding_mask=, tgt_is_causal=false, memory_is_causal=false}])
-- or those positionally, in that order.
function T.TransformerDecoderLayer:forward(tgt, memory, ...)
  local fn = "TransformerDecoderLayer"
  local tmask, mmask, tkpm, mkpm, tcausal, mcausal = forward_args(fn, decoder_names, ...)
  want_float(tgt, fn, "tgt")
  want_float(memory, fn, "memory")
  local x, sa, ca = tgt, self.self_attn, self.multihead_attn
  if self.norm_first then
    local h = self.norm1(x)
    x = x + attention_block(sa, self.dropout1, h, h, tmask, tkpm, tcausal)
    x = x + attention_block(ca, self.dropout2, self.norm2(x), memory, mmask, mkpm, mcausal)
    x = x + self:_ff_block(self.norm3(x))
  else
    x = self.norm1(x + attention_block(sa, self.dropout1, x, x, tmask, tkpm, tcausal))
    x = self.norm2(x + attention_block(ca, self.dropout2, x, memory, mmask, mkpm, mcausal))
    x = self.norm3(x + self:_ff_block(x))
  end
  return x
end

---------------------------------------------------------------- TransformerEncoder, TransformerDecoder

-- num_layers copies of layer (each with its own parameters, copied from
-- the layer given, as PyTorch's deepcopy), in a ModuleList named layers,
-- then opts.norm when given.
local function stack(self, fn, what, layer, num_layers, opts, extra)
  if not module.is_module(layer) then
    raise(string.format("%s: expected %s to be a module (a %sLayer), got %s", fn, what, fn, type(layer)))
  end
  want_int(num_layers, fn, "num_layers")
  if module.is_module(opts) then opts = { norm = opts } end
  local allowed = { norm = true }
  for _, k in ipairs(extra) do allowed[k] = true end
  opts = check_opts(opts or {}, fn, allowed)
  local layers = L.ModuleList()
  for _ = 1, num_layers do layers:append(layer:deepcopy()) end
  self.layers = layers
  self.num_layers = num_layers
  if opts.norm ~= nil then
    if not module.is_module(opts.norm) then raise(fn .. ": expected norm to be a module, got " .. type(opts.norm)) end
    self.norm = opts.norm
  end
end

local function final_norm(self, x)
  local norm = self._modules.map.norm
  if norm ~= nil then x = norm(x) end
  return x
end

-- TransformerEncoder(encoder_layer, num_layers [, {norm=}]).
T.TransformerEncoder = Module:extend("TransformerEncoder")
function T.TransformerEncoder:__init(encoder_layer, num_layers, opts)
  stack(self, "TransformerEncoder", "encoder_layer", encoder_layer, num_layers, opts, { "enable_nested_tensor", "mask_check" })
end

-- forward(src [, {mask=, src_key_padding_mask=, is_causal=false}]) or
-- forward(src, mask, src_key_padding_mask, is_causal).
function T.TransformerEncoder:forward(src, ...)
  local mask, kpm, is_causal = forward_args("TransformerEncoder", { "mask", "src_key_padding_mask", "is_causal" }, ...)
  local x = src
  for _, layer in ipairs(self.layers) do
    x = layer(x, { src_mask = mask, src_key_padding_mask = kpm, is_causal = is_causal })
  end
  return final_norm(self, x)
end

-- TransformerDecoder(decoder_layer, num_layers [, {norm=}]).
T.TransformerDecoder = Module:extend("TransformerDecoder")
function T.TransformerDecoder:__init(decoder_layer, num_layers, opts)
  stack(self, "TransformerDecoder", "decoder_layer", decoder_layer, num_layers, opts, {})
end

-- forward(tgt, memory [, options or positional arguments as
-- TransformerDecoderLayer's]).
function T.TransformerDecoder:forward(tgt, memory, ...)
  local tmask, mmask, tkpm, mkpm, tcausal, mcausal = forward_args("TransformerDecoder", decoder_names, ...)
  local x = tgt
  for _, layer in ipairs(self.layers) do
    x = layer(x, memory, { tgt_mask = tmask, memory_mask = mmask, tgt_key_padding_mask = tkpm,
                           memory_key_padding_mask = mkpm, tgt_is_causal = tcausal, memory_is_causal = mcausal })
  end
  return final_norm(self, x)
end

---------------------------------------------------------------- Transformer

-- Transformer([d_model=512 [, nhead=8 [, num_encoder_layers=6 [,
-- num_decoder_layers=6 [, dim_feedforward=2048 [, dropout=0.1]]]]]] [,
-- {the same by name, activation=, custom_encoder=, custom_decoder=,
-- layer_norm_eps=, batch_first=, norm_first=, bias=, dtype=, device=}]):
-- PyTorch's encoder-decoder, each stack closed by a LayerNorm; every
-- parameter of more than one dimension xavier_uniform_ initialised.
T.Transformer = Module:extend("Transformer")
local positional = { "d_model", "nhead", "num_encoder_layers", "num_decoder_layers", "dim_feedforward", "dropout" }
local transformer_opts = { activation = true, custom_encoder = true, custom_decoder = true, layer_norm_eps = true,
                           batch_first = true, norm_first = true, bias = true, dtype = true, device = true }
for _, k in ipairs(positional) do transformer_opts[k] = true end
function T.Transformer:__init(...)
  local fn = "Transformer"
  local n = select("#", ...)
  local last = n > 0 and select(n, ...) or nil
  local opts = {}
  if type(last) == "table" then n = n - 1; opts = last end
  opts = check_opts(opts, fn, transformer_opts)
  if n > #positional then raise(string.format("%s: expected at most %d numbers before the options, got %d", fn, #positional, n)) end
  for i = 1, n do
    local name = positional[i]
    if opts[name] ~= nil then raise(string.format("%s: %s given twice, as argument %d and as an option", fn, name, i)) end
    opts[name] = (select(i, ...))
  end
  local d_model, nhead = opts.d_model or 512, opts.nhead or 8
  local layer = { dim_feedforward = opts.dim_feedforward, dropout = opts.dropout, activation = opts.activation,
                  layer_norm_eps = opts.layer_norm_eps, batch_first = opts.batch_first, norm_first = opts.norm_first,
                  bias = opts.bias, dtype = opts.dtype, device = opts.device }
  local norm = { eps = opts.layer_norm_eps or 1e-5, bias = opts.bias ~= false, dtype = opts.dtype,
                 device = opts.device }
  self.encoder = opts.custom_encoder or T.TransformerEncoder(T.TransformerEncoderLayer(d_model, nhead, layer),
    opts.num_encoder_layers or 6, { norm = L.LayerNorm(d_model, norm) })
  self.decoder = opts.custom_decoder or T.TransformerDecoder(T.TransformerDecoderLayer(d_model, nhead, layer),
    opts.num_decoder_layers or 6, { norm = L.LayerNorm(d_model, norm) })
  for _, p in ipairs(self:parameters()) do
    if p:dim() > 1 then init.xavier_uniform_(p) end
  end
  self.d_model, self.nhead, self.batch_first = d_model, nhead, opts.batch_first == true
end

local transformer_names = { "src_mask", "tgt_mask", "memory_mask", "src_key_padding_mask", "tgt_key_padding_mask",
                            "memory_key_padding_mask", "src_is_causal", "tgt_is_causal", "memory_is_causal" }

-- forward(src, tgt [, {src_mask=, tgt_mask=, memory_mask=,
-- src_key_padding_mask=, tgt_key_padding_mask=, memory_key_padding_mask=,
-- src_is_causal=, tgt_is_causal=, memory_is_causal=}]) or those
-- positionally, in that order: src (S, N, E) and tgt (T, N, E) ((N, S, E)
-- and (N, T, E) with batch_first; (S, E) and (T, E) unbatched) give (T, N, E).
function T.Transformer:forward(src, tgt, ...)
  local fn = "Transformer"
  local smask, tmask, mmask, skpm, tkpm, mkpm, scausal, tcausal, mcausal = forward_args(fn, transformer_names, ...)
  want_float(src, fn, "src")
  want_float(tgt, fn, "tgt")
  local bdim = self.batch_first and 0 or 1
  if src:dim() == 3 and (tgt:dim() ~= 3 or src:size(bdim) ~= tgt:size(bdim)) then
    raise(string.format("%s: the batch number of src and tgt must be equal, got src %s and tgt %s%s", fn,
                        shape_str(src), shape_str(tgt), self.batch_first and " (batch_first)" or ""))
  end
  if src:size(-1) ~= self.d_model or tgt:size(-1) ~= self.d_model then
    raise(string.format("%s: the feature number of src and tgt must be equal to d_model=%d, got src %s and tgt %s",
                        fn, self.d_model, shape_str(src), shape_str(tgt)))
  end
  local memory = self.encoder(src, { mask = smask, src_key_padding_mask = skpm, is_causal = scausal })
  return self.decoder(tgt, memory, { tgt_mask = tmask, memory_mask = mmask, tgt_key_padding_mask = tkpm,
                                     memory_key_padding_mask = mkpm, tgt_is_causal = tcausal,
                                     memory_is_causal = mcausal })
end

-- Transformer.generate_square_subsequent_mask(sz [, {dtype=, device=}]):
-- the float causal mask, -inf above the diagonal and 0 elsewhere. Also
-- callable on a model (model:generate_square_subsequent_mask(sz)).
function T.Transformer.generate_square_subsequent_mask(a, b, c)
  local sz, opts = a, b
  if type(a) == "table" then sz, opts = b, c end
  want_int(sz, "generate_square_subsequent_mask", "sz")
  opts = check_opts(opts or {}, "generate_square_subsequent_mask", { dtype = true, device = true })
  return torch.full({ sz, sz }, -math.huge, { dtype = opts.dtype, device = opts.device }):triu(1)
end

return T
