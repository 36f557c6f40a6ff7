-- dplua.tensor: the Tensor methods and properties that are not math:
-- inspection (size, stride, dtype, device, ...), views (view, permute,
-- split, ...), indexing (t[i], t[{...}]), conversion (to, item, tolist)
-- and autograd (requires_grad, grad, backward, no_grad). dplua/init.lua
-- makes them the Tensor's.
local B = require("dplua.base")
local ffi, C, torch = B.ffi, B.C, B.torch
local methods, getters, setters = B.methods, B.getters, B.setters
local raise, check, new, wrap, finally = B.raise, B.check, B.new, B.wrap, B.finally
local is_tensor, typename, is_options = B.is_tensor, B.typename, B.is_options
local outp, shape_buf, dims_buf = B.outp, B.shape_buf, B.dims_buf
local check_int, check_dim, parse_shape, shape_of, wrap_dim = B.check_int, B.check_dim, B.parse_shape, B.shape_of,
                                                               B.wrap_dim
local dtype_mt, dtypes_by_id, dtypes_by_name, to_dtype = B.dtype_mt, B.dtypes_by_id, B.dtypes_by_name, B.to_dtype
local device_obj, parse_device, DP_CPU, DP_ALL_DIMS = B.device_obj, B.parse_device, B.DP_CPU, B.DP_ALL_DIMS

---------------------------------------------------------------- inspection

function methods.dim(t) return C.dp_tensor_ndim(t.p) end
methods.ndimension = methods.dim
function methods.numel(t) return tonumber(C.dp_tensor_numel(t.p)) end
methods.nelement = methods.numel

function methods.size(t, d)
  if d == nil then return shape_of(t) end
  if C.dp_tensor_ndim(t.p) == 0 then raise("size: a 0-d tensor has no dimensions") end
  return tonumber(C.dp_tensor_size(t.p, wrap_dim(t, d, "size")))
end

function methods.stride(t, d)
  if d ~= nil then return tonumber(C.dp_tensor_stride(t.p, wrap_dim(t, d, "stride"))) end
  local s = {}
  for i = 0, C.dp_tensor_ndim(t.p) - 1 do s[i + 1] = tonumber(C.dp_tensor_stride(t.p, i)) end
  return s
end

function methods.storage_offset(t) return tonumber(C.dp_tensor_offset(t.p)) end

