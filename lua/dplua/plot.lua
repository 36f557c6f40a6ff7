-- dplua.plot: `dplua plot METRICS.jsonl... -o OUT.svg`, line charts of
-- metrics logged as JSON lines (MetricsLogger, torch.report, anything with
-- one JSON object per line).
--
--   dplua plot run/metrics.jsonl -o loss.svg
--   dplua plot a.jsonl b.jsonl -o cmp.svg --y loss,acc --log loss
--   dplua plot run/metrics.jsonl -o loss.png      # via rsvg-convert or ImageMagick
--
-- Every numeric field becomes a panel of its own (its own y axis: a loss
-- and a learning rate differ by orders of magnitude), drawn against `step`
-- (or --x NAME; the line number when no record has it). Panels are stacked
-- and share the x range. With several files each panel has one line per
-- file, and the legend names the files, or for the reports of sweep trials
-- (SWEEP.logs/trial-NNN.report.jsonl) their hyperparameters, which the
-- sweep heads each trial's log with. The SVG is written directly, with
-- no plotting program; PNG output converts it with rsvg-convert or
-- ImageMagick when one is installed.
local command = require("dplua.command")
local json = require("dplua.json")

local M = {}

local format, concat, floor, log10 = string.format, table.concat, math.floor, math.log10

-- Fields that are not drawn unless asked for with --y.
local not_metrics = { step = true, time = true, wall_time = true, epoch = true }

-- Matplotlib's tab10: distinct, and readable on white.
local palette = { "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                  "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf" }

local plot_error = command.fail

---------------------------------------------------------------- data

local function finite(v) return type(v) == "number" and v == v and v ~= math.huge and v ~= -math.huge end

-- The hyperparameters of a sweep trial's report (SWEEP.logs/trial-NNN
-- .report.jsonl): the "# DPLUA_HPARAMS=" line that `dplua sweep` writes at
-- the head of the trial's log (trial-NNN.log beside it); nil for others.
-- Second, where the sweep pruned the trial: "epoch = 3" from the log's
-- "# dplua sweep: pruned at epoch = 3" line, or nil.
local function trial_hparams(path)
  local base = path:match("^(.*)%.report%.jsonl$")
  local f = base and io.open(base .. ".log", "r")
  if not f then return nil end
  local hparams, pruned
  for line in f:lines() do
    local text = line:match("^# DPLUA_HPARAMS=(.*)$")
    if text and not hparams then
      local v = json.decode((text:gsub("  CUDA_VISIBLE_DEVICES=%S*$", "")))
      if type(v) == "table" and v[1] == nil then hparams = v end
    end
    pruned = line:match("^# dplua sweep: pruned at (.*)$") or pruned
  end
  f:close()
  return hparams, pruned
end

