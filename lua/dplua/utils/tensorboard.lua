-- dplua.utils.tensorboard: torch.utils.tensorboard.SummaryWriter, which
-- writes TensorBoard event files that `tensorboard --logdir runs` reads.
--
--   local SummaryWriter = torch.utils.tensorboard.SummaryWriter
--   local w = SummaryWriter("runs/mlp")                -- nil: runs/<date>_<host>
--   w:add_scalar("loss/train", loss, step)             -- a number or a one-element tensor
--   w:add_scalars("loss", {train = 0.3, test = 0.4}, step)
--   w:add_histogram("fc1.weight", model.fc1.weight, step)
--   w:add_text("notes", "lr warm-up of 100 steps", step)
--   w:add_hparams({lr = 1e-3, batch_size = 64}, {["hparam/accuracy"] = 0.9})
--   w:close()
--
-- An event file (runs/mlp/events.out.tfevents.<time>.<host>.<pid>.<n>) is
-- a sequence of TFRecords, each an Event protobuf message:
--
--   uint64 length | uint32 masked CRC-32C of the length | data | uint32 masked CRC-32C of data
--
-- all little-endian; the first Event holds file_version "brain.Event:2",
-- the others a Summary. The messages are those of TensorFlow's event.proto
-- and summary.proto and of TensorBoard's hparams and text plugins, encoded
-- here in protobuf's wire format (varints, fixed 32/64-bit numbers and
-- length-delimited fields; fields at their default value are left out, as
-- protobuf's own encoders do). Each summary is what PyTorch's SummaryWriter
-- writes for the same call (tags, plugin names, histogram buckets), so that
-- TensorBoard shows both alike.
--
-- Events go to the file through its buffer; it is flushed after max_queue
-- events or when flush_secs have passed at the next event (there is no
-- background thread), and by flush() and close(). Floats are written in the
-- machine's byte order, which must be little-endian (x86-64, AArch64).
local ffi = require("ffi")
local bit = require("bit")
local torch = require("dplua")
local report = require("dplua.report")

local M = {}

local band, bor, bxor, bnot, rshift, lshift = bit.band, bit.bor, bit.bxor, bit.bnot, bit.rshift, bit.lshift
local char, byte, format, concat = string.char, string.byte, string.format, table.concat

---------------------------------------------------------------- protobuf wire format

local u64 = ffi.typeof("uint64_t")
local i64 = ffi.typeof("int64_t")