-- as_strided(size, stride [, storage_offset = t:storage_offset()]): a view
-- of t's storage with those sizes and strides (elements may repeat: a
-- window view of a sequence). Every element reached must lie in the
-- storage; autograd does not record it (a tensor requiring grad is refused
-- while grad mode is on).
local stride_buf = ffi.new("int64_t[8]")
local function strided_args(fn, size, stride)
  if type(size) ~= "table" or type(stride) ~= "table" then
    raise(string.format("%s: expected size and stride as lists of integers, got %s and %s", fn, typename(size),
                        typename(stride)))
  end
  if #size ~= #stride then
    raise(string.format("%s: mismatch in length of strides and shape (%d sizes, %d strides)", fn, #size, #stride))
  end
  local n = parse_shape(fn, size)
  for i = 1, n do stride_buf[i - 1] = check_int(stride[i], fn, "stride " .. i) end
  return n
end
function methods.as_strided(t, size, stride, offset)
  local fn = "as_strided"
  local n = strided_args(fn, size, stride)
  offset = offset == nil and C.dp_tensor_offset(t.p) or check_int(offset, fn, "storage_offset")
  return new(C.dp_as_strided(outp, t.p, n, shape_buf, stride_buf, offset))
end
function methods.as_strided_(t, size, stride, offset)
  local view = methods.as_strided(t, size, stride, offset)
  check(C.dp_set_view(t.p, view.p))
  return t
end
-- empty_strided(size, stride [, opts]) and t:new_empty_strided(size, stride
-- [, opts]): a new tensor of those strides over the smallest storage that holds them.
local function storage_extent(size, stride)
  local last = 0
  for i = 1, #size do
    if size[i] == 0 then return 0 end
    last = last + (size[i] - 1) * stride[i]
  end
  return last + 1
end
function torch.empty_strided(size, stride, opts)
  strided_args("empty_strided", size, stride)
  return torch.empty(storage_extent(size, stride), opts):as_strided(size, stride, 0)
end
function methods.new_empty_strided(t, size, stride, opts)
  opts = torch._options(opts, "new_empty_strided")
  return torch.empty_strided(size, stride, { dtype = opts.dtype or t.dtype, device = opts.device or t.device,
                                             requires_grad = opts.requires_grad })
end

-- resize_(sizes...) and resize_as_(other): t takes that shape, contiguous,
-- in place, its storage read as C-contiguous (grown, keeping what fits, when
-- it holds too few elements; the new ones are uninitialised), as PyTorch's
function methods.resize_(t, ...)
  local nd = parse_shape("resize_", ...)
  check(C.dp_resize_(t.p, nd, shape_buf))
  return t
end
function methods.resize_as_(t, other)
  if not is_tensor(other) then raise("resize_as_: expected a tensor, got " .. typename(other)) end
  return methods.resize_(t, other:size())
end
-- detach_(): t itself becomes a leaf that does not require grad
function methods.detach_(t)
  check(C.dp_detach_(t.p))
  return t
end

function methods.is_contiguous(t) return C.dp_tensor_is_contiguous(t.p) ~= 0 end
function methods.element_size(t) return tonumber(C.dp_dtype_size(C.dp_tensor_dtype(t.p))) end
function methods.is_floating_point(t) return C.dp_dtype_is_floating(C.dp_tensor_dtype(t.p)) ~= 0 end
-- The pointer and the current stream leave dplua: the work waiting to be
-- launched (src/core/gpu_linear.c) is launched first, so that what another
-- library enqueues with them comes after it.
function methods.data_ptr(t)
  C.dp_cuda_launch_deferred()
  return C.dp_tensor_data(t.p)
end

getters.shape = shape_of
getters.dtype = function(t) return dtypes_by_id[C.dp_tensor_dtype(t.p)] end
getters.device = function(t) return device_obj(C.dp_tensor_device(t.p)) end
getters.ndim = methods.dim
getters.is_cuda = function(t) return C.dp_tensor_device(t.p) ~= DP_CPU end
getters.itemsize = methods.element_size
getters.nbytes = function(t) return tonumber(C.dp_tensor_numel(t.p)) * methods.element_size(t) end
-- every tensor is dense and strided: PyTorch's other layouts and kinds are none of dplua's
torch.strided = setmetatable({}, { __tostring = function() return "torch.strided" end })
getters.layout = function() return torch.strided end
getters.is_sparse = function() return false end
getters.is_quantized = function() return false end
getters.is_meta = function() return false end
getters.is_mkldnn = function() return false end
getters.T = function(t)
  local n = C.dp_tensor_ndim(t.p)
  local dims = {}
  for i = 1, n do dims[i] = n - i end
  return methods.permute(t, dims)
end

local type_names = { float32 = "torch.FloatTensor", float64 = "torch.DoubleTensor", int64 = "torch.LongTensor",
                     int32 = "torch.IntTensor", uint8 = "torch.ByteTensor", bool = "torch.BoolTensor",
                     bfloat16 = "torch.BFloat16Tensor" }
local dtypes_by_type_name = {}
for dt_name, type_name in pairs(type_names) do dtypes_by_type_name[type_name] = dt_name end
-- t:type() is its type's name; t:type(dtype) or t:type("torch.DoubleTensor")
-- (a "torch.cuda." name: on the current GPU) converts.
function methods.type(t, dt)
  if type(dt) == "string" then
    local cpu_name, on_gpu = dt:gsub("^torch%.cuda%.", "torch.")
    if dtypes_by_type_name[cpu_name] then
      return methods.to(t, { dtype = dtypes_by_type_name[cpu_name], device = on_gpu > 0 and "cuda" or "cpu" })
    end
  end
  if type(dt) == "string" and not dtypes_by_name[dt:gsub("^torch%.", "")] then
    raise("type: unknown type " .. dt .. " (expected a dtype, or a name such as torch.FloatTensor)")
  end
  if dt ~= nil then return methods.to(t, dt) end
  local name = type_names[getters.dtype(t).name]
  return C.dp_tensor_device(t.p) == DP_CPU and name or name:gsub("^torch%.", "torch.cuda.")
end

---------------------------------------------------------------- views

local function shape_method(cfn, fn)
  return function(t, ...)
    local nd = parse_shape(fn, ...)
    return new(cfn(outp, t.p, nd, shape_buf))
  end
end
methods.view = shape_method(C.dp_view, "view")
methods.reshape = shape_method(C.dp_reshape, "reshape")
methods.expand = shape_method(C.dp_expand, "expand")
function methods.view_as(t, o) return methods.view(t, shape_of(o)) end
function methods.reshape_as(t, o) return methods.reshape(t, shape_of(o)) end
function methods.expand_as(t, o) return methods.expand(t, shape_of(o)) end

function methods.permute(t, first, ...)
  local list = type(first) == "table" and first or { first, ... }
  local n = #list
  if n > 8 then raise("permute: too many dims") end
  for i = 1, n do dims_buf[i - 1] = check_dim(list[i], "permute", "dim") end
  return new(C.dp_permute(outp, t.p, n, dims_buf))
end

function methods.transpose(t, d0, d1)
  return new(C.dp_transpose(outp, t.p, check_dim(d0, "transpose", "dim0"), check_dim(d1, "transpose", "dim1")))
end

function methods.t(t)
  local n = C.dp_tensor_ndim(t.p)
  if n > 2 then raise(string.format("t: expects a tensor with <= 2 dimensions, but self is %dD", n)) end
  if n < 2 then return new(C.dp_alias(outp, t.p)) end
  return methods.transpose(t, 0, 1)
end

function methods.contiguous(t) return new(C.dp_contiguous(outp, t.p)) end

function methods.squeeze(t, d)
  if d == nil then return new(C.dp_squeeze(outp, t.p, DP_ALL_DIMS)) end
  return new(C.dp_squeeze(outp, t.p, check_dim(d, "squeeze", "dim")))
end

function methods.unsqueeze(t, d) return new(C.dp_unsqueeze(outp, t.p, check_dim(d, "unsqueeze", "dim"))) end

function methods.narrow(t, d, start, len)
  return new(C.dp_narrow(outp, t.p, check_dim(d, "narrow", "dim"), check_int(start, "narrow", "start"),
                         check_int(len, "narrow", "length")))
end

-- split(split_size or {sizes}, dim=0): a Lua list of views along dim, each
-- split_size long (the last one shorter), or of the given sizes, which
-- must add up to the dim's size. chunk(n, dim=0): at most n views, each
-- ceil(size / n) long. As PyTorch's, an empty dim gives empty views.
local function at_least_1d(t, fn)
  if t:dim() == 0 then raise(fn .. ": expected a tensor of at least 1 dim, got a 0-d tensor") end
end

function methods.split(t, sizes, d)
  at_least_1d(t, "split")
  d = wrap_dim(t, d or 0, "split")
  local total, out, start = shape_of(t)[d + 1], {}, 0
  if type(sizes) == "table" then
    local sum = 0   -- (in doubles: sizes near 2^62 cannot wrap around to the dim's size)
    for i = 1, #sizes do
      local n = check_int(sizes[i], "split", "a split size")
      if n < 0 then raise(string.format("split: split sizes must not be negative, got %d", n)) end
      sum = sum + n
    end
    if sum ~= total then
      raise(string.format("split: the split sizes add up to %.0f, but dim %d has size %d", sum, d, total))
    end
    for i = 1, #sizes do
      out[i] = methods.narrow(t, d, start, sizes[i])
      start = start + sizes[i]
    end
    return out
  end
  local step = check_int(sizes, "split", "split_size")
  if step < 0 or (step == 0 and total > 0) then
    raise(string.format("split: split_size must be positive for a dim of size %d, got %d", total, step))
  end
  repeat
    local len = math.min(step, total - start)
    out[#out + 1] = methods.narrow(t, d, start, len)
    start = start + len
  until start >= total
  return out
end

function methods.chunk(t, chunks, d)
  chunks = check_int(chunks, "chunk", "chunks")
  if chunks <= 0 then raise(string.format("chunk: expected a positive number of chunks, got %d", chunks)) end
  at_least_1d(t, "chunk")
  d = wrap_dim(t, d or 0, "chunk")
  local total = shape_of(t)[d + 1]
  if total == 0 then   -- as PyTorch: `chunks` empty tensors (a list, so a bounded one)
    if chunks > 2 ^ 20 then
      raise(string.format("chunk: %.0f chunks of an empty dim would be as many empty tensors; at most 2^20", chunks))
    end
    local out = {}
    for i = 1, chunks do out[i] = methods.narrow(t, d, 0, 0) end
    return out
  end
  return methods.split(t, math.ceil(total / chunks), d)
end

function methods.select(t, d, i)
  return new(C.dp_select(outp, t.p, check_dim(d, "select", "dim"), check_int(i, "select", "index")))
end

function methods.flatten(t, s, e)
  local n = C.dp_tensor_ndim(t.p)
  if n == 0 then return methods.reshape(t, 1) end
  s = wrap_dim(t, s or 0, "flatten"); e = wrap_dim(t, e or -1, "flatten")
  if s > e then raise("flatten: start_dim cannot come after end_dim") end
  local shape, sizes = {}, shape_of(t)
  for i = 1, s do shape[#shape + 1] = sizes[i] end
  local prod = 1
  for i = s + 1, e + 1 do prod = prod * sizes[i] end
  shape[#shape + 1] = prod
  for i = e + 2, n do shape[#shape + 1] = sizes[i] end
  return methods.reshape(t, shape)
end

function methods.detach(t) return new(C.dp_alias(outp, t.p)) end
function methods.clone(t) return new(C.dp_clone(outp, t.p)) end

-- t[i] and t[{...}] -----------------------------------------------------
--
-- Basic indexing makes views: a number selects (the dim goes), a
-- {start, stop[, step]} table slices (the dim stays), as PyTorch's t[i]
-- and t[start:stop:step]. Advanced indexing copies, as PyTorch's: an
-- int64 (or int32) tensor picks positions along its dim (negative from
-- the end), a bool tensor picks the positions where it is true over as
-- many dims as it has (its shape must be theirs); several such indices
-- broadcast together, and the result takes their shape in place of the
-- dims they index when those are adjacent, at the front otherwise. A
-- number beside them selects first, as in PyTorch (not NumPy). A Lua list of numbers is a slice, never a list
-- of positions: positions are a tensor (torch.tensor({0, 2}, {dtype =
-- torch.int64})).

local function has_tensor(key)
  if is_tensor(key) then return true end
  if type(key) ~= "table" then return false end
  for k = 1, #key do if is_tensor(key[k]) then return true end end
  return false
end

local function too_many(t)
  raise(string.format("index: too many indices for a tensor of dimension %d", C.dp_tensor_ndim(t.p)))
end

-- v sliced along dim d by a {start, stop[, step]} table e
local function sliced(v, d, e)
  local start, stop, step = e[1] or 0, e[2] or tonumber(C.dp_tensor_size(v.p, d)), e[3] or 1
  check_int(start, "index", "slice start"); check_int(stop, "index", "slice stop"); check_int(step, "index", "slice step")
  return new(C.dp_slice(outp, v.p, d, start, stop, step))
end

local function bad_index(e)
  raise("index: each index must be a number, a {start, stop[, step]} table or a tensor, got " .. typename(e))
end

local function basic_view(t, key)
  if type(key) == "number" then
    if C.dp_tensor_ndim(t.p) == 0 then raise("index: invalid index of a 0-d tensor") end
    return new(C.dp_select(outp, t.p, 0, check_int(key, "index", "index")))
  end
  if type(key) ~= "table" then
    raise("index: expected a number, a tensor or a table of indices, got " .. typename(key))
  end
  local v, d = t, 0
  for k = 1, #key do
    local e = key[k]
    if d >= C.dp_tensor_ndim(v.p) and (type(e) == "number" or type(e) == "table") then too_many(t) end
    if type(e) == "number" then
      v = new(C.dp_select(outp, v.p, d, check_int(e, "index", "index")))
    elseif type(e) == "table" then
      v, d = sliced(v, d, e), d + 1
    else
      bad_index(e)
    end
  end
  return v
end

-- The numbers and slices of key applied to t (the tensors' dims kept),
-- and the advanced indices: {dim = (in that view), index = a tensor}.
local function advanced_parts(t, key)
  if is_tensor(key) then key = { key } end
  local v, d, adv = t, 0, {}
  for k = 1, #key do
    local e = key[k]
    local need = is_tensor(e) and e.dtype == torch.bool and e:dim() or 1
    if d + need > C.dp_tensor_ndim(v.p) then too_many(t) end
    if type(e) == "number" then
      v = new(C.dp_select(outp, v.p, d, check_int(e, "index", "index")))
    elseif is_tensor(e) and e.dtype == torch.bool then
      if e:dim() == 0 then raise("index: a 0-d bool tensor is not supported as an index") end
      for j = 0, e:dim() - 1 do
        if v:size(d + j) ~= e:size(j) then
          raise(string.format("index: the shape of the mask %s does not match the shape of the indexed tensor %s "
                              .. "at dim %d (%d against %d)", tostring(e.shape), tostring(t.shape), d + j,
                              e:size(j), v:size(d + j)))
        end
      end
      local parts = methods.nonzero(e, { as_tuple = true })
      for j = 1, #parts do adv[#adv + 1] = { dim = d + j - 1, index = parts[j] } end
      d = d + e:dim()
    elseif is_tensor(e) then
      if e.dtype ~= torch.int64 and e.dtype ~= torch.int32 then
        raise(string.format("index: tensors used as indices must be int64, int32 or bool, got a %s tensor "
                            .. "(convert it with :long())", e.dtype.name))
      end
      adv[#adv + 1] = { dim = d, index = e }
      d = d + 1
    elseif type(e) == "table" then
      v, d = sliced(v, d, e), d + 1
    else
      bad_index(e)
    end
  end
  return v, adv
end

-- an index along a dim of `size` as int64 on v's device, checked and
-- with negative positions wrapped
local function checked_index(x, size, dim, v)
  local dev = v.device
  x = x:to(dev):long()
  local bad = x:lt(-size):logical_or(x:ge(size))
  if x:numel() > 0 and bad:any():item() then
    local first = bad:reshape(-1):nonzero():select(1, 0):narrow(0, 0, 1)
    raise(string.format("index: index %d is out of bounds for dim %d with size %d",
                        x:reshape(-1):index_select(0, first):item(), dim, size))
  end
  return x + x:lt(0):long() * size
end

local function advanced_view(t, key)
  local v, adv = advanced_parts(t, key)
  local dims, idx, is_adv = {}, {}, {}
  for i, a in ipairs(adv) do
    dims[i], is_adv[a.dim] = a.dim, true
    idx[i] = checked_index(a.index, v:size(a.dim), a.dim, v)
  end
  local ok, S = pcall(function()
    local z = idx[1]
    for i = 2, #idx do z = z * 0 + idx[i] * 0 end
    return z:size()
  end)
  if not ok then
    local shapes = {}
    for i = 1, #idx do shapes[i] = tostring(idx[i].shape) end
    raise("index: shape mismatch: the index tensors could not be broadcast together with shapes "
          .. table.concat(shapes, ", "))
  end
  -- the advanced dims first, flattened into one, then the others
  local perm, rest, lin, M = {}, {}, nil, 1
  for i, d in ipairs(dims) do
    perm[i] = d
    local size = v:size(d)
    lin = lin and lin * size + idx[i]:expand(S) or idx[i]:expand(S)
    M = M * size
  end
  for d = 0, v:dim() - 1 do
    if not is_adv[d] then perm[#perm + 1] = d; rest[#rest + 1] = v:size(d) end
  end
  local flat_shape, out_shape = { M }, {}
  for _, n in ipairs(S) do out_shape[#out_shape + 1] = n end
  for _, n in ipairs(rest) do flat_shape[#flat_shape + 1] = n; out_shape[#out_shape + 1] = n end
  local r = methods.permute(v, perm):reshape(flat_shape):index_select(0, lin:reshape(-1)):reshape(out_shape)
  local adjacent = dims[#dims] - dims[1] == #dims - 1
  if adjacent and dims[1] > 0 and #S > 0 then
    -- back in place: the dims before the first indexed one, the index's, the rest
    local order, nS = {}, #S
    for j = 0, dims[1] - 1 do order[#order + 1] = nS + j end
    for j = 0, nS - 1 do order[#order + 1] = j end
    for j = nS + dims[1], #out_shape - 1 do order[#order + 1] = j end
    r = methods.permute(r, order)
  end
  return r
end

local function index_view(t, key)
  if has_tensor(key) then return advanced_view(t, key) end
  return basic_view(t, key)
end

-- t[key] = value: into the view for basic keys; for advanced ones the
-- row-major positions the key picks (the key applied to a tensor of
-- positions) are written through put_, t[mask] = number through
-- masked_fill_.
local function assign(t, key, value)
  if type(value) == "boolean" then value = value and 1 or 0 end
  if type(value) ~= "number" and not is_tensor(value) then
    raise("index assignment: expected a tensor or a number, got " .. typename(value))
  end
  if not has_tensor(key) then
    local view = basic_view(t, key)
    if is_tensor(value) then check(C.dp_copy_into(view.p, value.p)) else check(C.dp_fill_into(view.p, value)) end
    return
  end
  if is_tensor(key) and key.dtype == torch.bool and type(value) == "number" and key:dim() == t:dim() then
    local same = true
    for d = 0, t:dim() - 1 do same = same and key:size(d) == t:size(d) end
    if same then methods.masked_fill_(t, key:to(t.device), value); return end
  end
  local positions = torch.arange(t:numel(), { dtype = torch.int64, device = t.device }):view(shape_of(t))
  local where = advanced_view(positions, key)
  local src
  if type(value) == "number" then
    src = torch.full(shape_of(where), value, { dtype = t.dtype, device = t.device })
  else
    local ok, e = pcall(function() return value:detach():to(t.device):expand(shape_of(where)) end)
    if not ok then
      raise(string.format("index assignment: a value of shape %s does not broadcast to the indexed shape %s",
                          tostring(value.shape), tostring(where.shape)))
    end
    src = e
  end
  methods.put_(t, where, src)
end

-- index_put_(indices, values, accumulate=false): t[indices] = values with
-- indices a Lua list of tensors (one per leading dim), as PyTorch's;
-- index_put a copy.
function methods.index_put_(t, indices, values, accumulate)
  if type(indices) ~= "table" or is_tensor(indices) or #indices == 0 then
    raise("index_put_: expected indices to be a non-empty Lua list of tensors, got " .. typename(indices))
  end
  for i = 1, #indices do
    if not is_tensor(indices[i]) then
      raise(string.format("index_put_: expected a tensor at position %d of indices, got %s", i, typename(indices[i])))
    end
  end
  if accumulate then raise("index_put_: accumulate=true is not supported (use index_add_ or scatter_add_)") end
  assign(t, indices, values)
  return t
end
function methods.index_put(t, indices, values, accumulate)
  return methods.index_put_(t:clone(), indices, values, accumulate)
end

---------------------------------------------------------------- conversion

-- to(dtype), to(device), to(device, dtype), to(other_tensor), to{dtype=, device=},
-- each with non_blocking: to("cuda", {non_blocking = true}) or a last
-- argument true. Non-blocking matters for a pinned tensor (pin_memory())
-- going to a GPU: the copy is queued and the call returns at once.
-- One argument of to() applied to (dtype id, device, non_blocking). A
-- function of the module, not a closure of each call: making a closure is
-- not compiled by LuaJIT, and to() is on the path of every autocast cast.
local function to_arg(x, dt, dev, non_blocking)
  if x == nil then return dt, dev, non_blocking end
  if type(x) == "boolean" then return dt, dev, x end
  if is_tensor(x) then return C.dp_tensor_dtype(x.p), C.dp_tensor_device(x.p), non_blocking end
  if getmetatable(x) == dtype_mt or (type(x) == "string" and dtypes_by_name[x:gsub("^torch%.", "")]) then
    return to_dtype(x, "to").id, dev, non_blocking
  end
  if is_options(x) then
    if x.dtype then dt = to_dtype(x.dtype, "to").id end
    if x.device then dev = parse_device(x.device, "to") end
    return dt, dev, non_blocking or x.non_blocking == true
  end
  return dt, parse_device(x, "to"), non_blocking
end

function methods.to(t, a, b, c)
  local dt, dev, non_blocking = C.dp_tensor_dtype(t.p), C.dp_tensor_device(t.p), false
  dt, dev, non_blocking = to_arg(a, dt, dev, non_blocking)
  dt, dev, non_blocking = to_arg(b, dt, dev, non_blocking)
  dt, dev, non_blocking = to_arg(c, dt, dev, non_blocking)
  if non_blocking then return new(C.dp_to_non_blocking(outp, t.p, dt, dev)) end
  return new(C.dp_to(outp, t.p, dt, dev))
end

for name, dt in pairs({ float = 0, double = 1, long = 2, int = 3, byte = 4, bool = 5, bfloat16 = 6 }) do
  methods[name] = function(t) return new(C.dp_to(outp, t.p, dt, C.dp_tensor_device(t.p))) end
end
function methods.cpu(t) return new(C.dp_to(outp, t.p, C.dp_tensor_dtype(t.p), DP_CPU)) end
-- cuda(), cuda(index), cuda{device=, non_blocking=}
function methods.cuda(t, index)
  local non_blocking = false
  if is_options(index) then index, non_blocking = index.device, index.non_blocking == true end
  local dev = parse_device(index or "cuda", "cuda")
  if non_blocking then return new(C.dp_to_non_blocking(outp, t.p, C.dp_tensor_dtype(t.p), dev)) end
  return new(C.dp_to(outp, t.p, C.dp_tensor_dtype(t.p), dev))
end
-- pin_memory(): a copy in page-locked host memory, from which to(device,
-- {non_blocking = true}) copies without waiting; is_pinned().
function methods.pin_memory(t) return new(C.dp_pin_memory(outp, t.p)) end
function methods.is_pinned(t) return C.dp_tensor_is_pinned(t.p) ~= 0 end

local item_d, item_i = ffi.new("double[1]"), ffi.new("int64_t[1]")

-- Element i of a double array as a Lua number. LuaJIT keeps its other
-- values in the NaN space of doubles: a NaN whose high word is 0xfff80000
-- or more (uninitialised memory from torch.empty can hold one, and
-- arithmetic keeps its bits) would reach Lua as a tagged value, a nil or a
-- bogus pointer, and crash the process. Such NaNs are read as Lua's own.
-- words: the same memory as uint32_t; a little-endian double's high word
-- is its second half.
local function read_double(p, words, i)
  if words[2 * i + 1] >= 0xfff80000 then return 0 / 0 end
  return p[i]
end
local item_words = ffi.cast("uint32_t *", item_d)
function methods.item(t)
  local dt = C.dp_tensor_dtype(t.p)
  if dt == 2 then
    check(C.dp_item_int64(t.p, item_i))
    local v = item_i[0]
    if v >= -9007199254740992LL and v <= 9007199254740992LL then return tonumber(v) end
    return v  -- beyond 2^53: keep the exact int64 cdata
  end
  check(C.dp_item(t.p, item_d))
  local v = read_double(item_d, item_words, 0)
  if dt == 5 then return v ~= 0 end
  return v
end

-- Reads every element as a Lua value, through a contiguous float64 (or
-- int64) copy so that one loop serves every dtype.
local function elements(t)
  local dt = C.dp_tensor_dtype(t.p)
  local n = tonumber(C.dp_tensor_numel(t.p))
  local stage_dt = dt == 2 and 2 or 1
  local c = new(C.dp_to(outp, t.p, stage_dt, C.dp_tensor_device(t.p)))
  c = new(C.dp_contiguous(outp, c.p))
  if C.dp_tensor_device(c.p) ~= DP_CPU then c = methods.cpu(c) end
  local p = ffi.cast(stage_dt == 2 and "int64_t *" or "double *", C.dp_tensor_data(c.p))
  local words = ffi.cast("uint32_t *", p)
  local out = {}
  for i = 0, n - 1 do
    local v = stage_dt == 2 and tonumber(p[i]) or read_double(p, words, i)
    if dt == 5 then v = v ~= 0 end
    out[i + 1] = v
  end
  return out, n
end
torch._elements = elements

function methods.tolist(t)
  local flat = elements(t)
  local shape = shape_of(t)
  if #shape == 0 then return flat[1] end
  local pos = 0
  local function build(d)
    local r = {}
    for i = 1, shape[d] do
      if d == #shape then pos = pos + 1; r[i] = flat[pos] else r[i] = build(d + 1) end
    end
    return r
  end
  return build(1)
end

---------------------------------------------------------------- autograd

getters.requires_grad = function(t) return C.dp_requires_grad(t.p) ~= 0 end
getters.is_leaf = function(t) return C.dp_is_leaf(t.p) ~= 0 end
getters.grad = function(t)
  local g = C.dp_get_grad(t.p)
  if g == nil then return nil end
  return wrap(g)
end
local grad_fn_mt = { __tostring = function(f) return "<" .. f.name .. ">" end }
getters.grad_fn = function(t)
  local name = C.dp_grad_fn_name(t.p)
  if name == nil then return nil end
  return setmetatable({ name = ffi.string(name) }, grad_fn_mt)
end
getters.data = function(t) return new(C.dp_alias(outp, t.p)) end

setters.requires_grad = function(t, v) check(C.dp_set_requires_grad(t.p, v and 1 or 0)) end
setters.grad = function(t, g)
  if g ~= nil and not is_tensor(g) then raise("grad: expected a tensor or nil, got " .. typename(g)) end
  check(C.dp_set_grad(t.p, g and g.p or nil))
end

function methods.requires_grad_(t, flag)
  check(C.dp_set_requires_grad(t.p, (flag == nil or flag) and 1 or 0))
  return t
end

-- t:register_hook(fn) (dplua/autograd.lua): fn(grad) may return a new gradient.
function methods.register_hook(t, fn) return require("dplua.autograd")._register_hook(t, fn) end
function methods.register_post_accumulate_grad_hook(t, fn)
  return require("dplua.autograd")._register_post_accumulate_grad_hook(t, fn)
end
function methods.retain_grad(t) return require("dplua.autograd")._retain_grad(t) end
getters.retains_grad = function(t) return require("dplua.autograd")._retains_grad(t) end

-- A backward that may run Lua (torch.utils.checkpoint, autograd.Function,
-- tensor hooks) calls back into Lua from C, which LuaJIT allows only from an FFI call
-- it did not compile: this function is never compiled.
local function backward_calling_lua(t, gradient, retain)
  check(C.dp_backward(t.p, gradient and gradient.p or nil, retain and 1 or 0))
end
jit.off(backward_calling_lua)

-- backward([gradient] [, {retain_graph=true}]) or backward(gradient, retain_graph)
function methods.backward(t, gradient, retain)
  if is_options(gradient) then gradient, retain = nil, gradient end
  if type(retain) == "table" then retain = retain.retain_graph end
  if gradient ~= nil and not is_tensor(gradient) then
    raise("backward: expected the gradient to be a tensor, got " .. typename(gradient))
  end
  if C.dp_lua_nodes_live() ~= 0 then return backward_calling_lua(t, gradient, retain) end
  check(C.dp_backward(t.p, gradient and gradient.p or nil, retain and 1 or 0))
end

-- Runs fn with grad mode set, restoring the previous mode even on error.
local function with_grad_mode(enabled, fn, ...)
  return finally(C.dp_set_grad_enabled, C.dp_set_grad_enabled(enabled), pcall(fn, ...))
end

function torch.no_grad(fn, ...)
  if type(fn) ~= "function" then raise("no_grad: expected a function to run without recording, got " .. typename(fn)) end
  return with_grad_mode(0, fn, ...)
end
function torch.enable_grad(fn, ...) return with_grad_mode(1, fn, ...) end
-- inference_mode([mode,] fn, ...): fn without recording, as no_grad (dplua's
-- tensors carry no version counters for it to skip); with mode false, fn
-- runs in the grad mode it finds.
local inference = false
local function restore_inference(was) inference = was end
function torch.inference_mode(mode, fn, ...)
  if type(mode) == "function" then return torch.inference_mode(true, mode, fn, ...) end
  if type(fn) ~= "function" then raise("inference_mode: expected a function to run, got " .. typename(fn)) end
  if mode == false then return finally(restore_inference, inference, pcall(function(...)
    inference = false
    return fn(...)
  end, ...)) end
  return finally(restore_inference, inference, pcall(function(...)
    inference = true
    return with_grad_mode(0, fn, ...)
  end, ...))
end
function torch.is_inference_mode_enabled() return inference end
function torch.set_grad_enabled(flag) C.dp_set_grad_enabled(flag and 1 or 0) end
function torch.is_grad_enabled() return C.dp_is_grad_enabled() ~= 0 end

torch._grad_fn_name = function(t)
  local name = C.dp_grad_fn_name(t.p)
  return name ~= nil and ffi.string(name) or nil
end
torch._requires_grad = function(t) return C.dp_requires_grad(t.p) ~= 0 end

return { index_view = index_view, assign = assign }
