-- dplua.nn.layers: the built-in modules (Linear, Conv2d, activations,
-- Sequential, ...), each a Module subclass whose forward calls
-- nn.functional and whose tostring is PyTorch's.
--
-- Constructors take PyTorch's positional arguments, and the keyword ones in
-- a trailing options table:  nn.Linear(10, 2, {bias=false, dtype=torch.float64}),
-- nn.Conv2d(1, 32, 3, {stride=1, padding=1}).
local torch = require("dplua")
local module = require("dplua.nn.module")
local F = require("dplua.nn.functional")
local init = require("dplua.nn.init_")
local raise = torch._raise
local Module, Parameter = module.Module, module.Parameter
local pyrepr, pyfloat = module.pyrepr, module.pyfloat

local L = {}

local function is_opts(x) return type(x) == "table" and x[1] == nil and not torch.is_tensor(x) and getmetatable(x) == nil end
local function typename(x) return torch.is_tensor(x) and "Tensor" or (module.is_module(x) and "Module" or type(x)) end

-- A misspelt option is an error rather than silently ignored.
local function check_opts(opts, fn, allowed)
  if type(opts) ~= "table" or torch.is_tensor(opts) then
    raise(string.format("%s: expected a table of options, got %s", fn, typename(opts)))
  end
  for k in pairs(opts) do
    if not allowed[k] then raise(string.format("%s: unknown option '%s'", fn, tostring(k))) end
  end
  return opts
end

local function want_int(v, fn, what, min)
  if type(v) ~= "number" or v % 1 ~= 0 or v < (min or 0) then
    raise(string.format("%s: expected %s to be an integer >= %d, got %s", fn, what, min or 0, tostring(v)))
  end
  return v
end

-- Creation options for torch.empty & co. (nil when there are none: an
-- empty table would read as a size).
local function factory(opts)
  if opts.dtype == nil and opts.device == nil then return nil end
  return { dtype = opts.dtype, device = opts.device }
end

