-- dplua.primitives: the fused C operations under dplua.nn and
-- dplua.optim, as torch._linear, torch._cross_entropy, torch._sgd_step,
-- ... Thin wrappers with the C argument order; dplua.nn and dplua.optim
-- build the PyTorch-shaped API on them.
local B = require("dplua.base")
local ffi, C, torch = B.ffi, B.C, B.torch
local raise, check, new, wrap = B.raise, B.check, B.new, B.wrap
local is_tensor, typename, check_int = B.is_tensor, B.typename, B.check_int
local outp, outp2 = B.outp, B.outp2

local function opt_p(t)
  if t == nil then return nil end
  if not is_tensor(t) then raise("expected a tensor or nil, got " .. typename(t)) end
  return t.p
end
local i64x2 = { ffi.new("int64_t[2]"), ffi.new("int64_t[2]"), ffi.new("int64_t[2]"), ffi.new("int64_t[2]") }
local function pair(buf, v, fn, what)
  if type(v) == "number" then v = { v, v } end
  if type(v) ~= "table" or #v ~= 2 then raise(string.format("%s: expected %s as a number or a pair, got %s", fn, what, typename(v))) end
  buf[0] = check_int(v[1], fn, what); buf[1] = check_int(v[2], fn, what)
  return buf
end

function torch._linear(x, w, b)
  if not is_tensor(x) or not is_tensor(w) then raise("linear: expected input and weight tensors") end
  return new(C.dp_linear(outp, x.p, w.p, opt_p(b)))
