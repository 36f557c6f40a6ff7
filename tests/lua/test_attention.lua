-- test_attention.lua -- F.scaled_dot_product_attention against PyTorch's
-- math (tests/ref/attention.lua, written by scripts/gen_attention_ref.py):
-- outputs and the gradients of q, k and v for every case, through the
-- fused op and through the composite path (a zero float mask takes it),
-- in float64, float32 and bfloat16; strided inputs; float64 gradcheck;
-- bad input.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local dir = os.getenv("DPLUA_TEST_DIR") or (here .. "/..")
package.path = dir .. "/lua/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local F = torch.nn.functional
local ref = dofile(dir .. "/ref/attention.lua")

local function tensor(r, dtype) return T.ref_tensor(torch, r, dtype) end

-- tolerances per dtype: float64 exact to rounding, float32 and bfloat16 to their precision
local tol = { [torch.float64] = 1e-10, [torch.float32] = 2e-5, [torch.bfloat16] = 3e-2 }

local function run_case(name, c, dtype, composite)
  local label = string.format("%s %s %s", name, tostring(dtype), composite and "composite" or "fused")
  T.run(label, function()
    local q = tensor(c.q, dtype):requires_grad_()
    local k = tensor(c.k, dtype):requires_grad_()
    local v = tensor(c.v, dtype):requires_grad_()
    local opts = { is_causal = c.is_causal, scale = c.scale }
    if c.mask then
      opts.attn_mask = tensor(c.mask, c.mask.bool and nil or dtype)
    elseif composite then
      if c.is_causal then
        -- the causal rule as a bool mask: keys j <= i
        local L, S = q:size(-2), k:size(-2)
        opts.attn_mask, opts.is_causal = torch.ones(L, S, { dtype = torch.bool }):tril(), nil
      else
        opts.attn_mask = torch.zeros(q:size(-2), k:size(-2), { dtype = dtype })
      end
    end
    local out = F.scaled_dot_product_attention(q, k, v, opts)
    local fused = not c.mask and not composite
    T.is(out.grad_fn and out.grad_fn.name == "ScaledDotProductFlashAttentionBackward0", fused,
         label .. ": the fused op runs exactly when there is no mask")
    local rt = tol[dtype]
    T.tensor_close(out:double(), tensor(c.out), rt, rt, label .. ": out")
    out:backward(tensor(c.dout, dtype))
    T.tensor_close(q.grad:double(), tensor(c.dq), rt, rt, label .. ": dq")
    T.tensor_close(k.grad:double(), tensor(c.dk), rt, rt, label .. ": dk")
    T.tensor_close(v.grad:double(), tensor(c.dv), rt, rt, label .. ": dv")
  end)
end

for _, name in ipairs(T.sorted_keys(ref)) do
  for _, dtype in ipairs({ torch.float64, torch.float32, torch.bfloat16 }) do
    run_case(name, ref[name], dtype, false)
    if not ref[name].mask and dtype == torch.float64 then run_case(name, ref[name], dtype, true) end
  end
end

T.run("strided inputs: (B, L, H, E) transposed to (B, H, L, E), as a GPT's heads are", function()
  local c = ref.causal
  local q, k, v = tensor(c.q), tensor(c.k), tensor(c.v)
  local qt = q:transpose(1, 2):contiguous():transpose(1, 2)
  local kt = k:transpose(1, 2):contiguous():transpose(1, 2)
  local vt = v:transpose(1, 2):contiguous():transpose(1, 2)
  T.ok(not qt:is_contiguous(), "the inputs are strided views")
  qt:requires_grad_(); kt:requires_grad_(); vt:requires_grad_()
  local out = F.scaled_dot_product_attention(qt, kt, vt, { is_causal = true })
  T.tensor_close(out, tensor(c.out), 1e-10, 1e-10, "out")
  T.ok(out:transpose(1, 2):is_contiguous(), "out is stored (B, L, H, E) as the inputs are")
  out:backward(tensor(c.dout):transpose(1, 2):contiguous():transpose(1, 2))   -- a strided gradient too
  for _, g in ipairs({ { "dq", qt.grad, c.dq }, { "dk", kt.grad, c.dk }, { "dv", vt.grad, c.dv } }) do
    T.tensor_close(g[2], tensor(g[3]), 1e-10, 1e-10, g[1])
  end
end)

