-- PyTorch's checkpoint format with CUDA tensors (make check-gpu): a
-- PyTorch-written file loads onto the GPU with map_location = "cuda" with
-- the bytes of its CPU load (itself checked against PyTorch by
-- tests/lua/test_torchfile.lua), and a checkpoint of CUDA tensors saves
-- (through the CPU) and loads back equal, on either device.
local dir = os.getenv("DPLUA_TEST_DIR") or (debug.getinfo(1, "S").source:match("^@(.*)/gpu/") or "tests")
package.path = dir .. "/lua/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
if not torch.cuda.is_available() then T.skip_all("no CUDA device") end

local ffi = require("ffi")

-- the same dtype, shape and bytes (NaN payloads too)
local function bytes(t)
  local c = t:cpu():contiguous()
  return ffi.string(torch.C.dp_tensor_data(c.p), c:numel() * c.dtype.itemsize)
end
local function same(got, want, name)
  T.ok(got.dtype == want.dtype and tostring(got:size()) == tostring(want:size()) and bytes(got) == bytes(want), name)
end

local ref = dir .. "/ref/torchfile_torch_values.pt"
local cpu = torch.load(ref)
for _, how in ipairs({ "cuda", { map_location = "cuda:0" } }) do
  local gpu = torch.load(ref, how)
  for _, k in ipairs({ "float32", "float64", "int64", "bfloat16", "bool", "float16", "scalar", "empty" }) do
    T.is(gpu[k].device.type, "cuda", k .. " is on the GPU")
    same(gpu[k], cpu[k], k .. ": the bytes of the CPU load")
  end
  same(gpu.views.transposed, cpu.views.transposed, "a view of a shared storage")
end

local tmp = os.tmpname()
os.remove(tmp)
tmp = tmp .. ".pt"
local x = torch.randn(5, 7, { device = "cuda" })
torch.save({ x = x, xt = x:t(), n = 3 }, tmp)
local back = torch.load(tmp)
T.is(back.x.device.type, "cpu", "saved CUDA tensors load on the CPU without map_location")
same(back.x, x, "a CUDA tensor round-trips")
same(back.xt, x:t():contiguous(), "a CUDA view round-trips")
same(torch.load(tmp, "cuda").x, x, "and back onto the GPU")
os.remove(tmp)
T.done_testing()
