-- dplua.report: what a training script needs to take part in a sweep.
--
--   local torch = require("dplua")
--   local hp = torch.hparams{lr = 1e-3, batch_size = 64}   -- defaults, overridden by the sweep
--   ...
--   torch.report{loss = loss, test_accuracy = acc}          -- once per epoch, say
--
-- torch.hparams is the table of hyperparameters that `dplua sweep` chose
-- for this trial (decoded from the JSON in $DPLUA_HPARAMS), or an empty
-- table when the script runs on its own. Calling it with a table of
-- defaults returns a new table: the defaults with the sweep's values put
-- over them. A sweep value for a number default may be a numeric string and
-- for a boolean "true"/"false"; a sweep key that the defaults do not name
-- is an error (a misspelt key would otherwise be silently ignored).
--
-- torch.report{...} records metrics: it appends one JSON line, the metrics
-- plus `wall_time` (seconds since 1970), to $DPLUA_REPORT_FILE when that is
-- set (the sweep driver reads it after the trial), and keeps the latest
-- value of each metric in report.last() either way. Metrics are numbers,
-- strings, booleans or one-element tensors. Under torch.distributed only
-- rank 0 writes.
local json = require("dplua.json")
local C = require("dplua").C

local M = {}

-- Seconds since 1970.
function M.wall_time() return C.dp_clock_wall() end

-- True unless torch.distributed is initialised and this is not rank 0.
-- Does not load the distributed module when the script has not.
function M.is_rank0()
  local dist = package.loaded["dplua.distributed"]
  if type(dist) ~= "table" or type(dist.is_initialized) ~= "function" then return true end
  local ok, init = pcall(dist.is_initialized)
  if not ok or not init then return true end
  local ok2, rank = pcall(dist.get_rank)
  return not ok2 or rank == 0
end

-- A metric value as JSON can hold it: numbers, strings and booleans stay,
-- a one-element tensor becomes its number. An error names `who` and
-- points `level` frames up (default 3: the caller's caller).
function M.plain_value(v, key, who, level)
  level = level or 3
  local ty = type(v)
  if ty == "number" or ty == "string" or ty == "boolean" then return v end
  if ty == "cdata" then
    local torch = package.loaded["dplua"]
    if torch and torch.is_tensor and torch.is_tensor(v) then
      if v:numel() ~= 1 then
        error(("%s: metric '%s' is a tensor of %d elements; pass one number"):format(who, key, v:numel()), level)
      end
      return v:item()
    end
    if tonumber(v) then return tonumber(v) end
  end
  error(("%s: metric '%s' is a %s; expected a number, string, boolean or one-element tensor")
        :format(who, tostring(key), ty), level)
end

-- A table of metrics, e.g. {loss = 0.3}, with plain values (plain_value)
-- under string names. Errors name `who` and point at its caller.
function M.plain_metrics(metrics, who, example)
  if type(metrics) ~= "table" then
    error(("%s: expected a table of metrics, e.g. %s, got %s"):format(who, example, type(metrics)), 3)
  end
  local line = {}
  for k, v in pairs(metrics) do
    if type(k) ~= "string" then
      error(("%s: metric names must be strings, got %s %s"):format(who, type(k), tostring(k)), 3)
    end
    line[k] = M.plain_value(v, k, who, 4)
  end
  return line
end

---------------------------------------------------------------- hparams

local function parse_hparams()
  local text = os.getenv("DPLUA_HPARAMS")
  if text == nil or text == "" then return {} end
  local v, err = json.decode(text)
  if v == nil then error("DPLUA_HPARAMS is not JSON: " .. err, 0) end
  if type(v) ~= "table" or v[1] ~= nil then
    error("DPLUA_HPARAMS must be a JSON object of hyperparameters, got: " .. text, 0)
  end
  for k, x in pairs(v) do
    if x == json.null then v[k] = nil end
  end
  return v
end

local function coerce(key, value, default)
  if type(default) == "number" and type(value) == "string" then
    local n = tonumber(value)
    if n == nil then
      error(("hparams: '%s' must be a number (default %s), the sweep gave %q"):format(key, tostring(default), value), 3)
    end
    return n
  end
  if type(default) == "boolean" and type(value) == "string" then
    if value == "true" then return true elseif value == "false" then return false end
    error(("hparams: '%s' must be a boolean, the sweep gave %q"):format(key, value), 3)
  end
  return value
end

-- torch.hparams(defaults): the defaults with this trial's values over them.
local function with_defaults(self, defaults)
  if type(defaults) ~= "table" then
    error("hparams: expected a table of defaults, e.g. torch.hparams{lr = 1e-3}, got " .. type(defaults), 2)
  end
  local out = {}
  for k, v in pairs(defaults) do out[k] = v end
  local unknown = {}
  for k, v in pairs(self) do
    if defaults[k] == nil then
      unknown[#unknown + 1] = tostring(k)
    else
      out[k] = coerce(k, v, defaults[k])
    end
  end
  if #unknown > 0 then
    local known = {}
    for k in pairs(defaults) do known[#known + 1] = tostring(k) end
    table.sort(unknown)
    table.sort(known)
    error(("hparams: the sweep sets %s, which the script's defaults do not name (they name: %s)")
          :format(table.concat(unknown, ", "), table.concat(known, ", ")), 2)
  end
  return out
end

-- A malformed $DPLUA_HPARAMS is an error when the hparams are used, not
-- when this module loads (the progress bar and the sweep driver load it too).
do
  local ok, hp = pcall(parse_hparams)
  if ok then
    M.hparams = setmetatable(hp, { __call = with_defaults })
  else
    local function fail() error(hp, 2) end
    M.hparams = setmetatable({}, { __index = fail, __call = fail })
  end
end

---------------------------------------------------------------- report

local last = {}
local report_path = os.getenv("DPLUA_REPORT_FILE")
if report_path == "" then report_path = nil end

-- torch.report{name = value, ...}: see the top of the file.
function M.report(metrics)
  local line = M.plain_metrics(metrics, "report", "torch.report{loss = 0.3}")
  for k, v in pairs(line) do last[k] = v end
  if line.wall_time == nil then line.wall_time = M.wall_time() end
  if report_path and M.is_rank0() then
    local f, err = io.open(report_path, "a")
    if not f then error("report: cannot append to DPLUA_REPORT_FILE: " .. tostring(err), 2) end
    f:write(json.encode(line, { order = { "step", "epoch" } }), "\n")
    f:close()
  end
end

-- A copy of the latest value of every metric reported so far.
function M.last()
  local t = {}
  for k, v in pairs(last) do t[k] = v end
  return t
end

-- The file torch.report writes to, or nil outside a sweep.
function M.report_file() return report_path end

return M
