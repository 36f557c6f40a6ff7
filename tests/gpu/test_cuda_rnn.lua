-- The recurrent layers on CUDA (cuda/rnn.cu, make check-gpu) against the
-- CPU (itself checked against PyTorch by tests/lua/test_rnn.lua) from the
-- same weights and inputs: the fused gate ops torch._lstm_gates and
-- torch._gru_gates and the whole layer torch._lstm_layer, forward and
-- backward, then nn.LSTM, nn.GRU, nn.RNN and
-- the cells, outputs, final states and the gradients of the input, the
-- initial state and every parameter, in float32 and float64; sizes past
-- one block of threads, and a dtype the kernels do not take.
local dir = os.getenv("DPLUA_TEST_DIR") or (debug.getinfo(1, "S").source:match("^@(.*)/gpu/") or "tests")
package.path = dir .. "/lua/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local nn = torch.nn
if not torch.cuda.is_available() then T.skip_all("no CUDA device") end

local dev = "cuda:0"
torch.manual_seed(0)

local tols = { [torch.float32] = 2e-5, [torch.float64] = 1e-12 }

-- the largest difference relative to the reference's largest magnitude
local function rel_err(got, want)
  return (got:cpu():double() - want:cpu():double()):abs():max():item() / math.max(want:abs():max():item(), 1e-30)
end

local function close(name, dtype, got, want)
  local err = rel_err(got, want)
  T.ok(err <= tols[dtype], name, string.format("relative error %.3g > %.3g", err, tols[dtype]))
end

-- f over leaves made from the CPU tensors xs, on the CPU and on the GPU:
-- the outputs and the gradients of sum(out * w) compared
local function gates_case(name, dtype, f, xs)
  T.run(name .. " " .. tostring(dtype), function()
    local function go(device)
      local leaves = {}
      for i, x in ipairs(xs) do leaves[i] = x:to(device):to(dtype):detach():requires_grad_() end
      local y = f(leaves)
      local w = torch.cos(torch.arange(y:numel(), { dtype = torch.float64 })):view(y:size()):to(device):to(dtype)
      ;(y * w):sum():backward()
      local grads = {}
      for i, l in ipairs(leaves) do grads[i] = l.grad end
      return y, grads
    end
    local y_cpu, g_cpu = go("cpu")
    local y_gpu, g_gpu = go(dev)
    T.is(tostring(y_gpu.device), dev, "the output is on the GPU")
    close(name .. ": output", dtype, y_gpu, y_cpu)
    for i = 1, #xs do close(name .. ": gradient of input " .. i, dtype, g_gpu[i], g_cpu[i]) end
  end)
end

for _, dtype in ipairs({ torch.float32, torch.float64 }) do
  for _, size in ipairs({ { 3, 5 }, { 64, 300 } }) do
    local N, H = size[1], size[2]
    local tag = string.format(" %dx%d", N, H)
    gates_case("lstm gates" .. tag, dtype, function(a) return torch._lstm_gates(a[1], a[2], a[3]) end,
               { torch.randn(N, 4 * H, { dtype = torch.float64 }) * 2, torch.randn(N, 4 * H, { dtype = torch.float64 }),
                 torch.randn(N, H, { dtype = torch.float64 }) })
    gates_case("lstm layer" .. tag, dtype, function(a) return torch._lstm_layer(a[1], a[2], a[3], a[4], a[5]) end,
               { torch.randn(6, N, 4 * H, { dtype = torch.float64 }), torch.randn(N, H, { dtype = torch.float64 }),
                 torch.randn(N, H, { dtype = torch.float64 }), torch.randn(4 * H, H, { dtype = torch.float64 }) * 0.1,
                 torch.randn(4 * H, { dtype = torch.float64 }) })
    gates_case("gru gates" .. tag, dtype, function(a) return torch._gru_gates(a[1], a[2], a[3]) end,
               { torch.randn(N, 3 * H, { dtype = torch.float64 }), torch.randn(N, 3 * H, { dtype = torch.float64 }),
                 torch.randn(N, H, { dtype = torch.float64 }) })
  end
end

-- A module built on the CPU, copied to the GPU: the same forward and backward.
local function module_case(name, dtype, make, x, hx)
  T.run(name .. " " .. tostring(dtype), function()
    torch.manual_seed(1)
    local m = make():to(dtype)
    local mg = make():to(dtype)
    mg:load_state_dict(m:state_dict())
    mg:to(dev)
    local function go(mod, device)
      local xl = x:to(device):to(dtype):detach():requires_grad_()
      local h
      if type(hx) == "table" then
        h = { hx[1]:to(device):to(dtype):detach():requires_grad_(), hx[2]:to(device):to(dtype):detach():requires_grad_() }
      elseif hx then
        h = hx:to(device):to(dtype):detach():requires_grad_()
      end
      local out, state = mod(xl, h)
      local loss
      if type(out) == "table" then loss = out[1]:sum() + out[2]:mul(2):sum(); out = out[1]
      else loss = out:sum() end
      if type(state) == "table" then loss = loss + state[1]:mul(3):sum() + state[2]:mul(4):sum()
      elseif state then loss = loss + state:mul(3):sum() end
      loss:backward()
      return out, xl.grad
    end
    local out_c, dx_c = go(m, "cpu")
    local out_g, dx_g = go(mg, dev)
    close(name .. ": output", dtype, out_g, out_c)
    close(name .. ": gradient of the input", dtype, dx_g, dx_c)
    local pg = {}
    for n, p in mg:named_parameters() do pg[n] = p end
    for n, p in m:named_parameters() do close(name .. ": gradient of " .. n, dtype, pg[n].grad, p.grad) end
  end)
end

for _, dtype in ipairs({ torch.float32, torch.float64 }) do
  local x = torch.randn(7, 4, 10, { dtype = torch.float64 })
  module_case("LSTM 2 layers bidirectional", dtype, function() return nn.LSTM(10, 32, 2, { bidirectional = true }) end, x,
              { torch.randn(4, 4, 32, { dtype = torch.float64 }), torch.randn(4, 4, 32, { dtype = torch.float64 }) })
  module_case("LSTM proj_size batch_first", dtype,
              function() return nn.LSTM(10, 32, 2, { proj_size = 8, batch_first = true }) end, x)
  module_case("GRU 2 layers bidirectional", dtype, function() return nn.GRU(10, 32, 2, { bidirectional = true }) end, x,
              torch.randn(4, 4, 32, { dtype = torch.float64 }))
  module_case("RNN relu", dtype, function() return nn.RNN(10, 32, { nonlinearity = "relu" }) end, x)
  module_case("LSTMCell", dtype, function() return nn.LSTMCell(10, 32) end, torch.randn(4, 10, { dtype = torch.float64 }))
  module_case("GRUCell", dtype, function() return nn.GRUCell(10, 32) end, torch.randn(4, 10, { dtype = torch.float64 }))
end

T.run("bfloat16 is refused with a message", function()
  local gates = torch.zeros(2, 8, { device = dev, dtype = torch.bfloat16 })
  T.raises(function() torch._lstm_gates(gates, gates, torch.zeros(2, 2, { device = dev, dtype = torch.bfloat16 })) end,
           "expected c to be float32 or float64", "lstm gates")
  local m = nn.LSTM(3, 4):to(dev)
  T.raises(function() m(torch.zeros(2, 1, 3)) end, "input is on cpu but the parameters are on cuda:0", "devices")
end)

T.done_testing()