T.run("five dims and a non-contiguous last dim take a contiguous copy", function()
  local c = ref.plain
  local q, k, v = tensor(c.q):unsqueeze(0), tensor(c.k):unsqueeze(0), tensor(c.v):unsqueeze(0)
  local out = F.scaled_dot_product_attention(q, k, v)
  T.is(T.shape(out), { 1, 2, 3, 5, 3 }, "shape")
  T.tensor_close(out:squeeze(0), tensor(c.out), 1e-10, 1e-10, "out")
  local vt = tensor(c.v):transpose(-2, -1):contiguous():transpose(-2, -1)
  out = F.scaled_dot_product_attention(tensor(c.q), tensor(c.k), vt)
  T.tensor_close(out, tensor(c.out), 1e-10, 1e-10, "out with v's last dim strided")
  -- five strided dims: the fused op against matmul, softmax, matmul
  torch.manual_seed(3)
  local function heads(n) return torch.randn(2, n, 3, 2, 4, { dtype = torch.float64 }):permute(0, 2, 3, 1, 4) end
  local q5, k5, v5 = heads(5), heads(6), heads(6)
  local qs, ks, vs = q5:clone():requires_grad_(), k5:clone():requires_grad_(), v5:clone():requires_grad_()
  q5:requires_grad_(); k5:requires_grad_(); v5:requires_grad_()
  local fused = F.scaled_dot_product_attention(q5, k5, v5)
  local plain = torch.softmax(qs:matmul(ks:transpose(-2, -1)) / 2, -1):matmul(vs)
  T.tensor_close(fused, plain, 1e-12, 1e-12, "five permuted dims: out")
  local g = torch.randn(2, 3, 2, 5, 4, { dtype = torch.float64 })
  fused:backward(g)
  plain:backward(g)
  T.tensor_close(q5.grad, qs.grad, 1e-12, 1e-12, "five permuted dims: dq")
  T.tensor_close(v5.grad, vs.grad, 1e-12, 1e-12, "five permuted dims: dv")
end)

T.run("gradcheck in float64, causal and not", function()
  torch.manual_seed(7)
  for _, causal in ipairs({ false, true }) do
    local q = torch.randn({ 2, 2, 5, 3 }, { dtype = torch.float64 }):requires_grad_()
    local k = torch.randn({ 2, 2, 6, 3 }, { dtype = torch.float64 }):requires_grad_()
    local v = torch.randn({ 2, 2, 6, 4 }, { dtype = torch.float64 }):requires_grad_()
    T.ok(torch.autograd.gradcheck(function(a, b, c)
      return F.scaled_dot_product_attention(a, b, c, { is_causal = causal, scale = 0.7 })
    end, { q, k, v }), "gradcheck, is_causal=" .. tostring(causal))
  end
end)

T.run("empty key sequence: zeros, as softmax over nothing times nothing", function()
  local out = F.scaled_dot_product_attention(torch.randn(2, 3, 4), torch.randn(2, 0, 4), torch.randn(2, 0, 5))
  T.is(T.shape(out), { 2, 3, 5 }, "shape")
  T.is(out:abs():sum():item(), 0, "zeros")
end)

T.run("dropout: p = 1 drops every weight; 0 < p < 1 scales the kept ones", function()
  local q, k, v = torch.randn(1, 4, 3), torch.randn(1, 4, 3), torch.randn(1, 4, 3)
  T.is(F.scaled_dot_product_attention(q, k, v, { dropout_p = 1 }):abs():sum():item(), 0, "p = 1")
  local out = F.scaled_dot_product_attention(q, k, torch.ones(1, 4, 3), { dropout_p = 0.5 })
  -- each output is 2 * (the sum of the kept weights of its row): between 0 and 2
  T.ok(out:min():item() >= 0 and out:max():item() <= 2 + 1e-6, "values within [0, 2]")
end)

T.run("enable_gqa: grouped-query attention repeats each key and value head for its group", function()
  torch.manual_seed(6)
  local f64 = { dtype = torch.float64 }
  local q = torch.randn(2, 6, 5, 4, f64):requires_grad_()
  local k = torch.randn(2, 2, 7, 4, f64):requires_grad_()
  local v = torch.randn(2, 2, 7, 3, f64):requires_grad_()
  for _, causal in ipairs({ false, true }) do
    local y = F.scaled_dot_product_attention(q, k, v, { enable_gqa = true, is_causal = causal })
    local want = F.scaled_dot_product_attention(q, k:repeat_interleave(3, 1), v:repeat_interleave(3, 1), { is_causal = causal })
    T.tensor_close(y, want, 1e-14, 1e-14, "6 query heads over 2 key/value heads" .. (causal and ", causal" or ""))
  end
  T.ok(torch.autograd.gradcheck(function(a, b, c) return F.scaled_dot_product_attention(a, b, c, { enable_gqa = true }) end,
                                { q, k, v }), "gradcheck through the repetition")
  T.raises(function() F.scaled_dot_product_attention(q, torch.randn(2, 4, 7, 4, f64), torch.randn(2, 4, 7, 3, f64),
                                                     { enable_gqa = true }) end,
           "the query's 6 heads must be a multiple of the key's and value's %(4, 4%)", "heads that do not divide")
end)

