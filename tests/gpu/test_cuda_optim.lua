-- The CUDA side of a mixed-precision training step (make check-gpu)
-- against the CPU's (itself checked against PyTorch by
-- tests/lua/test_train.lua): Adam/AdamW over bfloat16 parameters with a
-- float32 master copy (the fused kernel with bfloat16 and float32
-- gradients, amsgrad, capturable, and through the optimizer with the first
-- layer's bias gradient in the step's launch), clip_grad_norm_ over a flat
-- gradient buffer, and torch.utils.checkpoint with dropout.
local dir = os.getenv("DPLUA_TEST_DIR") or (debug.getinfo(1, "S").source:match("^@(.*)/gpu/") or "tests")
package.path = dir .. "/lua/?.lua;" .. package.path
local T = require("tap")
local models = require("models")
local torch = require("dplua")
local nn, optim, F = torch.nn, torch.optim, torch.nn.functional
if not torch.cuda.is_available() then T.skip_all("no CUDA device") end

local dev = "cuda:0"
local bf16, f32 = torch.bfloat16, torch.float32

-- bit for bit, dtypes too; else a diagnostic with the largest difference
local function same_bits(got, want, name)
  got = got:cpu()
  local ok = got.dtype == want.dtype and got:numel() == want:numel() and got:eq(want):all():item()
  T.ok(ok, name, not ok and string.format("%s vs %s, max difference %g", tostring(got.dtype), tostring(want.dtype),
                                          (got:double() - want:double()):abs():max():item()) or nil)
end

-- The fused step on the CPU and on the GPU from the same buffers, 4 steps.
local n = 100003   -- not a multiple of a block
for _, case in ipairs({
  { name = "AdamW", decoupled = true, wd = 0.1, amsgrad = false, grad = bf16 },
  { name = "AdamW amsgrad", decoupled = true, wd = 0.01, amsgrad = true, grad = bf16 },
  { name = "Adam", decoupled = false, wd = 0.05, amsgrad = false, grad = bf16 },
  { name = "AdamW, float32 gradient", decoupled = true, wd = 0.1, amsgrad = false, grad = f32 },
}) do
  for _, capturable in ipairs({ false, true }) do
    T.run(string.format("master step %s%s: CUDA equals the CPU", case.name, capturable and " (capturable)" or ""),
          function()
      torch.manual_seed(1)
      local w = torch.randn(n)                  -- the master copy, not what p rounds from
      local p = (w + torch.randn(n) * 1e-3):to(bf16)
      local bufs = {}
      for _, d in ipairs({ "cpu", dev }) do
        bufs[d] = { p = p:to(d), w = w:to(d), m = torch.zeros(n, { device = d }), v = torch.zeros(n, { device = d }),
                    vmax = case.amsgrad and torch.zeros(n, { device = d }) or nil,
                    step = torch.zeros({}, { dtype = torch.float64, device = d }) }
      end
      for step = 1, 4 do
        local g = torch.randn(n):to(case.grad)
        for _, d in ipairs({ "cpu", dev }) do
          local b = bufs[d]
          if capturable then
            torch._adam_step_t(b.p, g:to(d), b.m, b.v, b.vmax, b.w, 0.01, 0.9, 0.999, 1e-8, case.wd, case.decoupled,
                               b.step)
          else
            torch._adam_step(b.p, g:to(d), b.m, b.v, b.vmax, b.w, 0.01, 0.9, 0.999, 1e-8, case.wd, case.decoupled,
                             step)
          end
        end
      end
      local c, g = bufs.cpu, bufs[dev]
      same_bits(g.w, c.w, "the master copy")
      same_bits(g.p, c.p, "the bfloat16 parameters")
      same_bits(g.m, c.m, "exp_avg")
      same_bits(g.v, c.v, "exp_avg_sq")
      if case.amsgrad then same_bits(g.vmax, c.vmax, "max_exp_avg_sq") end
      same_bits(g.p, g.w:to(bf16):cpu(), "the parameters are the copy rounded")
    end)
  end
end

