-- test_layer_norm.lua -- F.layer_norm, nn.LayerNorm and torch._add_layer_norm
-- against PyTorch (tests/ref/layer_norm.lua, written by
-- scripts/gen_layer_norm_ref.py): outputs and the gradients of input,
-- weight and bias in float64, float32 and bfloat16, for rows of 7 to 768
-- elements, one or two normalized dims, with and without weight and bias;
-- autocast's float32 LayerNorm of a bfloat16 input; float64 gradcheck;
-- bad input.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local dir = os.getenv("DPLUA_TEST_DIR") or (here .. "/..")
package.path = dir .. "/lua/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local F = torch.nn.functional
local nn = torch.nn
local ref = dofile(dir .. "/ref/layer_norm.lua")

-- a reference tensor: its stored values, or the generator's
-- ((i * a + s) % 197 - 98) / 49 * scale + offset, the same float64 bits as
-- the generator's
local function tensor(r, dtype)
  local flat = {}
  if r.gen then
    local a, s, scale, offset = r.gen[1], r.gen[2], r.gen[3], r.gen[4]
    local n = 1
    for _, d in ipairs(r.shape) do n = n * d end
    for i = 0, n - 1 do flat[i + 1] = ((i * a + s) % 197 - 98) / 49 * scale + offset end
  else
    for i = 1, #r do flat[i] = r[i] end
  end
  return torch.tensor(flat, { dtype = torch.float64 }):reshape(r.shape):to(dtype or torch.float64)
end

-- float64 to its rounding; float32 to its precision; bfloat16 inputs carry
-- a relative error of 2^-9 into every output
local tol = { [torch.float64] = 1e-10, [torch.float32] = 1e-4, [torch.bfloat16] = 6e-2 }

local function numel(shape)
  local n = 1
  for _, d in ipairs(shape) do n = n * d end
  return n
end

local function leaf(r, dtype)
  if r == nil then return nil end
  return tensor(r, dtype):requires_grad_()
end

local function run_case(name, c, dtype)
  local label = string.format("%s %s", name, tostring(dtype))
  T.run(label, function()
    local x, w, b = leaf(c.x, dtype), leaf(c.weight, dtype), leaf(c.bias, dtype)
    local res = leaf(c.residual, dtype)
    local out, h
    if res then
      h, out = torch._add_layer_norm(x, res, w, b, c.eps)
      T.is(h.grad_fn and h.grad_fn.name, "AddBackward0", label .. ": the sum is an addition on the tape")
      T.tensor_close(h:double(), (x + res):double(), 0, 0, label .. ": the sum is x + residual, rounded alike")
    else
      out = F.layer_norm(x, c.normalized_shape, w, b, c.eps)
    end
    T.is(out.grad_fn and out.grad_fn.name, "NativeLayerNormBackward0", label .. ": one node")
    T.is(out.dtype, dtype, label .. ": the output's dtype")
    local rt = tol[dtype]
    T.tensor_close(out:double(), tensor(c.out), rt, rt, label .. ": out")
    out:backward(tensor(c.dout, dtype))
    T.tensor_close(x.grad:double(), tensor(c.dx), rt, rt, label .. ": dx")
    if res then T.tensor_close(res.grad:double(), tensor(c.dx), rt, rt, label .. ": dresidual") end
    -- dweight and dbias add a row's error up over every row
    local rows = x:numel() / numel(c.normalized_shape)
    if w then T.tensor_close(w.grad:double(), tensor(c.dweight), rt, rt * rows, label .. ": dweight") end
    if b then T.tensor_close(b.grad:double(), tensor(c.dbias), rt, rt * rows, label .. ": dbias") end
  end)
end

for _, name in ipairs(T.sorted_keys(ref)) do
  run_case(name, ref[name], torch.float64)
  -- 1000 + 0.01 * x keeps too few digits of x in float32 and bfloat16, there as in PyTorch
  if not name:match("^offset") then
    run_case(name, ref[name], torch.float32)
    run_case(name, ref[name], torch.bfloat16)
  end
end

