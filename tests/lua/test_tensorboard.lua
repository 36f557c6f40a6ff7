-- torch.utils.tensorboard.SummaryWriter: the event files it writes are read
-- back by an independent reader, tests/tensorboard/read_events.py (Debian's
-- python3-protobuf, with protoc compiling the published .proto schemas
-- beside it), which checks every record's two CRC-32Cs and that each Event
-- re-encodes to the same bytes; the values it decodes are compared with
-- what was written, and histograms with PyTorch's algorithm run by NumPy
-- (scripts/gen_tensorboard_ref.py -> tests/ref/tensorboard_histograms.lua).
-- Without the reader (no python3, protoc or python3-protobuf) this test
-- fails: scripts/setup-debian installs them.
local dir = os.getenv("DPLUA_TEST_DIR") or (debug.getinfo(1, "S").source:match("^@(.*)/lua/") or "tests")
package.path = dir .. "/lua/?.lua;" .. package.path
local T = require("tap")
local ffi = require("ffi")
local torch = require("dplua")
local json = require("dplua.json")
local tb = torch.utils.tensorboard
local SummaryWriter = tb.SummaryWriter

local python = "/usr/bin/python3"
local reader = dir .. "/tensorboard/read_events.py"

-- The decoded files under path: { [run] = { {file=, events=}, ... } }, or
-- nil and the reader's complaint.
local function read_events(path)
  local tmp = T.temp_dir("tb-out")
  local out = tmp .. "/events.json"
  local p = io.popen(python .. " " .. T.sh_quote(reader) .. " " .. T.sh_quote(path) .. " >" .. T.sh_quote(out) .. " 2>&1; echo $?")
  local status = tonumber(p:read("*a"))
  p:close()
  local text = T.read_file(out)
  os.execute("rm -rf " .. T.sh_quote(tmp))
  if status ~= 0 then return nil, text end
  local files = assert(json.decode(text))
  local runs = {}
  for _, f in ipairs(files) do
    runs[f.run] = runs[f.run] or {}
    table.insert(runs[f.run], f)
  end
  return runs
end

