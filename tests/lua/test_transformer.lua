-- test_transformer.lua -- nn.MultiheadAttention, the Transformer encoder
-- and decoder layers and stacks, and nn.Transformer against PyTorch
-- (tests/ref/transformer.lua,
-- written by scripts/gen_transformer_ref.py): PyTorch's weights loaded
-- with load_state_dict, then the outputs, the attention weights and the
-- gradients of the inputs and of every parameter, in float64 and float32;
-- batch_first both ways, unbatched inputs, norm_first both ways, relu and
-- gelu, bool and float masks, key padding masks, is_causal, kdim/vdim,
-- bias=false. Then parameter names, initialisation, deepcopy'd layers and
-- bad input.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local dir = os.getenv("DPLUA_TEST_DIR") or (here .. "/..")
package.path = dir .. "/lua/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local nn = torch.nn
local ref = dofile(dir .. "/ref/transformer.lua")

local function tensor(r, dtype) return T.ref_tensor(torch, r, dtype) end

local tol = { [torch.float64] = 1e-10, [torch.float32] = 1e-4 }

local function build(c, dtype)
  local opts = {}
  for k, v in pairs(c.opts) do opts[k] = v end
  opts.dtype = dtype
  if c.kind == "mha" then return nn.MultiheadAttention(c.E, c.H, opts) end
  if c.kind == "transformer" then return nn.Transformer(opts) end
  local decoder = c.kind == "dlayer" or c.kind == "decoder"
  local layer = (decoder and nn.TransformerDecoderLayer or nn.TransformerEncoderLayer)(c.E, c.H, opts)
  if c.kind == "layer" or c.kind == "dlayer" then return layer end
  local norm = c.final_norm and nn.LayerNorm(c.E, { dtype = dtype }) or nil
  return (decoder and nn.TransformerDecoder or nn.TransformerEncoder)(layer, c.num_layers, { norm = norm })
end

local function run_case(name, c, dtype)
  local label = name .. " " .. tostring(dtype)
  T.run(label, function()
    local m = build(c, dtype)
    local sd = {}
    for k, v in pairs(c.weights) do sd[k] = tensor(v, dtype) end
    m:load_state_dict(sd)
    local inputs = {}
    for k, v in pairs(c.inputs) do inputs[k] = tensor(v, dtype):requires_grad_() end
    local fwd = {}
    for k, v in pairs(c.fwd) do fwd[k] = type(v) == "table" and tensor(v, not v.bool and dtype or nil) or v end
    local out, weights
    if c.kind == "mha" then
      local x = inputs.x
      if x then out, weights = m(x, x, x, fwd)
      else out, weights = m(inputs.query, inputs.key, inputs.value, fwd) end
    elseif c.kind == "transformer" then
      out = m(inputs.src, inputs.tgt, fwd)
    elseif inputs.memory then
      out = m(inputs.tgt, inputs.memory, fwd)
    else
      out = m(inputs.src, fwd)
    end
    local rt = tol[dtype]
    T.tensor_close(out:double(), tensor(c.out), rt, rt, label .. ": output")
    local loss = (out * tensor(c.dout, dtype)):sum()
    if c.weights_out then
      T.tensor_close(weights:double(), tensor(c.weights_out), rt, rt, label .. ": attention weights")
      loss = loss + (weights * tensor(c.dweights, dtype)):sum()
    else
      T.is(weights, nil, label .. ": no weights with need_weights=false")
    end
    loss:backward()
    local params = {}
    for n, p in m:named_parameters() do params[n] = p end
    for _, k in ipairs(T.sorted_keys(c.grads)) do
      local pname = k:match("^param%.(.*)$")
      local t = pname and params[pname] or inputs[k]
      T.ok(t ~= nil, label .. ": has " .. k)
      if t then T.tensor_close(t.grad:double(), tensor(c.grads[k]), rt, rt, label .. ": gradient of " .. k) end
    end
    local count = 0
    for _ in pairs(params) do count = count + 1 end
    local want = 0
    for k in pairs(c.grads) do if k:match("^param%.") then want = want + 1 end end
    T.is(count, want, label .. ": the parameters are PyTorch's")
  end)
end

