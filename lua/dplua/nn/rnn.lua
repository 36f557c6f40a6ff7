-- dplua.nn.rnn: nn.RNN, nn.LSTM and nn.GRU, and their cells nn.RNNCell,
-- nn.LSTMCell and nn.GRUCell, with PyTorch's arguments, parameter names,
-- shapes and initialisation, so that a PyTorch state dict loads as it is.
--
--   local lstm = nn.LSTM(32, 64, 2, {batch_first = true, dropout = 0.1})
--   local out, state = lstm(x)              -- state = {h_n, c_n}
--   out, state = lstm(x, state)             -- PyTorch's (h0, c0) is a table
--   local gru = nn.GRU(32, 64, {bidirectional = true})
--   local out, h_n = gru(x, h0)
--
-- A layer computes the input-to-hidden product of every timestep at once
-- (one product over the whole sequence), then per timestep the recurrent
-- product and the gates' pointwise step: one node of the fused ops
-- torch._lstm_gates and torch._gru_gates (src/core/rnn.c) for LSTM and
-- GRU, which also add the two products, tanh or relu for RNN. A forward
-- LSTM direction without projection, in float32 or float64, runs its
-- timesteps in C instead, one node for the layer (torch._lstm_layer),
-- whose backward gets the recurrent weight's gradient from one product
-- over the sequence.
local torch = require("dplua")
local module = require("dplua.nn.module")
local F = require("dplua.nn.functional")
local init = require("dplua.nn.init_")
local L = require("dplua.nn.layers")
local raise = torch._raise
local Module, Parameter = module.Module, module.Parameter
local is_tensor, shape_str, pyrepr = torch.is_tensor, F._shape_str, module.pyrepr

local R = {}

---------------------------------------------------------------- helpers

local check_opts, make = L._check_opts, L._make
local function want_int(v, fn, what, min) return L._want_int(v, fn, what, min) end

local function want_bool(v, fn, what)
  if type(v) ~= "boolean" then raise(string.format("%s: expected %s to be a boolean, got %s", fn, what, tostring(v))) end
  return v
end

local function shape_of(t) return "[" .. table.concat(t, ", ") .. "]" end

-- nn.utils.rnn (PackedSequence), loaded when first needed
local function rnn_utils() return require("dplua.nn.utils").rnn end

-- The number of gate blocks in the stacked weights: LSTM i, f, g, o; GRU r, z, n.
local GATES = { LSTM = 4, GRU = 3, RNN_TANH = 1, RNN_RELU = 1 }

-- One timestep of each kind: gi = x W_ih^T + b_ih (already computed for
-- the whole sequence), h (and c) the state before the step. Returns the
-- new h (and c).
local function rnn_tanh_step(gi, h, w_hh, b_hh) return torch.tanh(gi + F.linear(h, w_hh, b_hh)) end
local function rnn_relu_step(gi, h, w_hh, b_hh) return F.relu(gi + F.linear(h, w_hh, b_hh)) end

-- The fused gate ops take float32 and float64 of one dtype; bfloat16 and
-- autocast's mixed dtypes run the same formulas as tensor ops.
local FUSED = { [tostring(torch.float32)] = true, [tostring(torch.float64)] = true }
local function fused(a, b) return a.dtype == b.dtype and FUSED[tostring(a.dtype)] end

local function lstm_gates_ops(gates, c)
  local H = c:size(-1)
  local i, f = torch.sigmoid(gates:narrow(1, 0, H)), torch.sigmoid(gates:narrow(1, H, H))
  local g, o = torch.tanh(gates:narrow(1, 2 * H, H)), torch.sigmoid(gates:narrow(1, 3 * H, H))
  local c1 = f * c + i * g
  return o * torch.tanh(c1), c1
end

local function gru_gates_ops(gi, gh, h)
  local H = h:size(-1)
  local r = torch.sigmoid(gi:narrow(1, 0, H) + gh:narrow(1, 0, H))
  local z = torch.sigmoid(gi:narrow(1, H, H) + gh:narrow(1, H, H))
  local n = torch.tanh(gi:narrow(1, 2 * H, H) + r * gh:narrow(1, 2 * H, H))
  return (1 - z) * n + z * h
end