end
-- act(linear(x, w, b)) as one node, the activation in the product's
-- epilogue (nn.Sequential's Linear then ReLU or GELU): act "relu", "gelu"
-- or "gelu_tanh" (GELU with approximate="tanh")
local linear_acts = { relu = C.DP_RELU, gelu = C.DP_GELU, gelu_tanh = C.DP_GELU_TANH }
function torch._linear_act(x, w, b, act)
  if not is_tensor(x) or not is_tensor(w) then raise("linear: expected input and weight tensors") end
  local op = linear_acts[act]
  if op == nil then
    raise(string.format('linear: the activation must be "relu", "gelu" or "gelu_tanh", got %s', tostring(act)))
  end
  return new(C.dp_linear_act(outp, x.p, w.p, opt_p(b), op))
end

-- fp32: the loss in float32 as autocast computes it (C's dp_cross_entropy_fp32)
function torch._cross_entropy(input, target, weight, ignore_index, label_smoothing, reduction, log_probs, fp32)
  if not is_tensor(input) or not is_tensor(target) then
    raise(string.format("cross_entropy: expected input and target tensors, got %s and %s", typename(input), typename(target)))
  end
  local fn = fp32 and C.dp_cross_entropy_fp32 or C.dp_cross_entropy
  return new(fn(outp, input.p, target.p, opt_p(weight), ignore_index or -100, label_smoothing or 0, reduction or 1,
                log_probs and 1 or 0))
end

-- attention by the fused op (src/core/attention.c), when _attention_fused
-- says a kernel takes q, k, v; F.scaled_dot_product_attention decides
function torch._attention_fused(q, k, v) return C.dp_attention_fused(q.p, k.p, v.p) ~= 0 end
function torch._scaled_dot_product_attention(q, k, v, is_causal, scale)
  return new(C.dp_scaled_dot_product_attention(outp, q.p, k.p, v.p, is_causal and 1 or 0, scale))
end

-- LayerNorm over the last n elements as one node (src/core/norm.c):
-- out_dtype the input's, or float32 for a bfloat16 input; F.layer_norm
-- checks the arguments
function torch._native_layer_norm(input, weight, bias, n, eps, out_dtype)
  return new(C.dp_layer_norm(outp, nil, nil, input.p, opt_p(weight), opt_p(bias), n, eps, out_dtype.id))
end
-- dropout in training, one op (p in [0, 1)): the mask is rand_like(x) >= p
function torch._native_dropout(x, p) return new(C.dp_dropout(outp, x.p, p)) end
-- x + residual and the LayerNorm of it in one pass: returns both
function torch._native_add_layer_norm(x, residual, weight, bias, n, eps, out_dtype)
  local out = new(C.dp_add_layer_norm(outp2, outp, x.p, residual.p, opt_p(weight), opt_p(bias), n, eps, out_dtype.id))
  return wrap(outp2[0]), out
end

-- BatchNorm over every dim but dim 1 as one node (src/core/norm.c),
-- moving the running statistics in place when training; F.batch_norm
-- decides
function torch._native_batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)
  return new(C.dp_batch_norm(outp, input.p, opt_p(weight), opt_p(bias), opt_p(running_mean), opt_p(running_var),
                             training and 1 or 0, momentum, eps))
end

function torch._unfold(x, kernel, stride, padding, dilation, pad_value)
  if not is_tensor(x) then raise("unfold: expected a tensor, got " .. typename(x)) end
  return new(C.dp_unfold(outp, x.p, pair(i64x2[1], kernel, "unfold", "kernel_size"),
                         pair(i64x2[2], stride or kernel, "unfold", "stride"),
                         pair(i64x2[3], padding or 0, "unfold", "padding"),
                         pair(i64x2[4], dilation or 1, "unfold", "dilation"), pad_value or 0))
end

-- One timestep of a recurrent layer's gates as one node (src/core/rnn.c),
-- gi = x W_ih^T + b_ih and gh = h W_hh^T + b_hh: LSTM's gi, gh (N, 4H) and
-- c (N, H) give {h', c'} stacked as (2, N, H); GRU's gi, gh (N, 3H) and h
-- (N, H) give h' (N, H). nn.LSTM and nn.GRU build on them.
function torch._lstm_gates(gi, gh, c)
  if not is_tensor(gi) or not is_tensor(gh) or not is_tensor(c) then
    raise(string.format("lstm_gates: expected gi, gh and c tensors, got %s, %s and %s", typename(gi), typename(gh),
                        typename(c)))
  end
  return new(C.dp_lstm_gates(outp, gi.p, gh.p, c.p))
end
-- A whole LSTM layer (src/core/rnn.c): gi (T, N, 4H) = x W_ih^T + b_ih,
-- h0 and c0 (N, H), w_hh (4H, H), b_hh (4H) or nil give (2, T + 1, N, H):
-- h0 then h_t after each timestep, and the same of the c's.
function torch._lstm_layer(gi, h0, c0, w_hh, b_hh)
  if not is_tensor(gi) or not is_tensor(h0) or not is_tensor(c0) or not is_tensor(w_hh) then
    raise(string.format("lstm_layer: expected gi, h0, c0 and w_hh tensors, got %s, %s, %s and %s", typename(gi),
                        typename(h0), typename(c0), typename(w_hh)))
  end
  if b_hh ~= nil and not is_tensor(b_hh) then
    raise("lstm_layer: expected b_hh to be a tensor or nil, got " .. typename(b_hh))
  end
  return new(C.dp_lstm_layer(outp, gi.p, h0.p, c0.p, w_hh.p, opt_p(b_hh)))
end
function torch._gru_gates(gi, gh, h)
  if not is_tensor(gi) or not is_tensor(gh) or not is_tensor(h) then
    raise(string.format("gru_gates: expected gi, gh and h tensors, got %s, %s and %s", typename(gi), typename(gh),
                        typename(h)))
  end
  return new(C.dp_gru_gates(outp, gi.p, gh.p, h.p))
end

-- conv2d as one node (CPU float32/float64 only; F.conv2d checks the
-- arguments and decides): stride, padding, dilation pairs, groups
function torch._conv2d(x, w, b, stride, padding, dilation, groups)
  return new(C.dp_conv2d(outp, x.p, w.p, opt_p(b), pair(i64x2[1], stride, "conv2d", "stride"),
                         pair(i64x2[2], padding, "conv2d", "padding"), pair(i64x2[3], dilation, "conv2d", "dilation"),
                         groups))
end

-- max_pool2d as one node (CPU float32/float64 only; F.max_pool2d checks
-- the arguments and decides): kernel, stride, padding, dilation pairs
function torch._max_pool2d(x, kernel, stride, padding, dilation)
  return new(C.dp_max_pool2d(outp, x.p, pair(i64x2[1], kernel, "max_pool2d", "kernel_size"),
                             pair(i64x2[2], stride, "max_pool2d", "stride"),
                             pair(i64x2[3], padding, "max_pool2d", "padding"),
                             pair(i64x2[4], dilation, "max_pool2d", "dilation")))
end

function torch._sgd_step(p, g, buf, lr, momentum, dampening, nesterov, weight_decay, first_step)
  check(C.dp_sgd_step(p.p, g.p, opt_p(buf), lr, momentum or 0, dampening or 0, nesterov and 1 or 0,
                      weight_decay or 0, first_step and 1 or 0))
end

-- master: nil, or the float32 master copy of bfloat16 p (the moments are then float32)
function torch._adam_step(p, g, m, v, vmax, master, lr, beta1, beta2, eps, weight_decay, decoupled, step)
  check(C.dp_adam_step(p.p, g.p, m.p, v.p, opt_p(vmax), opt_p(master), lr, beta1, beta2, eps, weight_decay or 0,
                       decoupled and 1 or 0, step))
end
-- capturable: the step count is a 0-d float64 tensor beside p, incremented here
function torch._adam_step_t(p, g, m, v, vmax, master, lr, beta1, beta2, eps, weight_decay, decoupled, step_t)
  check(C.dp_adam_step_t(p.p, g.p, m.p, v.p, opt_p(vmax), opt_p(master), lr, beta1, beta2, eps, weight_decay or 0,
                         decoupled and 1 or 0, step_t.p))
end
-- Adadelta, RMSprop and Adagrad: one pass over p, g and the state buffers
-- (of p's dtype; RMSprop's grad_avg read only when centered, momentum_buf
-- only with momentum > 0); Adagrad's step counts from 1
function torch._adadelta_step(p, g, square_avg, acc_delta, lr, rho, eps, weight_decay)
  check(C.dp_adadelta_step(opt_p(p), opt_p(g), opt_p(square_avg), opt_p(acc_delta), lr, rho, eps, weight_decay or 0))
end
function torch._rmsprop_step(p, g, square_avg, grad_avg, momentum_buf, lr, alpha, eps, weight_decay, momentum, centered)
  check(C.dp_rmsprop_step(opt_p(p), opt_p(g), opt_p(square_avg), opt_p(grad_avg), opt_p(momentum_buf), lr, alpha, eps,
                          weight_decay or 0, momentum or 0, centered and 1 or 0))
end
function torch._adagrad_step(p, g, sum, lr, lr_decay, weight_decay, eps, step)
  check(C.dp_adagrad_step(opt_p(p), opt_p(g), opt_p(sum), lr, lr_decay or 0, weight_decay or 0, eps, step))
end

local params_buf = ffi.new("dp_tensor*[?]", 4096)
function torch._flatten_params(list)
  local n = #list
  if n == 0 then raise("flatten_params: expected at least one parameter") end
  if n > 4096 then raise("flatten_params: at most 4096 parameters in one group") end
  for i = 1, n do
    if not is_tensor(list[i]) then raise("flatten_params: expected tensors, got " .. typename(list[i]) .. " at " .. i) end
    params_buf[i - 1] = list[i].p
  end
  check(C.dp_flatten_params(outp, outp2, n, params_buf))
  return wrap(outp[0]), wrap(outp2[0])
end