-- Through the optimizer, gradients made exact (loss = sum(p * g)) so that
-- both devices step from the same bits.
T.run("AdamW master_weights over a model's bfloat16 parameters: CUDA equals the CPU", function()
  local shapes = { { 64, 33 }, { 64 }, { 10, 64 }, { 10 } }
  torch.manual_seed(2)
  local init, grads = {}, {}
  for i, s in ipairs(shapes) do init[i] = torch.randn(s):to(bf16) end
  for k = 1, 5 do
    grads[k] = {}
    for i, s in ipairs(shapes) do grads[k][i] = torch.randn(s):to(bf16) end
  end
  local result = {}
  for _, d in ipairs({ "cpu", dev }) do
    local ps = {}
    for i, t in ipairs(init) do ps[i] = nn.Parameter(t:to(d)) end
    local opt = optim.AdamW(ps, { lr = 0.02, weight_decay = 0.1, master_weights = true })
    for k = 1, 5 do
      opt:zero_grad()
      local loss
      for i, p in ipairs(ps) do
        local term = (p:float() * grads[k][i]:to(d):float()):sum()
        loss = loss and loss + term or term
      end
      loss:backward()
      opt:step()
    end
    result[d] = { ps = ps, sd = opt:state_dict() }
  end
  for i = 1, #shapes do
    same_bits(result[dev].ps[i]:detach(), result.cpu.ps[i]:detach(), "parameter " .. i)
    same_bits(result[dev].sd.state[i - 1].master_param, result.cpu.sd.state[i - 1].master_param, "master " .. i)
  end
end)

T.run("AdamW master_weights on a bfloat16 MLP: the first layer's bias gradient in the step's launch", function()
  torch.manual_seed(4)
  local m = nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10)):to(bf16):to(dev)
  local opt = optim.AdamW(m:parameters(), { lr = 1e-3, master_weights = true })
  local x, y = torch.randn(256, 784):to(bf16):to(dev), torch.randint(0, 10, { 256 }):to(dev)
  local losses = models.train(m, opt, function(out, t) return F.cross_entropy(out:float(), t) end, x, y, 20)
  local first, last = losses[1], losses[#losses]
  T.ok(last < first, string.format("the loss falls (%.4f -> %.4f)", first, last))
  local sd = opt:state_dict()
  for i, p in ipairs(m:parameters()) do
    same_bits(p:detach(), sd.state[i - 1].master_param:to(bf16):cpu(), "parameter " .. i .. " is its master rounded")
  end
end)

T.run("clip_grad_norm_ over a CUDA flat gradient buffer equals the CPU's", function()
  torch.manual_seed(5)
  local shapes = { { 300, 7 }, { 7 }, { 5, 300 } }
  local gs = {}
  for i, s in ipairs(shapes) do gs[i] = torch.randn(s, { dtype = torch.float64 }) end
  local out = {}
  for _, d in ipairs({ "cpu", dev }) do
    local ps = {}
    for i, s in ipairs(shapes) do ps[i] = nn.Parameter(torch.zeros(s, { dtype = torch.float64, device = d })) end
    optim.SGD(ps, { lr = 0.1 })
    local loss
    for i, p in ipairs(ps) do
      local term = (p * gs[i]:to(d)):sum()
      loss = loss and loss + term or term
    end
    loss:backward()
    local grads = {}
    for i, p in ipairs(ps) do grads[i] = p.grad end
    T.is(#nn.utils._grad_runs(grads), 1, d .. ": one run")
    out[d] = { total = nn.utils.clip_grad_norm_(ps, 1.0), ps = ps }
  end
  T.ok(out[dev].total.device.type == "cuda", "the total stays on the device")
  T.close(out[dev].total:item(), out.cpu.total:item(), 1e-12, 0, "the total norm")
  for i = 1, #shapes do
    local diff = (out[dev].ps[i].grad:cpu() - out.cpu.ps[i].grad):abs():max():item()
    T.ok(diff < 1e-14, "clipped gradient " .. i .. " (diff " .. diff .. ")")
  end
end)

T.run("checkpoint with dropout on CUDA: the gradients without it", function()
  local block = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Dropout(0.2), nn.Linear(256, 64))
  block:double():to(dev):train()
  local x = torch.randn(32, 64, { dtype = torch.float64 }):to(dev):requires_grad_()
  local function grads(ck)
    block:zero_grad()
    x.grad = nil
    torch.manual_seed(11)
    local h = ck and torch.utils.checkpoint.checkpoint(block, x) or block(x)
    local loss = ((h + x) ^ 2):sum()
    loss:backward()
    local out = { x.grad:cpu() }
    for _, p in ipairs(block:parameters()) do out[#out + 1] = p.grad:cpu() end
    return out
  end
  local plain, ck = grads(false), grads(true)
  for i = 1, #plain do
    local diff = (plain[i] - ck[i]):abs():max():item()
    T.ok(diff <= 1e-12 * math.max(plain[i]:abs():max():item(), 1), "gradient " .. i .. " (diff " .. diff .. ")")
  end
end)

T.done_testing()
