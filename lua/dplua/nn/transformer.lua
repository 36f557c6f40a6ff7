-- dplua.nn.transformer: nn.MultiheadAttention, nn.TransformerEncoderLayer
-- and nn.TransformerEncoder, with PyTorch's parameter names, options and
-- masks, so that a PyTorch state dict loads into them as it is.
--
--   local mha = nn.MultiheadAttention(512, 8, {batch_first = true})
--   local out, weights = mha(x, x, x, {key_padding_mask = pad})
--   local enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(512, 8, {batch_first = true}), 6)
--   local y = enc(x, {is_causal = true})
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
-- batch_first=false, kdim=embed_dim, vdim=embed_dim, dtype=, device=}]):
-- in_proj_weight (3E, E) when kdim == vdim == E, else q_proj_weight,
-- k_proj_weight and v_proj_weight; in_proj_bias (3E); out_proj a Linear.
-- Weights xavier_uniform_, biases zero, as PyTorch.
T.MultiheadAttention = Module:extend("MultiheadAttention")
-- out_proj's class is named as PyTorch names it, so that printing matches.
T.NonDynamicallyQuantizableLinear = L.Linear:extend("NonDynamicallyQuantizableLinear")

local mha_opts = { dropout = true, bias = true, batch_first = true, kdim = true, vdim = true, dtype = true, device = true,
                   add_bias_kv = true, add_zero_attn = true }
function T.MultiheadAttention:__init(embed_dim, num_heads, opts)
  local fn = "MultiheadAttention"
  opts = check_opts(opts or {}, fn, mha_opts)
  if opts.add_bias_kv or opts.add_zero_attn then raise(fn .. ": add_bias_kv and add_zero_attn are not supported") end
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
  if is_causal and kpm == nil and not need_weights then
    attn_mask, sdpa_causal = nil, true
  elseif is_causal and attn_mask == nil then
    attn_mask = causal_mask(L_, S, query.device)
  end
  local mask = self:_merged_mask(attn_mask, kpm, N, L_, S, query, batched)
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

---------------------------------------------------------------- TransformerEncoderLayer

local activations = { relu = F.relu, gelu = F.gelu }

-- TransformerEncoderLayer(d_model, nhead [, {dim_feedforward=2048,
-- dropout=0.1, activation="relu" | "gelu" | function, layer_norm_eps=1e-5,
-- batch_first=false, norm_first=false, bias=true, dtype=, device=}]):
-- self-attention then a feed-forward block, each with dropout and a
-- residual, LayerNorm after each (or before, with norm_first), as PyTorch.
T.TransformerEncoderLayer = Module:extend("TransformerEncoderLayer")
local layer_opts = { dim_feedforward = true, dropout = true, activation = true, layer_norm_eps = true,
                     batch_first = true, norm_first = true, bias = true, dtype = true, device = true }
function T.TransformerEncoderLayer:__init(d_model, nhead, opts)
  local fn = "TransformerEncoderLayer"
  opts = check_opts(opts or {}, fn, layer_opts)
  want_int(d_model, fn, "d_model")
  local ff = want_int(opts.dim_feedforward or 2048, fn, "dim_feedforward")
  local p = opts.dropout
  if p == nil then p = 0.1 end
  want_prob(p, fn)
  local bias = opts.bias ~= false
  local eps = opts.layer_norm_eps or 1e-5
  local dt, dev = opts.dtype, opts.device
  local act = opts.activation or "relu"
  if type(act) == "string" then
    if not activations[act] then raise(fn .. ': activation should be "relu" or "gelu" (or a function), not ' .. act) end
    self.activation_name, act = act, activations[act]
  elseif type(act) ~= "function" and not module.is_module(act) then
    raise(fn .. ': activation should be "relu", "gelu", a function or a module, got ' .. type(act))
  end
  self.self_attn = T.MultiheadAttention(d_model, nhead, { dropout = p, bias = bias, batch_first = opts.batch_first,
                                                           dtype = dt, device = dev })
  self.linear1 = L.Linear(d_model, ff, { bias = bias, dtype = dt, device = dev })
  self.dropout = L.Dropout(p)
  self.linear2 = L.Linear(ff, d_model, { bias = bias, dtype = dt, device = dev })
  self.norm_first = opts.norm_first == true
  self.norm1 = L.LayerNorm(d_model, { eps = eps, bias = bias, dtype = dt, device = dev })
  self.norm2 = L.LayerNorm(d_model, { eps = eps, bias = bias, dtype = dt, device = dev })
  self.dropout1 = L.Dropout(p)
  self.dropout2 = L.Dropout(p)
  self.activation = act