-- Reads one JSONL file: {name=, records={...}, hparams=}. Lines that are not JSON
-- objects are skipped with a warning (the last line of a running job may be
-- cut short).
local function read_file(path)
  local records, bad = json.read_lines(path)
  if not records then plot_error("cannot read " .. path .. ": " .. tostring(bad)) end
  for i, b in ipairs(bad) do
    if i > 3 then io.stderr:write(format("dplua plot: ... and %d more lines that are not JSON\n", #bad - 3)); break end
    io.stderr:write("dplua plot: skipping ", b, "\n")
  end
  local objects = {}
  for _, r in ipairs(records) do
    if type(r) == "table" then objects[#objects + 1] = r end
  end
  local hparams, pruned = trial_hparams(path)
  return { name = path:match("([^/]+)$") or path, path = path, records = objects, hparams = hparams, pruned = pruned }
end

-- The legend's name of each file: a sweep trial's hyperparameters (those
-- that differ between the trials drawn, or all when none differ), else
-- the file name; a name two files would share gets the file name added,
-- and a trial the sweep pruned says where.
local function legend_labels(files)
  local values, differ = {}, {}
  for _, f in ipairs(files) do
    for k, v in pairs(f.hparams or {}) do
      local shown = json.encode(v)
      if values[k] ~= nil and values[k] ~= shown then differ[k] = true end
      values[k] = shown
    end
  end
  for _, f in ipairs(files) do   -- a name that some trials lack differs too
    if f.hparams then
      for k in pairs(values) do if f.hparams[k] == nil then differ[k] = true end end
    end
  end
  local show_config = next(values) and require("dplua.sweep").show_config
  local labels, count = {}, {}
  for i, f in ipairs(files) do
    local label = f.name
    if f.hparams then
      local shown = {}
      for k, v in pairs(f.hparams) do
        if next(differ) == nil or differ[k] then shown[k] = v end
      end
      label = show_config(shown)
    end
    labels[i] = label
    count[label] = (count[label] or 0) + 1
  end
  for i, f in ipairs(files) do
    if count[labels[i]] > 1 and labels[i] ~= f.name then labels[i] = labels[i] .. " (" .. f.name .. ")" end
  end
  for i, f in ipairs(files) do
    if f.pruned then labels[i] = labels[i] .. " (pruned at " .. f.pruned .. ")" end
  end
  return labels
end

-- The metrics to draw: those asked for, or every numeric field but x and
-- the clock fields; "loss" first, then fields holding "loss", then the rest.
local function pick_metrics(files, x, wanted)
  if wanted then return wanted end
  local seen = {}
  for _, f in ipairs(files) do
    for _, r in ipairs(f.records) do
      for k, v in pairs(r) do
        if type(k) == "string" and type(v) == "number" and k ~= x and not not_metrics[k] then seen[k] = true end
      end
    end
  end
  local list = {}
  for k in pairs(seen) do list[#list + 1] = k end
  local function rank(k) return k == "loss" and 0 or (k:find("loss") and 1 or 2) end
  table.sort(list, function(a, b)
    if rank(a) ~= rank(b) then return rank(a) < rank(b) end
    return a < b
  end)
  return list
end

-- The points of one metric in one file: a list of runs (a missing or
-- non-finite value, or a non-positive one on a log axis, breaks the line).
local function series(file, x, metric, logy)
  local use_index = true
  for _, r in ipairs(file.records) do
    if type(r[x]) == "number" then use_index = false; break end
  end
  local runs, cur, n = {}, {}, 0
  for i, r in ipairs(file.records) do
    local xv, yv = use_index and i or r[x], r[metric]
    -- a record without the metric is skipped (metrics logged at different
    -- rates share a file); null, NaN or a value a log axis cannot show
    -- breaks the line
    if yv ~= nil and finite(xv) then
      if finite(yv) and (not logy or yv > 0) then
        cur[#cur + 1] = { xv, yv }
        n = n + 1
      elseif #cur > 0 then
        runs[#runs + 1] = cur
        cur = {}
      end
    end
  end
  if #cur > 0 then runs[#runs + 1] = cur end
  return runs, n, use_index
end

---------------------------------------------------------------- scales

-- 1, 2, 2.5 or 5 times a power of ten, near range / n.
local function nice_step(range, n)
  local raw = range / n
  local p = 10 ^ floor(log10(raw))
  local m = raw / p
  local s = m < 1.5 and 1 or m < 2.25 and 2 or m < 3.5 and 2.5 or m < 7.5 and 5 or 10
  return s * p
end

-- A linear axis over [lo, hi]: the domain (widened to whole ticks when
-- `round` is set) and the ticks.
local function linear_axis(lo, hi, n, round)
  if lo == hi then
    local d = lo == 0 and 1 or math.abs(lo) * 0.1
    lo, hi = lo - d, hi + d
  end
  local step = nice_step(hi - lo, n)
  if round then
    lo, hi = floor(lo / step + 1e-9) * step, math.ceil(hi / step - 1e-9) * step
  end
  local ticks = {}
  local k = math.ceil(lo / step - 1e-9)
  while k * step <= hi + step * 1e-9 do
    local v = k * step
    if math.abs(v) < step * 1e-9 then v = 0 end
    ticks[#ticks + 1] = v
    k = k + 1
  end
  return { lo = lo, hi = hi, ticks = ticks, log = false,
           map = function(v) return (v - lo) / (hi - lo) end }
end

-- A log10 axis over [lo, hi] (both > 0), padded by 5%: ticks at the
-- decades, with 2 and 5 (or every digit) between them when it spans few.
local function log_axis(lo, hi)
  local a, b = log10(lo), log10(hi)
  if b - a < 1e-12 then a, b = a - 0.5, b + 0.5 end
  local pad = (b - a) * 0.05
  a, b = a - pad, b + pad
  local span = b - a
  local mults = span > 4 and { 1 } or span > 0.8 and { 1, 2, 5 } or span > 0.4 and { 1, 2, 3, 5 }
                or { 1, 2, 3, 4, 5, 6, 7, 8, 9 }
  local every = math.max(1, math.ceil(span / 8))
  local ticks = {}
  for d = floor(a), math.ceil(b) do
    if d % every == 0 or #mults > 1 then
      for _, m in ipairs(mults) do
        local v = m * 10 ^ d
        local lv = log10(v)
        if lv >= a - 1e-9 and lv <= b + 1e-9 then ticks[#ticks + 1] = v end
      end
    end
  end
  if #ticks < 2 then   -- a narrow range between two digits: linear ticks in it
    ticks = linear_axis(10 ^ a, 10 ^ b, 4, false).ticks
  end
  return { lo = 10 ^ a, hi = 10 ^ b, ticks = ticks, log = true,
           map = function(v) return (log10(v) - a) / (b - a) end }
end

-- "0.3", "1500", "1e-4", "2.5e6".
local function tick_label(v)
  if v == 0 then return "0" end
  local s = format("%.6g", v)
  if math.abs(v) >= 1e6 or math.abs(v) < 1e-4 then s = format("%.3g", v) end
  s = s:gsub("e([-+])0*(%d)", function(sign, d) return "e" .. (sign == "-" and "-" or "") .. d end)
  return s
end
M.tick_label = tick_label

---------------------------------------------------------------- SVG

local function esc(s)
  return (tostring(s):gsub("[&<>\"']", { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;",
                                         ['"'] = "&quot;", ["'"] = "&apos;" }))
end

local function num(v) return (format("%.2f", v):gsub("%.?0+$", "")) end

-- At most about two points per pixel column: the first, lowest, highest
-- and last point of each column, in their order (only for x that never
-- decreases; otherwise every point is kept).
local function thin(run, px)
  if #run <= 4 * px then return run end
  for i = 2, #run do if run[i][1] < run[i - 1][1] then return run end end
  local x0, x1 = run[1][1], run[#run][1]
  if x1 == x0 then return run end
  local out, bucket, members = {}, nil, {}
  local function flush()
    if #members == 0 then return end
    local lo, hi = members[1], members[1]
    for _, p in ipairs(members) do
      if p[2] < lo[2] then lo = p end
      if p[2] > hi[2] then hi = p end
    end
    local keep = { [members[1]] = true, [lo] = true, [hi] = true, [members[#members]] = true }
    for _, p in ipairs(members) do if keep[p] then out[#out + 1] = p end end
    members = {}
  end
  for _, p in ipairs(run) do
    local b = floor((p[1] - x0) / (x1 - x0) * px)
    if b ~= bucket then flush(); bucket = b end
    members[#members + 1] = p
  end
  flush()
  return out
end

-- A panel's geometry: the frame and the maps from data to pixels.
local function frame_of(p, layout, xaxis)
  local f = { L = layout.left, W = layout.plot_w, top = p.top, H = layout.plot_h }
  function f.px(x) return f.L + xaxis.map(x) * f.W end
  function f.py(y) return f.top + f.H - p.yaxis.map(y) * f.H end
  return f
end

-- The frame, grid lines, ticks with their labels, and the axis labels.
local function axes_svg(out, p, f, layout, xaxis)
  local L, W, top, H = f.L, f.W, f.top, f.H
  out[#out + 1] = format('<rect class="frame" x="%s" y="%s" width="%s" height="%s" fill="#fcfcfc" stroke="#444" stroke-width="1"/>',
                         num(L), num(top), num(W), num(H))
  for _, t in ipairs(p.yaxis.ticks) do
    local y = f.py(t)
    out[#out + 1] = format('<line class="grid" x1="%s" y1="%s" x2="%s" y2="%s" stroke="#e0e0e0" stroke-width="1"/>',
                           num(L), num(y), num(L + W), num(y))
    out[#out + 1] = format('<line class="tick" x1="%s" y1="%s" x2="%s" y2="%s" stroke="#444"/>', num(L - 5), num(y), num(L), num(y))
    out[#out + 1] = format('<text class="ytick" x="%s" y="%s" text-anchor="end" dominant-baseline="middle">%s</text>',
                           num(L - 8), num(y), esc(tick_label(t)))
  end
  for _, t in ipairs(xaxis.ticks) do
    local x = f.px(t)
    out[#out + 1] = format('<line class="grid" x1="%s" y1="%s" x2="%s" y2="%s" stroke="#e0e0e0" stroke-width="1"/>',
                           num(x), num(top), num(x), num(top + H))
    out[#out + 1] = format('<line class="tick" x1="%s" y1="%s" x2="%s" y2="%s" stroke="#444"/>', num(x), num(top + H), num(x), num(top + H + 5))
    out[#out + 1] = format('<text class="xtick" x="%s" y="%s" text-anchor="middle">%s</text>',
                           num(x), num(top + H + 18), esc(tick_label(t)))
  end
  local ylabel = p.metric .. (p.yaxis.log and " (log scale)" or "")
  local cy = top + H / 2
  out[#out + 1] = format('<text class="ylabel" x="%s" y="%s" text-anchor="middle" font-size="13" transform="rotate(-90 %s %s)">%s</text>',
                         num(layout.ylabel_x), num(cy), num(layout.ylabel_x), num(cy), esc(ylabel))
  out[#out + 1] = format('<text class="xlabel" x="%s" y="%s" text-anchor="middle" font-size="13">%s</text>',
                         num(L + W / 2), num(top + H + 36), esc(layout.xlabel))
end

-- The lines, clipped to the frame, and markers on short series (a point
-- per epoch, say). Returns the pixel positions drawn.
local function lines_svg(out, p, f, id)
  out[#out + 1] = format('<clipPath id="clip-%d"><rect x="%s" y="%s" width="%s" height="%s"/></clipPath>',
                         id, num(f.L), num(f.top), num(f.W), num(f.H))
  out[#out + 1] = format('<g clip-path="url(#clip-%d)">', id)
  local drawn = {}
  for _, s in ipairs(p.series) do
    for _, run in ipairs(s.runs) do
      local pts = {}
      for _, pt in ipairs(thin(run, f.W)) do
        local X, Y = f.px(pt[1]), f.py(pt[2])
        pts[#pts + 1] = num(X) .. "," .. num(Y)
        drawn[#drawn + 1] = { X, Y }
      end
      out[#out + 1] = format('<polyline class="series" data-metric="%s" data-file="%s" fill="none" stroke="%s" stroke-width="1.6" stroke-linejoin="round" points="%s"/>',
                             esc(p.metric), esc(s.file), s.color, concat(pts, " "))
    end
  end
  out[#out + 1] = "</g>"
  for _, s in ipairs(p.series) do
    if s.count <= 50 then
      for _, run in ipairs(s.runs) do
        for _, pt in ipairs(run) do
          out[#out + 1] = format('<circle cx="%s" cy="%s" r="2.5" fill="%s"/>', num(f.px(pt[1])), num(f.py(pt[2])), s.color)
        end
      end
    end
  end
  return drawn
end

-- How many drawn points (and samples of the segments between them) fall
-- in the box at x, y of size w, h.
local function covered(drawn, x, y, w, h)
  local hits = 0
  for i, d in ipairs(drawn) do
    local e = drawn[i + 1]
    for k = 0, (e and 4 or 0) do
      local X = e and d[1] + (e[1] - d[1]) * k / 5 or d[1]
      local Y = e and d[2] + (e[2] - d[2]) * k / 5 or d[2]
      if X >= x - 4 and X <= x + w + 4 and Y >= y - 4 and Y <= y + h + 4 then hits = hits + 1 end
    end
  end
  return hits
end

-- The legend, in the inside corner that hides the fewest points.
local function legend_svg(out, p, f, drawn)
  local lw = 0
  for _, s in ipairs(p.series) do lw = math.max(lw, #s.label) end
  local w, h = 34 + lw * 7, 8 + 17 * #p.series
  local best, bx, by = math.huge, nil, nil
  for _, c in ipairs({ { f.L + f.W - w - 8, f.top + 8 }, { f.L + f.W - w - 8, f.top + f.H - h - 8 },
                       { f.L + 8, f.top + 8 }, { f.L + 8, f.top + f.H - h - 8 } }) do
    local hits = covered(drawn, c[1], c[2], w, h)
    if hits < best then best, bx, by = hits, c[1], c[2] end
  end
  out[#out + 1] = '<g class="legend">'
  out[#out + 1] = format('<rect x="%s" y="%s" width="%s" height="%s" fill="white" fill-opacity="0.85" stroke="#bbb"/>',
                         num(bx), num(by), num(w), num(h))
  for i, s in ipairs(p.series) do
    local y = by + 4 + 17 * (i - 1) + 8.5
    out[#out + 1] = format('<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="2.5"/>',
                           num(bx + 6), num(y), num(bx + 24), num(y), s.color)
    out[#out + 1] = format('<text x="%s" y="%s" dominant-baseline="middle">%s</text>', num(bx + 29), num(y), esc(s.label))
  end
  out[#out + 1] = "</g>"
end

local function panel_svg(out, p, layout, xaxis, id)
  local f = frame_of(p, layout, xaxis)
  out[#out + 1] = format('<g class="panel" id="panel-%s">', esc(p.metric))
  axes_svg(out, p, f, layout, xaxis)
  legend_svg(out, p, f, lines_svg(out, p, f, id))
  out[#out + 1] = "</g>"
end

-- The SVG text of the chart. opts: x, y (a list), log (a set of metrics,
-- or true for all), title, width, panel_height.
function M.svg(files, opts)
  opts = opts or {}
  local x = opts.x or "step"
  local metrics = pick_metrics(files, x, opts.y)
  if #metrics == 0 then plot_error("no numeric fields to plot in " .. files[1].path) end
  local panels, xlo, xhi, by_index = {}, math.huge, -math.huge, false
  local labels = legend_labels(files)
  for mi, m in ipairs(metrics) do
    local logy = opts.log == true or (type(opts.log) == "table" and opts.log[m])
    local p = { metric = m, series = {}, ylo = math.huge, yhi = -math.huge }
    for fi, f in ipairs(files) do
      local runs, count, use_index = series(f, x, m, logy)
      by_index = by_index or use_index
      if count > 0 then
        for _, run in ipairs(runs) do
          for _, pt in ipairs(run) do
            xlo, xhi = math.min(xlo, pt[1]), math.max(xhi, pt[1])
            p.ylo, p.yhi = math.min(p.ylo, pt[2]), math.max(p.yhi, pt[2])
          end
        end
        local color = #files > 1 and palette[(fi - 1) % #palette + 1] or palette[(mi - 1) % #palette + 1]
        p.series[#p.series + 1] = { label = #files > 1 and labels[fi] or m, file = f.name, runs = runs, count = count,
                                    color = color }
      end
    end
    if #p.series > 0 then
      p.yaxis = logy and log_axis(p.ylo, p.yhi) or linear_axis(p.ylo, p.yhi, 5, true)
      panels[#panels + 1] = p
    elseif opts.y then
      io.stderr:write(format("dplua plot: no %svalues of '%s' to draw\n", logy and "positive " or "", m))
    end
  end
  if #panels == 0 then plot_error("none of " .. concat(metrics, ", ") .. " has values to draw") end
  local width = opts.width or 800
  local layout = { left = 84, plot_w = width - 84 - 24, plot_h = opts.panel_height or 220,
                   ylabel_x = 20, xlabel = by_index and "line" or x }
  local top0, gap = 48, 64
  for i, p in ipairs(panels) do p.top = top0 + (i - 1) * (layout.plot_h + gap) end
  local height = top0 + #panels * (layout.plot_h + gap) - gap + 48
  local xaxis = linear_axis(xlo, xhi, math.max(2, floor(layout.plot_w / 110)), false)
  local title = opts.title
  if not title then
    local names = {}
    for _, f in ipairs(files) do names[#names + 1] = f.name end
    title = concat(names, ", ")
  end
  local out = {
    '<?xml version="1.0" encoding="UTF-8"?>',
    format('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" '
           .. 'font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="11" fill="#222">',
           width, height, width, height),
    format('<title>%s</title>', esc(title)),
    format('<rect width="%d" height="%d" fill="white"/>', width, height),
    format('<text class="title" x="%s" y="28" text-anchor="middle" font-size="15" font-weight="bold">%s</text>',
           num(layout.left + layout.plot_w / 2), esc(title)),
  }
  for i, p in ipairs(panels) do panel_svg(out, p, layout, xaxis, i) end
  out[#out + 1] = "</svg>"
  return concat(out, "\n") .. "\n", panels
end

---------------------------------------------------------------- output

local function shell_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local function have(cmd)
  local ok = os.execute("command -v " .. cmd .. " >/dev/null 2>&1")
  return ok == 0 or ok == true
end

local function write_file(path, text)
  local f, err = io.open(path, "w")
  if not f then plot_error("cannot write " .. tostring(err)) end
  f:write(text)
  f:close()
end

-- Writes the SVG text to path: directly for .svg, converted for .png.
local function write_output(path, text)
  local ext = (path:match("%.([%w]+)$") or ""):lower()
  if ext == "svg" then return write_file(path, text) end
  if ext ~= "png" then plot_error("the output must end in .svg or .png, got " .. path, 2) end
  local converters = {
    { "rsvg-convert", function(i, o) return "rsvg-convert -b white -o " .. o .. " " .. i end },
    { "magick", function(i, o) return "magick -background white -density 96 " .. i .. " " .. o end },
    { "convert", function(i, o) return "convert -background white -density 96 " .. i .. " " .. o end },
  }
  for _, c in ipairs(converters) do
    if have(c[1]) then
      local tmp = path .. ".tmp.svg"
      write_file(tmp, text)
      local ok = os.execute(c[2](shell_quote(tmp), shell_quote(path)) .. " 2>/dev/null")
      os.remove(tmp)
      if ok == 0 or ok == true then return end
    end
  end
  plot_error("cannot write " .. path .. ": PNG needs rsvg-convert (Debian: librsvg2-bin) or ImageMagick, "
             .. "and neither worked here; write SVG instead: -o " .. path:gsub("%.[%w]+$", ".svg"))
end

---------------------------------------------------------------- main

local usage = [[
usage: dplua plot METRICS.jsonl [MORE.jsonl...] [-o OUT.svg] [options]

Draws every numeric field of JSON-lines files (MetricsLogger, torch.report)
against the step, one panel per metric, one line per file, as SVG. The
legend names the files, or the hyperparameters of sweep trials' reports.

options:
  -o, --output FILE   OUT.svg, or OUT.png (needs rsvg-convert or ImageMagick);
                      default: the first file with .svg for .jsonl
  --x NAME            the x field (default step; the line number when absent)
  --y A,B,...         the metrics to draw (default: every numeric field but
                      step, time, wall_time and epoch)
  --log A,B,...|all   log-scale y axes for these metrics
  --title TEXT        the title (default: the file names)
  --width N           the picture's width in pixels (default 800)
  --height N          each panel's height in pixels (default 220)
  -h, --help          this help]]

local function list(s)
  local t = {}
  for item in s:gmatch("[^,%s]+") do t[#t + 1] = item end
  return t
end

local function plot_option(o, a, value)
  if a == "--x" then o.x = value()
  elseif a == "--y" then o.y = list(value())
  elseif a == "--log" then
    local v = value()
    if v == "all" then o.log = true
    else o.log = {}; for _, m in ipairs(list(v)) do o.log[m] = true end end
  elseif a == "--title" then o.title = value()
  elseif a == "--width" or a == "--height" then
    local n = tonumber(value())
    if not n or n < 200 then plot_error(a .. " expects a number of pixels >= 200", 2) end
    o[a == "--width" and "width" or "panel_height"] = floor(n)
  else return false end
  return true
end

local function parse_command_line(args) return command.parse_options(args, plot_option) end

local function run(argv)
  local o = parse_command_line(argv)
  if o.help then print(usage); return 0 end
  if #o.files == 0 then io.stderr:write(usage, "\n"); return 2 end
  local files = {}
  for i, path in ipairs(o.files) do files[i] = read_file(path) end
  local output = o.output or (o.files[1]:gsub("%.jsonl?$", "") .. ".svg")
  local svg, panels = M.svg(files, o)
  write_output(output, svg)
  local names = {}
  for _, p in ipairs(panels) do names[#names + 1] = p.metric end
  print(format("dplua plot: wrote %s (%s against %s)", output, concat(names, ", "), o.x or "step"))
  return 0
end

-- `dplua plot ARGS`: returns the exit status (0, 1 for unreadable input or
-- output, 2 for a bad command line).
function M.main(args) return command.main("plot", run, args) end

return M
