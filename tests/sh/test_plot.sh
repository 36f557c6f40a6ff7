#!/bin/sh
# tests/sh/test_plot.sh -- `dplua plot`: the SVG is well-formed XML (xmllint
# when installed, else python3's parser, else a rough check), has a
# polyline per metric whose points follow the data, axis labels, ticks and
# a legend; options; PNG output or its clear refusal; mistakes. TAP output;
# run by `make check` with top_builddir set (default ".").
#
#   sh tests/sh/test_plot.sh          # from the build directory

. "$(dirname "$0")/tap.sh"

absolute_dplua
need_dplua
make_tmp plot

# plot ARGS...: dplua plot in $tmp; output in $tmp/out and $tmp/err.
plot() {
    (cd "$tmp" && "$dplua" plot "$@") >"$tmp/out" 2>"$tmp/err"
    status=$?
}
count() { grep -o -e "$1" "$tmp/$2" | wc -l; }

# well_formed FILE: 0 when FILE parses as XML.
well_formed() {
    if command -v xmllint >/dev/null 2>&1; then
        xmllint --noout "$1" 2>>"$tmp/err"
    elif command -v python3 >/dev/null 2>&1; then
        python3 -c 'import sys, xml.dom.minidom; xml.dom.minidom.parse(sys.argv[1])' "$1" 2>>"$tmp/err"
    else
        head -1 "$1" | grep -q '^<?xml' && grep -q '^<svg ' "$1" && tail -1 "$1" | grep -q '^</svg>$' \
            && [ "$(grep -c '<g[ >]' "$1")" -eq "$(grep -c '</g>' "$1")" ]
    fi
}