for _, name in ipairs(T.sorted_keys(ref)) do
  for _, dtype in ipairs({ torch.float64, torch.float32 }) do run_case(name, ref[name], dtype) end
end

T.run("MultiheadAttention: PyTorch's parameter names, shapes and initialisation", function()
  torch.manual_seed(0)
  local m = nn.MultiheadAttention(16, 4)
  local got = {}
  for n, p in m:named_parameters() do got[#got + 1] = n .. "=" .. table.concat(p:size(), "x") end
  T.is(table.concat(got, " "), "in_proj_weight=48x16 in_proj_bias=48 out_proj.weight=16x16 out_proj.bias=16", "names")
  T.is(m.in_proj_bias:abs():sum():item(), 0, "in_proj_bias zero")
  T.is(m.out_proj.bias:abs():sum():item(), 0, "out_proj.bias zero")
  local bound = math.sqrt(6 / (16 + 48))   -- xavier_uniform_ over (48, 16)
  T.ok(m.in_proj_weight:abs():max():item() <= bound, "in_proj_weight within the xavier bound")
  local sep = nn.MultiheadAttention(8, 2, { kdim = 3, vdim = 5, bias = false })
  got = {}
  for n, p in sep:named_parameters() do got[#got + 1] = n .. "=" .. table.concat(p:size(), "x") end
  T.is(table.concat(got, " "), "q_proj_weight=8x8 k_proj_weight=8x3 v_proj_weight=8x5 out_proj.weight=8x8",
       "kdim/vdim: separate projections, bias=false")
  local kv = nn.MultiheadAttention(8, 2, { add_bias_kv = true, add_zero_attn = true })
  got = {}
  for n, p in kv:named_parameters() do got[#got + 1] = n .. "=" .. table.concat(p:size(), "x") end
  T.is(table.concat(got, " "), "in_proj_weight=24x8 in_proj_bias=24 bias_k=1x1x8 bias_v=1x1x8 out_proj.weight=8x8 "
       .. "out_proj.bias=8", "add_bias_kv: bias_k and bias_v, as PyTorch names and orders them")
  T.ok(kv.bias_k:abs():sum():item() > 0 and kv.add_zero_attn, "bias_k initialised (xavier_normal_), add_zero_attn kept")
  T.is(tostring(m), "MultiheadAttention(\n  (out_proj): NonDynamicallyQuantizableLinear(in_features=16, "
       .. "out_features=16, bias=True)\n)", "printing")
end)

T.run("need_weights=false with no mask runs the fused attention; is_causal equals the causal mask", function()
  torch.manual_seed(1)
  local m = nn.MultiheadAttention(8, 2, { batch_first = true })
  local x = torch.randn(2, 5, 8)
  local a = m(x, x, x, { need_weights = false, is_causal = true })
  local b = m(x, x, x, { attn_mask = torch.ones(5, 5, { dtype = torch.bool }):triu(1) })
  T.tensor_close(a, b, 1e-5, 1e-5, "causal flash path equals the masked composite")
  local c = m(x, x, x, { need_weights = true, is_causal = true })
  T.tensor_close(c, b, 1e-5, 1e-5, "is_causal without a mask, with weights")
end)

T.run("TransformerEncoder: layers are copies with their own parameters", function()
  local layer = nn.TransformerEncoderLayer(8, 2, { dim_feedforward = 16, batch_first = true })
  local enc = nn.TransformerEncoder(layer, 3)
  T.is(#enc:parameters(), 3 * #layer:parameters(), "three layers' parameters")
  T.tensor_close(enc.layers[2].linear1.weight, layer.linear1.weight, 0, 0, "copied values")
  torch.no_grad(function() enc.layers[0].linear1.weight:fill_(1) end)
  T.ok(layer.linear1.weight:sum():item() ~= enc.layers[0].linear1.weight:sum():item(), "not shared")
  local n = 0
  for i, l in ipairs(enc.layers) do n = i; T.ok(l.self_attn ~= nil, "ipairs over layers " .. i) end
  T.is(n, 3, "ipairs sees every layer")
  T.is(enc.layers[1].dropout.p, 0.1, "the layer's options come along")
end)

T.run("Transformer: the square subsequent mask, the constructor's arguments, PyTorch's names", function()
  local want = tensor(ref.transformer_batch_first.fwd.tgt_mask)
  T.tensor_close(nn.Transformer.generate_square_subsequent_mask(4):double(), want, 0, 0,
                 "generate_square_subsequent_mask(4) is PyTorch's")
  local m = nn.Transformer(8, 2, 1, 1, 16, { batch_first = true })
  T.is(m:generate_square_subsequent_mask(3, { dtype = torch.float64 }).dtype, torch.float64, "called on a model, dtype")
  T.is(m.encoder.layers[0].linear1.out_features, 16, "dim_feedforward given positionally")
  T.is(m.decoder.layers[0].dropout.p, 0.1, "dropout by default")
  local names = {}
  for n in m:named_parameters() do names[#names + 1] = n end
  T.is(#names, 12 + 18 + 2 * 2, "an encoder layer's 12 tensors, a decoder layer's 18, two norms' 2 each")
  T.is(names[1], "encoder.layers.0.self_attn.in_proj_weight", "encoder first")
  T.is(names[13], "encoder.norm.weight", "the encoder's norm after its layers")
  T.is(names[19], "decoder.layers.0.multihead_attn.in_proj_weight", "the cross-attention after the self-attention")
  local bound = math.sqrt(6 / (16 + 8))   -- xavier_uniform_ over linear1's (16, 8)
  local w = m.decoder.layers[0].linear1.weight
  T.ok(w:abs():max():item() <= bound and w:abs():max():item() > bound / 2, "linear weights xavier_uniform_")
  T.is(m.decoder.layers[0].linear1.bias:abs():max():item() <= 1 / math.sqrt(8), true, "biases keep Linear's init")
  local y = m(torch.randn(2, 5, 8), torch.randn(2, 3, 8), { tgt_is_causal = true })
  T.is(T.shape(y), { 2, 3, 8 }, "batch_first output (N, T, E)")
  local u = m(torch.randn(5, 8), torch.randn(3, 8))
  T.is(T.shape(u), { 3, 8 }, "unbatched")
  local custom = nn.Transformer({ d_model = 8, nhead = 2, custom_encoder = nn.Identity(), num_decoder_layers = 1,
                                  dim_feedforward = 4 })
  T.is(tostring(custom.encoder), "Identity()", "custom_encoder")
end)

T.run("bad input names the problem", function()
  T.raises(function() nn.MultiheadAttention(10, 3) end, "embed_dim must be divisible by num_heads", "heads")
  T.raises(function() nn.MultiheadAttention(8, 2, { dropuot = 0.1 }) end, "unknown option 'dropuot'", "option")
  T.raises(function() nn.TransformerEncoderLayer(8, 2, { activation = "tanh" }) end, 'activation should be "relu" or "gelu"',
           "activation")
  local m = nn.MultiheadAttention(8, 2, { batch_first = true })
  local x = torch.randn(2, 5, 8)
  T.raises(function() m(x, x, x, { attn_mask = torch.zeros(4, 4) }) end, "2%-D attn_mask is %[4, 4%], but should be %[5, 5%]",
           "attn_mask shape")
  T.raises(function() m(x, x, x, { key_padding_mask = torch.zeros(2, 4, { dtype = torch.bool }) }) end,
           "expected key_padding_mask of shape %[2, 5%]", "key_padding_mask shape")
  T.raises(function() m(torch.randn(2, 5, 6), x, x) end, "do not fit embed_dim=8", "width")
  T.raises(function() m(x, x, torch.randn(5, 8)) end, "all 3%-D %(batched%) or all 2%-D", "dims")
  T.raises(function() m(x, x, x, { attn_mask = torch.zeros(5, 5, { dtype = torch.int64 }) }) end,
           "attn_mask to be a bool or floating point tensor", "mask dtype")
  T.raises(function() nn.TransformerEncoder(42, 2) end, "expected encoder_layer to be a module", "layer")
  T.raises(function() nn.TransformerDecoder(nn.TransformerDecoderLayer(8, 2), 0) end, "num_layers", "no layers")
  local t = nn.Transformer(8, 2, 1, 1, 16)
  T.raises(function() t(torch.randn(5, 2, 8), torch.randn(3, 4, 8)) end,
           "the batch number of src and tgt must be equal, got src %[5, 2, 8%] and tgt %[3, 4, 8%]", "batch")
  T.raises(function() t(torch.randn(5, 2, 8), torch.randn(3, 2, 6)) end,
           "the feature number of src and tgt must be equal to d_model=8", "width")
  T.raises(function() nn.Transformer(8, 2, { d_model = 8 }) end, "d_model given twice", "twice")
  T.raises(function() nn.Transformer(8, 2, { num_layers = 2 }) end, "unknown option 'num_layers'", "option")
  local dl = nn.TransformerDecoderLayer(8, 2, { batch_first = true })
  T.raises(function() dl(torch.randn(2, 3, 8), torch.randn(2, 5, 8), { tgt_mask = torch.zeros(4, 4) }) end,
           "2%-D attn_mask is %[4, 4%], but should be %[3, 3%]", "tgt_mask shape")
  T.raises(function() dl(torch.randn(2, 3, 8), torch.randn(2, 5, 8), { memory_mask = torch.zeros(3, 3) }) end,
           "2%-D attn_mask is %[3, 3%], but should be %[3, 5%]", "memory_mask shape")
  T.raises(function() dl(torch.randn(2, 3, 8), torch.randn(2, 5, 8), { memry_mask = 1 }) end,
           "unknown option 'memry_mask'", "misspelt option")
end)

T.run("F.multi_head_attention_forward against PyTorch", function()
  local r = dofile(here .. "/../ref/mha_functional.lua").separate
  local shapes = { { "query", { 4, 2, 6 } }, { "key", { 5, 2, 4 } }, { "value", { 5, 2, 3 } },
                   { "q_proj_weight", { 6, 6 } }, { "k_proj_weight", { 6, 4 } }, { "v_proj_weight", { 6, 3 } },
                   { "in_proj_bias", { 18 } }, { "bias_k", { 1, 1, 6 } }, { "bias_v", { 1, 1, 6 } },
                   { "out_proj_weight", { 6, 6 } }, { "out_proj_bias", { 6 } }, { "attn_mask", { 4, 5 } } }
  local t = {}
  for i, e in ipairs(shapes) do
    t[e[1]] = T.filled(torch, e[2], function(k) return 0.4 * math.sin(1 + 0.7 * k + (i - 1)) end)
    if e[1] ~= "attn_mask" then t[e[1]]:requires_grad_() end
  end
  local kpm = torch.tensor({ { false, false, false, false, false }, { false, false, false, false, true } })
  local F_ = torch.nn.functional
  local out, w = F_.multi_head_attention_forward(t.query, t.key, t.value, 6, 2, nil, t.in_proj_bias, t.bias_k, t.bias_v,
    false, 0, t.out_proj_weight, t.out_proj_bias, { key_padding_mask = kpm, attn_mask = t.attn_mask,
    use_separate_proj_weight = true, q_proj_weight = t.q_proj_weight, k_proj_weight = t.k_proj_weight,
    v_proj_weight = t.v_proj_weight, average_attn_weights = false })
  T.values_close(out:reshape(-1):tolist(), r.out, 1e-12, 1e-12, "output")
  T.is(T.shape(w), r.weights_shape, "per-head weights' shape")
  T.values_close(w:reshape(-1):tolist(), r.weights, 1e-12, 1e-12, "weights")
  local function wsum(y) return (y * torch.arange(0, y:numel(), { dtype = torch.float64 }):cos():reshape(y:size())):sum() end
  ;(wsum(out) + wsum(w)):backward()
  for _, e in ipairs(shapes) do
    if r["d_" .. e[1]] then
      T.values_close(t[e[1]].grad:reshape(-1):tolist(), r["d_" .. e[1]], 1e-10, 1e-12, "the gradient of " .. e[1])
    end
  end
  T.raises(function() F_.multi_head_attention_forward(t.query, t.key, t.value, 8, 2) end,
           "was expecting embedding dimension of 8, but got 6", "embed_dim_to_check")
end)

T.done_testing()