T.run("backends.cuda.enable_flash_sdp(false) takes the math path", function()
  local q = torch.randn(1, 2, 3, 4, { dtype = torch.float64 }):requires_grad_()
  local fused = F.scaled_dot_product_attention(q, q, q)
  torch.backends.cuda.enable_flash_sdp(false)
  local math_path = F.scaled_dot_product_attention(q, q, q)
  T.ok(not torch.backends.cuda.flash_sdp_enabled(), "read back")
  torch.backends.cuda.enable_flash_sdp(true)
  T.is(torch._grad_fn_name(fused), "ScaledDotProductFlashAttentionBackward0", "the fused op by default")
  T.is(torch._grad_fn_name(math_path), "MatmulBackward0", "the composite with flash disabled")
  T.tensor_close(math_path, fused, 1e-14, 1e-14, "the same values")
  T.raises(function() torch.backends.cuda.enable_flash_sdp(1) end, "expected a boolean", "a number")
  local attention = torch.nn.attention
  local name = attention.sdpa_kernel(attention.SDPBackend.MATH, function()
    return torch._grad_fn_name(F.scaled_dot_product_attention(q, q, q))
  end)
  T.is(name, "MatmulBackward0", "sdpa_kernel(MATH): the composite inside")
  T.ok(torch.backends.cuda.flash_sdp_enabled(), "and the switches back after")
  T.is(attention.sdpa_kernel({ attention.SDPBackend.FLASH_ATTENTION, attention.SDPBackend.MATH }, function()
    return torch._grad_fn_name(F.scaled_dot_product_attention(q, q, q))
  end), "ScaledDotProductFlashAttentionBackward0", "sdpa_kernel with flash: the fused op")
  T.raises(function() attention.sdpa_kernel("fast", function() end) end, "expected SDPBackend values", "an unknown backend")
end)

T.run("bad input is a clear error", function()
  local q, k, v = torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 6)
  T.raises(function() F.scaled_dot_product_attention(q, torch.randn(2, 5, 3), v) end,
           "expected query %(%.%.%., L, E%), key %(%.%.%., S, E%)", "key's head dim differs")
  T.raises(function() F.scaled_dot_product_attention(q, k, torch.randn(2, 4, 6)) end,
           "key %(%.%.%., S, E%) and value %(%.%.%., S, Ev%)", "value's length differs")
  T.raises(function() F.scaled_dot_product_attention(q, torch.randn(3, 5, 4), v) end,
           "the same leading dims", "batch dims differ")
  T.raises(function() F.scaled_dot_product_attention(q, k:unsqueeze(0), v) end,
           "the same number of dims", "dims differ")
  T.raises(function() F.scaled_dot_product_attention(q, k:double(), v) end,
           "one dtype", "dtypes differ")
  T.raises(function() F.scaled_dot_product_attention(q:long(), k, v) end,
           "expected query to be a floating point tensor", "integer query")
  T.raises(function() F.scaled_dot_product_attention(q, k, v, { attn_mask = torch.ones(3, 4) }) end,
           "", "a mask that does not broadcast to (L, S)")
  T.raises(function() F.scaled_dot_product_attention(q, k, v, { causal = true }) end,
           "unknown option 'causal'", "misspelt option")
  T.raises(function() F.scaled_dot_product_attention(q, k, v, { is_causal = true, attn_mask = torch.ones(3, 5) }) end,
           "cannot both be given", "mask and causal")
  T.raises(function() F.scaled_dot_product_attention(q, k, v, { dropout_p = 2 }) end,
           "dropout_p in %[0, 1%]", "dropout_p out of range")
  T.raises(function() F.scaled_dot_product_attention(q, k, v, { is_causal = 1 }) end,
           "is_causal to be a boolean", "is_causal not a boolean")
end)

T.done_testing()
