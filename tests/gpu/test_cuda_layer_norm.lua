-- The LayerNorm kernels (cuda/norm.cu, make check-gpu) against the CPU's
-- LayerNorm in float64 (itself checked against PyTorch by
-- tests/lua/test_layer_norm.lua) from the same inputs: out and the
-- gradients of input, weight and bias in float32, bfloat16, float64,
-- autocast's bfloat16 in, float32 out, and float32 x with a bfloat16
-- residual (bfloat16 out under autocast); rows of 7 to 8192 elements (a warp a
-- row up to 1024, a block beyond, partial sums in global memory past
-- 6144), more rows than the backward's blocks, rows that do not start on
-- 16 bytes, the fused residual add, and the same bits on a second run.
local dir = os.getenv("DPLUA_TEST_DIR") or (debug.getinfo(1, "S").source:match("^@(.*)/gpu/") or "tests")
package.path = dir .. "/lua/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local F = torch.nn.functional
if not torch.cuda.is_available() then T.skip_all("no CUDA device") end

local dev = "cuda:0"
torch.manual_seed(0)

-- the largest difference relative to the reference's largest magnitude
local function rel_err(got, want)
  return (got:cpu():double() - want):abs():max():item() / math.max(want:abs():max():item(), 1e-30)
end

local tols = { [torch.float32] = 2e-5, [torch.bfloat16] = 2e-2, [torch.float64] = 1e-12 }

local function leaf(t) return t and t:detach():requires_grad_() or nil end

-- LayerNorm of x (and x + r when r is given) with w, b; returns the
-- outputs and the leaves
local function run(x, r, w, b, autocast)
  x, r, w, b = leaf(x), leaf(r), leaf(w), leaf(b)
  local n = x:size(-1)
  local function go()
    if r then return torch._add_layer_norm(x, r, w, b) end
    return nil, F.layer_norm(x, { n }, w, b)
  end
  local h, out
  if autocast then h, out = torch.autocast("cuda", go) else h, out = go() end
  return h, out, x, r, w, b
end

local function compare(name, dtype, got, want)
  local tol = tols[dtype]
  for key, g in pairs(got) do
    local err = rel_err(g, want[key])
    T.ok(err <= tol, name .. ": " .. key, string.format("relative error %.3g > %.3g", err, tol))
  end
end

-- rows x n of dtype; affine: "both", "weight", "none"; residual: the fused add
-- shift: rows start one element past a 16-byte boundary
local function check(dtype, rows, n, affine, opts)
  opts = opts or {}
  local name = string.format("%s %dx%d %s%s%s%s", tostring(dtype), rows, n, affine,
                             opts.residual and " residual" or "", opts.shift and " shifted" or "",
                             opts.autocast and " autocast" or "")
  T.run(name, function()
    local pdtype = opts.autocast and torch.float32 or dtype
    local function make(...) return torch.randn(...):to(dtype) end
    local x = make(rows, n)
    if opts.shift then x = make(rows * n + 1):narrow(0, 1, rows * n):view(rows, n) end
    local r = opts.residual and make(rows, n) or nil
    local w = affine ~= "none" and (torch.randn(n) * 0.3 + 1):to(pdtype) or nil
    local b = affine == "both" and (torch.randn(n) * 0.3):to(pdtype) or nil
    local out_dtype = opts.autocast and torch.float32 or dtype
    local dout = torch.randn(rows, n):to(out_dtype)
    local gx = x:to(dev)
    if opts.shift then gx = torch.zeros(rows * n + 1, { dtype = dtype, device = dev }):narrow(0, 1, rows * n):view(rows, n):copy_(gx) end
    local h, out, lx, lr, lw, lb = run(gx, r and r:to(dev), w and w:to(dev), b and b:to(dev), opts.autocast)
    T.is(out.grad_fn and out.grad_fn.name, "NativeLayerNormBackward0", name .. ": one node")
    T.is(tostring(out.dtype), tostring(out_dtype), name .. ": the output's dtype")
    T.is(tostring(out.device), dev, name .. ": on the GPU")
    out:backward(dout:to(dev))
    local ch, cout, cx, cr, cw, cb = run(x:double(), r and r:double(), w and w:double(), b and b:double())
    cout:backward(dout:double())
    local got, want = { out = out, dx = lx.grad }, { out = cout, dx = cx.grad }
    if h then got.sum, want.sum = h, (x:double() + r:double()):to(dtype):double() end
    if lr then got.dresidual, want.dresidual = lr.grad, cr.grad end
    if lw then got.dweight, want.dweight = lw.grad, cw.grad end
    if lb then got.dbias, want.dbias = lb.grad, cb.grad end
    compare(name, dtype, got, want)
    if lw then
      local _, out2, _, _, lw2 = run(gx, r and r:to(dev), lw:detach(), lb and lb:detach(), opts.autocast)
      out2:backward(dout:to(dev))
      T.is((lw2.grad - lw.grad):abs():max():item(), 0, name .. ": dweight has the same bits on a second run")
    end
  end)