-- A varint: 7 bits a byte, low first, the high bit set on all but the
-- last. Negative numbers are their 64-bit two's complement (10 bytes).
local function varint(n)
  if n >= 0 and n < 2 ^ 53 then
    local out = {}
    while n >= 128 do
      out[#out + 1] = n % 128 + 128
      n = math.floor(n / 128)
    end
    out[#out + 1] = n
    return char(unpack(out))
  end
  local v, out = ffi.cast(u64, ffi.cast(i64, n)), {}
  while v >= 128 do
    out[#out + 1] = tonumber(v % 128) + 128
    v = v / 128
  end
  out[#out + 1] = tonumber(v)
  return char(unpack(out))
end

local double_box, float_box = ffi.new("double[1]"), ffi.new("float[1]")
local function fixed64_double(x) double_box[0] = x; return ffi.string(double_box, 8) end
local function fixed32_float(x) float_box[0] = x; return ffi.string(float_box, 4) end

local function key(field, wire) return varint(field * 8 + wire) end

-- Fields: f_* write a field always (members of a oneof), opt_* only when
-- not at the default (proto3's implicit presence).
local function f_varint(field, n) return key(field, 0) .. varint(n) end
local function f_double(field, x) return key(field, 1) .. fixed64_double(x) end
local function f_float(field, x) return key(field, 5) .. fixed32_float(x) end
local function f_bytes(field, s) return key(field, 2) .. varint(#s) .. s end
local function opt_varint(field, n) return (n and n ~= 0) and f_varint(field, n) or "" end
local function opt_double(field, x) return (x and x ~= 0) and f_double(field, x) or "" end
local function opt_bytes(field, s) return (s and s ~= "") and f_bytes(field, s) or "" end
local function f_bool(field, b) return f_varint(field, b and 1 or 0) end

-- A packed repeated double field.
local function packed_doubles(field, list)
  if #list == 0 then return "" end
  local parts = {}
  for i, x in ipairs(list) do parts[i] = fixed64_double(x) end
  return f_bytes(field, concat(parts))
end

---------------------------------------------------------------- CRC-32C and the TFRecord frame

-- CRC-32C (Castagnoli): the reflected polynomial 0x82F63B78, one table
-- lookup a byte.
local crc_table = {}
for i = 0, 255 do
  local c = i
  for _ = 1, 8 do
    if band(c, 1) ~= 0 then c = bxor(rshift(c, 1), 0x82F63B78) else c = rshift(c, 1) end
  end
  crc_table[i] = c
end

local function crc32c(s)
  local c = -1
  for i = 1, #s do
    c = bxor(rshift(c, 8), crc_table[band(bxor(c, byte(s, i)), 0xFF)])
  end
  return bnot(c) % 2 ^ 32
end
M.crc32c = crc32c

-- TFRecord's mask: rotate right by 15 bits and add a constant, so that a
-- CRC of data that holds CRCs is not a CRC of CRCs.
local function masked_crc(s)
  local c = crc32c(s)
  return (bor(rshift(c, 15), lshift(c, 17)) % 2 ^ 32 + 0xA282EAD8) % 2 ^ 32
end
M.masked_crc32c = masked_crc

local function le32(n) return char(n % 256, math.floor(n / 2 ^ 8) % 256, math.floor(n / 2 ^ 16) % 256, math.floor(n / 2 ^ 24)) end
local function le64(n) return le32(n % 2 ^ 32) .. le32(math.floor(n / 2 ^ 32)) end

local function tfrecord(data)
  local len = le64(#data)
  return len .. le32(masked_crc(len)) .. data .. le32(masked_crc(data))
end
M.tfrecord = tfrecord

---------------------------------------------------------------- messages

-- DataType (types.proto), SummaryMetadata's data classes, SessionLog's and
-- the hparams plugin's enums.
local DT_FLOAT, DT_DOUBLE, DT_STRING = 1, 2, 7
local SESSION_START = 1
local HP_STRING, HP_BOOL, HP_FLOAT64 = 1, 2, 3
local STATUS_SUCCESS = 1

-- Event: wall_time 1, step 2, file_version 3, summary 5, session_log 7.
local function event(wall_time, step, what_field, what)
  return f_double(1, wall_time) .. opt_varint(2, step) .. f_bytes(what_field, what)
end

-- Summary.Value: tag 1, simple_value 2, histo 5, tensor 8, metadata 9.
local function summary_value(tag, fields)
  return f_bytes(1, f_bytes(1, tag) .. fields)
end

-- SummaryMetadata with PluginData {plugin_name 1, content 2} at field 1.
local function plugin_metadata(name, content)
  return f_bytes(9, f_bytes(1, f_bytes(1, name) .. opt_bytes(2, content)))
end

-- HistogramProto: min 1, max 2, num 3, sum 4, sum_squares 5, bucket_limit
-- 6, bucket 7.
local function histogram_proto(h)
  return opt_double(1, h.min) .. opt_double(2, h.max) .. opt_double(3, h.num) .. opt_double(4, h.sum)
         .. opt_double(5, h.sum_squares) .. packed_doubles(6, h.bucket_limit) .. packed_doubles(7, h.bucket)
end

-- google.protobuf.Value: number_value 2, string_value 3, bool_value 4.
local function struct_value(v)
  if type(v) == "number" then return f_double(2, v) end
  if type(v) == "string" then return f_bytes(3, v) end
  return f_bool(4, v)
end

---------------------------------------------------------------- argument checks

-- Raises at the first caller outside this file.
local this_file = debug.getinfo(1, "S").source
local function fail(who, msg)
  local level = 2
  while debug.getinfo(level, "S") and debug.getinfo(level, "S").source == this_file do level = level + 1 end
  error(who .. ": " .. msg, level)
end

local function check_tag(who, tag, what)
  if type(tag) ~= "string" or tag == "" then
    fail(who, format("%s must be a non-empty string, got %s", what or "tag", type(tag) == "string" and '""' or type(tag)))
  end
end

local function check_step(who, step)
  if step == nil then return nil end
  if type(step) == "cdata" then step = tonumber(step) end
  if type(step) ~= "number" or step % 1 ~= 0 then
    fail(who, "global_step must be an integer or nil, got " .. tostring(step))
  end
  return step
end

local function check_walltime(who, t)
  if t == nil then return report.wall_time() end
  if type(t) ~= "number" or t ~= t then fail(who, "walltime must be seconds since 1970 or nil, got " .. tostring(t)) end
  return t
end

-- A number out of a number, a boolean or a one-element tensor.
local function number_of(who, v, what)
  if type(v) == "number" then return v end
  if type(v) == "boolean" then return v and 1 or 0 end
  if type(v) == "cdata" and torch.is_tensor(v) then
    if v:numel() ~= 1 then fail(who, format("%s is a tensor of %d elements; expected one", what, v:numel())) end
    return tonumber(v:item()) or (v:item() and 1 or 0)
  end
  if type(v) == "cdata" and tonumber(v) then return tonumber(v) end
  fail(who, format("%s must be a number or a one-element tensor, got %s", what, type(v)))
end

local sorted_keys = require("dplua.json").sorted_keys

---------------------------------------------------------------- histograms

-- PyTorch's default bins ("tensorflow"): ±1e-12 * 1.1^k up to 1e20, and 0.
local default_bins
local function tensorflow_bins()
  if default_bins then return default_bins end
  local pos, v = {}, 1e-12
  while v < 1e20 do
    pos[#pos + 1] = v
    v = v * 1.1
  end
  default_bins = {}
  for i = #pos, 1, -1 do default_bins[#default_bins + 1] = -pos[i] end
  default_bins[#default_bins + 1] = 0
  for i = 1, #pos do default_bins[#default_bins + 1] = pos[i] end
  return default_bins
end

local function values_of(who, values)
  local list
  if torch.is_tensor(values) then
    list = torch._elements(values)
  elseif type(values) == "table" then
    list = values
  else
    fail(who, "values must be a tensor or a table of numbers, got " .. type(values))
  end
  if #list == 0 then fail(who, "values are empty; a histogram needs at least one value") end
  local out = {}
  for i, v in ipairs(list) do
    if type(v) == "boolean" then v = v and 1 or 0 end
    if type(v) ~= "number" then fail(who, format("values[%d] is a %s, expected a number", i, type(v))) end
    if v ~= v or v == math.huge or v == -math.huge then
      fail(who, format("values[%d] is %s; a histogram needs finite values", i, tostring(v)))
    end
    out[i] = v
  end
  return out
end

-- The bin edges: numpy's for `bins` (a count: equal widths over [min, max],
-- as np.linspace computes them; a list: those edges; "tensorflow").
local function bin_edges(who, bins, lo, hi)
  if bins == nil or bins == "tensorflow" then return tensorflow_bins() end
  if type(bins) == "number" then
    if bins < 1 or bins % 1 ~= 0 then fail(who, "bins must be a positive integer, a list of edges or \"tensorflow\", got " .. bins) end
    if lo == hi then lo, hi = lo - 0.5, hi + 0.5 end
    local edges, step = {}, (hi - lo) / bins
    for i = 0, bins - 1 do edges[i + 1] = i * step + lo end
    edges[bins + 1] = hi
    return edges
  end
  local list = torch.is_tensor(bins) and torch._elements(bins) or bins
  if type(list) ~= "table" or #list < 2 then
    fail(who, "bins must be a positive integer, a list of at least two edges or \"tensorflow\", got " .. tostring(bins))
  end
  for i = 2, #list do
    if type(list[i]) ~= "number" or type(list[i - 1]) ~= "number" or not (list[i] >= list[i - 1]) then
      fail(who, "bin edges must be numbers that never decrease")
    end
  end
  return list
end

-- Counts per bin [e[i], e[i+1]) (the last bin closed), values outside left
-- out, as np.histogram counts them.
local function bin_counts(values, edges)
  local nb = #edges - 1
  local counts = {}
  for i = 1, nb do counts[i] = 0 end
  local first, last = edges[1], edges[nb + 1]
  for _, v in ipairs(values) do
    if v >= first and v <= last then
      local lo, hi = 1, nb + 1          -- the number of edges <= v, by bisection
      while lo < hi do
        local mid = math.floor((lo + hi) / 2)
        if edges[mid] <= v then lo = mid + 1 else hi = mid end
      end
      local b = math.min(lo - 1, nb)
      counts[b] = counts[b] + 1
    end
  end
  return counts
end

-- Merges groups of `every` bins (the last group padded with empty bins).
local function merge_bins(counts, edges, max_bins)
  local nb = #counts
  if not max_bins or nb <= max_bins then return counts, edges end
  local every = math.floor(nb / max_bins)
  local merged, limits = {}, {}
  for i = 1, nb, every do
    local s = 0
    for j = i, math.min(i + every - 1, nb) do s = s + counts[j] end
    merged[#merged + 1] = s
    limits[#limits + 1] = edges[i]
  end
  limits[#limits + 1] = edges[nb + 1]
  return merged, limits
end

-- The HistogramProto fields of values, with PyTorch's trimming: bins from
-- the first to the last non-empty one, and the bin before them (empty when
-- the first bin is the first), since TensorBoard keeps only right edges.
function M.histogram(values, bins, max_bins, who)
  who = who or "histogram"
  values = values_of(who, values)
  local lo, hi, sum, sq = math.huge, -math.huge, 0, 0
  for _, v in ipairs(values) do
    if v < lo then lo = v end
    if v > hi then hi = v end
    sum, sq = sum + v, sq + v * v
  end
  if max_bins ~= nil and (type(max_bins) ~= "number" or max_bins < 1 or max_bins % 1 ~= 0) then
    fail(who, "max_bins must be a positive integer or nil, got " .. tostring(max_bins))
  end
  local edges = bin_edges(who, bins, lo, hi)
  local counts, limits = merge_bins(bin_counts(values, edges), edges, max_bins)
  local start, stop
  for i, c in ipairs(counts) do
    if c > 0 then
      start = start or i
      stop = i
    end
  end
  if not start then fail(who, "no value falls within the bins") end
  local h = { min = lo, max = hi, num = #values, sum = sum, sum_squares = sq, bucket_limit = {}, bucket = {} }
  -- counts[start - 1 .. stop] (0 before the first bin) and their right edges
  for i = start - 1, stop do
    h.bucket[#h.bucket + 1] = i >= 1 and counts[i] or 0
    h.bucket_limit[#h.bucket_limit + 1] = limits[i + 1]
  end
  return h
end

---------------------------------------------------------------- the event file

local host_name, pid = torch._host_name, torch._pid
local files_made = 0

local EventFile = {}
EventFile.__index = EventFile

local function open_event_file(dir, opts, who)
  if torch.C.dp_make_dirs(dir) ~= 0 then fail(who, ffi.string(torch.C.dp_last_error())) end
  local now = report.wall_time()
  local path = format("%s/events.out.tfevents.%010d.%s.%s.%d%s", dir, math.floor(now), host_name, pid,
                      files_made, opts.filename_suffix or "")
  files_made = files_made + 1
  local f, err = io.open(path, "wb")
  if not f then fail(who, "cannot create an event file: " .. tostring(err)) end
  f:setvbuf("full")
  local self = setmetatable({ path = path, f = f, queued = 0, max_queue = opts.max_queue or 10,
                              flush_secs = opts.flush_secs or 120, last_flush = now }, EventFile)
  self:write(event(now, 0, 3, "brain.Event:2"))
  return self
end

function EventFile:write(data)
  self.f:write(tfrecord(data))
  self.queued = self.queued + 1
  if self.queued >= self.max_queue or report.wall_time() - self.last_flush >= self.flush_secs then self:flush() end
end

function EventFile:summary(values, step, wall_time)
  self:write(event(wall_time, step, 5, values))
end

function EventFile:flush()
  self.f:flush()
  self.queued, self.last_flush = 0, report.wall_time()
end

function EventFile:close()
  self.f:close()
end

---------------------------------------------------------------- SummaryWriter

local SummaryWriter = {}
SummaryWriter.__index = SummaryWriter

local writer_options = { comment = true, purge_step = true, max_queue = true, flush_secs = true, filename_suffix = true }

-- SummaryWriter(log_dir, {comment=, purge_step=, max_queue=10,
-- flush_secs=120, filename_suffix=}): PyTorch's arguments; log_dir nil is
-- runs/<Mon><DD>_<HH-MM-SS>_<host><comment>.
function M.SummaryWriter(log_dir, opts)
  local who = "SummaryWriter"
  if type(log_dir) == "table" and opts == nil then log_dir, opts = nil, log_dir end
  opts = opts or {}
  if type(opts) ~= "table" then fail(who, "options must be a table, got " .. type(opts)) end
  for k in pairs(opts) do
    if not writer_options[k] then
      fail(who, format("unknown option '%s' (known: %s)", tostring(k), concat(sorted_keys(writer_options), ", ")))
    end
  end
  if log_dir == nil then
    log_dir = "runs/" .. os.date("%b%d_%H-%M-%S") .. "_" .. host_name .. (opts.comment or "")
  elseif type(log_dir) ~= "string" or log_dir == "" then
    fail(who, "log_dir must be a directory path or nil, got " .. type(log_dir))
  end
  for _, k in ipairs({ "max_queue", "flush_secs" }) do
    local v = opts[k]
    if v ~= nil and (type(v) ~= "number" or v < 0) then fail(who, k .. " must be a number >= 0, got " .. tostring(v)) end
  end
  if opts.filename_suffix ~= nil and (type(opts.filename_suffix) ~= "string" or opts.filename_suffix:find("/")) then
    fail(who, "filename_suffix must be a string without '/'")
  end
  local purge = check_step(who, opts.purge_step)
  local self = setmetatable({ log_dir = log_dir, opts = opts, all_writers = {} }, SummaryWriter)
  local file = self:_file(who)
  if purge then
    -- SessionLog {status 1: START}: TensorBoard drops the events at and
    -- after this step that an earlier, interrupted run wrote
    file:write(event(report.wall_time(), purge, 7, f_varint(1, SESSION_START)))
  end
  return self
end

function SummaryWriter:get_logdir() return self.log_dir end

function SummaryWriter:_file(who)
  if not self.file then self.file = open_event_file(self.log_dir, self.opts, who) end
  return self.file
end

local function check_self(self, who)
  if getmetatable(self) ~= SummaryWriter then
    error(who .. ": call it as a method, writer:" .. who:match("[%w_]+$") .. "(...)", 3)
  end
end

-- add_scalar(tag, value, global_step, walltime, new_style, double_precision):
-- simple_value, or with new_style a tensor of the scalars plugin.
function SummaryWriter:add_scalar(tag, value, global_step, walltime, new_style, double_precision)
  local who = "SummaryWriter.add_scalar"
  check_self(self, who)
  check_tag(who, tag)
  local x = number_of(who, value, "scalar_value")
  local step, t = check_step(who, global_step), check_walltime(who, walltime)
  local fields
  if new_style then
    -- TensorProto: dtype 1, float_val 5 / double_val 6 (packed)
    local tensor = double_precision and (f_varint(1, DT_DOUBLE) .. f_bytes(6, fixed64_double(x)))
                   or (f_varint(1, DT_FLOAT) .. f_bytes(5, fixed32_float(x)))
    fields = f_bytes(8, tensor) .. plugin_metadata("scalars", "")
  else
    fields = f_float(2, x)
  end
  self:_file(who):summary(summary_value(tag, fields), step, t)
end

-- add_scalars(main_tag, {tag = value, ...}, global_step, walltime): each
-- tag in a run of its own, log_dir/<main_tag with '/' as '_'>_<tag>, under
-- the tag main_tag, so that TensorBoard draws them in one chart.
function SummaryWriter:add_scalars(main_tag, tag_scalar_dict, global_step, walltime)
  local who = "SummaryWriter.add_scalars"
  check_self(self, who)
  check_tag(who, main_tag, "main_tag")
  if type(tag_scalar_dict) ~= "table" or next(tag_scalar_dict) == nil then
    fail(who, "expected a table of tag = value, e.g. {train = 0.3, test = 0.4}, got " .. type(tag_scalar_dict))
  end
  local step, t = check_step(who, global_step), check_walltime(who, walltime)
  for _, tag in ipairs(sorted_keys(tag_scalar_dict)) do
    if type(tag) ~= "string" then fail(who, "tags must be strings, got " .. type(tag) .. " " .. tostring(tag)) end
    local x = number_of(who, tag_scalar_dict[tag], "the value of '" .. tag .. "'")
    local dir = self.log_dir .. "/" .. main_tag:gsub("/", "_") .. "_" .. tag
    local w = self.all_writers[dir]
    if not w then
      w = open_event_file(dir, self.opts, who)
      self.all_writers[dir] = w
    end
    w:summary(summary_value(main_tag, f_float(2, x)), step, t)
  end
end

-- add_histogram(tag, values, global_step, bins, walltime, max_bins): values
-- a tensor or a table of numbers; bins "tensorflow" (the default), a count
-- or a list of edges.
function SummaryWriter:add_histogram(tag, values, global_step, bins, walltime, max_bins)
  local who = "SummaryWriter.add_histogram"
  check_self(self, who)
  check_tag(who, tag)
  local step, t = check_step(who, global_step), check_walltime(who, walltime)
  if type(bins) == "string" and bins ~= "tensorflow" then
    fail(who, "bins must be \"tensorflow\", a count or a list of edges, got \"" .. bins .. "\"")
  end
  local h = M.histogram(values, bins, max_bins, who)
  self:_file(who):summary(summary_value(tag, f_bytes(5, histogram_proto(h))), step, t)
end

-- add_text(tag, text, global_step, walltime): the text plugin's string
-- tensor of shape [1], under tag/text_summary.
function SummaryWriter:add_text(tag, text, global_step, walltime)
  local who = "SummaryWriter.add_text"
  check_self(self, who)
  check_tag(who, tag)
  if type(text) ~= "string" then fail(who, "text_string must be a string, got " .. type(text)) end
  local step, t = check_step(who, global_step), check_walltime(who, walltime)
  -- TensorProto: dtype 1, tensor_shape 2 (TensorShapeProto.dim 2: Dim.size 1), string_val 8
  local tensor = f_varint(1, DT_STRING) .. f_bytes(2, f_bytes(2, f_varint(1, 1))) .. f_bytes(8, text)
  local fields = f_bytes(8, tensor) .. plugin_metadata("text", "")
  self:_file(who):summary(summary_value(tag .. "/text_summary", fields), step, t)
end

-- The hparams plugin's three summaries (HParamsPluginData: version 1,
-- experiment 2, session_start_info 3, session_end_info 4).
local function hparams_summaries(who, hparam_dict, metric_names, domains)
  local infos, start = {}, {}
  for _, k in ipairs(sorted_keys(hparam_dict)) do
    if type(k) ~= "string" then fail(who, "hyperparameter names must be strings, got " .. type(k)) end
    local v = hparam_dict[k]
    local kind
    if type(v) == "string" then kind = HP_STRING
    elseif type(v) == "boolean" then kind = HP_BOOL
    else
      v = number_of(who, v, "hyperparameter '" .. k .. "'")
      kind = HP_FLOAT64
    end
    -- SessionStartInfo.hparams: map<string, Value>, entries {key 1, value 2}
    start[#start + 1] = f_bytes(1, f_bytes(1, k) .. f_bytes(2, struct_value(v)))
    -- HParamInfo: name 1, type 4, domain_discrete 5 (ListValue: values 1)
    local domain = ""
    local d = domains and domains[k]
    if d ~= nil then
      if type(d) ~= "table" or #d == 0 then fail(who, format("hparam_domain_discrete['%s'] must be a list of values", k)) end
      local items = {}
      for i, x in ipairs(d) do
        if type(x) ~= "number" and type(x) ~= "string" and type(x) ~= "boolean" then
          fail(who, format("hparam_domain_discrete['%s'][%d] is a %s", k, i, type(x)))
        end
        items[i] = f_bytes(1, struct_value(x))
      end
      domain = f_bytes(5, concat(items))
    end
    infos[#infos + 1] = f_bytes(4, f_bytes(1, k) .. f_varint(4, kind) .. domain)
  end
  -- Experiment: hparam_infos 4, metric_infos 5 (MetricInfo.name 1: MetricName.tag 2)
  for _, m in ipairs(metric_names) do infos[#infos + 1] = f_bytes(5, f_bytes(1, f_bytes(2, m))) end
  local function plugin(data) return plugin_metadata("hparams", data) end
  return summary_value("_hparams_/experiment", plugin(f_bytes(2, concat(infos)))),
         summary_value("_hparams_/session_start_info", plugin(f_bytes(3, concat(start)))),
         summary_value("_hparams_/session_end_info", plugin(f_bytes(4, f_varint(1, STATUS_SUCCESS))))
end

-- add_hparams(hparam_dict, metric_dict, hparam_domain_discrete, run_name,
-- global_step): as PyTorch, in the run log_dir/run_name (default: the
-- time, a new run; "." is this writer's own run): the hparams plugin's
-- experiment, session start (the values) and session end, then each
-- metric as a scalar, which TensorBoard's HPARAMS tab shows beside them.
function SummaryWriter:add_hparams(hparam_dict, metric_dict, hparam_domain_discrete, run_name, global_step)
  local who = "SummaryWriter.add_hparams"
  check_self(self, who)
  if type(hparam_dict) ~= "table" or type(metric_dict) ~= "table" then
    fail(who, "expected hparam_dict and metric_dict tables, e.g. add_hparams({lr = 0.1}, {accuracy = 0.9}), got "
              .. type(hparam_dict) .. " and " .. type(metric_dict))
  end
  if hparam_domain_discrete ~= nil and type(hparam_domain_discrete) ~= "table" then
    fail(who, "hparam_domain_discrete must be a table of name = {values...} or nil")
  end
  local metrics = sorted_keys(metric_dict)
  local values = {}
  for _, m in ipairs(metrics) do
    if type(m) ~= "string" then fail(who, "metric names must be strings, got " .. type(m)) end
    values[m] = number_of(who, metric_dict[m], "metric '" .. m .. "'")
  end
  local step = check_step(who, global_step)
  local exp, ssi, sei = hparams_summaries(who, hparam_dict, metrics, hparam_domain_discrete)
  if run_name == nil then run_name = format("%.6f", report.wall_time()) end
  if type(run_name) ~= "string" or run_name == "" then fail(who, "run_name must be a non-empty string or nil") end
  local file, own = self:_file(who), run_name == "."
  if not own then file = open_event_file(self.log_dir .. "/" .. run_name, self.opts, who) end
  local t = report.wall_time()
  for _, s in ipairs({ exp, ssi, sei }) do file:summary(s, nil, t) end
  for _, m in ipairs(metrics) do file:summary(summary_value(m, f_float(2, values[m])), step, t) end
  if own then file:flush() else file:close() end
end

function SummaryWriter:flush()
  check_self(self, "SummaryWriter.flush")
  if self.file then self.file:flush() end
  for _, w in pairs(self.all_writers) do w:flush() end
end

-- Flushes and closes every file; a later add_* starts a new event file.
function SummaryWriter:close()
  check_self(self, "SummaryWriter.close")
  if self.file then self.file:close() end
  for _, w in pairs(self.all_writers) do w:close() end
  self.file, self.all_writers = nil, {}
end

return M