T.run("nn.LayerNorm runs the fused op, with and without elementwise_affine", function()
  local c = ref.rows_3x5x33
  local ln = nn.LayerNorm(33):double()
  ln.weight:detach():copy_(tensor(c.weight))
  ln.bias:detach():copy_(tensor(c.bias))
  local out = ln(tensor(c.x))
  T.is(out.grad_fn and out.grad_fn.name, "NativeLayerNormBackward0", "grad_fn")
  T.tensor_close(out, tensor(c.out), 1e-10, 1e-10, "out")
  c = ref.no_affine_3x5x33
  local plain = nn.LayerNorm(33, { elementwise_affine = false }):double()
  T.tensor_close(plain(tensor(c.x)), tensor(c.out), 1e-10, 1e-10, "out without weight and bias")
end)

T.run("a strided input normalizes as its contiguous copy", function()
  local c = ref.rows_3x5x33
  local xt = tensor(c.x):transpose(0, 1):contiguous():transpose(0, 1)
  T.ok(not xt:is_contiguous(), "the input is a strided view")
  local out = F.layer_norm(xt, { 33 }, tensor(c.weight), tensor(c.bias))
  T.tensor_close(out, tensor(c.out), 1e-10, 1e-10, "out")
end)

T.run("weight of another dtype promotes as PyTorch does", function()
  local c = ref.rows_3x5x33
  local out = F.layer_norm(tensor(c.x, torch.float32), { 33 }, tensor(c.weight), tensor(c.bias))
  T.is(out.dtype, torch.float64, "float32 input with float64 weight and bias: float64")
  T.tensor_close(out, tensor(c.out), 1e-6, 1e-6, "out")
end)

T.run("autocast: a bfloat16 input gives a float32 output, read without a float32 copy", function()
  local c = ref.gpt_4x768
  local xb = tensor(c.x, torch.bfloat16):requires_grad_()
  local w, b = tensor(c.weight, torch.float32):requires_grad_(), tensor(c.bias, torch.float32):requires_grad_()
  local out = torch.autocast("cpu", function() return F.layer_norm(xb, { 768 }, w, b) end)
  T.is(out.dtype, torch.float32, "float32 output")
  T.is(out.grad_fn and out.grad_fn.name, "NativeLayerNormBackward0", "one node, no cast before it")
  -- a bfloat16 value is exactly a float32 one: the same as normalizing the float32 copy
  local want = F.layer_norm(xb:detach():float(), { 768 }, w:detach(), b:detach())
  T.tensor_close(out, want, 0, 0, "the values of the float32 copy's LayerNorm")
  out:backward(tensor(c.dout, torch.float32))
  T.is(xb.grad.dtype, torch.bfloat16, "the input's gradient in bfloat16")
  T.is(w.grad.dtype, torch.float32, "the weight's in float32")
  T.tensor_close(xb.grad:double(), tensor(c.dx), 6e-2, 6e-2, "dx")
  local h, out2 = torch.autocast("cpu", function()
    return torch._add_layer_norm(xb:detach(), xb:detach(), w:detach(), b:detach())
  end)
  T.is(h.dtype, torch.bfloat16, "the residual sum stays in bfloat16")
  T.is(out2.dtype, torch.float32, "its LayerNorm is float32")
end)

