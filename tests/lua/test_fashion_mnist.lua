-- test_fashion_mnist.lua: a short run of examples/fashion_mnist.lua — 5,000
-- training images, 300 steps, tested on 1,000 test images — must learn far
-- above chance (10%), and loading must cost less than the training steps.
-- Skips only when Debian's dataset-fashion-mnist is not installed.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")

local DIR = "/usr/share/datasets/fashion-mnist"
local d = io.open(DIR, "r")
if not d then
  T.skip_all(DIR .. " is missing: install Debian's dataset-fashion-mnist (scripts/setup-debian does)")
end
d:close()

local script = T.test_dir() .. "/../examples/fashion_mnist.lua"
local chunk, err = loadfile(script)
if not T.ok(chunk ~= nil, "load " .. script, err) then T.done_testing() end

local lines = {}
local ok, res = pcall(chunk, {
  data = DIR, subset = 5000, test_subset = 1000, epochs = 4, max_steps = 300, batch_size = 64, seed = 1,
  log = function(s) lines[#lines + 1] = s; io.write("# ", s, "\n") end,
})
if not T.ok(ok, "the example runs", not ok and tostring(res) or nil) then T.done_testing() end

local first, last = res.epochs[1], res.epochs[#res.epochs]
T.is(res.steps, 300, "it stops after --max-steps steps")
T.is(#res.epochs, 4, "4 epochs of 79 steps hold 300 steps")
T.ok(res.test_accuracy >= 0.70, "test accuracy on 1,000 images is at least 70% (chance: 10%)",
     ("got %.2f%%"):format(100 * res.test_accuracy))
T.ok(last.loss < first.loss, "the training loss goes down", ("epoch 1: %.4f, epoch %d: %.4f"):format(first.loss, #res.epochs, last.loss))
T.ok(res.data_time < res.step_time, "loading takes less time than the training steps",
     ("data %.3f s, steps %.3f s"):format(res.data_time, res.step_time))
T.ok(lines[#lines]:find("^done: test accuracy") ~= nil, "it reports the accuracy and the data/step times", lines[#lines])
T.diag(("%.1f s of training; data loading %.1f%% of the loop")
       :format(res.time, 100 * res.data_time / (res.data_time + res.step_time)))
T.done_testing()
