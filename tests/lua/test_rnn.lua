-- test_rnn.lua -- nn.RNN, nn.LSTM, nn.GRU and their cells against PyTorch
-- (tests/ref/rnn.lua, written by scripts/gen_rnn_ref.py): PyTorch's
-- weights loaded with load_state_dict, then the outputs, h_n, c_n and the
-- gradients of the input, h0, c0 and every parameter, in float64 and
-- float32; two layers, bidirectional, batch_first, given h0, unbatched
-- input, bias=false, LSTM's proj_size, RNN's relu, packed batches (sorted
-- and not, with pack_padded_sequence and pad_packed_sequence). Then the fused gate
-- ops against finite differences, parameter names and initialisation,
-- dropout between layers, and bad input.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local dir = os.getenv("DPLUA_TEST_DIR") or (here .. "/..")
package.path = dir .. "/lua/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local nn = torch.nn
local ref = dofile(dir .. "/ref/rnn.lua")

local function tensor(r, dtype) return T.ref_tensor(torch, r, dtype) end

local tol = { [torch.float64] = 1e-10, [torch.float32] = 1e-4 }

local function build(c, dtype)
  local opts = { dtype = dtype }
  for k, v in pairs(c.opts) do opts[k] = v end
  local a = c.args
  if c.kind:match("Cell$") then return nn[c.kind](a[1], a[2], opts) end
  return nn[c.kind](a[1], a[2], a[3], opts)
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
    local lstm = c.kind:match("^LSTM") ~= nil
    local hx = inputs.h0
    if lstm and hx then hx = { inputs.h0, inputs.c0 } end
    local out, h_n, c_n
    if c.kind:match("Cell$") then
      local s = m(inputs.x, hx)
      if lstm then out, c_n = s[1], s[2] else out = s end
    elseif c.lengths then
      local R = nn.utils.rnn
      local bf = c.opts.batch_first == true
      local packed = R.pack_padded_sequence(inputs.x, c.lengths, { batch_first = bf, enforce_sorted = c.enforce_sorted })
      local po, state = m(packed, hx)
      T.ok(R.is_packed(po), label .. ": a packed input gives a packed output")
      local lengths
      out, lengths = R.pad_packed_sequence(po, { batch_first = bf })
      T.is(lengths:tolist(), c.lengths, label .. ": the lengths in the batch's order")
      if lstm then h_n, c_n = state[1], state[2] else h_n = state end
    else
      local state
      out, state = m(inputs.x, hx)
      if lstm then h_n, c_n = state[1], state[2] else h_n = state end
    end
    local rt = tol[dtype]
    local loss = 0
    for _, p in ipairs({ { "out", out }, { "h_n", h_n }, { "c_n", c_n } }) do
      local key, t = p[1], p[2]
      T.is(t ~= nil, c[key] ~= nil, label .. ": " .. key .. " returned as PyTorch returns it")
      if t ~= nil and c[key] ~= nil then
        T.tensor_close(t:double(), tensor(c[key]), rt, rt, label .. ": " .. key)
        loss = loss + (t * tensor(c["d" .. key], dtype)):sum()
      end
    end
    loss:backward()
    local params = {}
    for n, p in m:named_parameters() do params[n] = p end
    for _, k in ipairs(T.sorted_keys(c.grads)) do
      local pname = k:match("^param%.(.*)$")
      local t = pname and params[pname] or inputs[k]
      T.ok(t ~= nil and t.grad ~= nil, label .. ": has a gradient of " .. k)
      if t and t.grad then T.tensor_close(t.grad:double(), tensor(c.grads[k]), rt, rt, label .. ": gradient of " .. k) end
    end
    local names, want = {}, {}
    for n in m:named_parameters() do names[#names + 1] = n end
    for k in pairs(c.weights) do want[#want + 1] = k end
    table.sort(names)
    table.sort(want)
    T.is(table.concat(names, " "), table.concat(want, " "), label .. ": the parameters are PyTorch's")
  end)
end

for _, name in ipairs(T.sorted_keys(ref)) do
  for _, dtype in ipairs({ torch.float64, torch.float32 }) do run_case(name, ref[name], dtype) end
end

T.run("bfloat16 runs the gate formulas as tensor ops", function()
  for _, name in ipairs({ "lstm_2layer_bidir_h0", "gru_2layer_bidir_batch_first_h0", "rnn_tanh_2layer_h0" }) do
    local c = ref[name]
    local m = build(c, torch.float64)
    local sd = {}
    for k, v in pairs(c.weights) do sd[k] = tensor(v) end
    m:load_state_dict(sd)
    m:to(torch.bfloat16)
    local x = tensor(c.inputs.x, torch.bfloat16)
    local hx = c.inputs.h0 and tensor(c.inputs.h0, torch.bfloat16)
    if c.inputs.c0 then hx = { hx, tensor(c.inputs.c0, torch.bfloat16) } end
    local out = m(x, hx)
    T.is(out.dtype, torch.bfloat16, name .. ": a bfloat16 output")
    T.tensor_close(out:double(), tensor(c.out), 0, 5e-2, name .. ": output within bfloat16's rounding")
  end
end)

---------------------------------------------------------------- the fused gate ops

T.run("torch._lstm_gates: forward as the gate formulas of gi + gh, backward as finite differences", function()
  torch.manual_seed(3)
  local N, H = 3, 4
  local gi, gh = torch.randn(N, 4 * H, { dtype = torch.float64 }) * 2, torch.randn(N, 4 * H, { dtype = torch.float64 })
  local c = torch.randn(N, H, { dtype = torch.float64 })
  local hc = torch._lstm_gates(gi, gh, c)
  local gates = gi + gh
  T.is(table.concat(hc:size(), "x"), "2x3x4", "output {h, c} stacked: (2, N, H)")
  local i, f = torch.sigmoid(gates:narrow(1, 0, H)), torch.sigmoid(gates:narrow(1, H, H))
  local g, o = torch.tanh(gates:narrow(1, 2 * H, H)), torch.sigmoid(gates:narrow(1, 3 * H, H))
  local c1 = f * c + i * g
  T.tensor_close(hc:select(0, 1), c1, 1e-14, 1e-14, "c' = f c + i g")
  T.tensor_close(hc:select(0, 0), o * torch.tanh(c1), 1e-14, 1e-14, "h' = o tanh(c')")
  T.ok(torch.autograd.gradcheck(torch._lstm_gates, { gi:requires_grad_(), gh:requires_grad_(), c:requires_grad_() }),
       "gradcheck: float64 central differences")
end)

T.run("torch._gru_gates: forward as the gate formulas, backward as finite differences", function()
  torch.manual_seed(4)
  local N, H = 3, 4
  local gi, gh = torch.randn(N, 3 * H, { dtype = torch.float64 }), torch.randn(N, 3 * H, { dtype = torch.float64 })
  local h = torch.randn(N, H, { dtype = torch.float64 })
  local r = torch.sigmoid(gi:narrow(1, 0, H) + gh:narrow(1, 0, H))
  local z = torch.sigmoid(gi:narrow(1, H, H) + gh:narrow(1, H, H))
  local n = torch.tanh(gi:narrow(1, 2 * H, H) + r * gh:narrow(1, 2 * H, H))
  T.tensor_close(torch._gru_gates(gi, gh, h), (1 - z) * n + z * h, 1e-14, 1e-14, "h' = (1 - z) n + z h")
  T.ok(torch.autograd.gradcheck(torch._gru_gates, { gi:requires_grad_(), gh:requires_grad_(), h:requires_grad_() }),
       "gradcheck: float64 central differences")
end)

T.run("torch._lstm_layer: the gate steps in order, backward as finite differences", function()
  torch.manual_seed(5)
  local T_, N, H = 4, 3, 2
  local o = { dtype = torch.float64 }
  local gi, h0, c0 = torch.randn(T_, N, 4 * H, o), torch.randn(N, H, o), torch.randn(N, H, o)
  local w, b = torch.randn(4 * H, H, o), torch.randn(4 * H, o)
  local y = torch._lstm_layer(gi, h0, c0, w, b)
  T.is(table.concat(y:size(), "x"), "2x5x3x2", "output (2, T + 1, N, H)")
  T.tensor_close(y:select(0, 0):select(0, 0), h0, 0, 0, "y[0][0] holds h0")
  T.tensor_close(y:select(0, 1):select(0, 0), c0, 0, 0, "y[1][0] holds c0")
  T.ok(y:select(0, 0):narrow(0, 1, T_):is_contiguous(), "the h's after each step are a contiguous view")
  local h, c = h0, c0
  for t = 0, T_ - 1 do
    local hc = torch._lstm_gates(gi:select(0, t), torch.nn.functional.linear(h, w, b), c)
    h, c = hc:select(0, 0), hc:select(0, 1)
    T.tensor_close(y:select(1, t + 1), hc, 1e-14, 1e-14, "timestep " .. t .. " as lstm_gates of h w^T + b")
  end
  local without = torch._lstm_layer(gi, h0, c0, w)
  local h1 = torch._lstm_gates(gi:select(0, 0), torch.nn.functional.linear(h0, w), c0)
  T.tensor_close(without:select(1, 1), h1, 1e-14, 1e-14, "no b_hh")
  local leaves = { gi:requires_grad_(), h0:requires_grad_(), c0:requires_grad_(), w:requires_grad_(), b:requires_grad_() }
  T.ok(torch.autograd.gradcheck(torch._lstm_layer, leaves), "gradcheck: every input, float64 central differences")
  T.ok(torch.autograd.gradcheck(function(a, d, e, f) return torch._lstm_layer(a, d, e, f) end,
                                { leaves[1], leaves[2], leaves[3], leaves[4] }), "gradcheck without b_hh")
  local grad = torch.no_grad(function() return torch._lstm_layer(gi, h0, c0, w, b) end)
  T.ok(not grad.requires_grad, "under no_grad: no node")
  T.tensor_close(grad, y, 0, 0, "under no_grad: the same values")
end)

---------------------------------------------------------------- modules

T.run("parameter names, shapes, initialisation and printing", function()
  torch.manual_seed(0)
  local m = nn.LSTM(10, 20, 2, { bidirectional = true, proj_size = 5 })
  local got = {}
  for n, p in m:named_parameters() do got[#got + 1] = n .. "=" .. table.concat(p:size(), "x") end
  T.is(table.concat(got, " "),
       "weight_ih_l0=80x10 weight_hh_l0=80x5 bias_ih_l0=80 bias_hh_l0=80 weight_hr_l0=5x20 "
       .. "weight_ih_l0_reverse=80x10 weight_hh_l0_reverse=80x5 bias_ih_l0_reverse=80 bias_hh_l0_reverse=80 "
       .. "weight_hr_l0_reverse=5x20 "
       .. "weight_ih_l1=80x10 weight_hh_l1=80x5 bias_ih_l1=80 bias_hh_l1=80 weight_hr_l1=5x20 "
       .. "weight_ih_l1_reverse=80x10 weight_hh_l1_reverse=80x5 bias_ih_l1_reverse=80 bias_hh_l1_reverse=80 "
       .. "weight_hr_l1_reverse=5x20", "LSTM: PyTorch's names and order")
  local bound = 1 / math.sqrt(20)
  for n, p in m:named_parameters() do
    T.ok(p:abs():max():item() <= bound and p:abs():max():item() > bound / 2, n .. " uniform within 1/sqrt(hidden_size)")
  end
  T.is(tostring(m), "LSTM(10, 20, proj_size=5, num_layers=2, bidirectional=True)", "LSTM printing")
  local g = nn.GRU(3, 4, { bias = false, batch_first = true, dropout = 0.5 })
  got = {}
  for n, p in g:named_parameters() do got[#got + 1] = n .. "=" .. table.concat(p:size(), "x") end
  T.is(table.concat(got, " "), "weight_ih_l0=12x3 weight_hh_l0=12x4", "GRU bias=false")
  T.is(tostring(g), "GRU(3, 4, bias=False, batch_first=True, dropout=0.5)", "GRU printing")
  local cell = nn.RNNCell(3, 4, { nonlinearity = "relu" })
  got = {}
  for n, p in cell:named_parameters() do got[#got + 1] = n .. "=" .. table.concat(p:size(), "x") end
  T.is(table.concat(got, " "), "weight_ih=4x3 weight_hh=4x4 bias_ih=4 bias_hh=4", "RNNCell names")
  T.is(tostring(cell), "RNNCell(3, 4, nonlinearity=relu)", "RNNCell printing")
  T.is(tostring(nn.LSTMCell(3, 4, false)), "LSTMCell(3, 4, bias=False)", "LSTMCell printing, positional bias")
  T.is(tostring(nn.RNN(3, 4, { num_layers = 3 })), "RNN(3, 4, num_layers=3)", "num_layers as an option")
end)

T.run("dropout applies between layers while training only", function()
  torch.manual_seed(5)
  local m = nn.LSTM(3, 8, 2, { dropout = 0.5, dtype = torch.float64 })
  local x = torch.randn(6, 2, 3, { dtype = torch.float64 })
  m:eval()
  local a = m(x)
  local b = m(x)
  T.tensor_close(a, b, 0, 0, "eval: deterministic")
  m:train()
  local c = m(x)
  T.ok((c - a):abs():max():item() > 1e-3, "train: the second layer sees a dropped-out input")
  local one = nn.GRU(3, 8, 1, { dropout = 0.5, dtype = torch.float64 })
  local d, e = one(x), one(x)
  T.tensor_close(d, e, 0, 0, "one layer: no dropout after the last layer")
end)

T.run("the state carries over: two halves of a sequence equal the whole", function()
  torch.manual_seed(6)
  local m = nn.LSTM(3, 5, 2, { dtype = torch.float64, batch_first = true })
  local x = torch.randn(2, 6, 3, { dtype = torch.float64 })
  local whole, s = m(x)
  local a, s1 = m(x:narrow(1, 0, 3))
  local b, s2 = m(x:narrow(1, 3, 3), s1)
  T.tensor_close(torch.cat({ a, b }, 1), whole, 1e-12, 1e-12, "output")
  T.tensor_close(s2[1], s[1], 1e-12, 1e-12, "h_n")
  T.tensor_close(s2[2], s[2], 1e-12, 1e-12, "c_n")
end)

T.run("PackedSequence: the layout, the round trips and bad input", function()
  local R = nn.utils.rnn
  local seqs = { torch.arange(1, 3):float():view(2, 1), torch.arange(10, 14):float():view(4, 1),
                 torch.arange(20, 23):float():view(3, 1) }
  local p = R.pack_sequence(seqs, { enforce_sorted = false })
  T.is(p.batch_sizes:tolist(), { 3, 3, 2, 1 }, "batch_sizes: sequences still running at each step")
  T.is(p.data:view(-1):tolist(), { 10, 20, 1, 11, 21, 2, 12, 22, 13 }, "data time-major, longest first")
  T.is(p.sorted_indices:tolist(), { 1, 2, 0 }, "sorted_indices")
  T.is(p.unsorted_indices:tolist(), { 2, 0, 1 }, "unsorted_indices")
  local back = R.unpack_sequence(p)
  for i = 1, 3 do T.tensor_close(back[i], seqs[i], 0, 0, "unpack_sequence gives sequence " .. i) end
  local padded, lengths = R.pad_packed_sequence(p, { batch_first = true, padding_value = -1, total_length = 6 })
  T.is(T.shape(padded), { 3, 6, 1 }, "total_length pads to 6 steps")
  T.is(padded[0]:view(-1):tolist(), { 1, 2, -1, -1, -1, -1 }, "padding_value past the end")
  T.is(lengths:tolist(), { 2, 4, 3 }, "lengths in the batch's order")
  T.raises(function() R.pack_padded_sequence(torch.zeros(4, 3, 1), { 2, 4, 3 }) end,
           "sorted in decreasing order when enforce_sorted is true", "unsorted lengths")
  T.raises(function() R.pack_padded_sequence(torch.zeros(4, 3, 1), { 4, 0, 0 }) end,
           "length 0 of sequence 1 is not within %[1, 4%]", "a sequence of no steps")
  T.raises(function() R.pack_padded_sequence(torch.zeros(4, 3, 1), { 4, 3 }) end, "expected 3 lengths", "too few lengths")
  T.raises(function() R.pad_packed_sequence(p, { total_length = 2 }) end, "total_length 2 is shorter", "total_length")
  T.raises(function() R.pad_packed_sequence(torch.zeros(2)) end, "expected a PackedSequence", "not packed")
  local lstm = nn.LSTM(1, 2)
  T.raises(function() lstm(R.pack_sequence({ torch.zeros(2, 3) })) end, "input.size%(%-1%) must be equal to input_size",
           "a packed input of the wrong width")
end)

T.run("bad input names the problem", function()
  local m = nn.LSTM(5, 4, 2)
  T.raises(function() m(torch.randn(3, 2, 6)) end, "input.size%(%-1%) must be equal to input_size. Expected 5, got 6",
           "input size")
  T.raises(function() m(torch.randn(3, 2, 2, 5)) end, "expected a 3%-D %(batched%) or 2%-D %(unbatched%) input, got 4%-D",
           "input dims")
  T.raises(function() m(torch.randn(3, 2, 5), { torch.zeros(1, 2, 4), torch.zeros(2, 2, 4) }) end,
           "expected h0 of shape %[2, 2, 4%], got %[1, 2, 4%]", "h0 shape")
  T.raises(function() m(torch.randn(3, 2, 5), { torch.zeros(2, 2, 4), torch.zeros(2, 3, 4) }) end,
           "expected c0 of shape %[2, 2, 4%], got %[2, 3, 4%]", "c0 shape")
  T.raises(function() m(torch.randn(3, 2, 5), torch.zeros(2, 2, 4)) end, "expected hx to be a table {h0, c0}", "LSTM hx")
  T.raises(function() m(torch.randn(3, 2, 5, { dtype = torch.float64 })) end,
           "input is torch.float64 but the parameters are torch.float32", "input dtype")
  T.raises(function() m(torch.randn(3, 2, 5), { torch.zeros(2, 2, 4, { dtype = torch.float64 }), torch.zeros(2, 2, 4) }) end,
           "expected h0 of dtype torch.float32", "h0 dtype")
  T.raises(function() m(torch.zeros(3, 2, 5, { dtype = torch.int64 })) end, "expected input to be a floating point tensor",
           "integer input")
  T.raises(function() m(torch.zeros(0, 2, 5)) end, "at least one timestep", "empty sequence")
  local g = nn.GRU(5, 4)
  T.raises(function() g(torch.randn(3, 2, 5), torch.zeros(1, 3, 4)) end, "expected hx of shape %[1, 2, 4%], got %[1, 3, 4%]",
           "GRU hx shape")
  T.raises(function() g(torch.randn(3, 5), torch.zeros(1, 2, 4)) end, "expected hx of shape %[1, 4%]", "unbatched hx")
  T.raises(function() nn.RNN(5, 4, { nonlinearity = "sigmoid" }) end, "unknown nonlinearity 'sigmoid'", "nonlinearity")
  T.raises(function() nn.LSTM(5, 4, { proj_size = 4 }) end, "proj_size has to be smaller than hidden_size", "proj_size")
  T.raises(function() nn.GRU(5, 4, { proj_size = 2 }) end, "unknown option 'proj_size'", "proj_size is LSTM's")
  T.raises(function() nn.LSTM(5, 4, { dropout = 2 }) end, "dropout should be a number in range %[0, 1%]", "dropout")
  T.raises(function() nn.LSTM(5, 4, 0) end, "expected num_layers to be an integer >= 1", "num_layers")
  local cell = nn.LSTMCell(5, 4)
  T.raises(function() cell(torch.randn(2, 5), { torch.zeros(2, 4), torch.zeros(3, 4) }) end,
           "expected c of shape %[2, 4%], got %[3, 4%]", "cell c shape")
  T.raises(function() cell(torch.randn(2, 3)) end, "Expected 5, got 3", "cell input size")
  T.raises(function() torch._lstm_gates(torch.zeros(2, 16), torch.zeros(2, 12), torch.zeros(2, 4)) end,
           "expected gh of shape %[2, 16%], got %[2, 12%]", "lstm gates shape")
  T.raises(function() torch._gru_gates(torch.zeros(2, 12), torch.zeros(2, 12, { dtype = torch.float64 }), torch.zeros(2, 4)) end,
           "dtype", "gru gates dtype")
  local z = torch.zeros
  T.raises(function() torch._lstm_layer(z(3, 2, 12), z(2, 4), z(2, 4), z(16, 4)) end,
           "expected gi of shape %[3, 2, 16%], got %[3, 2, 12%]", "lstm layer gi shape")
  T.raises(function() torch._lstm_layer(z(2, 16), z(2, 4), z(2, 4), z(16, 4)) end,
           "expected gi of shape %[T, 2, 16%] with T >= 1, got %[2, 16%]", "lstm layer gi 2-D")
  T.raises(function() torch._lstm_layer(z(0, 2, 16), z(2, 4), z(2, 4), z(16, 4)) end,
           "with T >= 1, got %[0, 2, 16%]", "lstm layer without timesteps")
  T.raises(function() torch._lstm_layer(z(3, 2, 16), z(2, 4), z(2, 4), z(16, 5)) end,
           "expected w_hh of shape %[16, 4%], got %[16, 5%]", "lstm layer w_hh shape")
  T.raises(function() torch._lstm_layer(z(3, 2, 16), z(2, 4), z(2, 4), z(16, 4), z(12)) end,
           "expected b_hh of shape %[16%], got %[12%]", "lstm layer b_hh shape")
  T.raises(function() torch._lstm_layer(z(3, 2, 16), z(2, 4), z(2, 4, { dtype = torch.float64 }), z(16, 4)) end,
           "expected c0 of dtype float32 %(the state's%), got float64", "lstm layer dtype")
  T.raises(function() torch._lstm_layer(z(3, 2, 16), z(2, 4), z(2, 4), 3) end,
           "expected gi, h0, c0 and w_hh tensors", "lstm layer not a tensor")
end)

T.done_testing()