-- A GPT block's residual stream under autocast: float32 x beside a
-- bfloat16 branch output. The fused op reads the bfloat16 residual as it
-- is and, under autocast, writes the LayerNorm in bfloat16: the values and
-- gradients of the casts written out (x + r:float(), layer_norm(h):bfloat16()).
T.run("add_layer_norm: float32 x, bfloat16 residual; a bfloat16 output under autocast", function()
  torch.manual_seed(5)
  local x, r = torch.randn(4, 3, 64), torch.randn(4, 3, 64):bfloat16()
  local w, b = torch.randn(64), torch.randn(64)
  local dh = torch.randn(4, 3, 64)
  for _, autocast in ipairs({ false, true }) do
    local what = autocast and "autocast: " or ""
    local out_dtype = autocast and torch.bfloat16 or torch.float32
    local dout = torch.randn(4, 3, 64):to(out_dtype)
    local function leaves() return x:clone():requires_grad_(), r:clone():requires_grad_(), w:clone():requires_grad_(), b:clone():requires_grad_() end
    local fx, fr, fw, fb = leaves()
    local function fused() return torch._add_layer_norm(fx, fr, fw, fb) end
    local h, out
    if autocast then h, out = torch.autocast("cpu", fused) else h, out = fused() end
    T.is(h.dtype, torch.float32, what .. "the sum in float32")
    T.is(out.dtype, out_dtype, what .. "the LayerNorm's dtype")
    T.is(out.grad_fn and out.grad_fn.name, "NativeLayerNormBackward0", what .. "no cast after the LayerNorm")
    local loss = (out:float() * dout:float()):sum() + (h * dh):sum()
    loss:backward()
    local cx, cr, cw, cb = leaves()
    local ch = cx + cr:float()
    local cout = F.layer_norm(ch, { 64 }, cw, cb):to(out_dtype)
    local closs = (cout:float() * dout:float()):sum() + (ch * dh):sum()
    closs:backward()
    T.tensor_close(h, ch, 0, 0, what .. "sum")
    T.tensor_close(out:double(), cout:double(), 0, 0, what .. "LayerNorm")
    T.is(fr.grad.dtype, torch.bfloat16, what .. "the residual's gradient in bfloat16")
    T.tensor_close(fr.grad:double(), cr.grad:double(), 0, 0, what .. "dresidual")
    T.tensor_close(fx.grad, cx.grad, 1e-6, 1e-6, what .. "dx")
    T.tensor_close(fw.grad, cw.grad, 1e-6, 1e-6, what .. "dweight")
    T.tensor_close(fb.grad, cb.grad, 1e-6, 1e-6, what .. "dbias")
  end
  local h = torch._add_layer_norm(r, x, nil, nil)
  T.tensor_close(h, x + r:float(), 0, 0, "a bfloat16 x beside a float32 residual: the same float32 sum")
end)

T.run("add_layer_norm with a residual that only broadcasts takes the two ops", function()
  local x, r = torch.randn(2, 3, 8, { dtype = torch.float64 }), torch.randn(8, { dtype = torch.float64 })
  local h, out = torch._add_layer_norm(x, r, nil, nil)
  T.tensor_close(h, x + r, 0, 0, "sum")
  T.tensor_close(out, F.layer_norm(x + r, 8), 0, 0, "LayerNorm")
end)

T.run("add_layer_norm with a float64 weight keeps a float32 sum, as the two ops do", function()
  local x, r = torch.randn(3, 6), torch.randn(3, 6)
  local w = torch.randn(6, { dtype = torch.float64 })
  local h, out = torch._add_layer_norm(x, r, w, nil)
  T.is(h.dtype, torch.float32, "the sum in float32")
  T.is(out.dtype, torch.float64, "the LayerNorm in float64")
  T.tensor_close(out, F.layer_norm(x + r, 6, w), 0, 0, "values")
end)

T.run("gradcheck in float64", function()
  torch.manual_seed(11)
  local function R(...) return torch.randn({ ... }, { dtype = torch.float64 }):requires_grad_() end
  local gradcheck = torch.autograd.gradcheck
  T.ok(gradcheck(function(x, w, b) return F.layer_norm(x, { 7 }, w, b) end, { R(3, 7), R(7), R(7) }),
       "with weight and bias")
  T.ok(gradcheck(function(x) return F.layer_norm(x, 5, nil, nil, 1e-3) end, { R(2, 3, 5) }), "without them")
  T.ok(gradcheck(function(x, w) return F.layer_norm(x, { 2, 3 }, w) end, { R(4, 2, 3), R(2, 3) }),
       "two normalized dims, weight only")
  T.ok(gradcheck(function(x, b) return F.layer_norm(x, { 6 }, nil, b) end, { R(2, 6), R(6) }), "bias only")
  T.ok(gradcheck(function(x, r, w, b)
    local h, out = torch._add_layer_norm(x, r, w, b)
    return out + h * 0.5
  end, { R(3, 9), R(3, 9), R(9), R(9) }), "add_layer_norm: both outputs")
  -- a pre-LayerNorm block: x feeds the residual path and the LayerNorm, whose
  -- backward then adds its dx to the residual path's gradient in place
  T.ok(gradcheck(function(x, w, b)
    local y = x * 2
    local h = y + F.layer_norm(y, { 6 }, w, b) * 3
    return F.layer_norm(h, { 6 }) + h
  end, { R(4, 6), R(6), R(6) }), "x used beside its LayerNorm, twice")
end)