end

-- PyTorch's (src_mask, src_key_padding_mask, is_causal), positionally or
-- as an options table.
local function encoder_args(fn, a, b, c, names)
  if type(a) == "table" and not is_tensor(a) then
    local o = check_opts(a, fn, { [names[1]] = true, [names[2]] = true, is_causal = true })
    return o[names[1]], o[names[2]], o.is_causal == true
  end
  return a, b, c == true
end

function T.TransformerEncoderLayer:_sa_block(x, mask, kpm, is_causal)
  local out = self.self_attn(x, x, x, { attn_mask = mask, key_padding_mask = kpm, need_weights = false,
                                        is_causal = is_causal })
  return self.dropout1(out)
end

function T.TransformerEncoderLayer:_ff_block(x)
  return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))
end

-- forward(src [, {src_mask=, src_key_padding_mask=, is_causal=false}]) or
-- forward(src, src_mask, src_key_padding_mask, is_causal).
function T.TransformerEncoderLayer:forward(src, a, b, c)
  local mask, kpm, is_causal = encoder_args("TransformerEncoderLayer", a, b, c,
                                            { "src_mask", "src_key_padding_mask" })
  want_float(src, "TransformerEncoderLayer", "src")
  local x = src
  if self.norm_first then
    x = x + self:_sa_block(self.norm1(x), mask, kpm, is_causal)
    x = x + self:_ff_block(self.norm2(x))
  else
    x = self.norm1(x + self:_sa_block(x, mask, kpm, is_causal))
    x = self.norm2(x + self:_ff_block(x))
  end
  return x
end

---------------------------------------------------------------- TransformerEncoder

-- TransformerEncoder(encoder_layer, num_layers [, {norm=}]): num_layers
-- copies of encoder_layer (each with its own parameters, copied from the
-- layer given, as PyTorch's deepcopy), in a ModuleList named layers, then
-- norm when given.
T.TransformerEncoder = Module:extend("TransformerEncoder")
function T.TransformerEncoder:__init(encoder_layer, num_layers, opts)
  local fn = "TransformerEncoder"
  if not module.is_module(encoder_layer) then
    raise(fn .. ": expected encoder_layer to be a module (a TransformerEncoderLayer), got " .. type(encoder_layer))
  end
  want_int(num_layers, fn, "num_layers")
  if module.is_module(opts) then opts = { norm = opts } end
  opts = check_opts(opts or {}, fn, { norm = true, enable_nested_tensor = true, mask_check = true })
  local layers = L.ModuleList()
  for _ = 1, num_layers do layers:append(encoder_layer:deepcopy()) end
  self.layers = layers
  self.num_layers = num_layers
  if opts.norm ~= nil then
    if not module.is_module(opts.norm) then raise(fn .. ": expected norm to be a module, got " .. type(opts.norm)) end
    self.norm = opts.norm
  end
end

-- forward(src [, {mask=, src_key_padding_mask=, is_causal=false}]) or
-- forward(src, mask, src_key_padding_mask, is_causal).
function T.TransformerEncoder:forward(src, a, b, c)
  local mask, kpm, is_causal = encoder_args("TransformerEncoder", a, b, c, { "mask", "src_key_padding_mask" })
  local x = src
  for _, layer in ipairs(self.layers) do
    x = layer(x, { src_mask = mask, src_key_padding_mask = kpm, is_causal = is_causal })
  end
  local norm = self._modules.map.norm
  if norm ~= nil then x = norm(x) end
  return x
end

return T