# Two runs logged by MetricsLogger: 40 steps of a falling loss and the lr
# of a cosine schedule; acc every 10 steps; a NaN loss at step 25 in b.
(cd "$tmp" && "$dplua" -e '
  local MetricsLogger = require("dplua.utils.metrics").MetricsLogger
  for _, run in ipairs({ { "a.jsonl", 1 }, { "b.jsonl", 1.5 } }) do
    local log = MetricsLogger(run[1])
    for step = 1, 40 do
      local t = { step = step, loss = run[2] * 2 / step, lr = 0.01 * (1 + math.cos(math.pi * step / 40)) / 2, epoch = 1 }
      if step % 10 == 0 then t.acc = step / 50 end
      if run[1] == "b.jsonl" and step == 25 then t.loss = 0 / 0 end
      log:log(t)
    end
    log:close()
  end') >"$tmp/out" 2>"$tmp/err"
status=$?
[ $status -eq 0 ]; ok $? "MetricsLogger writes the test runs"

# ---------------------------------------------------------------- one file

plot a.jsonl -o a.svg
[ $status -eq 0 ] && [ -s "$tmp/a.svg" ] && grep -q "wrote a.svg (loss, acc, lr against step)" "$tmp/out"
ok $? "dplua plot writes the SVG and says what it drew"
well_formed "$tmp/a.svg"; ok $? "the SVG is well-formed XML"
head -2 "$tmp/a.svg" | grep -q '<svg xmlns="http://www.w3.org/2000/svg" width="800"'; ok $? "the root is an svg element with its namespace"
[ "$(count 'class="series" data-metric="loss"' a.svg)" -eq 1 ] && [ "$(count 'class="series" data-metric="lr"' a.svg)" -eq 1 ] \
    && [ "$(count 'class="series" data-metric="acc"' a.svg)" -eq 1 ]
ok $? "one polyline per metric"
! grep -q 'data-metric="\(step\|time\|wall_time\|epoch\)"' "$tmp/a.svg"; ok $? "step, time, wall_time and epoch are not drawn"
[ "$(count '<polyline' a.svg)" -eq 3 ]; ok $? "three polylines in all"
grep -q '<text class="xlabel"[^>]*>step</text>' "$tmp/a.svg" && grep -q '<text class="ylabel"[^>]*>loss</text>' "$tmp/a.svg" \
    && grep -q '<text class="ylabel"[^>]*>lr</text>' "$tmp/a.svg"
ok $? "axis labels name the x field and each metric"
[ "$(count 'class="ytick"' a.svg)" -ge 9 ] && [ "$(count 'class="xtick"' a.svg)" -ge 9 ]
ok $? "each axis has ticks with labels"
grep -q '<text class="xtick"[^>]*>10</text>' "$tmp/a.svg" && grep -q '<text class="ytick"[^>]*>0.002</text>' "$tmp/a.svg"
ok $? "ticks fall on round numbers"
[ "$(count 'class="legend"' a.svg)" -eq 3 ]; ok $? "each panel has a legend"
grep -q '<title>a.jsonl</title>' "$tmp/a.svg"; ok $? "the title names the file"

# the loss line: 40 points, left to right, going down the page as the loss falls
(cd "$tmp" && "$dplua" -e '
  local svg = io.open("a.svg"):read("*a")
  local pts = svg:match([[data%-metric="loss"[^>]-points="([^"]*)"]])
  local xs, ys = {}, {}
  for x, y in pts:gmatch("([-%d.]+),([-%d.]+)") do xs[#xs + 1] = tonumber(x); ys[#ys + 1] = tonumber(y) end
  assert(#xs == 40, "points: " .. #xs)
  for i = 2, 40 do assert(xs[i] > xs[i - 1] and ys[i] > ys[i - 1], "point " .. i) end
  local fx, fy, fw, fh = svg:match([[class="frame" x="([%d.]+)" y="([%d.]+)" width="([%d.]+)" height="([%d.]+)"]])
  fx, fy, fw, fh = tonumber(fx), tonumber(fy), tonumber(fw), tonumber(fh)
  assert(math.abs(xs[1] - fx) < 0.01 and math.abs(xs[40] - (fx + fw)) < 0.01, "x spans the frame")
  for i = 1, 40 do assert(ys[i] >= fy and ys[i] <= fy + fh, "inside the frame") end') >"$tmp/out" 2>"$tmp/err"
status=$?
[ $status -eq 0 ]; ok $? "the loss polyline has a point per step, in order, inside its frame"

plot a.jsonl
[ $status -eq 0 ] && [ -s "$tmp/a.svg" ] && grep -q "wrote a.svg" "$tmp/out"; ok $? "without -o the SVG is named after the file"

# ---------------------------------------------------------------- options

plot a.jsonl b.jsonl -o ab.svg --y loss,acc --log loss --title "two runs"
[ $status -eq 0 ] && well_formed "$tmp/ab.svg"; ok $? "two files, --y, --log and --title give well-formed XML"
[ "$(count 'data-metric="acc"' ab.svg)" -eq 2 ] && ! grep -q 'data-metric="lr"' "$tmp/ab.svg"
ok $? "--y picks the metrics; each file gets its line"
[ "$(count 'data-metric="loss" data-file="b.jsonl"' ab.svg)" -eq 2 ]; ok $? "a NaN breaks the line in two"
grep -q '>loss (log scale)</text>' "$tmp/ab.svg" && grep -q '<text class="ytick"[^>]*>1</text>' "$tmp/ab.svg"
ok $? "--log puts loss on a log scale with decade ticks"
grep -q '>a.jsonl</text>' "$tmp/ab.svg" && grep -q '>b.jsonl</text>' "$tmp/ab.svg" && grep -q '<title>two runs</title>' "$tmp/ab.svg"
ok $? "the legend names the files; --title sets the title"
[ "$(grep -o 'stroke="#[0-9a-f]*" stroke-width="1.6"' "$tmp/ab.svg" | sort -u | wc -l)" -eq 2 ]
ok $? "the two files have two colours"

plot a.jsonl -o x.svg --x time --y loss
[ $status -eq 0 ] && grep -q '<text class="xlabel"[^>]*>time</text>' "$tmp/x.svg"; ok $? "--x draws against another field"

printf '{"loss":3}\n{"loss":2}\n{"loss":1.5}\n' >"$tmp/noidx.jsonl"
plot noidx.jsonl -o noidx.svg
[ $status -eq 0 ] && grep -q '<text class="xlabel"[^>]*>line</text>' "$tmp/noidx.svg"; ok $? "without a step field the x axis is the line number"

# ---------------------------------------------------------------- sweep trials

# The reports of sweep trials: the legend names their hyperparameters
# (those that differ), which the sweep wrote at the head of each log.
copy_data sweep_quadratic.lua
printf 'return { script = "sweep_quadratic.lua", space = { x = {0, 1}, y = -2, sleep = 0 }, metric = "loss" }\n' >"$tmp/sw.lua"
(cd "$tmp" && "$dplua" sweep sw.lua) >"$tmp/out" 2>"$tmp/err"
ok $? "a sweep of two trials for the legend test"
plot sw.logs/trial-001.report.jsonl sw.logs/trial-002.report.jsonl a.jsonl -o sw.svg --y loss
[ $status -eq 0 ] && grep -q '>x=0</text>' "$tmp/sw.svg" && grep -q '>x=1</text>' "$tmp/sw.svg" && grep -q '>a.jsonl</text>' "$tmp/sw.svg" \
    && ! grep -q '>trial-00[12].report.jsonl</text>' "$tmp/sw.svg"
ok $? "the legend names each trial by the hyperparameters that differ, other files by name"
grep -q 'data-file="trial-001.report.jsonl"' "$tmp/sw.svg"; ok $? "data-file keeps the file name"
plot sw.logs/trial-001.report.jsonl b.jsonl -o sw1.svg --y loss
[ $status -eq 0 ] && grep -q '>sleep=0 x=0 y=-2</text>' "$tmp/sw1.svg"; ok $? "one trial: all its hyperparameters"
sed -i '2s/$/  CUDA_VISIBLE_DEVICES=1/' "$tmp/sw.logs/trial-002.log"
plot sw.logs/trial-001.report.jsonl sw.logs/trial-002.report.jsonl -o sw2.svg --y loss
[ $status -eq 0 ] && grep -q '>x=1</text>' "$tmp/sw2.svg"; ok $? "a trial that ran on a GPU"

# ---------------------------------------------------------------- PNG

# Whether a converter here turns an SVG into a PNG at all: a program of
# that name may be something else (some machines have a stand-in
# `convert` that only prints PNGs), and then dplua must refuse, not pass.
printf '<svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"><rect width="4" height="4"/></svg>\n' >"$tmp/probe.svg"
converts() {
    { rsvg-convert -o "$tmp/probe.png" "$tmp/probe.svg" || magick "$tmp/probe.svg" "$tmp/probe.png" ||
        convert "$tmp/probe.svg" "$tmp/probe.png"; } >/dev/null 2>&1 && head -c 4 "$tmp/probe.png" | grep -q PNG
}
if converts; then
    plot a.jsonl -o a.png
    [ $status -eq 0 ] && head -c 4 "$tmp/a.png" | grep -q PNG; ok $? "-o FILE.png converts the SVG"
else
    plot a.jsonl -o a.png
    [ $status -eq 1 ] && grep -q "neither worked here" "$tmp/err" && [ ! -e "$tmp/a.png" ]
    ok $? "-o FILE.png where no converter works (none here) is refused, nothing written"
fi
(cd "$tmp" && PATH=/nonexistent "$dplua" plot a.jsonl -o a2.png) >"$tmp/out" 2>"$tmp/err"
status=$?
[ $status -eq 1 ] && grep -q "PNG needs rsvg-convert" "$tmp/err" && grep -q -- "-o a2.svg" "$tmp/err" && [ ! -e "$tmp/a2.png" ]
ok $? "without a converter, .png is refused with a hint to write .svg"

# ---------------------------------------------------------------- mistakes

plot a.jsonl -o a.pdf
[ $status -eq 2 ] && grep -q "must end in .svg or .png" "$tmp/err"; ok $? "another extension exits 2"
plot missing.jsonl -o m.svg
[ $status -eq 1 ] && grep -q "missing.jsonl" "$tmp/err"; ok $? "a missing file is named"
printf '{"name":"x"}\n' >"$tmp/words.jsonl"
plot words.jsonl -o w.svg
[ $status -eq 1 ] && grep -q "no numeric fields" "$tmp/err"; ok $? "a file without numbers is an error"
printf '{"step":1,"loss":1}\n{"step":2,"lo\n' >"$tmp/cut.jsonl"
plot cut.jsonl -o cut.svg
[ $status -eq 0 ] && grep -q "skipping cut.jsonl:2" "$tmp/err"; ok $? "a line cut short is skipped with a warning"
plot a.jsonl --bogus
[ $status -eq 2 ] && grep -q "unknown option --bogus" "$tmp/err"; ok $? "an unknown option exits 2"
plot
[ $status -eq 2 ] && grep -q "usage: dplua plot" "$tmp/err"; ok $? "no file prints the usage and exits 2"
plot --help
[ $status -eq 0 ] && grep -q "usage: dplua plot" "$tmp/out"; ok $? "--help exits 0"

done_testing