T.run("bad input is a clear error", function()
  local x = torch.randn(2, 3, 4)
  T.raises(function() F.layer_norm(x, { 3 }) end, "normalized_shape=%[3%], expected input with shape %[%*, 3%]",
           "normalized_shape that is not the input's last dims")
  T.raises(function() F.layer_norm(x, { 2, 3, 4, 5 }) end, "normalized_shape", "more dims than the input")
  T.raises(function() F.layer_norm(x, {}) end, "non%-empty table", "empty normalized_shape")
  T.raises(function() F.layer_norm(x, { 4 }, torch.ones(3)) end, "expected weight of shape %[4%]", "weight of 3")
  T.raises(function() F.layer_norm(x, { 3, 4 }, torch.ones(4)) end, "expected weight of shape %[3, 4%]",
           "weight of one dim for two")
  T.raises(function() F.layer_norm(x, { 4 }, nil, torch.ones(2, 2)) end, "expected bias of shape %[4%]",
           "bias of the wrong shape")
  T.raises(function() F.layer_norm(x, { 4 }, "w") end, "expected weight to be a tensor", "weight not a tensor")
  T.raises(function() F.layer_norm(torch.ones(2, 4, { dtype = torch.int64 }), { 4 }) end,
           "expected input to be a floating point tensor", "integer input")
  T.raises(function() F.layer_norm(x, { 4 }, nil, nil, "small") end, "expected eps to be a number", "eps")
  T.raises(function() torch._add_layer_norm(x, torch.ones(2, 3, 4, { dtype = torch.int64 })) end,
           "expected residual to be a floating point tensor", "integer residual")
  T.raises(function() torch._add_layer_norm(x, x, torch.ones(3)) end, "expected weight of shape %[4%]",
           "add_layer_norm's weight")
end)

T.run("the C op's own checks (torch._native_layer_norm, below F.layer_norm's)", function()
  local x = torch.randn(2, 3, 4)
  local ln, add = torch._native_layer_norm, torch._native_add_layer_norm
  T.raises(function() ln(x, nil, nil, 5, 1e-5, torch.float32) end, "last dims hold 5 elements, got shape %[2, 3, 4%]",
           "n not the size of trailing dims")
  T.raises(function() ln(x, nil, nil, 0, 1e-5, torch.float32) end, "hold 0 elements", "n = 0")
  T.raises(function() ln(x, torch.ones(4, { dtype = torch.float64 }), nil, 4, 1e-5, torch.float32) end,
           "expected weight of dtype float32 %(the parameters' beside this input and output%), got float64", "weight of another dtype")
  T.raises(function() ln(x, nil, torch.ones(5), 4, 1e-5, torch.float32) end, "expected bias of 4 elements",
           "bias of 5 elements")
  T.raises(function() ln(x, nil, nil, 4, 1e-5, torch.float64) end,
           "output dtype to be the input's %(float32%), or float32 and bfloat16 for each other, got float64",
           "an output dtype the kernels do not take")
  T.raises(function() ln(x:long(), nil, nil, 4, 1e-5, torch.int64) end, "expected a floating point input, got int64",
           "integer input")
  T.raises(function() add(x, torch.randn(2, 3, 5), nil, nil, 4, 1e-5, torch.float32) end,
           "expected the residual of the input's shape, dtype %(or bfloat16 beside float32%) and device, got %[2, 3, 5%] float32", "residual shape")
  T.raises(function() add(x, x:double(), nil, nil, 4, 1e-5, torch.float32) end, "float64", "residual dtype")
end)

T.done_testing()