local function lstm_step(gi, h, c, w_hh, b_hh, w_hr)
  local gh = F.linear(h, w_hh, b_hh)
  local h1, c1
  if fused(gi, c) and fused(gh, c) then
    local hc = torch._lstm_gates(gi, gh, c)
    h1, c1 = hc:select(0, 0), hc:select(0, 1)
  else
    h1, c1 = lstm_gates_ops(gi + gh, c)
  end
  if w_hr then h1 = F.linear(h1, w_hr) end
  return h1, c1
end

local function gru_step(gi, h, w_hh, b_hh)
  local gh = F.linear(h, w_hh, b_hh)
  if fused(gi, h) and fused(gh, h) then return torch._gru_gates(gi, gh, h) end
  return gru_gates_ops(gi, gh, h)
end

local function step_of(mode, gi, h, c, w_hh, b_hh, w_hr)
  if mode == "LSTM" then return lstm_step(gi, h, c, w_hh, b_hh, w_hr) end
  if mode == "GRU" then return gru_step(gi, h, w_hh, b_hh) end
  if mode == "RNN_TANH" then return rnn_tanh_step(gi, h, w_hh, b_hh) end
  return rnn_relu_step(gi, h, w_hh, b_hh)
end

-- The checks every forward makes of its input and its state.
local function check_input(x, fn, dims, input_size, like)
  if not is_tensor(x) then raise(string.format("%s: expected input to be a tensor, got %s", fn, type(x))) end
  if not x:is_floating_point() then
    raise(string.format("%s: expected input to be a floating point tensor, got %s", fn, tostring(x.dtype)))
  end
  if x:dim() ~= dims and x:dim() ~= dims - 1 then
    raise(string.format("%s: expected a %d-D (batched) or %d-D (unbatched) input, got %d-D input of shape %s",
                        fn, dims, dims - 1, x:dim(), shape_str(x)))
  end
  if x:size(-1) ~= input_size then
    raise(string.format("%s: input.size(-1) must be equal to input_size. Expected %d, got %d (input of shape %s)",
                        fn, input_size, x:size(-1), shape_str(x)))
  end
  if x.dtype ~= like.dtype then
    raise(string.format("%s: input is %s but the parameters are %s (convert one with :to())",
                        fn, tostring(x.dtype), tostring(like.dtype)))
  end
  if tostring(x.device) ~= tostring(like.device) then
    raise(string.format("%s: input is on %s but the parameters are on %s", fn, tostring(x.device), tostring(like.device)))
  end
end

local function check_state(h, fn, what, want, x)
  if not is_tensor(h) then raise(string.format("%s: expected %s to be a tensor, got %s", fn, what, type(h))) end
  local got = h:size()
  local same = #got == #want
  for i = 1, #want do same = same and got[i] == want[i] end
  if not same then
    raise(string.format("%s: expected %s of shape %s, got %s", fn, what, shape_of(want), shape_of(got)))
  end
  if h.dtype ~= x.dtype then
    raise(string.format("%s: expected %s of dtype %s (the input's), got %s", fn, what, tostring(x.dtype), tostring(h.dtype)))
  end
  if tostring(h.device) ~= tostring(x.device) then
    raise(string.format("%s: expected %s on %s (the input's), got %s", fn, what, tostring(x.device), tostring(h.device)))
  end
end

local function uniform_all(m, bound)
  for _, p in m:named_parameters() do init.uniform_(p, -bound, bound) end
end

---------------------------------------------------------------- RNN, LSTM, GRU

local base_opts = { num_layers = true, bias = true, batch_first = true, dropout = true, bidirectional = true,
                    dtype = true, device = true }
local lstm_opts = { proj_size = true }
local rnn_opts = { nonlinearity = true }
for k in pairs(base_opts) do lstm_opts[k] = true; rnn_opts[k] = true end

R.RNNBase = Module:extend("RNNBase")