end

for _, dtype in ipairs({ torch.float32, torch.bfloat16 }) do
  for _, n in ipairs({ 7, 33, 768, 1000, 1001, 1024, 4096, 8192 }) do
    check(dtype, 64, n, "both")
  end
  -- more rows than the backward's blocks (1024, 682 and 128 of them)
  check(dtype, 2100, 768, "both")
  check(dtype, 1500, 1536, "weight")
  check(dtype, 300, 8192, "both")
  check(dtype, 5, 2048, "none")
  check(dtype, 33, 768, "both", { shift = true })
  check(dtype, 31, 1000, "both", { residual = true })
  check(dtype, 64, 4096, "both", { residual = true })
end
check(torch.float64, 40, 768, "both")
check(torch.float64, 40, 1001, "weight", { residual = true })
check(torch.bfloat16, 64, 768, "both", { autocast = true })
check(torch.bfloat16, 64, 4096, "both", { autocast = true, residual = true })

-- GPT's residual stream: float32 x beside a bfloat16 branch output, and
-- under autocast a bfloat16 LayerNorm output (float32 parameters), on the
-- GPU against the CPU from the same values
for _, n in ipairs({ 768, 1001, 2048 }) do
  for _, autocast in ipairs({ false, true }) do
    local name = string.format("float32 x, bfloat16 residual, %dx%d%s", 48, n, autocast and ", autocast" or "")
    T.run(name, function()
      local x, r = torch.randn(48, n), torch.randn(48, n):bfloat16()
      local w, b = torch.randn(n) * 0.3 + 1, torch.randn(n) * 0.3
      local out_dtype = autocast and torch.bfloat16 or torch.float32
      local dout, dh = torch.randn(48, n):to(out_dtype), torch.randn(48, n)
      local function go(device)
        local lx, lr = x:to(device):requires_grad_(), r:to(device):requires_grad_()
        local lw, lb = w:to(device):requires_grad_(), b:to(device):requires_grad_()
        local function f() return torch._add_layer_norm(lx, lr, lw, lb) end
        local h, out
        if autocast then h, out = torch.autocast(device:match("^%a+"), f) else h, out = f() end
        T.is(tostring(h.dtype), tostring(torch.float32), name .. " on " .. device .. ": the sum in float32")
        T.is(tostring(out.dtype), tostring(out_dtype), name .. " on " .. device .. ": the output's dtype")
        local loss = (out:float() * dout:to(device):float()):sum() + (h * dh:to(device)):sum()
        loss:backward()
        T.is(tostring(lr.grad.dtype), tostring(torch.bfloat16),
             name .. " on " .. device .. ": the residual's gradient in bfloat16")
        return { out = out, sum = h, dx = lx.grad, dresidual = lr.grad, dweight = lw.grad, dbias = lb.grad }
      end
      local got, want = go(dev), go("cpu")
      for key, g in pairs(got) do
        local tol = (g.dtype == torch.bfloat16) and 1e-2 or 2e-5
        local err = rel_err(g, want[key]:double())
        T.ok(err <= tol, name .. ": " .. key, string.format("relative error %.3g > %.3g", err, tol))
      end
    end)
  end
end

T.run("no rows: an empty output and zero gradients for weight and bias", function()
  local x = torch.zeros(0, 16, { device = dev }):requires_grad_()
  local w = torch.ones(16, { device = dev }):requires_grad_()
  local b = torch.zeros(16, { device = dev }):requires_grad_()
  local out = F.layer_norm(x, { 16 }, w, b)
  T.is(T.shape(out), { 0, 16 }, "shape")
  out:sum():backward()
  T.is(w.grad:abs():sum():item(), 0, "dweight zeros")
  T.is(b.grad:abs():sum():item(), 0, "dbias zeros")
end)

T.done_testing()
