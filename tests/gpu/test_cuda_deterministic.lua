-- torch.use_deterministic_algorithms on a GPU (make check-gpu): the ops
-- that add with atomics (scatter_add, F.fold, the flash attention
-- backward) give the same bits on every run, scatter_add and fold the
-- CPU's bits exactly (they add on host copies in its order).
local dir = os.getenv("DPLUA_TEST_DIR") or (debug.getinfo(1, "S").source:match("^@(.*)/gpu/") or "tests")
package.path = dir .. "/lua/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
if not torch.cuda.is_available() then T.skip_all("no CUDA device") end

local F = torch.nn.functional
local dev = "cuda:0"
local function bits_equal(a, b) return a:cpu():eq(b:cpu()):all():item() end

torch.manual_seed(1)
torch.use_deterministic_algorithms(true)

T.run("scatter_add: the CPU's sums, the same every run", function()
  local src = torch.randn(20000, 8)
  local index = torch.randint(0, 7, { 20000, 8 })   -- many repeats per position
  local want = torch.zeros(7, 8):scatter_add(0, index, src)
  local a = torch.zeros(7, 8, { device = dev }):scatter_add(0, index:to(dev), src:to(dev))
  local b = torch.zeros(7, 8, { device = dev }):scatter_add(0, index:to(dev), src:to(dev))
  T.ok(bits_equal(a, want), "equal to the CPU's bits")
  T.ok(bits_equal(a, b), "two runs agree")
end)

T.run("F.fold (an unfold's backward): the CPU's sums", function()
  local cols = torch.randn(4, 3 * 5 * 5, 12 * 12)
  local want = F.fold(cols, { 16, 16 }, 5)
  local got = F.fold(cols:to(dev), { 16, 16 }, 5)
  T.ok(bits_equal(got, want), "equal to the CPU's bits")
end)

T.run("attention backward: the same gradients every run", function()
  local function grads()
    torch.manual_seed(3)
    local q = torch.randn(2, 4, 256, 64, { device = dev, dtype = torch.bfloat16, requires_grad = true })
    local k = torch.randn(2, 4, 256, 64, { device = dev, dtype = torch.bfloat16, requires_grad = true })
    local v = torch.randn(2, 4, 256, 64, { device = dev, dtype = torch.bfloat16, requires_grad = true })
    F.scaled_dot_product_attention(q, k, v, { is_causal = true }):float():sum():backward()
    return q.grad, k.grad, v.grad
  end
  local q1, k1, v1 = grads()
  local q2, k2, v2 = grads()
  T.ok(bits_equal(q1, q2) and bits_equal(k1, k2) and bits_equal(v1, v2), "dq, dk, dv bit for bit")
end)

torch.use_deterministic_algorithms(false)
T.done_testing()