-- RNNBase(mode, input_size, hidden_size [, num_layers] [, opts]): mode
-- "LSTM", "GRU", "RNN_TANH" or "RNN_RELU"; the classes below pass it.
function R.RNNBase:__init(mode, fn, allowed, input_size, hidden_size, num_layers, opts)
  if type(num_layers) == "table" and opts == nil then num_layers, opts = nil, num_layers end
  opts = check_opts(opts or {}, fn, allowed)
  if num_layers == nil then num_layers = opts.num_layers or 1 end
  want_int(input_size, fn, "input_size", 0)
  want_int(hidden_size, fn, "hidden_size", 1)
  want_int(num_layers, fn, "num_layers", 1)
  local bias = opts.bias
  if bias == nil then bias = true end
  local dropout = opts.dropout or 0
  if type(dropout) ~= "number" or dropout < 0 or dropout > 1 then
    raise(string.format("%s: dropout should be a number in range [0, 1] representing the probability of an "
                        .. "element being zeroed, got %s", fn, tostring(dropout)))
  end
  local proj_size = want_int(opts.proj_size or 0, fn, "proj_size", 0)
  if proj_size >= hidden_size then
    raise(string.format("%s: proj_size has to be smaller than hidden_size, got proj_size=%d and hidden_size=%d",
                        fn, proj_size, hidden_size))
  end
  self.mode = mode
  self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
  self.bias = want_bool(bias, fn, "bias")
  self.batch_first = want_bool(opts.batch_first or false, fn, "batch_first")
  self.dropout = dropout
  self.bidirectional = want_bool(opts.bidirectional or false, fn, "bidirectional")
  self.proj_size = proj_size
  local D = self.bidirectional and 2 or 1
  local G = GATES[mode] * hidden_size
  local real_hidden = proj_size > 0 and proj_size or hidden_size
  -- PyTorch's order: per layer, per direction, w_ih, w_hh, b_ih, b_hh, w_hr
  for layer = 0, num_layers - 1 do
    for dir = 0, D - 1 do
      local sfx = "_l" .. layer .. (dir == 1 and "_reverse" or "")
      local in_size = layer == 0 and input_size or real_hidden * D
      self["weight_ih" .. sfx] = Parameter(make("empty", { G, in_size }, opts))
      self["weight_hh" .. sfx] = Parameter(make("empty", { G, real_hidden }, opts))
      if self.bias then
        self["bias_ih" .. sfx] = Parameter(make("empty", { G }, opts))
        self["bias_hh" .. sfx] = Parameter(make("empty", { G }, opts))
      end
      if proj_size > 0 then self["weight_hr" .. sfx] = Parameter(make("empty", { proj_size, hidden_size }, opts)) end
    end
  end
  self:reset_parameters()
end

-- Every weight and bias uniform(-1/sqrt(hidden_size), 1/sqrt(hidden_size)), as PyTorch.
function R.RNNBase:reset_parameters() uniform_all(self, 1 / math.sqrt(self.hidden_size)) end

function R.RNNBase:extra_repr()
  local s = string.format("%d, %d", self.input_size, self.hidden_size)
  if self.proj_size ~= 0 then s = s .. ", proj_size=" .. self.proj_size end
  if self.num_layers ~= 1 then s = s .. ", num_layers=" .. self.num_layers end
  if not self.bias then s = s .. ", bias=False" end
  if self.batch_first then s = s .. ", batch_first=True" end
  if self.dropout ~= 0 then s = s .. ", dropout=" .. pyrepr(self.dropout) end
  if self.bidirectional then s = s .. ", bidirectional=True" end
  return s
end

