-- test_interpolate.lua: F.interpolate and nn.Upsample, nearest and
-- bilinear (both align_corners), by size and by scale factor, up and down,
-- against PyTorch's outputs and input gradients in float64
-- (tests/ref/interpolate.lua, written by scripts/gen_interpolate_ref.py)
-- and in float32; errors.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local nn, F = torch.nn, torch.nn.functional
local ref = dofile(here .. "/../ref/interpolate.lua")

local cases = {  -- as in the generator
  nearest_scale_2 = { scale_factor = 2 },
  nearest_size_up = { size = { 8, 11 } },
  nearest_size_down = { size = { 3, 4 } },
  nearest_scale_1_5 = { scale_factor = 1.5 },
  bilinear_size_up = { size = { 9, 10 }, mode = "bilinear" },
  bilinear_size_down = { size = { 3, 4 }, mode = "bilinear" },
  bilinear_scale_2 = { scale_factor = 2, mode = "bilinear" },
  bilinear_scale_0_6 = { scale_factor = { 0.6, 0.5 }, mode = "bilinear" },
  bilinear_corners = { size = { 9, 4 }, mode = "bilinear", align_corners = true },
  bilinear_corners_one = { size = { 1, 3 }, mode = "bilinear", align_corners = true },
}

local function input(dtype)
  local v = {}
  for i = 0, 2 * 3 * 5 * 7 - 1 do v[#v + 1] = math.sin(1 + 0.7 * i) end
  return torch.tensor(v, { dtype = torch.float64 }):reshape(2, 3, 5, 7):to(dtype):requires_grad_()
end

for _, name in ipairs(T.sorted_keys(cases)) do
  T.run(name .. " against PyTorch", function()
    local c = ref[name]
    for _, dt in ipairs({ torch.float64, torch.float32 }) do
      local what, tol = name .. " " .. tostring(dt) .. ": ", dt == torch.float64 and 1e-13 or 1e-5
      local x = input(dt)
      local y = name:match("scale_2") and nn.Upsample(cases[name])(x) or F.interpolate(x, cases[name])
      T.is(y:size(), c.shape, what .. "shape")
      T.output_and_grad(torch, y, x, c, tol, what)
    end
  end)
end

T.run("errors", function()
  local x = torch.randn(1, 2, 4, 4)
  T.raises(function() F.interpolate(x, { mode = "bicubic", size = 3 }) end, "mode bicubic is not supported", "bicubic")
  T.raises(function() F.interpolate(x, { size = 3, scale_factor = 2 }) end, "only one of size or scale_factor", "both")
  T.raises(function() F.interpolate(x, {}) end, "only one of size or scale_factor", "neither")
  T.raises(function() F.interpolate(torch.randn(2, 4, 4), { size = 3 }) end, "expected a 4%-D input", "a 3-D input")
  T.raises(function() F.interpolate(x, { size = 3, align_corners = true }) end, "align_corners option can only be set",
           "align_corners with nearest")
  T.raises(function() F.interpolate(x, { size = 0 }) end, "positive integers", "size 0")
end)

T.done_testing()