-- The summary values of a run's events (its files in name order): a list
-- of {step=, wall_time=, value=} in order.
local function values_of(run)
  local out = {}
  for _, f in ipairs(run or {}) do
    for _, e in ipairs(f.events) do
      for _, v in ipairs(e.summary and e.summary.value or {}) do
        out[#out + 1] = { step = e.step, wall_time = e.wall_time, value = v }
      end
    end
  end
  return out
end

local function float32(x) return tonumber(ffi.new("float", x)) end

local function close_list(got, want, rtol, name)
  if type(got) ~= "table" or #got ~= #want then
    return T.ok(false, name .. string.format(" (%s values, expected %d)", type(got) == "table" and #got or type(got), #want))
  end
  for i = 1, #want do
    local g, w = got[i], want[i]
    if not (math.abs(g - w) <= rtol * math.abs(w)) then
      return T.ok(false, string.format("%s (entry %d: %.17g, expected %.17g)", name, i, g, w))
    end
  end
  T.ok(true, name)
end

---------------------------------------------------------------- CRC-32C

-- Check values: the CRC catalogue's "123456789", and RFC 3720 (iSCSI) B.4.
T.is(tb.crc32c("123456789"), 0xE3069283, "crc32c('123456789') = 0xE3069283")
T.is(tb.crc32c(""), 0, "crc32c of nothing is 0")
T.is(tb.crc32c(string.rep("\0", 32)), 0x8A9136AA, "crc32c of 32 zero bytes (RFC 3720)")
T.is(tb.crc32c(string.rep("\255", 32)), 0x62A8AB43, "crc32c of 32 0xFF bytes (RFC 3720)")
local ascending = {}
for i = 0, 31 do ascending[#ascending + 1] = string.char(i) end
T.is(tb.crc32c(table.concat(ascending)), 0x46DD794E, "crc32c of 0..31 (RFC 3720)")

---------------------------------------------------------------- the reader

local ok_reader = os.execute(python .. " -c 'import google.protobuf' >/dev/null 2>&1") == 0
                  and os.execute("command -v protoc >/dev/null 2>&1") == 0
T.ok(ok_reader, "the reader's needs are installed (python3-protobuf, protobuf-compiler: scripts/setup-debian)")

-- A damaged file is refused: the reader's CRC checks work.
do
  local d = T.temp_dir("tb-bad")
  local w = SummaryWriter(d)
  w:add_scalar("x", 1, 1)
  w:close()
  local p = io.popen("ls " .. T.sh_quote(d))
  local name = p:read("*l")
  p:close()
  local bytes = T.read_file(d .. "/" .. name)
  local _, err = read_events(d)
  T.ok(err == nil, "the reader accepts an intact file" .. (err and (": " .. err) or ""))
  -- flip one bit of the last record's data
  local i = #bytes - 6
  T.write_file(d .. "/" .. name, bytes:sub(1, i - 1) .. string.char(bit.bxor(bytes:byte(i), 1)) .. bytes:sub(i + 1))
  _, err = read_events(d)
  T.ok(err and err:find("data's CRC"), "the reader refuses a flipped bit: " .. tostring(err))
  T.write_file(d .. "/" .. name, bytes:sub(1, -2))
  _, err = read_events(d)
  T.ok(err and err:find("past the end"), "the reader refuses a file cut short: " .. tostring(err))
  os.execute("rm -rf " .. T.sh_quote(d))
end

---------------------------------------------------------------- a run of everything

local root = T.temp_dir("tb")
local logdir = root .. "/run"
local w = SummaryWriter(logdir, { purge_step = 7 })
T.is(w:get_logdir(), logdir, "get_logdir")
local losses = { 2.5, 1.25, 0.1, 1 / 3, -7e-3 }
for i, l in ipairs(losses) do w:add_scalar("loss/train", l, i * 10, 1718000000 + i) end
w:add_scalar("tensor_value", torch.tensor({ 0.75 }), 2 ^ 40)
w:add_scalar("no_step", 4)
w:add_scalar("negative_step", 1, -3)
w:add_scalar("new_style", 0.2, 1, nil, true)
w:add_scalars("loss", { train = 0.5, test = 0.75 }, 3)
w:add_scalars("loss", { train = 0.25, test = 0.5 }, 4)
w:add_text("notes", "lr warm-up — 100 steps\nline two", 5)
local ref_hist = dofile(dir .. "/ref/tensorboard_histograms.lua")
for i, c in ipairs(ref_hist) do
  local values = c.values
  if i == 1 then values = torch.tensor(c.values, { dtype = torch.float64 }) end   -- a tensor, once
  w:add_histogram("hist/" .. i, values, i, c.bins, nil, c.max_bins)
end
w:add_hparams({ lr = 1e-3, optimizer = "adam", nesterov = true, layers = torch.tensor(3) },
              { ["hparam/accuracy"] = 0.875, ["hparam/loss"] = 0.25 },
              { optimizer = { "adam", "sgd" } }, "hp")
w:flush()

local runs, err = read_events(logdir)
T.ok(runs ~= nil, "the reader decodes every file and every CRC matches" .. (err and (": " .. err) or ""))
runs = runs or {}

T.run("file names and the first record", function()
  local main = assert(runs["."], "no event file in the log dir")
  T.is(#main, 1, "one event file in the log dir")
  local host = io.open("/proc/sys/kernel/hostname"):read("*l")
  local t, h, pid, n = main[1].file:match("^events%.out%.tfevents%.(%d+)%.(.+)%.(%d+)%.(%d+)$")
  T.ok(t and #t == 10 and h == host:gsub("[^%w%.%-_]", "_") and tonumber(pid) > 0 and n,
       "events.out.tfevents.<time>.<host>.<pid>.<n>: " .. main[1].file)
  local first = main[1].events[1]
  T.is(first.file_version, "brain.Event:2", "the first event is file_version brain.Event:2")
  T.is(main[1].events[2].session_log, { status = "START" }, "purge_step writes a SessionLog START")
  T.is(main[1].events[2].step, 7, "... at the purge step")
end)

local main = values_of(runs["."])
local function find(tag)
  local out = {}
  for _, v in ipairs(main) do if v.value.tag == tag then out[#out + 1] = v end end
  return out
end

T.run("scalars", function()
  local got = find("loss/train")
  T.is(#got, #losses, "every add_scalar is an event")
  for i, l in ipairs(losses) do
    T.is(got[i].value.simple_value, float32(l), "simple_value " .. i .. " is the float32 of the value")
    T.is(got[i].step, i * 10, "global_step " .. i)
    T.is(got[i].wall_time, 1718000000 + i, "walltime " .. i)
  end
  local tv = find("tensor_value")[1]
  T.is(tv.value.simple_value, 0.75, "a one-element tensor is its value")
  T.is(tv.step, 2 ^ 40, "a step beyond 32 bits")
  T.is(find("no_step")[1].step, 0, "no global_step is step 0")
  T.is(find("negative_step")[1].step, -3, "a negative step (10-byte varint)")
  local now = torch.C.dp_clock_wall()
  T.ok(math.abs(find("no_step")[1].wall_time - now) < 3600, "walltime defaults to now")
  local ns = find("new_style")[1].value
  T.is(ns.tensor.dtype, "DT_FLOAT", "new_style: a float tensor")
  T.close(ns.tensor.float_val[1], float32(0.2), 1e-7, 0, "new_style: its value (the reader prints a float's shortest form)")
  T.is(ns.metadata.plugin_data.plugin_name, "scalars", "new_style: the scalars plugin")
end)

T.run("add_scalars writes one run per tag", function()
  for tag, want in pairs({ train = { 0.5, 0.25 }, test = { 0.75, 0.5 } }) do
    local got = values_of(runs["loss_" .. tag])
    T.is(#got, 2, "run loss_" .. tag)
    for i = 1, 2 do
      T.is(got[i].value.tag, "loss", "its tag is the main tag")
      T.is(got[i].value.simple_value, want[i], "loss_" .. tag .. " value " .. i)
      T.is(got[i].step, i + 2, "loss_" .. tag .. " step " .. i)
    end
  end
end)

T.run("text", function()
  local v = find("notes/text_summary")[1]
  T.ok(v, "the tag is TAG/text_summary")
  T.is(v.value.text, { "lr warm-up — 100 steps\nline two" }, "the string, UTF-8 intact")
  T.is(v.value.tensor.dtype, "DT_STRING", "a string tensor")
  T.is(v.value.tensor.tensor_shape, { dim = { { size = "1" } } }, "of shape [1]")
  T.is(v.value.metadata.plugin_data.plugin_name, "text", "the text plugin")
  T.is(v.step, 5, "its step")
end)

T.run("histograms against PyTorch's algorithm (NumPy)", function()
  for i, c in ipairs(ref_hist) do
    local v = find("hist/" .. i)[1]
    local h = v and v.value.histo
    if not h then
      T.ok(false, c.name .. ": no histogram")
    else
      T.is(h.num, c.num, c.name .. ": num")
      -- proto3 leaves out a field at its default: an absent min is 0
      T.is(h.min or 0, c.min, c.name .. ": min")
      T.is(h.max or 0, c.max, c.name .. ": max")
      T.close(h.sum, c.sum, 1e-12, 1e-12, c.name .. ": sum")
      T.close(h.sum_squares, c.sum_squares, 1e-12, 1e-12, c.name .. ": sum_squares")
      T.is(h.bucket, c.bucket, c.name .. ": bucket counts")
      close_list(h.bucket_limit, c.bucket_limit, 1e-15, c.name .. ": bucket limits")
      T.is(v.step, i, c.name .. ": step")
    end
  end
end)

T.run("hparams", function()
  local hp = values_of(runs["hp"])
  T.is(#hp, 5, "the run_name sub-run holds three plugin summaries and two metrics")
  local tags = {}
  for i, v in ipairs(hp) do tags[i] = v.value.tag end
  T.is(tags, { "_hparams_/experiment", "_hparams_/session_start_info", "_hparams_/session_end_info",
               "hparam/accuracy", "hparam/loss" }, "the tags, in PyTorch's order")
  for i = 1, 3 do T.is(hp[i].value.metadata.plugin_data.plugin_name, "hparams", "the hparams plugin " .. i) end
  T.is(hp[1].value.hparams, { experiment = {
    hparam_infos = {
      { name = "layers", type = "DATA_TYPE_FLOAT64" },
      { name = "lr", type = "DATA_TYPE_FLOAT64" },
      { name = "nesterov", type = "DATA_TYPE_BOOL" },
      { name = "optimizer", type = "DATA_TYPE_STRING", domain_discrete = { "adam", "sgd" } },
    },
    metric_infos = { { name = { tag = "hparam/accuracy" } }, { name = { tag = "hparam/loss" } } },
  } }, "the experiment: each hyperparameter's type and domain, each metric")
  T.is(hp[2].value.hparams, { session_start_info = { hparams = {
    layers = 3, lr = 1e-3, nesterov = true, optimizer = "adam" } } }, "the session's values")
  T.is(hp[3].value.hparams, { session_end_info = { status = "STATUS_SUCCESS" } }, "the session ends in success")
  T.is(hp[4].value.simple_value, 0.875, "metric hparam/accuracy")
  T.is(hp[5].value.simple_value, 0.25, "metric hparam/loss")
end)

T.run("close, then a new file; run_name '.' and a default run_name", function()
  w:close()
  w:close()
  w:add_scalar("after_close", 1, 1)
  w:add_hparams({ x = 1 }, { m = 2 }, nil, ".", 9)
  w:add_hparams({ x = 2 }, { m = 3 })
  w:close()
  local again = assert(read_events(logdir))
  T.is(#again["."], 2, "a second event file in the log dir")
  local second = values_of({ again["."][2] })
  T.is(second[1].value.tag, "after_close", "it holds what came after close")
  T.is(second[2].value.tag, "_hparams_/experiment", "run_name '.' writes into the writer's own run")
  T.is(second[5].value.simple_value, 2, "... with its metric")
  T.is(second[5].step, 9, "... at global_step")
  local timed = 0
  for run in pairs(again) do if run:match("^%d+%.%d+$") then timed = timed + 1 end end
  T.is(timed, 1, "no run_name: a sub-run named by the time")
end)

T.run("the default log dir", function()
  local program = arg[-1] or "dplua"
  if program:find("/") and program:sub(1, 1) ~= "/" then program = io.popen("pwd"):read("*l") .. "/" .. program end
  local d = T.temp_dir("tb-default")
  local f = io.popen("cd " .. T.sh_quote(d) .. " && " .. T.sh_quote(program)
                     .. " -e 'local w = require(\"dplua\").utils.tensorboard.SummaryWriter(nil, {comment = \"_c\"}) print(w:get_logdir()) w:close()'")
  local got = f:read("*l")
  f:close()
  T.ok(got and got:match("^runs/%a%a%a%d%d_%d%d%-%d%d%-%d%d_.+_c$"), "runs/<Mon><DD>_<HH-MM-SS>_<host><comment>: " .. tostring(got))
  os.execute("rm -rf " .. T.sh_quote(d))
end)

---------------------------------------------------------------- mistakes

local bad = SummaryWriter(root .. "/bad")
T.raises(function() bad:add_scalar(nil, 1) end, "add_scalar: tag must be a non%-empty string, got nil", "a missing tag")
T.raises(function() bad:add_scalar("x", "high") end, "scalar_value must be a number or a one%-element tensor, got string", "a string value")
T.raises(function() bad:add_scalar("x", torch.ones(3)) end, "tensor of 3 elements", "a tensor of three elements")
T.raises(function() bad:add_scalar("x", 1, 1.5) end, "global_step must be an integer", "a fractional step")
T.raises(function() bad.add_scalar("x", 1) end, "call it as a method, writer:add_scalar", "a call with . instead of :")
T.raises(function() bad:add_scalars("x", 1) end, "expected a table of tag = value", "add_scalars without a table")
T.raises(function() bad:add_histogram("h", {}) end, "values are empty", "an empty histogram")
T.raises(function() bad:add_histogram("h", { 1, 0 / 0 }) end, "values%[2%] is nan; a histogram needs finite values", "a NaN in a histogram")
T.raises(function() bad:add_histogram("h", { 1, 2 }, 0, "auto") end, "bins must be \"tensorflow\", a count or a list of edges", "numpy's bin rules are not taken")
T.raises(function() bad:add_histogram("h", { 1, 2 }, 0, { 3, 2 }) end, "never decrease", "decreasing edges")
T.raises(function() bad:add_histogram("h", { 5, 6 }, 0, { 0, 1 }) end, "no value falls within the bins", "no value within the bins")
T.raises(function() bad:add_text("t", 5) end, "text_string must be a string, got number", "text that is not a string")
T.raises(function() bad:add_hparams({ lr = {} }, {}) end, "hyperparameter 'lr' must be a number", "a table as a hyperparameter")
T.raises(function() bad:add_hparams({ lr = 1 }, nil) end, "expected hparam_dict and metric_dict tables", "no metric table")
T.raises(function() SummaryWriter("x", { flush_sec = 1 }) end, "unknown option 'flush_sec'", "a misspelt option")
T.raises(function() SummaryWriter(5) end, "log_dir must be a directory path or nil, got number", "a number as log_dir")
T.raises(function() SummaryWriter("/proc/no/such/dir") end, "SummaryWriter", "a log dir that cannot be made")
bad:close()

os.execute("rm -rf " .. T.sh_quote(root))
T.done_testing()