-- One direction of one layer over x (T, N, in): its outputs (T, N, out)
-- and final h (and c). With lengths (a packed batch: (N, 1) int64, each
-- sequence's steps), a sequence's state stops changing past its last
-- step, so its final state is the one there, and the reverse direction
-- starts each sequence at its own last step; outputs past the end are
-- left to the packing to drop.
function R.RNNBase:_direction(x, sfx, h, c, reverse, lengths)
  local w_ih, w_hh = self["weight_ih" .. sfx], self["weight_hh" .. sfx]
  local b_ih, b_hh = self["bias_ih" .. sfx], self["bias_hh" .. sfx]
  local w_hr = self["weight_hr" .. sfx]
  local gi = F.linear(x, w_ih, b_ih)      -- (T, N, G): every timestep in one product
  local T = x:size(0)
  if self.mode == "LSTM" and not reverse and not w_hr and fused(gi, h) and fused(gi, c) and fused(gi, w_hh)
     and (not b_hh or fused(gi, b_hh)) then
    local y = torch._lstm_layer(gi, h, c, w_hh, b_hh)   -- (2, T + 1, N, H): the h's, the c's
    local hs, cs = y:select(0, 0), y:select(0, 1)
    if lengths then   -- the states after each sequence's last step
      local at = lengths:view(1, -1, 1):expand(1, h:size(0), h:size(1))
      return hs:narrow(0, 1, T), hs:gather(0, at):squeeze(0), cs:gather(0, at):squeeze(0)
    end
    return hs:narrow(0, 1, T), hs:select(0, T), cs:select(0, T)
  end
  local outs = {}
  for k = 0, T - 1 do
    local t = reverse and T - 1 - k or k
    local h2, c2 = step_of(self.mode, gi:select(0, t), h, c, w_hh, b_hh, w_hr)
    if lengths then
      local running = lengths:gt(t)
      h2 = torch.where(running, h2, h)
      if c2 ~= nil then c2 = torch.where(running, c2, c) end
    end
    h, c = h2, c2
    outs[t + 1] = h
  end
  return torch.stack(outs, 0), h, c
end

-- forward(input [, hx]): input (T, N, input_size), (N, T, input_size)
-- with batch_first, or (T, input_size) unbatched, or a PackedSequence
-- (nn.utils.rnn.pack_padded_sequence); hx h0 (or LSTM's {h0, c0}), zeros
-- when absent. Returns output (T, N, D * out), or a PackedSequence for a
-- packed input, and h_n (LSTM: {h_n, c_n}), each (num_layers * D, N, out),
-- in the batch's own order.
function R.RNNBase:forward(x, hx)
  local fn = self.__name
  local lstm = self.mode == "LSTM"
  local packed = rnn_utils().is_packed(x)
  local lengths
  if packed then
    local p = x
    x, lengths = rnn_utils()._unpack_sorted(p)
    check_input(x, fn, 3, self.input_size, self.weight_ih_l0)
    lengths = torch.tensor(lengths, { dtype = torch.int64, device = x.device }):view(-1, 1)
    if hx ~= nil and p.sorted_indices then   -- the state given in the batch's order
      if lstm and type(hx) == "table" and not is_tensor(hx) then
        hx = { hx[1]:index_select(1, p.sorted_indices), hx[2]:index_select(1, p.sorted_indices) }
      elseif is_tensor(hx) then
        hx = hx:index_select(1, p.sorted_indices)
      end
    end
    local output, state = self:_forward(x, hx, fn, lstm, true, lengths)
    local out = rnn_utils()._pack_sorted(output, p.batch_sizes:tolist(), p.sorted_indices, p.unsorted_indices)
    if p.unsorted_indices then
      if lstm then state = { state[1]:index_select(1, p.unsorted_indices), state[2]:index_select(1, p.unsorted_indices) }
      else state = state:index_select(1, p.unsorted_indices) end
    end
    return out, state
  end
  check_input(x, fn, 3, self.input_size, self.weight_ih_l0)
  local batched = x:dim() == 3
  if not batched then x = x:unsqueeze(1)
  elseif self.batch_first then x = x:transpose(0, 1) end
  local output, state = self:_forward(x, hx, fn, lstm, batched)
  if not batched then
    output = output:squeeze(1)
    if lstm then state = { state[1]:squeeze(1), state[2]:squeeze(1) } else state = state:squeeze(1) end
  elseif self.batch_first then
    output = output:transpose(0, 1)
  end
  return output, state
end

-- The layers over x (T, N, input_size) from hx (absent: zeros); lengths
-- for a packed batch. Returns output (T, N, D * out) and h_n (LSTM: {h_n,
-- c_n}).
function R.RNNBase:_forward(x, hx, fn, lstm, batched, lengths)
  local T, N = x:size(0), x:size(1)
  if T == 0 then raise(fn .. ": expected a sequence of at least one timestep, got input of shape " .. shape_str(x)) end
  local D = self.bidirectional and 2 or 1
  local out_size = self.proj_size > 0 and self.proj_size or self.hidden_size
  local h0, c0
  if hx ~= nil then
    if lstm then
      if type(hx) ~= "table" or is_tensor(hx) or not is_tensor(hx[1]) or not is_tensor(hx[2]) then
        raise(fn .. ": expected hx to be a table {h0, c0} of two tensors")
      end
      h0, c0 = hx[1], hx[2]
    else
      h0 = hx
    end
    local LD = self.num_layers * D
    local want_h = batched and { LD, N, out_size } or { LD, out_size }
    check_state(h0, fn, lstm and "h0" or "hx", want_h, x)
    if lstm then check_state(c0, fn, "c0", batched and { LD, N, self.hidden_size } or { LD, self.hidden_size }, x) end
    if not batched then
      h0 = h0:unsqueeze(1)
      if lstm then c0 = c0:unsqueeze(1) end
    end
  else
    local o = { dtype = x.dtype, device = x.device }
    h0 = torch.zeros({ self.num_layers * D, N, out_size }, o)
    if lstm then c0 = torch.zeros({ self.num_layers * D, N, self.hidden_size }, o) end
  end
  local hn, cn = {}, {}
  local layer_in = x
  for layer = 0, self.num_layers - 1 do
    local outs = {}
    for dir = 0, D - 1 do
      local i = layer * D + dir
      local sfx = "_l" .. layer .. (dir == 1 and "_reverse" or "")
      local out, h, c = self:_direction(layer_in, sfx, h0:select(0, i), lstm and c0:select(0, i) or nil, dir == 1,
                                        lengths)
      outs[dir + 1], hn[i + 1], cn[i + 1] = out, h, c
    end
    layer_in = D == 1 and outs[1] or torch.cat(outs, 2)
    if self.dropout > 0 and self.training and layer < self.num_layers - 1 then
      layer_in = F.dropout(layer_in, self.dropout, true)
    end
  end
  local h_n = torch.stack(hn, 0)
  if lstm then return layer_in, { h_n, torch.stack(cn, 0) } end
  return layer_in, h_n
end

-- RNN(input_size, hidden_size [, num_layers] [, {nonlinearity="tanh",
-- bias=true, batch_first=false, dropout=0, bidirectional=false, dtype=, device=}])
R.RNN = R.RNNBase:extend("RNN")
function R.RNN:__init(input_size, hidden_size, num_layers, opts)
  local o = type(num_layers) == "table" and num_layers or opts or {}
  local nl = o.nonlinearity or "tanh"
  if nl ~= "tanh" and nl ~= "relu" then
    raise(string.format('RNN: unknown nonlinearity \'%s\' (expected "tanh" or "relu")', tostring(nl)))
  end
  self.nonlinearity = nl
  R.RNNBase.__init(self, nl == "tanh" and "RNN_TANH" or "RNN_RELU", "RNN", rnn_opts, input_size, hidden_size,
                   num_layers, opts)
end

-- LSTM(input_size, hidden_size [, num_layers] [, {bias=true, batch_first=false,
-- dropout=0, bidirectional=false, proj_size=0, dtype=, device=}])
R.LSTM = R.RNNBase:extend("LSTM")
function R.LSTM:__init(input_size, hidden_size, num_layers, opts)
  R.RNNBase.__init(self, "LSTM", "LSTM", lstm_opts, input_size, hidden_size, num_layers, opts)
end

-- GRU(input_size, hidden_size [, num_layers] [, {bias=true, batch_first=false,
-- dropout=0, bidirectional=false, dtype=, device=}])
R.GRU = R.RNNBase:extend("GRU")
function R.GRU:__init(input_size, hidden_size, num_layers, opts)
  R.RNNBase.__init(self, "GRU", "GRU", base_opts, input_size, hidden_size, num_layers, opts)
end

---------------------------------------------------------------- cells

local cell_opts = { bias = true, dtype = true, device = true }
local rnn_cell_opts = { bias = true, nonlinearity = true, dtype = true, device = true }

R.RNNCellBase = Module:extend("RNNCellBase")

-- RNNCellBase(mode, fn, allowed, input_size, hidden_size [, bias] [, opts])
function R.RNNCellBase:__init(mode, fn, allowed, input_size, hidden_size, bias, opts)
  if type(bias) == "table" and opts == nil then bias, opts = nil, bias end
  opts = check_opts(opts or {}, fn, allowed)
  if bias == nil then bias = opts.bias end
  if bias == nil then bias = true end
  want_int(input_size, fn, "input_size", 0)
  want_int(hidden_size, fn, "hidden_size", 1)
  self.mode = mode
  self.input_size, self.hidden_size = input_size, hidden_size
  self.bias = want_bool(bias, fn, "bias")
  local G = GATES[mode] * hidden_size
  self.weight_ih = Parameter(make("empty", { G, input_size }, opts))
  self.weight_hh = Parameter(make("empty", { G, hidden_size }, opts))
  if self.bias then
    self.bias_ih = Parameter(make("empty", { G }, opts))
    self.bias_hh = Parameter(make("empty", { G }, opts))
  else
    self:register_parameter("bias_ih", nil)
    self:register_parameter("bias_hh", nil)
  end
  self:reset_parameters()
end

function R.RNNCellBase:reset_parameters() uniform_all(self, 1 / math.sqrt(self.hidden_size)) end

function R.RNNCellBase:extra_repr()
  local s = string.format("%d, %d", self.input_size, self.hidden_size)
  if not self.bias then s = s .. ", bias=False" end
  if self.nonlinearity and self.nonlinearity ~= "tanh" then s = s .. ", nonlinearity=" .. self.nonlinearity end
  return s
end

-- forward(input [, hx]): input (N, input_size) or (input_size); hx h
-- (LSTMCell: {h, c}) of shape (N, hidden_size) or (hidden_size), zeros
-- when absent. Returns h' (LSTMCell: {h', c'}).
function R.RNNCellBase:forward(x, hx)
  local fn = self.__name
  local lstm = self.mode == "LSTM"
  check_input(x, fn, 2, self.input_size, self.weight_ih)
  local batched = x:dim() == 2
  if not batched then x = x:unsqueeze(0) end
  local N = x:size(0)
  local h, c
  if hx ~= nil then
    if lstm then
      if type(hx) ~= "table" or is_tensor(hx) or not is_tensor(hx[1]) or not is_tensor(hx[2]) then
        raise(fn .. ": expected hx to be a table {h, c} of two tensors")
      end
      h, c = hx[1], hx[2]
    else
      h = hx
    end
    local want = batched and { N, self.hidden_size } or { self.hidden_size }
    check_state(h, fn, lstm and "h" or "hx", want, x)
    if lstm then check_state(c, fn, "c", want, x) end
    if not batched then
      h = h:unsqueeze(0)
      if lstm then c = c:unsqueeze(0) end
    end
  else
    local o = { dtype = x.dtype, device = x.device }
    h = torch.zeros({ N, self.hidden_size }, o)
    if lstm then c = torch.zeros({ N, self.hidden_size }, o) end
  end
  local gi = F.linear(x, self.weight_ih, self.bias_ih)
  local h1, c1 = step_of(self.mode, gi, h, c, self.weight_hh, self.bias_hh)
  if not batched then
    h1 = h1:squeeze(0)
    if lstm then c1 = c1:squeeze(0) end
  end
  if lstm then return { h1, c1 } end
  return h1
end

-- RNNCell(input_size, hidden_size [, bias=true] [, {bias=, nonlinearity="tanh", dtype=, device=}])
R.RNNCell = R.RNNCellBase:extend("RNNCell")
function R.RNNCell:__init(input_size, hidden_size, bias, opts)
  local o = type(bias) == "table" and bias or opts or {}
  local nl = o.nonlinearity or "tanh"
  if nl ~= "tanh" and nl ~= "relu" then
    raise(string.format('RNNCell: unknown nonlinearity \'%s\' (expected "tanh" or "relu")', tostring(nl)))
  end
  self.nonlinearity = nl
  R.RNNCellBase.__init(self, nl == "tanh" and "RNN_TANH" or "RNN_RELU", "RNNCell", rnn_cell_opts, input_size,
                       hidden_size, bias, opts)
end

-- LSTMCell(input_size, hidden_size [, bias=true] [, {bias=, dtype=, device=}])
R.LSTMCell = R.RNNCellBase:extend("LSTMCell")
function R.LSTMCell:__init(input_size, hidden_size, bias, opts)
  R.RNNCellBase.__init(self, "LSTM", "LSTMCell", cell_opts, input_size, hidden_size, bias, opts)
end

-- GRUCell(input_size, hidden_size [, bias=true] [, {bias=, dtype=, device=}])
R.GRUCell = R.RNNCellBase:extend("GRUCell")
function R.GRUCell:__init(input_size, hidden_size, bias, opts)
  R.RNNCellBase.__init(self, "GRU", "GRUCell", cell_opts, input_size, hidden_size, bias, opts)
end

return R
