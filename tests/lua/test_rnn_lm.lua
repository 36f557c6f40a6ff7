-- test_rnn_lm.lua -- a small word-level LSTM language model (Embedding, a
-- two-layer nn.LSTM, a Linear decoder) trained 20 steps with truncated
-- backpropagation through time, the hidden state carried and detached,
-- gradients clipped, SGD; from PyTorch's initial weights over PyTorch's
-- batches, every step's loss against PyTorch's (tests/ref/rnn_lm.lua,
-- written by scripts/gen_rnn_lm_ref.py), in float64 and float32.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local dir = os.getenv("DPLUA_TEST_DIR") or (here .. "/..")
package.path = dir .. "/lua/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local nn, F = torch.nn, torch.nn.functional
local ref = dofile(dir .. "/ref/rnn_lm.lua")
local cfg = ref.config

local LM = nn.Module:extend("LM")
function LM:__init(dtype)
  self.encoder = nn.Embedding(cfg.ntoken, cfg.emb, { dtype = dtype })
  self.rnn = nn.LSTM(cfg.emb, cfg.hidden, cfg.layers, { dtype = dtype })
  self.decoder = nn.Linear(cfg.hidden, cfg.ntoken, { dtype = dtype })
end
function LM:forward(x, hidden)
  local out
  out, hidden = self.rnn(self.encoder(x), hidden)
  return self.decoder(out), hidden
end

local function train(dtype)
  local model = LM(dtype)
  local sd = {}
  -- the file's decimals are float32 values: read as float32 first, so that
  -- float64 starts from those exact numbers too, as PyTorch's run did
  for k, v in pairs(ref.weights) do sd[k] = T.ref_tensor(torch, v, torch.float32):to(dtype) end
  model:load_state_dict(sd)
  local opt = torch.optim.SGD(model:parameters(), { lr = cfg.lr })
  -- the example's batchify: the stream in bsz rows, transposed to (len, bsz)
  local data = torch.tensor(ref.tokens, { dtype = torch.int64 }):view(cfg.bsz, -1):t():contiguous()
  local zeros = torch.zeros(cfg.layers, cfg.bsz, cfg.hidden, { dtype = dtype })
  local hidden = { zeros, zeros }
  local losses = {}
  for step = 0, cfg.steps - 1 do
    local i = step * cfg.bptt
    local x, y = data:narrow(0, i, cfg.bptt), data:narrow(0, i + 1, cfg.bptt):reshape(-1)
    hidden = { hidden[1]:detach(), hidden[2]:detach() }
    opt:zero_grad()
    local out
    out, hidden = model(x, hidden)
    local loss = F.cross_entropy(out:view(-1, cfg.ntoken), y)
    loss:backward()
    nn.utils.clip_grad_norm_(model:parameters(), cfg.max_norm)
    opt:step()
    losses[#losses + 1] = loss:item()
  end
  return losses
end

for _, c in ipairs({ { torch.float64, ref.losses_float64, 1e-10 }, { torch.float32, ref.losses_float32, 1e-4 } }) do
  local dtype, want, tol = c[1], c[2], c[3]
  T.run("LSTM language model, 20 steps in " .. tostring(dtype), function()
    local got = train(dtype)
    T.is(#got, #want, "every step ran")
    for i = 1, #want do
      T.ok(math.abs(got[i] - want[i]) <= tol, string.format("step %d: loss %.12g (PyTorch %.12g)", i, got[i], want[i]),
           string.format("difference %.3g over %.3g", math.abs(got[i] - want[i]), tol))
    end
    T.ok(got[#got] < got[1], "the loss went down")
  end)
end

T.done_testing()