-- torch.empty/ones/zeros(shape [, {dtype=, device=}]).
local function make(maker, shape, opts, value)
  local f = factory(opts)
  if value ~= nil then return torch[maker](shape, value, f) end   -- (torch.full's fill value)
  if f then return torch[maker](shape, f) end
  return torch[maker](shape)
end

---------------------------------------------------------------- Identity, activations

L.Identity = Module:extend("Identity")
function L.Identity:forward(x) return x end

L.ReLU = Module:extend("ReLU")
function L.ReLU:forward(x) return F.relu(x) end

L.Tanh = Module:extend("Tanh")
function L.Tanh:forward(x) return F.tanh(x) end

L.Sigmoid = Module:extend("Sigmoid")
function L.Sigmoid:forward(x) return F.sigmoid(x) end

L.SiLU = Module:extend("SiLU")
function L.SiLU:forward(x) return F.silu(x) end

L.GELU = Module:extend("GELU")
function L.GELU:__init(approximate)
  if is_opts(approximate) then approximate = approximate.approximate end
  approximate = approximate or "none"
  if approximate ~= "none" and approximate ~= "tanh" then
    raise('GELU: approximate must be "none" or "tanh", got ' .. tostring(approximate))
  end
  self.approximate = approximate
end
function L.GELU:forward(x) return F.gelu(x, self.approximate) end
function L.GELU:extra_repr() return "approximate='" .. self.approximate .. "'" end

-- LeakyReLU(negative_slope=0.01), ELU(alpha=1), Softplus(beta=1,
-- threshold=20), Hardtanh(min_val=-1, max_val=1), ReLU6, Mish,
-- Hardsigmoid, Hardswish, SELU, Softsign: F's.
-- (inplace=, accepted by PyTorch, is accepted and ignored.)
local function activation(name, params, fn)
  local cls = Module:extend(name)
  function cls:__init(...)
    local o = ...
    local args = { ... }
    if is_opts(o) then args = {} for i, p in ipairs(params) do args[i] = o[p[1]] end end
    for i, p in ipairs(params) do self[p[1]] = args[i] == nil and p[2] or args[i] end
  end
  function cls:forward(x)
    local args = {}
    for i, p in ipairs(params) do args[i] = self[p[1]] end
    return fn(x, unpack(args, 1, #params))
  end
  function cls:extra_repr()
    local parts = {}
    for i, p in ipairs(params) do parts[i] = p[1] .. "=" .. tostring(self[p[1]]) end
    return table.concat(parts, ", ")
  end
  L[name] = cls
end
activation("LeakyReLU", { { "negative_slope", 0.01 } }, F.leaky_relu)
activation("ELU", { { "alpha", 1.0 } }, F.elu)
activation("Softplus", { { "beta", 1 }, { "threshold", 20 } }, F.softplus)
activation("Hardtanh", { { "min_val", -1.0 }, { "max_val", 1.0 } }, F.hardtanh)
activation("ReLU6", {}, F.relu6)
activation("Mish", {}, F.mish)
activation("Hardsigmoid", {}, F.hardsigmoid)
activation("Hardswish", {}, F.hardswish)
activation("SELU", {}, F.selu)
activation("Softsign", {}, F.softsign)
activation("CELU", { { "alpha", 1.0 } }, F.celu)
activation("LogSigmoid", {}, F.logsigmoid)
activation("Tanhshrink", {}, F.tanhshrink)
activation("Softshrink", { { "lambd", 0.5 } }, F.softshrink)
activation("Hardshrink", { { "lambd", 0.5 } }, F.hardshrink)
activation("Threshold", { { "threshold" }, { "value" } }, F.threshold)
activation("GLU", { { "dim", -1 } }, F.glu)
activation("ChannelShuffle", { { "groups" } }, F.channel_shuffle)

-- RReLU(lower=1/8, upper=1/3): random slopes while training, their mean otherwise.
L.RReLU = Module:extend("RReLU")
function L.RReLU:__init(lower, upper)
  if is_opts(lower) then lower, upper = lower.lower, lower.upper end
  self.lower, self.upper = lower or 1 / 8, upper or 1 / 3
end
function L.RReLU:forward(x) return F.rrelu(x, self.lower, self.upper, self.training) end
function L.RReLU:extra_repr() return "lower=" .. pyfloat(self.lower) .. ", upper=" .. pyfloat(self.upper) end

-- PReLU(num_parameters=1, init=0.25) (or {num_parameters=, init=, dtype=,
-- device=}): a learnt slope, one or one per channel.
L.PReLU = Module:extend("PReLU")
function L.PReLU:__init(num_parameters, init_value)
  local opts = {}
  if is_opts(num_parameters) then
    opts = check_opts(num_parameters, "PReLU", { num_parameters = true, init = true, dtype = true, device = true })
    num_parameters, init_value = opts.num_parameters, opts.init
  end
  self.num_parameters = want_int(num_parameters or 1, "PReLU", "num_parameters", 1)
  self.init = init_value or 0.25
  self.weight = Parameter(make("full", { self.num_parameters }, opts, self.init))
end
function L.PReLU:forward(x) return F.prelu(x, self.weight) end
function L.PReLU:extra_repr() return "num_parameters=" .. self.num_parameters end

-- Softmax2d: softmax over the channels (dim -3) of (N, C, H, W) or (C, H, W)
L.Softmax2d = Module:extend("Softmax2d")
function L.Softmax2d:forward(x)
  if not torch.is_tensor(x) then raise("Softmax2d: expected a tensor input, got " .. typename(x)) end
  if x:dim() ~= 3 and x:dim() ~= 4 then raise("Softmax2d: expected a 3-D or 4-D input, got " .. x:dim() .. " dims") end
  return F.softmax(x, -3)
end

L.Softmax = Module:extend("Softmax")
function L.Softmax:__init(dim)
  if is_opts(dim) then dim = dim.dim end
  self.dim = dim
end
function L.Softmax:forward(x) return F.softmax(x, self.dim) end
function L.Softmax:extra_repr() return "dim=" .. pyrepr(self.dim) end

L.LogSoftmax = Module:extend("LogSoftmax")
L.LogSoftmax.__init = L.Softmax.__init
function L.LogSoftmax:forward(x) return F.log_softmax(x, self.dim) end

L.Softmin = Module:extend("Softmin")
L.Softmin.__init = L.Softmax.__init
function L.Softmin:forward(x) return F.softmin(x, self.dim) end
L.Softmin.extra_repr = L.Softmax.extra_repr
L.LogSoftmax.extra_repr = L.Softmax.extra_repr

L.Dropout = Module:extend("Dropout")
function L.Dropout:__init(p)
  if is_opts(p) then p = p.p end
  if p == nil then p = 0.5 end
  if type(p) ~= "number" or p < 0 or p > 1 then
    raise("Dropout: dropout probability has to be between 0 and 1, but got " .. tostring(p))
  end
  self.p = p
  self.inplace = false
end
function L.Dropout:forward(x) return F.dropout(x, self.p, self.training) end
function L.Dropout:extra_repr() return "p=" .. pyfloat(self.p) .. ", inplace=False" end

-- Dropout1d/2d/3d (whole channels), AlphaDropout and
-- FeatureAlphaDropout (SELU's): Dropout's argument and printing.
local function dropout_variant(name, fn)
  local cls = L.Dropout:extend(name)
  function cls:forward(x) return fn(x, self.p, self.training) end
  L[name] = cls
end
dropout_variant("Dropout1d", F.dropout1d)
dropout_variant("Dropout2d", F.dropout2d)
dropout_variant("Dropout3d", F.dropout3d)
dropout_variant("AlphaDropout", F.alpha_dropout)
dropout_variant("FeatureAlphaDropout", F.feature_alpha_dropout)

L.Flatten = Module:extend("Flatten")
function L.Flatten:__init(start_dim, end_dim)
  if is_opts(start_dim) then start_dim, end_dim = start_dim.start_dim, start_dim.end_dim end
  self.start_dim, self.end_dim = start_dim or 1, end_dim or -1
end
function L.Flatten:forward(x)
  if not torch.is_tensor(x) then raise("Flatten: expected a tensor input, got " .. typename(x)) end
  return x:flatten(self.start_dim, self.end_dim)
end
function L.Flatten:extra_repr() return string.format("start_dim=%d, end_dim=%d", self.start_dim, self.end_dim) end

-- Unflatten(dim, unflattened_size): dim of the input viewed as the sizes
-- given (one of them may be -1).
L.Unflatten = Module:extend("Unflatten")
function L.Unflatten:__init(dim, unflattened_size)
  if type(dim) ~= "number" or dim % 1 ~= 0 then raise("Unflatten: expected dim to be an integer, got " .. tostring(dim)) end
  if type(unflattened_size) ~= "table" or #unflattened_size == 0 then
    raise("Unflatten: expected unflattened_size to be a non-empty table of integers")
  end
  self.dim, self.unflattened_size = dim, unflattened_size
end
function L.Unflatten:forward(x)
  if not torch.is_tensor(x) then raise("Unflatten: expected the input to be a tensor, got " .. typename(x)) end
  local shape, d = x:size(), self.dim < 0 and self.dim + x:dim() or self.dim
  if d < 0 or d >= #shape then
    raise(string.format("Unflatten: dim %d is out of range for an input of %d dims", self.dim, #shape))
  end
  local out = {}
  for i = 1, d do out[i] = shape[i] end
  for _, s in ipairs(self.unflattened_size) do out[#out + 1] = s end
  for i = d + 2, #shape do out[#out + 1] = shape[i] end
  return x:view(out)
end
function L.Unflatten:extra_repr()
  return string.format("dim=%d, unflattened_size=%s", self.dim, pyrepr(self.unflattened_size))
end

---------------------------------------------------------------- Linear

-- Linear(in_features, out_features [, bias=true] [, {bias=, dtype=, device=}]):
-- weight kaiming_uniform_(a=sqrt(5)), bias uniform(-1/sqrt(in), 1/sqrt(in)).
L.Linear = Module:extend("Linear")
function L.Linear:__init(in_features, out_features, bias, opts)
  if is_opts(bias) then bias, opts = bias.bias, bias end
  opts = check_opts(opts or {}, "Linear", { bias = true, dtype = true, device = true })
  if bias == nil then bias = true end
  want_int(in_features, "Linear", "in_features")
  want_int(out_features, "Linear", "out_features")
  self.in_features, self.out_features = in_features, out_features
  self.weight = Parameter(make("empty", { out_features, in_features }, opts))
  if bias then self.bias = Parameter(make("empty", { out_features }, opts))
  else self:register_parameter("bias", nil) end
  self:reset_parameters()
end
function L.Linear:reset_parameters()
  init.kaiming_uniform_(self.weight, { a = math.sqrt(5) })
  if self.bias ~= nil then
    local fan_in = init._calculate_fan_in_and_fan_out(self.weight)
    local bound = fan_in > 0 and 1 / math.sqrt(fan_in) or 0
    init.uniform_(self.bias, -bound, bound)
  end
end
function L.Linear:forward(x) return F.linear(x, self.weight, self.bias) end
function L.Linear:extra_repr()
  return string.format("in_features=%d, out_features=%d, bias=%s", self.in_features, self.out_features,
                       pyrepr(self.bias ~= nil))
end

---------------------------------------------------------------- Conv2d, MaxPool2d

-- Conv2d(in, out, kernel_size [, stride=1, padding=0, dilation=1, groups=1, bias=true])
-- or Conv2d(in, out, kernel_size, {stride=, padding=, dilation=, groups=, bias=, dtype=, device=}).
-- The channels of a convolution, checked and set on self (in_channels,
-- out_channels, groups); returns whether it has a bias (default true).
local function conv_channels(self, name, in_channels, out_channels, groups, bias)
  groups = groups or 1
  want_int(in_channels, name, "in_channels", 1)
  want_int(out_channels, name, "out_channels", 1)
  want_int(groups, name, "groups", 1)
  if in_channels % groups ~= 0 then raise(name .. ": in_channels must be divisible by groups") end
  if out_channels % groups ~= 0 then raise(name .. ": out_channels must be divisible by groups") end
  self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
  return bias ~= false
end

-- A size argument of an nd-dimensional layer (nd 1, 2 or 3) as an
-- nd-element table, as PyTorch keeps (and prints) it.
local function nd_tuple(nd, v, name, what)
  if nd == 2 then return F._pair(v, name, what) end
  if nd == 3 then return F._triple(v, name, what) end
  if type(v) == "table" and #v == 1 then v = v[1] end
  return { want_int(v, name, what, 0) }
end

-- Conv1d and Conv2d share their arguments and checks: nd is 1 or 2, and
-- kernel_size, stride, padding and dilation become nd-element tables.
local function conv_class(name, nd, conv)
  local cls = Module:extend(name)
  local function tuple(v, what) return nd_tuple(nd, v, name, what) end
  function cls:__init(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias)
    local opts = {}
    if is_opts(stride) then
      opts = check_opts(stride, name, { stride = true, padding = true, dilation = true, groups = true, bias = true,
                                        dtype = true, device = true })
      stride, padding, dilation, groups, bias = opts.stride, opts.padding, opts.dilation, opts.groups, opts.bias
    end
    bias = conv_channels(self, name, in_channels, out_channels, groups, bias)
    self.kernel_size = tuple(kernel_size, "kernel_size")
    self.stride = tuple(stride or 1, "stride")
    if padding == "same" or padding == "valid" then self.padding = padding
    else self.padding = tuple(padding or 0, "padding") end
    self.dilation = tuple(dilation or 1, "dilation")
    local shape = { out_channels, in_channels / self.groups }
    for _, k in ipairs(self.kernel_size) do shape[#shape + 1] = k end
    self.weight = Parameter(make("empty", shape, opts))
    if bias then self.bias = Parameter(make("empty", { out_channels }, opts))
    else self:register_parameter("bias", nil) end
    self:reset_parameters()
  end
  cls.reset_parameters = L.Linear.reset_parameters
  function cls:forward(x)
    return conv(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)
  end
  local function all(t, v)
    for _, x in ipairs(t) do if x ~= v then return false end end
    return true
  end
  function cls:extra_repr()
    local s = string.format("%d, %d, kernel_size=%s, stride=%s", self.in_channels, self.out_channels,
                            pyrepr(self.kernel_size), pyrepr(self.stride))
    local p = self.padding
    if type(p) == "string" then s = s .. ", padding=" .. p
    elseif not all(p, 0) then s = s .. ", padding=" .. pyrepr(p) end
    if not all(self.dilation, 1) then s = s .. ", dilation=" .. pyrepr(self.dilation) end
    if self.groups ~= 1 then s = s .. ", groups=" .. self.groups end
    if self.bias == nil then s = s .. ", bias=False" end
    return s
  end
  L[name] = cls
end
conv_class("Conv1d", 1, F.conv1d)
conv_class("Conv2d", 2, F.conv2d)
conv_class("Conv3d", 3, F.conv3d)

-- ConvTranspose1d / ConvTranspose2d(in, out, kernel_size [, stride=1,
-- padding=0, output_padding=0, groups=1, bias=true, dilation=1]) or with an
-- options table: weight (in, out/groups, kernel...), PyTorch's init.
local function conv_transpose_class(name, nd, conv)
  local cls = Module:extend(name)
  local function tuple(v, what) return nd_tuple(nd, v, name, what) end
  function cls:__init(in_channels, out_channels, kernel_size, stride, padding, output_padding, groups, bias, dilation)
    local opts = {}
    if is_opts(stride) then
      opts = check_opts(stride, name, { stride = true, padding = true, output_padding = true, groups = true,
                                        bias = true, dilation = true, dtype = true, device = true })
      stride, padding, output_padding, groups, bias, dilation =
        opts.stride, opts.padding, opts.output_padding, opts.groups, opts.bias, opts.dilation
    end
    bias = conv_channels(self, name, in_channels, out_channels, groups, bias)
    self.kernel_size = tuple(kernel_size, "kernel_size")
    self.stride = tuple(stride or 1, "stride")
    self.padding = tuple(padding or 0, "padding")
    self.output_padding = tuple(output_padding or 0, "output_padding")
    self.dilation = tuple(dilation or 1, "dilation")
    local shape = { in_channels, out_channels / self.groups }
    for _, k in ipairs(self.kernel_size) do shape[#shape + 1] = k end
    self.weight = Parameter(make("empty", shape, opts))
    if bias then self.bias = Parameter(make("empty", { out_channels }, opts))
    else self:register_parameter("bias", nil) end
    self:reset_parameters()
  end
  cls.reset_parameters = L.Linear.reset_parameters
  function cls:forward(x)
    return conv(x, self.weight, self.bias, self.stride, self.padding, self.output_padding, self.groups, self.dilation)
  end
  local function all(t, v)
    for _, x in ipairs(t) do if x ~= v then return false end end
    return true
  end
  function cls:extra_repr()
    local s = string.format("%d, %d, kernel_size=%s, stride=%s", self.in_channels, self.out_channels,
                            pyrepr(self.kernel_size), pyrepr(self.stride))
    if not all(self.padding, 0) then s = s .. ", padding=" .. pyrepr(self.padding) end
    if not all(self.output_padding, 0) then s = s .. ", output_padding=" .. pyrepr(self.output_padding) end
    if not all(self.dilation, 1) then s = s .. ", dilation=" .. pyrepr(self.dilation) end
    if self.groups ~= 1 then s = s .. ", groups=" .. self.groups end
    if self.bias == nil then s = s .. ", bias=False" end
    return s
  end
  L[name] = cls
end
conv_transpose_class("ConvTranspose1d", 1, F.conv_transpose1d)
conv_transpose_class("ConvTranspose2d", 2, F.conv_transpose2d)
conv_transpose_class("ConvTranspose3d", 3, F.conv_transpose3d)

-- MaxPool2d(kernel_size [, stride=kernel_size, padding=0, dilation=1,
-- return_indices=false, ceil_mode=false]) or MaxPool2d(kernel_size,
-- {stride=, padding=, dilation=, return_indices=, ceil_mode=}).
L.MaxPool2d = Module:extend("MaxPool2d")
function L.MaxPool2d:__init(kernel_size, stride, padding, dilation, return_indices, ceil_mode)
  if is_opts(stride) then
    local o = stride
    stride, padding, dilation, return_indices, ceil_mode = o.stride, o.padding, o.dilation, o.return_indices, o.ceil_mode
  end
  F._pair(kernel_size, "MaxPool2d", "kernel_size")
  self.kernel_size = kernel_size
  self.stride = stride or kernel_size
  self.padding = padding or 0
  self.dilation = dilation or 1
  self.return_indices = return_indices == true
  self.ceil_mode = ceil_mode == true
  F._pair(self.stride, "MaxPool2d", "stride")
  F._pair(self.padding, "MaxPool2d", "padding")
  F._pair(self.dilation, "MaxPool2d", "dilation")
end
function L.MaxPool2d:forward(x)
  return F.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode,
                      self.return_indices)
end
function L.MaxPool2d:extra_repr()
  return string.format("kernel_size=%s, stride=%s, padding=%s, dilation=%s, ceil_mode=%s",
                       pyrepr(self.kernel_size), pyrepr(self.stride), pyrepr(self.padding), pyrepr(self.dilation),
                       self.ceil_mode and "True" or "False")
end

-- AvgPool2d(kernel_size [, stride, padding, ceil_mode, count_include_pad,
-- divisor_override]) or with an options table after kernel_size.
-- (AvgPool3d shares it, its sizes checked as triples)
local function avg_pool_init(self, sizes, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
  if is_opts(stride) then
    local o = stride
    stride, padding, ceil_mode, count_include_pad, divisor_override =
      o.stride, o.padding, o.ceil_mode, o.count_include_pad, o.divisor_override
  end
  sizes(kernel_size, self.__name, "kernel_size")
  self.kernel_size, self.stride, self.padding = kernel_size, stride or kernel_size, padding or 0
  self.ceil_mode, self.count_include_pad = ceil_mode or false, count_include_pad ~= false
  self.divisor_override = divisor_override
end
L.AvgPool2d = Module:extend("AvgPool2d")
function L.AvgPool2d:__init(...) avg_pool_init(self, F._pair, ...) end
function L.AvgPool2d:forward(x)
  return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad,
                      self.divisor_override)
end
function L.AvgPool2d:extra_repr()
  return string.format("kernel_size=%s, stride=%s, padding=%s", pyrepr(self.kernel_size), pyrepr(self.stride),
                       pyrepr(self.padding))
end

-- AdaptiveAvgPool2d(output_size): an int, a pair, or a pair with nil
-- ({nil, 7}) keeping that dimension.
L.AdaptiveAvgPool2d = Module:extend("AdaptiveAvgPool2d")
function L.AdaptiveAvgPool2d:__init(output_size)
  if is_opts(output_size) and output_size.output_size ~= nil then output_size = output_size.output_size end
  self.output_size = output_size
end
function L.AdaptiveAvgPool2d:forward(x) return F.adaptive_avg_pool2d(x, self.output_size) end
function L.AdaptiveAvgPool2d:extra_repr() return "output_size=" .. pyrepr(self.output_size) end

-- AdaptiveMaxPool2d(output_size [, return_indices=false]) (or {output_size=,
-- return_indices=}).
L.AdaptiveMaxPool2d = Module:extend("AdaptiveMaxPool2d")
function L.AdaptiveMaxPool2d:__init(output_size, return_indices)
  if is_opts(output_size) and output_size.output_size ~= nil then
    output_size, return_indices = output_size.output_size, output_size.return_indices
  end
  self.output_size, self.return_indices = output_size, return_indices == true
end
function L.AdaptiveMaxPool2d:forward(x) return F.adaptive_max_pool2d(x, self.output_size, self.return_indices) end
L.AdaptiveMaxPool2d.extra_repr = L.AdaptiveAvgPool2d.extra_repr

-- MaxUnpool2d(kernel_size [, stride=kernel_size, padding=0]) or with
-- {stride=, padding=}; forward(input, indices [, output_size]).
-- an unpool's sizes kept as tuples (pairs, triples), as PyTorch keeps
-- (and prints) them
local function unpool_init(self, name, tuple, kernel_size, stride, padding)
  if is_opts(stride) then stride, padding = stride.stride, stride.padding end
  self.kernel_size = tuple(kernel_size, name, "kernel_size")
  self.stride = tuple(stride or kernel_size, name, "stride")
  self.padding = tuple(padding or 0, name, "padding")
end

L.MaxUnpool2d = Module:extend("MaxUnpool2d")
function L.MaxUnpool2d:__init(...) unpool_init(self, "MaxUnpool2d", F._pair, ...) end
function L.MaxUnpool2d:forward(x, indices, output_size)
  return F.max_unpool2d(x, indices, self.kernel_size, self.stride, self.padding, output_size)
end
function L.MaxUnpool2d:extra_repr()
  return string.format("kernel_size=%s, stride=%s, padding=%s", pyrepr(self.kernel_size), pyrepr(self.stride),
                       pyrepr(self.padding))
end

-- Unfold(kernel_size [, dilation=1, padding=0, stride=1]) and
-- Fold(output_size, kernel_size [, ...]) (or an options table after the
-- sizes) over F.unfold and F.fold.
L.Unfold = Module:extend("Unfold")
function L.Unfold:__init(kernel_size, dilation, padding, stride)
  if is_opts(dilation) then dilation, padding, stride = dilation.dilation, dilation.padding, dilation.stride end
  self.kernel_size, self.dilation, self.padding, self.stride = kernel_size, dilation or 1, padding or 0, stride or 1
end
function L.Unfold:forward(x) return F.unfold(x, self.kernel_size, self.dilation, self.padding, self.stride) end
function L.Unfold:extra_repr()
  return string.format("kernel_size=%s, dilation=%s, padding=%s, stride=%s", pyrepr(self.kernel_size),
                       pyrepr(self.dilation), pyrepr(self.padding), pyrepr(self.stride))
end

L.Fold = Module:extend("Fold")
function L.Fold:__init(output_size, ...)
  L.Unfold.__init(self, ...)
  self.output_size = output_size
end
function L.Fold:forward(x)
  return F.fold(x, self.output_size, self.kernel_size, self.dilation, self.padding, self.stride)
end
function L.Fold:extra_repr() return "output_size=" .. pyrepr(self.output_size) .. ", " .. L.Unfold.extra_repr(self) end

-- PixelShuffle(upscale_factor), PixelUnshuffle(downscale_factor).
L.PixelShuffle = Module:extend("PixelShuffle")
function L.PixelShuffle:__init(upscale_factor) self.upscale_factor = upscale_factor end
function L.PixelShuffle:forward(x) return F.pixel_shuffle(x, self.upscale_factor) end
function L.PixelShuffle:extra_repr() return "upscale_factor=" .. pyrepr(self.upscale_factor) end
L.PixelUnshuffle = Module:extend("PixelUnshuffle")
function L.PixelUnshuffle:__init(downscale_factor) self.downscale_factor = downscale_factor end
function L.PixelUnshuffle:forward(x) return F.pixel_unshuffle(x, self.downscale_factor) end
function L.PixelUnshuffle:extra_repr() return "downscale_factor=" .. pyrepr(self.downscale_factor) end

-- The 3-D pools: MaxPool3d, AvgPool3d, AdaptiveAvgPool3d and
-- AdaptiveMaxPool3d, with the 2-D ones' arguments (numbers or triples).
L.MaxPool3d = Module:extend("MaxPool3d")
function L.MaxPool3d:__init(kernel_size, stride, padding, dilation, return_indices, ceil_mode)
  if is_opts(stride) then
    local o = stride
    stride, padding, dilation, return_indices, ceil_mode = o.stride, o.padding, o.dilation, o.return_indices, o.ceil_mode
  end
  self.kernel_size, self.stride = kernel_size, stride or kernel_size
  self.padding, self.dilation = padding or 0, dilation or 1
  self.return_indices, self.ceil_mode = return_indices == true, ceil_mode == true
  for _, what in ipairs({ "kernel_size", "stride", "padding", "dilation" }) do F._triple(self[what], "MaxPool3d", what) end
end
function L.MaxPool3d:forward(x)
  return F.max_pool3d(x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode,
                      self.return_indices)
end
L.MaxPool3d.extra_repr = L.MaxPool2d.extra_repr

L.AvgPool3d = Module:extend("AvgPool3d")
function L.AvgPool3d:__init(...) avg_pool_init(self, F._triple, ...) end
function L.AvgPool3d:forward(x)
  return F.avg_pool3d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad,
                      self.divisor_override)
end
L.AvgPool3d.extra_repr = L.AvgPool2d.extra_repr

-- A pool of another dimension: the 2-D module's constructor and
-- printing, F's function of that dimension.
local function pool_variant(name, base, forward)
  local cls = Module:extend(name)
  function cls:__init(...) base.__init(self, ...) end
  cls.forward, cls.extra_repr = forward, base.extra_repr
  L[name] = cls
end
pool_variant("AdaptiveAvgPool3d", L.AdaptiveAvgPool2d, function(self, x) return F.adaptive_avg_pool3d(x, self.output_size) end)
pool_variant("AdaptiveMaxPool3d", L.AdaptiveMaxPool2d, function(self, x)
  return F.adaptive_max_pool3d(x, self.output_size, self.return_indices)
end)

-- The 1-D pools: MaxPool1d, AvgPool1d, AdaptiveAvgPool1d,
-- AdaptiveMaxPool1d and MaxUnpool1d, with the 2-D ones' arguments as
-- single numbers, over F's 1-D functions.
pool_variant("MaxPool1d", L.MaxPool2d, function(self, x)
  return F.max_pool1d(x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode,
                      self.return_indices)
end)
pool_variant("AvgPool1d", L.AvgPool2d, function(self, x)
  return F.avg_pool1d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad)
end)
pool_variant("AdaptiveAvgPool1d", L.AdaptiveAvgPool2d, function(self, x) return F.adaptive_avg_pool1d(x, self.output_size) end)
pool_variant("AdaptiveMaxPool1d", L.AdaptiveMaxPool2d, function(self, x)
  return F.adaptive_max_pool1d(x, self.output_size, self.return_indices)
end)

L.MaxUnpool1d = Module:extend("MaxUnpool1d")
function L.MaxUnpool1d:__init(kernel_size, stride, padding)
  if is_opts(stride) then stride, padding = stride.stride, stride.padding end
  local function single(v) return type(v) == "table" and v or { v } end
  self.kernel_size, self.stride = single(kernel_size), single(stride or kernel_size)
  self.padding = single(padding or 0)
end
function L.MaxUnpool1d:forward(x, indices, output_size)
  return F.max_unpool1d(x, indices, self.kernel_size, self.stride, self.padding, output_size)
end
L.MaxUnpool1d.extra_repr = L.MaxUnpool2d.extra_repr

-- FractionalMaxPool2d/3d(kernel_size [, output_size, output_ratio,
-- return_indices, _random_samples]) or with an options table after
-- kernel_size: F.fractional_max_pool2d/3d.
for nd = 2, 3 do
  local name = "FractionalMaxPool" .. nd .. "d"
  local cls = Module:extend(name)
  function cls:__init(kernel_size, output_size, output_ratio, return_indices, random_samples)
    if is_opts(output_size) then
      local o = output_size
      output_size, output_ratio, return_indices, random_samples = o.output_size, o.output_ratio, o.return_indices,
                                                                 o._random_samples
    end
    if output_size == nil and output_ratio == nil then
      raise(name .. ": FractionalMaxPool" .. nd .. "d requires specifying either an output size, or a pooling ratio")
    end
    self.kernel_size, self.output_size, self.output_ratio = kernel_size, output_size, output_ratio
    self.return_indices, self._random_samples = return_indices == true, random_samples
  end
  function cls:forward(x)
    return F["fractional_max_pool" .. nd .. "d"](x, self.kernel_size, { output_size = self.output_size,
      output_ratio = self.output_ratio, return_indices = self.return_indices, _random_samples = self._random_samples })
  end
  L[name] = cls
end

-- MaxUnpool3d(kernel_size [, stride=kernel_size, padding=0]): numbers or
-- triples, kept as triples
L.MaxUnpool3d = Module:extend("MaxUnpool3d")
function L.MaxUnpool3d:__init(...) unpool_init(self, "MaxUnpool3d", F._triple, ...) end
function L.MaxUnpool3d:forward(x, indices, output_size)
  return F.max_unpool3d(x, indices, self.kernel_size, self.stride, self.padding, output_size)
end
L.MaxUnpool3d.extra_repr = L.MaxUnpool2d.extra_repr

---------------------------------------------------------------- BatchNorm

-- BatchNorm1d / BatchNorm2d / BatchNorm3d(num_features [, eps=1e-5,
-- momentum=0.1, affine=true, track_running_stats=true]) or with an options
-- table: F.batch_norm with the running statistics as buffers (running_mean,
-- running_var, num_batches_tracked), batch statistics in training mode and
-- the running ones in eval mode. momentum = false (PyTorch's None) keeps
-- a cumulative average instead.
local function batch_norm_class(name, dims_ok, expected)
  local cls = Module:extend(name)
  function cls:__init(num_features, eps, momentum, affine, track_running_stats, process_group)
    local opts = {}
    if is_opts(eps) then
      opts = check_opts(eps, name, { eps = true, momentum = true, affine = true, track_running_stats = true,
                                     dtype = true, device = true, process_group = name == "SyncBatchNorm" })
      eps, momentum, affine, track_running_stats = opts.eps, opts.momentum, opts.affine, opts.track_running_stats
      process_group = opts.process_group
    end
    if name == "SyncBatchNorm" then self.process_group = process_group end
    self.num_features = want_int(num_features, name, "num_features", 1)
    self.eps = eps or 1e-5
    if momentum == nil then momentum = 0.1 end
    self.momentum = momentum
    self.affine = affine ~= false
    self.track_running_stats = track_running_stats ~= false
    local shape = { self.num_features }
    if self.affine then
      self.weight = Parameter(make("ones", shape, opts))
      self.bias = Parameter(make("zeros", shape, opts))
    else
      self:register_parameter("weight", nil)
      self:register_parameter("bias", nil)
    end
    if self.track_running_stats then
      self:register_buffer("running_mean", make("zeros", shape, opts))
      self:register_buffer("running_var", make("ones", shape, opts))
      self:register_buffer("num_batches_tracked", torch.zeros({}, { dtype = torch.int64 }))
    end
  end
  function cls:reset_running_stats()
    if self.track_running_stats then
      torch.no_grad(function()
        self.running_mean:zero_()
        self.running_var:fill_(1)
        self.num_batches_tracked:zero_()
      end)
    end
  end
  -- the factor by which this step moves the running statistics
  function cls:_momentum_factor()
    local factor = self.momentum or 0
    if self.training and self.track_running_stats then
      self.num_batches_tracked:add_(1)
      if not self.momentum then factor = 1 / self.num_batches_tracked:item() end
    end
    return factor
  end
  function cls:forward(x)
    if not torch.is_tensor(x) or not dims_ok(x:dim()) then
      raise(string.format("%s: expected %s input (got %s)", name, expected,
                          torch.is_tensor(x) and (x:dim() .. "D") or type(x)))
    end
    local factor = self:_momentum_factor()
    -- without running statistics (nil) F.batch_norm uses the batch's, in eval mode too
    return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, self.training, factor,
                        self.eps)
  end
  function cls:extra_repr()
    return string.format("%d, eps=%s, momentum=%s, affine=%s, track_running_stats=%s", self.num_features,
                         pyfloat(self.eps), self.momentum and pyfloat(self.momentum) or "None",
                         self.affine and "True" or "False", self.track_running_stats and "True" or "False")
  end
  L[name] = cls
  return cls
end
batch_norm_class("BatchNorm1d", function(d) return d == 2 or d == 3 end, "2D or 3D")
batch_norm_class("BatchNorm2d", function(d) return d == 4 end, "4D")
batch_norm_class("BatchNorm3d", function(d) return d == 5 end, "5D")

-- SyncBatchNorm(num_features [, eps=1e-5, momentum=0.1, affine=true,
-- track_running_stats=true, process_group]) or with an options table:
-- BatchNorm over the batch of every rank of the process group (the
-- default one when nil), for inputs of 2 or more dims. In training, each
-- rank's per-channel sum, sum of squares and count are summed across the
-- group by torch.distributed.nn.functional.all_reduce, whose backward
-- sums the gradients of those statistics the same way; the result, the
-- gradients and the running statistics are those of BatchNorm on the
-- concatenated batch. In eval mode, or with one rank, or without an
-- initialised process group, it is BatchNorm on the rank's own input.
local SyncBatchNorm = batch_norm_class("SyncBatchNorm", function(d) return d >= 2 end, "at least 2D")

function SyncBatchNorm:forward(x)
  if not torch.is_tensor(x) or x:dim() < 2 then
    raise(string.format("SyncBatchNorm: expected at least 2D input (got %s)",
                        torch.is_tensor(x) and (x:dim() .. "D") or type(x)))
  end
  local C = x:size(1)
  local numel = self.num_features
  if C ~= numel then
    raise(string.format("SyncBatchNorm: expected %d channels (dim 1) in the input, got %d", numel, C))
  end
  local dist = require("dplua.distributed")
  local group = self.process_group
  if not self.training or not dist.is_initialized() or dist.get_world_size(group) == 1 then
    local factor = self:_momentum_factor()
    return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, self.training, factor,
                        self.eps)
  end
  if group == dist.GroupMember.NON_GROUP_MEMBER then
    raise("SyncBatchNorm: this rank is not a member of its process_group")
  end
  local factor = self:_momentum_factor()
  local dims, shape = { 0 }, { 1, C }
  for d = 2, x:dim() - 1 do dims[#dims + 1] = d; shape[#shape + 1] = 1 end
  local count = torch.full({ 1 }, x:numel() / C, { dtype = x.dtype, device = x.device })
  local stats = dist.nn.functional.all_reduce(torch.cat({ x:sum(dims), (x * x):sum(dims), count }, 0), nil, group)
  local n = stats:narrow(0, 2 * C, 1)
  local mean = stats:narrow(0, 0, C) / n
  -- biased, as normalization uses; (E[x^2] - mean^2 may round below 0)
  local var = (stats:narrow(0, C, C) / n - mean * mean):clamp_min(0)
  if self.track_running_stats then
    local total = n:item()
    if total <= 1 then
      raise(string.format("SyncBatchNorm: Expected more than 1 value per channel when training, got %d over the " ..
                          "process group", total))
    end
    torch.no_grad(function()
      self.running_mean:mul_(1 - factor):add_(mean:detach(), factor)
      self.running_var:mul_(1 - factor):add_(var:detach() * (total / (total - 1)), factor)
    end)
  end
  local out = (x - mean:reshape(shape)) * (var + self.eps):rsqrt():reshape(shape)
  if self.weight ~= nil then out = out * self.weight:reshape(shape) end
  if self.bias ~= nil then out = out + self.bias:reshape(shape) end
  return out
end

-- SyncBatchNorm.convert_sync_batchnorm(module [, process_group]): module
-- with every BatchNorm1d/2d/3d in it replaced by a SyncBatchNorm that shares
-- its parameters and running statistics (module itself when it is one,
-- replaced: use the result, as in PyTorch).
function SyncBatchNorm.convert_sync_batchnorm(m, process_group)
  if not module.is_module(m) then
    raise("convert_sync_batchnorm: expected an nn.Module, got " .. typename(m))
  end
  local out = m
  if module.isinstance(m, L.BatchNorm1d) or module.isinstance(m, L.BatchNorm2d) or module.isinstance(m, L.BatchNorm3d) then
    out = SyncBatchNorm(m.num_features, { eps = m.eps, momentum = m.momentum, affine = m.affine,
                                          track_running_stats = m.track_running_stats,
                                          process_group = process_group })
    if m.affine then
      out.weight, out.bias = m.weight, m.bias
    end
    if m.track_running_stats then
      out.running_mean, out.running_var = m.running_mean, m.running_var
      out.num_batches_tracked = m.num_batches_tracked
    end
    out.training = m.training
  end
  for name, child in m:named_children() do
    out:add_module(name, SyncBatchNorm.convert_sync_batchnorm(child, process_group))
  end
  return out
end

---------------------------------------------------------------- Embedding, LayerNorm

-- Embedding(num_embeddings, embedding_dim [, {padding_idx=, dtype=, device=}]):
-- weight normal_(0, 1), the padding row zeroed.
L.Embedding = Module:extend("Embedding")
function L.Embedding:__init(num_embeddings, embedding_dim, opts)
  if type(opts) == "number" then opts = { padding_idx = opts } end
  opts = check_opts(opts or {}, "Embedding", { padding_idx = true, dtype = true, device = true })
  want_int(num_embeddings, "Embedding", "num_embeddings")
  want_int(embedding_dim, "Embedding", "embedding_dim")
  self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
  local pad = opts.padding_idx
  if pad ~= nil then
    if pad >= num_embeddings or pad < -num_embeddings then raise("Embedding: padding_idx must be within num_embeddings") end
    if pad < 0 then pad = pad + num_embeddings end
  end
  self.padding_idx = pad
  self.weight = Parameter(make("empty", { num_embeddings, embedding_dim }, opts))
  self:reset_parameters()
end
function L.Embedding:reset_parameters()
  init.normal_(self.weight)
  if self.padding_idx ~= nil then
    local w = self.weight
    torch.no_grad(function() w[self.padding_idx]:fill_(0) end)
  end
end
function L.Embedding:forward(x) return F.embedding(x, self.weight, self.padding_idx) end
function L.Embedding:extra_repr()
  local s = string.format("%d, %d", self.num_embeddings, self.embedding_dim)
  if self.padding_idx ~= nil then s = s .. ", padding_idx=" .. self.padding_idx end
  return s
end

-- LayerNorm(normalized_shape [, eps=1e-5] [, elementwise_affine=true]) or
-- LayerNorm(normalized_shape, {eps=, elementwise_affine=, bias=, dtype=, device=}).
L.LayerNorm = Module:extend("LayerNorm")
function L.LayerNorm:__init(normalized_shape, eps, elementwise_affine)
  local opts = {}
  if is_opts(eps) then
    opts = check_opts(eps, "LayerNorm", { eps = true, elementwise_affine = true, bias = true, dtype = true, device = true })
    eps, elementwise_affine = opts.eps, opts.elementwise_affine
  end
  if type(normalized_shape) == "number" then normalized_shape = { normalized_shape } end
  if type(normalized_shape) ~= "table" or #normalized_shape == 0 then
    raise("LayerNorm: expected normalized_shape to be an integer or a table of integers")
  end
  local shape = {}
  for i, s in ipairs(normalized_shape) do shape[i] = want_int(s, "LayerNorm", "normalized_shape", 1) end
  self.normalized_shape = shape
  self.eps = eps or 1e-5
  if elementwise_affine == nil then elementwise_affine = true end
  self.elementwise_affine = elementwise_affine
  if elementwise_affine then
    self.weight = Parameter(make("ones", shape, opts))
    if opts.bias ~= false then self.bias = Parameter(make("zeros", shape, opts))
    else self:register_parameter("bias", nil) end
  else
    self:register_parameter("weight", nil)
    self:register_parameter("bias", nil)
  end
end
function L.LayerNorm:forward(x)
  return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
end
function L.LayerNorm:extra_repr()
  return string.format("%s, eps=%s, elementwise_affine=%s", pyrepr(self.normalized_shape), pyfloat(self.eps),
                       pyrepr(self.elementwise_affine))
end

-- RMSNorm(normalized_shape [, eps, elementwise_affine=true]) or with
-- {eps=, elementwise_affine=, dtype=, device=}: F.rms_norm with a weight
-- of ones; eps nil is the dtype's machine epsilon, as PyTorch's.
L.RMSNorm = Module:extend("RMSNorm")
function L.RMSNorm:__init(normalized_shape, eps, elementwise_affine)
  local opts = {}
  if is_opts(eps) then
    opts = check_opts(eps, "RMSNorm", { eps = true, elementwise_affine = true, dtype = true, device = true })
    eps, elementwise_affine = opts.eps, opts.elementwise_affine
  end
  if type(normalized_shape) == "number" then normalized_shape = { normalized_shape } end
  if type(normalized_shape) ~= "table" or torch.is_tensor(normalized_shape) then
    raise("RMSNorm: expected normalized_shape to be an integer or a list of them, got " .. typename(normalized_shape))
  end
  local shape = {}
  for i, v in ipairs(normalized_shape) do shape[i] = want_int(v, "RMSNorm", "normalized_shape", 1) end
  self.normalized_shape, self.eps = shape, eps
  self.elementwise_affine = elementwise_affine ~= false
  if self.elementwise_affine then self.weight = Parameter(make("ones", shape, opts))
  else self:register_parameter("weight", nil) end
end
function L.RMSNorm:forward(x) return F.rms_norm(x, self.normalized_shape, self.weight, self.eps) end
function L.RMSNorm:extra_repr()
  return string.format("%s, eps=%s, elementwise_affine=%s", pyrepr(self.normalized_shape),
                       self.eps == nil and "None" or pyfloat(self.eps), pyrepr(self.elementwise_affine))
end

-- InstanceNorm1d/2d/3d(num_features [, eps=1e-5, momentum=0.1,
-- affine=false, track_running_stats=false]) or with an options table:
-- F.instance_norm, running statistics as buffers when tracked (used in
-- eval mode), an unbatched input (C, *) taken as a batch of one.
local function instance_norm_class(name, spatial)
  local cls = Module:extend(name)
  function cls:__init(num_features, eps, momentum, affine, track_running_stats)
    local opts = {}
    if is_opts(eps) then
      opts = check_opts(eps, name, { eps = true, momentum = true, affine = true, track_running_stats = true,
                                     dtype = true, device = true })
      eps, momentum, affine, track_running_stats = opts.eps, opts.momentum, opts.affine, opts.track_running_stats
    end
    self.num_features = want_int(num_features, name, "num_features", 1)
    self.eps, self.momentum = eps or 1e-5, momentum or 0.1
    self.affine, self.track_running_stats = affine == true, track_running_stats == true
    if self.affine then
      self.weight = Parameter(make("ones", { num_features }, opts))
      self.bias = Parameter(make("zeros", { num_features }, opts))
    else
      self:register_parameter("weight", nil)
      self:register_parameter("bias", nil)
    end
    if self.track_running_stats then
      self:register_buffer("running_mean", make("zeros", { num_features }, opts))
      self:register_buffer("running_var", make("ones", { num_features }, opts))
      self:register_buffer("num_batches_tracked", torch.zeros({}, { dtype = torch.int64, device = opts.device }))
    else
      self:register_buffer("running_mean", nil)
      self:register_buffer("running_var", nil)
      self:register_buffer("num_batches_tracked", nil)
    end
  end
  function cls:forward(x)
    if not torch.is_tensor(x) then raise(name .. ": expected a tensor input, got " .. typename(x)) end
    if x:dim() ~= spatial + 1 and x:dim() ~= spatial + 2 then
      raise(string.format("%s: expected a %d-D or %d-D input, got %d-D input", name, spatial + 1, spatial + 2, x:dim()))
    end
    local batched = x:dim() == spatial + 2
    if not batched then x = x:unsqueeze(0) end
    if x:size(1) ~= self.num_features and self.affine then
      raise(string.format("%s: expected input with %d channels, got %d", name, self.num_features, x:size(1)))
    end
    local use_input_stats = self.training or not self.track_running_stats
    if self.training and self.track_running_stats then
      torch.no_grad(function() self.num_batches_tracked:add_(1) end)
    end
    local y = F.instance_norm(x, { running_mean = self.running_mean, running_var = self.running_var, weight = self.weight,
                                   bias = self.bias, use_input_stats = use_input_stats, momentum = self.momentum,
                                   eps = self.eps })
    return batched and y or y:squeeze(0)
  end
  function cls:extra_repr()
    return string.format("%d, eps=%s, momentum=%s, affine=%s, track_running_stats=%s", self.num_features,
                         pyfloat(self.eps), pyfloat(self.momentum), pyrepr(self.affine), pyrepr(self.track_running_stats))
  end
  L[name] = cls
end
instance_norm_class("InstanceNorm1d", 1)
instance_norm_class("InstanceNorm2d", 2)
instance_norm_class("InstanceNorm3d", 3)

-- LocalResponseNorm(size [, alpha=1e-4, beta=0.75, k=1]).
L.LocalResponseNorm = Module:extend("LocalResponseNorm")
function L.LocalResponseNorm:__init(size, alpha, beta, k)
  if is_opts(alpha) then alpha, beta, k = alpha.alpha, alpha.beta, alpha.k end
  self.size = want_int(size, "LocalResponseNorm", "size", 1)
  self.alpha, self.beta, self.k = alpha or 1e-4, beta or 0.75, k or 1.0
end
function L.LocalResponseNorm:forward(x) return F.local_response_norm(x, self.size, self.alpha, self.beta, self.k) end
function L.LocalResponseNorm:extra_repr()
  return string.format("%d, alpha=%s, beta=%s, k=%s", self.size, pyfloat(self.alpha), pyfloat(self.beta), pyfloat(self.k))
end

-- Bilinear(in1_features, in2_features, out_features [, bias=true]) (or an
-- options table): weight (out, in1, in2) and bias uniform in
-- +-1/sqrt(in1), as PyTorch.
L.Bilinear = Module:extend("Bilinear")
function L.Bilinear:__init(in1, in2, out, bias)
  local opts = {}
  if is_opts(bias) then
    opts = check_opts(bias, "Bilinear", { bias = true, dtype = true, device = true })
    bias = opts.bias
  end
  self.in1_features = want_int(in1, "Bilinear", "in1_features", 1)
  self.in2_features = want_int(in2, "Bilinear", "in2_features", 1)
  self.out_features = want_int(out, "Bilinear", "out_features", 1)
  self.weight = Parameter(make("empty", { out, in1, in2 }, opts))
  if bias ~= false then self.bias = Parameter(make("empty", { out }, opts))
  else self:register_parameter("bias", nil) end
  local bound = 1 / math.sqrt(in1)
  init.uniform_(self.weight, -bound, bound)
  if self.bias ~= nil then init.uniform_(self.bias, -bound, bound) end
end
function L.Bilinear:forward(x1, x2) return F.bilinear(x1, x2, self.weight, self.bias) end
function L.Bilinear:extra_repr()
  return string.format("in1_features=%d, in2_features=%d, out_features=%d, bias=%s", self.in1_features,
                       self.in2_features, self.out_features, pyrepr(self.bias ~= nil))
end

-- EmbeddingBag(num_embeddings, embedding_dim [, {mode="mean",
-- padding_idx=, include_last_offset=false, dtype=, device=}]):
-- forward(input [, offsets, per_sample_weights]) through F.embedding_bag.
L.EmbeddingBag = Module:extend("EmbeddingBag")
function L.EmbeddingBag:__init(num_embeddings, embedding_dim, opts)
  opts = check_opts(opts or {}, "EmbeddingBag", { mode = true, padding_idx = true, include_last_offset = true,
                                                  dtype = true, device = true })
  self.num_embeddings = want_int(num_embeddings, "EmbeddingBag", "num_embeddings", 1)
  self.embedding_dim = want_int(embedding_dim, "EmbeddingBag", "embedding_dim", 1)
  self.mode, self.padding_idx = opts.mode or "mean", opts.padding_idx
  self.include_last_offset = opts.include_last_offset == true
  self.weight = Parameter(make("empty", { num_embeddings, embedding_dim }, opts))
  init.normal_(self.weight)
  if self.padding_idx ~= nil then
    local w = self.weight
    torch.no_grad(function() w[self.padding_idx]:fill_(0) end)
  end
end
function L.EmbeddingBag:forward(input, offsets, per_sample_weights)
  return F.embedding_bag(input, self.weight, offsets, { mode = self.mode, padding_idx = self.padding_idx,
                                                         include_last_offset = self.include_last_offset,
                                                         per_sample_weights = per_sample_weights })
end
function L.EmbeddingBag:extra_repr()
  return string.format("%d, %d, mode='%s'", self.num_embeddings, self.embedding_dim, self.mode)
end

-- CosineSimilarity([dim=1, eps=1e-8]) and PairwiseDistance([p=2, eps=1e-6,
-- keepdim=false]), or with an options table: their F.* forms of (x1, x2).
L.CosineSimilarity = Module:extend("CosineSimilarity")
function L.CosineSimilarity:__init(dim, eps)
  if is_opts(dim) then dim, eps = dim.dim, dim.eps end
  self.dim, self.eps = dim or 1, eps or 1e-8
end
function L.CosineSimilarity:forward(x1, x2) return F.cosine_similarity(x1, x2, self.dim, self.eps) end
L.PairwiseDistance = Module:extend("PairwiseDistance")
function L.PairwiseDistance:__init(p, eps, keepdim)
  if is_opts(p) then p, eps, keepdim = p.p, p.eps, p.keepdim end
  self.norm, self.eps, self.keepdim = p or 2, eps or 1e-6, keepdim == true
end
function L.PairwiseDistance:forward(x1, x2) return F.pairwise_distance(x1, x2, self.norm, self.eps, self.keepdim) end

-- Upsample([size, scale_factor, mode="nearest", align_corners]) or
-- Upsample({size=, scale_factor=, mode=, align_corners=}): F.interpolate.
L.Upsample = Module:extend("Upsample")
function L.Upsample:__init(size, scale_factor, mode, align_corners)
  if type(size) == "table" and size[1] == nil then
    local o = size
    size, scale_factor, mode, align_corners = o.size, o.scale_factor, o.mode, o.align_corners
  end
  self.size, self.scale_factor, self.mode, self.align_corners = size, scale_factor, mode or "nearest", align_corners
end
function L.Upsample:forward(x)
  return F.interpolate(x, { size = self.size, scale_factor = self.scale_factor, mode = self.mode,
                            align_corners = self.align_corners })
end

-- UpsamplingNearest2d([size, scale_factor]) and UpsamplingBilinear2d
-- (align_corners = true, as PyTorch's): Upsample with the mode fixed.
L.UpsamplingNearest2d = L.Upsample:extend("UpsamplingNearest2d")
function L.UpsamplingNearest2d:__init(size, scale_factor)
  if type(size) == "table" and size[1] == nil then size, scale_factor = size.size, size.scale_factor end
  L.Upsample.__init(self, size, scale_factor, "nearest")
end
L.UpsamplingBilinear2d = L.Upsample:extend("UpsamplingBilinear2d")
function L.UpsamplingBilinear2d:__init(size, scale_factor)
  if type(size) == "table" and size[1] == nil then size, scale_factor = size.size, size.scale_factor end
  L.Upsample.__init(self, size, scale_factor, "bilinear", true)
end

-- LPPool1d / LPPool2d(norm_type, kernel_size [, stride, ceil_mode=false]).
local function lp_pool_class(name, fn)
  local cls = Module:extend(name)
  function cls:__init(norm_type, kernel_size, stride, ceil_mode)
    if is_opts(stride) then stride, ceil_mode = stride.stride, stride.ceil_mode end
    self.norm_type, self.kernel_size, self.stride, self.ceil_mode = norm_type, kernel_size, stride, ceil_mode == true
  end
  function cls:forward(x) return fn(x, self.norm_type, self.kernel_size, self.stride, self.ceil_mode) end
  function cls:extra_repr()
    return string.format("norm_type=%s, kernel_size=%s, stride=%s, ceil_mode=%s", pyrepr(self.norm_type),
                         pyrepr(self.kernel_size), self.stride == nil and "None" or pyrepr(self.stride),
                         pyrepr(self.ceil_mode))
  end
  L[name] = cls
end
lp_pool_class("LPPool1d", F.lp_pool1d)
lp_pool_class("LPPool2d", F.lp_pool2d)

-- GroupNorm(num_groups, num_channels [, eps=1e-5, affine=true]) or with an
-- options table {eps=, affine=, dtype=, device=}: F.group_norm with a
-- per-channel weight (ones) and bias (zeros) when affine.
L.GroupNorm = Module:extend("GroupNorm")
function L.GroupNorm:__init(num_groups, num_channels, eps, affine)
  local opts = {}
  if is_opts(eps) then
    opts = check_opts(eps, "GroupNorm", { eps = true, affine = true, dtype = true, device = true })
    eps, affine = opts.eps, opts.affine
  end
  self.num_groups = want_int(num_groups, "GroupNorm", "num_groups", 1)
  self.num_channels = want_int(num_channels, "GroupNorm", "num_channels", 1)
  if num_channels % num_groups ~= 0 then raise("GroupNorm: num_channels must be divisible by num_groups") end
  self.eps = eps or 1e-5
  self.affine = affine ~= false
  if self.affine then
    self.weight = Parameter(make("ones", { num_channels }, opts))
    self.bias = Parameter(make("zeros", { num_channels }, opts))
  else
    self:register_parameter("weight", nil)
    self:register_parameter("bias", nil)
  end
end
function L.GroupNorm:forward(x) return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps) end
function L.GroupNorm:extra_repr()
  return string.format("%d, %d, eps=%s, affine=%s", self.num_groups, self.num_channels, pyfloat(self.eps),
                       pyrepr(self.affine))
end

-- The padding modules over F.pad, as PyTorch's: ZeroPad1d/2d/3d,
-- ConstantPad1d/2d/3d(padding, value), ReflectionPad1d/2d/3d,
-- ReplicationPad1d/2d/3d and CircularPad1d/2d/3d(padding). padding is an
-- integer (every side) or 2, 4 or 6 sides (left, right, top, bottom,
-- front, back).
local function pad_module(name, nd, mode, takes_value)
  local cls = Module:extend(name)
  function cls:__init(padding, value)
    if type(padding) == "number" then
      if padding % 1 ~= 0 then raise(name .. ": expected padding to be an integer, got " .. padding) end
      local p = {}
      for i = 1, 2 * nd do p[i] = padding end
      padding = p
    elseif type(padding) ~= "table" or #padding ~= 2 * nd then
      raise(string.format("%s: expected padding to be an integer or %d integers, got %s", name, 2 * nd,
                          type(padding) == "table" and #padding .. " of them" or type(padding)))
    end
    self.padding = padding
    if takes_value then
      if type(value) ~= "number" then raise(name .. ": expected value to be a number, got " .. type(value)) end
      self.value = value
    elseif mode == "constant" then
      self.value = 0
    end
  end
  function cls:forward(x) return F.pad(x, self.padding, mode, self.value) end
  function cls:extra_repr()
    if takes_value then return string.format("padding=%s, value=%s", pyrepr(self.padding), pyfloat(self.value)) end
    return pyrepr(self.padding)
  end
  L[name] = cls
end
for nd = 1, 3 do
  pad_module("ZeroPad" .. nd .. "d", nd, "constant", false)
  pad_module("ConstantPad" .. nd .. "d", nd, "constant", true)
  pad_module("ReflectionPad" .. nd .. "d", nd, "reflect", false)
  pad_module("ReplicationPad" .. nd .. "d", nd, "replicate", false)
  pad_module("CircularPad" .. nd .. "d", nd, "circular", false)
end

---------------------------------------------------------------- containers

-- Sequential(m1, m2, ...) or Sequential({m1, m2, ...}): children named
-- "0", "1", ...; seq[i] is the i-th child, 0-based like PyTorch (negative
-- counts from the end); seq:len() is the number of children.
L.Sequential = Module:extend("Sequential")
function L.Sequential:__init(...)
  local list = { ... }
  if select("#", ...) == 1 and type(list[1]) == "table" and not module.is_module(list[1]) then list = list[1] end
  for i, m in ipairs(list) do
    if not module.is_module(m) then
      raise(string.format("Sequential: expected a Module at position %d, got %s", i, type(m)))
    end
    self:add_module(tostring(i - 1), m)
  end
end
local function container_index(self, i, fn)
  local n = #self._modules.keys
  if i < 0 then i = i + n end
  if i < 0 or i >= n or i % 1 ~= 0 then
    raise(string.format("%s: index %s is out of range (expected 0..%d)", fn, tostring(i), n - 1))
  end
  return self._modules.keys[i + 1]
end
function L.Sequential:__getitem(i) return self._modules.map[container_index(self, i, self:_get_name())] end
function L.Sequential:len() return #self._modules.keys end
L.Sequential.__iterable = true
function L.Sequential:append(m)
  self:add_module(tostring(#self._modules.keys), m)
  return self
end
-- A Linear whose output goes straight into a ReLU or a GELU becomes one
-- fused op (torch._linear_act: one node, and on a GPU the activation in the
-- product's epilogue, one kernel less), unless either module's forward was
-- replaced. Under autocast its inputs are cast as F.linear casts them and
-- the activation runs in bfloat16, as it does after F.linear.
-- fused_act says which activation, or nil.
local function class_of(m) return rawget(getmetatable(m), "__class") end
local autocast_on, AC = false, nil   -- kept by dplua.autocast, as F's is: no call per layer
require("dplua.autocast").watch(function(on, m) autocast_on, AC = on, m end)
local function fused_act(lin, act, x)
  if class_of(lin) ~= L.Linear or not torch.is_tensor(x) or rawget(lin._attrs, "forward") ~= nil
     or rawget(act._attrs, "forward") ~= nil then
    return nil
  end
  local c = class_of(act)
  if c == L.ReLU then return "relu" end
  if c == L.GELU then return act.approximate == "tanh" and "gelu_tanh" or "gelu" end
  return nil
end

function L.Sequential:forward(x, ...)
  local keys, map = self._modules.keys, self._modules.map
  local n = #keys
  local i = 1
  if n > 0 and select("#", ...) > 0 then   -- extra arguments go to the first module only
    x = map[keys[1]](x, ...)
    i = 2
  end
  while i <= n do
    local m = map[keys[i]]
    local act = i < n and map[keys[i + 1]] or nil
    local fused = act ~= nil and fused_act(m, act, x)
    if fused then
      F._check_linear(x, m.weight, m.bias)
      local w, b = m.weight, m.bias
      if autocast_on then x, w, b = AC.cast_inputs(x, w, b) end
      x = torch._linear_act(x, w, b, fused)
      i = i + 2
    else
      x = m(x)
      i = i + 1
    end
  end
  return x
end

-- ModuleList({m1, m2}): a list of children without a forward.
L.ModuleList = Module:extend("ModuleList")
function L.ModuleList:__init(list)
  if list ~= nil and (type(list) ~= "table" or module.is_module(list)) then
    raise("ModuleList: expected a list of modules, got " .. typename(list))
  end
  for _, m in ipairs(list or {}) do self:append(m) end
end
L.ModuleList.__getitem = L.Sequential.__getitem
L.ModuleList.len = L.Sequential.len
L.ModuleList.__iterable = true
function L.ModuleList:append(m)
  if not module.is_module(m) then raise("ModuleList: append expects a Module, got " .. type(m)) end
  self:add_module(tostring(#self._modules.keys), m)
  return self
end
function L.ModuleList:forward() raise("ModuleList has no forward: iterate over its children instead") end

-- ModuleDict({name = m, ...}) or ModuleDict({{name, m}, ...}): children by
-- name, without a forward: d.name, d["name"], d:keys(), d:values(),
-- d:items(), d:len(), d:contains(name), d:update(...). A table's names are
-- taken sorted (a Lua table keeps no order), a list of pairs in its order.
L.ModuleDict = Module:extend("ModuleDict")
function L.ModuleDict:__init(modules)
  if modules ~= nil then self:update(modules) end
end
function L.ModuleDict:update(modules)
  local fn = "ModuleDict.update"
  if type(modules) ~= "table" or module.is_module(modules) then
    raise(fn .. ": expected a table of name = module or a list of {name, module} pairs, got " .. typename(modules))
  end
  local pairs_list = {}
  if modules[1] ~= nil then
    for i, p in ipairs(modules) do
      if type(p) ~= "table" or #p ~= 2 then raise(string.format("%s: entry %d is not a {name, module} pair", fn, i)) end
      pairs_list[i] = p
    end
  else
    local names = {}
    for k in pairs(modules) do
      if type(k) ~= "string" then raise(fn .. ": module names must be strings, got " .. type(k)) end
      names[#names + 1] = k
    end
    table.sort(names)
    for i, k in ipairs(names) do pairs_list[i] = { k, modules[k] } end
  end
  for _, p in ipairs(pairs_list) do
    if not module.is_module(p[2]) then raise(string.format("%s: '%s' is a %s, not a Module", fn, tostring(p[1]), typename(p[2]))) end
    self:add_module(p[1], p[2])
  end
  return self
end
function L.ModuleDict:keys()
  local out = {}
  for i, k in ipairs(self._modules.keys) do out[i] = k end
  return out
end
function L.ModuleDict:values()
  local out = {}
  for i, k in ipairs(self._modules.keys) do out[i] = self._modules.map[k] end
  return out
end
function L.ModuleDict:items()
  local out = {}
  for i, k in ipairs(self._modules.keys) do out[i] = { k, self._modules.map[k] } end
  return out
end
L.ModuleDict.len = L.Sequential.len
function L.ModuleDict:contains(name) return self._modules.map[name] ~= nil end
function L.ModuleDict:forward() raise("ModuleDict has no forward: call its modules by name instead") end

---------------------------------------------------------------- lazy modules

-- LazyLinear(out_features [, opts]), LazyConv1d/2d/3d(out_channels,
-- kernel_size [, ...]), LazyConvTranspose1d/2d/3d, LazyBatchNorm1d/2d/3d([eps,
-- ...]): the base module's arguments without the first, which the first
-- input gives (Linear: its last dim; the others: its channel dim). On that
-- first call the module becomes the base class (a LazyLinear a Linear), its
-- parameters made and initialised as the base's; so, as in PyTorch, an
-- optimizer is built after one forward.
local function lazy(name, base, in_size)
  local cls = Module:extend(name)
  function cls:__init(...)
    rawset(self, "_lazy_args", { n = select("#", ...), ... })
  end
  function cls:forward(x, ...)
    if not torch.is_tensor(x) then raise(string.format("%s: expected the input to be a tensor, got %s", name, typename(x))) end
    local n_in = in_size(x)
    local args = rawget(self, "_lazy_args")
    rawset(self, "_lazy_args", nil)
    setmetatable(self, rawget(base, "__instance_mt"))
    base.__init(self, n_in, unpack(args, 1, args.n))
    return self(x, ...)
  end
  function cls:has_uninitialized_params() return rawget(self, "_lazy_args") ~= nil end
  function cls:extra_repr() return "uninitialized" end
  L[name] = cls
end
lazy("LazyLinear", L.Linear, function(x) return x:size(-1) end)
for nd = 1, 3 do
  local function channels(x) return x:dim() == nd + 2 and x:size(1) or x:size(0) end
  lazy("LazyConv" .. nd .. "d", L["Conv" .. nd .. "d"], channels)
  lazy("LazyConvTranspose" .. nd .. "d", L["ConvTranspose" .. nd .. "d"], channels)
  lazy("LazyBatchNorm" .. nd .. "d", L["BatchNorm" .. nd .. "d"], function(x) return x:size(1) end)
  lazy("LazyInstanceNorm" .. nd .. "d", L["InstanceNorm" .. nd .. "d"], channels)
end

-- CrossMapLRN2d(size [, alpha, beta, k]): LocalResponseNorm of 4-D input,
-- PyTorch's older name
L.CrossMapLRN2d = L.LocalResponseNorm:extend("CrossMapLRN2d")
function L.CrossMapLRN2d:forward(x)
  if not torch.is_tensor(x) or x:dim() ~= 4 then
    raise("CrossMapLRN2d: expected a 4-D input (N, C, H, W), got " .. (torch.is_tensor(x) and (x:dim() .. " dims") or typename(x)))
  end
  return L.LocalResponseNorm.forward(self, x)
end

-- DataParallel(module [, device_ids, output_device, dim]): the module
-- (as its child `module`, so state dicts carry PyTorch's "module." keys),
-- run as it is on one device. Splitting a batch over several GPUs in one
-- process is what DistributedDataParallel under `dplua --nproc_per_node`
-- does, and PyTorch itself recommends it over DataParallel: with more than
-- one device the call says so.
L.DataParallel = Module:extend("DataParallel")
function L.DataParallel:__init(module, device_ids, output_device, dim)
  if not torch.nn.is_module(module) then raise("DataParallel: expected a module, got " .. typename(module)) end
  if is_opts(device_ids) then device_ids = device_ids.device_ids end
  if device_ids ~= nil and type(device_ids) ~= "table" then
    raise("DataParallel: expected device_ids to be a list, got " .. typename(device_ids))
  end
  local n = device_ids and #device_ids or torch.cuda.device_count()
  self.module, self._devices = module, n
  self.device_ids = device_ids
end
function L.DataParallel:forward(...)
  if self._devices > 1 then
    raise(string.format("DataParallel: %d devices: dplua runs data parallelism as DistributedDataParallel, one "
                        .. "process per GPU (dplua --nproc_per_node=%d train.lua); see docs/DISTRIBUTED.md",
                        self._devices, self._devices))
  end
  return self.module(...)
end

-- The construction helpers, for the other files of dplua.nn (names with
-- "_" are not layers: dplua/nn/init.lua leaves them out of nn).
L._check_opts, L._want_int, L._make = check_opts, want_int, make

return L
