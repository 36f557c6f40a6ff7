-- test_creation.lua -- creation functions, dtypes and inspection; random
-- streams by their statistics and reproducibility (PyTorch's streams differ).
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local dir = os.getenv("DPLUA_TEST_DIR") or (here .. "/..")
package.path = dir .. "/lua/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")

T.run_ref(torch, "creation")

-- ---------------------------------------------------------------- dtypes

T.run("dtype objects", function()
    T.is(tostring(torch.float32), "torch.float32", "tostring(torch.float32)")
    T.is(tostring(torch.float), "torch.float32", "torch.float is float32")
    T.is(tostring(torch.double), "torch.float64", "torch.double is float64")
    T.is(tostring(torch.long), "torch.int64", "torch.long is int64")
    T.is(tostring(torch.int), "torch.int32", "torch.int is int32")
    for _, n in ipairs({"float64", "int64", "int32", "uint8", "bool", "bfloat16"}) do
        T.is(tostring(torch[n]), "torch." .. n, "tostring(torch." .. n .. ")")
    end
end)

local function dtype_of(fn) return function() return tostring(fn().dtype) end end
local function shape_of(fn) return function() return T.shape(fn()) end end

T.check("numbers give float32", dtype_of(function() return torch.tensor({1, 2, 3}) end), "torch.float32")
T.check("booleans give bool", dtype_of(function() return torch.tensor({true, false}) end), "torch.bool")
T.check("a number gives a float32 0-d tensor", dtype_of(function() return torch.tensor(3) end), "torch.float32")
T.check("tensor(3) is 0-d", function() return torch.tensor(3):dim() end, 0)
T.check("dtype as string", dtype_of(function() return torch.tensor({1, 2}, {dtype = "int64"}) end), "torch.int64")
T.check("zeros dtype option", dtype_of(function() return torch.zeros(2, {dtype = torch.int32}) end), "torch.int32")
T.check("zeros default float32", dtype_of(function() return torch.zeros(2) end), "torch.float32")
T.check("arange of integers is int64", dtype_of(function() return torch.arange(3) end), "torch.int64")
T.check("arange with a fraction is float32", dtype_of(function() return torch.arange(0, 3, 0.5) end), "torch.float32")
T.check("randint default int64", dtype_of(function() return torch.randint(0, 5, {3}) end), "torch.int64")

-- ---------------------------------------------------------------- inspection

local function z23() return torch.zeros(2, 3) end
T.check("size() as a table", shape_of(z23), {2, 3})
T.check("size()[1] is the first size (1-based table)", function() return z23():size()[1] end, 2)
T.check("size()[2]", function() return z23():size()[2] end, 3)
T.check("size(0) (0-based dim)", function() return z23():size(0) end, 2)
T.check("size(1)", function() return z23():size(1) end, 3)
T.check("size(-1)", function() return z23():size(-1) end, 3)
T.check("t.shape[1]", function() return z23().shape[1] end, 2)
T.check("t.shape[2]", function() return z23().shape[2] end, 3)
T.check("dim()", function() return z23():dim() end, 2)
T.check("numel()", function() return z23():numel() end, 6)
T.check("#t is the size of dim 0", function() return #z23() end, 2)
T.check("device is cpu", function() return tostring(z23().device) end, "cpu")
T.check("stride() of a contiguous [2, 3]", function() local s = z23():stride(); return {s[1], s[2]} end, {3, 1})
T.check("is_contiguous()", function() return z23():is_contiguous() end, true)
T.check("transpose is not contiguous", function() return z23():t():is_contiguous() end, false)
T.check("zeros({4, 5}) numel", function() return torch.zeros({4, 5}):numel() end, 20)
T.check("zeros({}) is 0-d", function() return torch.zeros({}):dim() end, 0)
T.check("0-d has one element", function() return torch.zeros({}):numel() end, 1)
T.check("zeros(0) is empty", function() return torch.zeros(0):numel() end, 0)
T.check("device option cpu", function() return tostring(torch.zeros(2, {device = "cpu"}).device) end, "cpu")

-- ---------------------------------------------------------------- empty, *_like

local function i22() return torch.zeros({2, 2}, {dtype = torch.int32}) end
T.check("empty(2, 3) shape", shape_of(function() return torch.empty(2, 3) end), {2, 3})
T.check("empty default dtype", dtype_of(function() return torch.empty(2, 3) end), "torch.float32")
T.check("empty dtype option", dtype_of(function() return torch.empty({4}, {dtype = torch.float64}) end), "torch.float64")
T.check("empty_like keeps dtype", dtype_of(function() return torch.empty_like(i22()) end), "torch.int32")
T.check("empty_like keeps shape", shape_of(function() return torch.empty_like(i22()) end), {2, 2})
T.check("zeros_like keeps dtype", dtype_of(function() return torch.zeros_like(i22()) end), "torch.int32")
T.check("ones_like keeps dtype", dtype_of(function() return torch.ones_like(i22()) end), "torch.int32")
T.check("full_like keeps dtype", dtype_of(function() return torch.full_like(i22(), 3) end), "torch.int32")
T.check("ones_like dtype option", dtype_of(function() return torch.ones_like(i22(), {dtype = torch.float64}) end),
        "torch.float64")

-- ---------------------------------------------------------------- random

T.run("rand statistics", function()
    torch.manual_seed(1234)
    local r = torch.rand(100000)
    T.is(T.shape(r), {100000}, "rand(100000) shape")
    T.is(tostring(r.dtype), "torch.float32", "rand dtype float32")
    T.ok(r:min():item() >= 0, "rand >= 0")
    T.ok(r:max():item() < 1, "rand < 1")
    T.close(r:mean():item(), 0.5, 0, 0.005, "rand mean ~ 0.5")
    T.close(r:var():item(), 1 / 12, 0, 0.002, "rand var ~ 1/12")
    local lo = r:lt(0.1):sum():item()
    T.close(lo, 10000, 0, 600, "rand: about 10% below 0.1")
    local r64 = torch.rand({200, 50}, {dtype = torch.float64})
    T.is(tostring(r64.dtype), "torch.float64", "rand float64 dtype")
    T.is(T.shape(r64), {200, 50}, "rand({200, 50}) shape")
    T.ok(r64:min():item() >= 0 and r64:max():item() < 1, "rand float64 in [0, 1)")
    T.is(T.shape(torch.rand(2, 3)), {2, 3}, "rand(2, 3) shape")
    local rl = torch.rand_like(torch.zeros({3, 4}, {dtype = torch.float64}))
    T.is(tostring(rl.dtype), "torch.float64", "rand_like keeps dtype")
    T.is(T.shape(rl), {3, 4}, "rand_like keeps shape")
    -- float32 draws (a vectorised loop) are the float64 draws' top 24 bits
    -- (philox_uniform, one block at a time), element for element
    torch.manual_seed(7)
    local a = torch.rand(100003)
    torch.manual_seed(7)
    local b = torch.rand(100003, {dtype = torch.float64})
    T.is((a:double() - (b * 2 ^ 24):floor() / 2 ^ 24):abs():max():item(), 0,
         "rand float32: the float64 stream's first 24 bits, every element")
end)

T.run("randn statistics", function()
    torch.manual_seed(99)
    local r = torch.randn(100000)
    T.is(tostring(r.dtype), "torch.float32", "randn dtype float32")
    T.close(r:mean():item(), 0, 0, 0.02, "randn mean ~ 0")
    T.close(r:std():item(), 1, 0, 0.02, "randn std ~ 1")
    local tail = r:abs():gt(1.96):sum():item()
    T.close(tail / 100000, 0.05, 0, 0.005, "randn: about 5% beyond 1.96")
    local r64 = torch.randn({50000}, {dtype = torch.float64})
    T.is(tostring(r64.dtype), "torch.float64", "randn float64 dtype")
    T.close(r64:mean():item(), 0, 0, 0.03, "randn float64 mean ~ 0")
    T.close(r64:std():item(), 1, 0, 0.03, "randn float64 std ~ 1")
    local rl = torch.randn_like(torch.zeros(2, 5))
    T.is(T.shape(rl), {2, 5}, "randn_like shape")
end)

T.run("randint", function()
    torch.manual_seed(7)
    local r = torch.randint(0, 10, {100000})
    T.is(tostring(r.dtype), "torch.int64", "randint dtype int64")
    T.is(r:min():item(), 0, "randint min is low")
    T.is(r:max():item(), 9, "randint max is high - 1")
    T.close(r:double():mean():item(), 4.5, 0, 0.05, "randint mean ~ 4.5")
    for k = 0, 9 do
        T.close(r:eq(k):sum():item(), 10000, 0, 600, "randint: value " .. k .. " about 10%")
    end
    local s = torch.randint(3, 5, {1000})
    T.ok(s:min():item() == 3 and s:max():item() == 4, "randint(3, 5) gives 3 and 4")
    local i32 = torch.randint(-5, 5, {2, 3}, {dtype = torch.int32})
    T.is(tostring(i32.dtype), "torch.int32", "randint dtype option")
    T.is(T.shape(i32), {2, 3}, "randint shape")
    T.ok(i32:min():item() >= -5 and i32:max():item() < 5, "randint negative range")
    local rl = torch.randint_like(torch.zeros({4, 4}, {dtype = torch.int32}), 0, 3)
    T.is(tostring(rl.dtype), "torch.int32", "randint_like keeps dtype")
    T.ok(rl:min():item() >= 0 and rl:max():item() <= 2, "randint_like range")
end)

T.run("manual_seed reproducibility", function()
    local function draw()
        return {torch.rand(10):tolist(), torch.randn(2, 3):tolist(), torch.randint(0, 1000, {8}):tolist(),
                torch.rand({3}, {dtype = torch.float64}):tolist()}
    end
    torch.manual_seed(42)
    local a = draw()
    torch.manual_seed(42)
    local b = draw()
    T.is(b, a, "same seed gives the same streams (rand, randn, randint)")
    torch.manual_seed(43)
    local c = draw()
    T.ok(c[1][1] ~= a[1][1] or c[1][2] ~= a[1][2], "another seed gives other numbers")
    torch.manual_seed(42)
    local x = torch.rand(5):tolist()
    local y = torch.rand(5):tolist()
    T.ok(x[1] ~= y[1], "consecutive draws differ")
end)

T.run("torch.Generator: a stream of its own", function()
  torch.manual_seed(1)
  local want = torch.rand(4)
  torch.manual_seed(1)
  local g = torch.Generator():manual_seed(5)
  T.ok(torch.is_generator(g), "is_generator")
  local x = torch.randn(3, { generator = g })
  T.ok(torch.equal(torch.rand(4), want), "drawing from g leaves torch's stream where it was")
  local h = torch.Generator():manual_seed(5)
  T.ok(torch.equal(torch.randn(3, { generator = h }), x), "the same seed draws the same")
  T.ok(torch.equal(torch.randint(0, 100, { 5 }, { generator = g }), torch.randint(0, 100, { 5 }, { generator = h })),
       "and both move on alike (randint)")
  T.ok(torch.equal(torch.randperm(6, { generator = g }), torch.randperm(6, { generator = h })), "randperm")
  T.ok(torch.equal(torch.normal(0, 1, { 3 }, { generator = g }), torch.normal(0, 1, { 3 }, { generator = h })), "normal")
  local w = torch.tensor({ 0.1, 0.5, 0.4 })
  T.ok(torch.equal(w:multinomial(4, true, { generator = g }), w:multinomial(4, true, { generator = h })), "multinomial")
  T.ok(torch.equal(torch.poisson(torch.full({ 4 }, 3.5), g), torch.poisson(torch.full({ 4 }, 3.5), h)), "poisson")
  -- torch's stream with the generator's seed draws what the generator drew
  torch.manual_seed(7)
  local from_torch = torch.rand(3)
  T.ok(torch.equal(torch.rand(3, { generator = torch.Generator():manual_seed(7) }), from_torch),
       "a Generator seeded s draws what torch.manual_seed(s) draws")
  local state = g:get_state()
  local a = torch.rand(2, { generator = g })
  g:set_state(state)
  T.ok(torch.equal(torch.rand(2, { generator = g }), a), "get_state and set_state replay")
  T.is(torch.Generator():initial_seed(), 67280421310721, "PyTorch's default seed")
  local default = torch.manual_seed(9)
  T.ok(rawequal(default, torch.default_generator), "manual_seed returns the default generator, as PyTorch")
  T.is({ default:initial_seed(), torch.initial_seed() }, { 9, 9 }, "initial_seed of torch's stream")
  local want9 = torch.rand(3)
  default:manual_seed(9)
  T.ok(torch.equal(torch.rand(3, { generator = default }), want9), "drawing from the default generator is torch's stream")
  local st = default:get_state()
  local next3 = torch.rand(3)
  default:set_state(st)
  T.ok(torch.equal(torch.rand(3), next3), "its get_state and set_state are torch's")
  T.ok(type(torch.seed()) == "number", "torch.seed() picks a seed")
  local cuda_state = torch.cuda.get_rng_state()
  local after = torch.rand(4)
  torch.cuda.set_rng_state(cuda_state)
  T.ok(torch.equal(torch.rand(4), after), "torch.cuda.get_rng_state / set_rng_state: the one stream's state")
  torch.cuda.set_rng_state_all({ cuda_state })
  T.ok(torch.equal(torch.rand(4), after), "set_rng_state_all")
  T.is(#torch.cuda.get_rng_state_all(), torch.cuda.device_count(), "get_rng_state_all: one per device")
  T.raises(function() torch.cuda.get_rng_state("cpu") end, "expected a CUDA device, got cpu", "a CPU device")
  T.is(g:initial_seed(), 5, "initial_seed")
  T.ok(type(torch.Generator():seed()) == "number", "seed() picks one")
  T.is(tostring(torch.Generator("cpu").device), "cpu", "the device recorded")
  T.raises(function() torch.rand(2, { generator = 5 }) end, "rand: expected generator to be a torch.Generator, got number",
           "a number is not a Generator")
  T.raises(function() g:manual_seed(0.5) end, "Generator.manual_seed: expected an integer seed", "a fractional seed")
  T.raises(function() g:set_state(torch.zeros(3)) end, "expected the uint8 tensor of 16 bytes", "a bad state")
  local ok = pcall(torch.randn, 2, { generator = g, dtype = "no such dtype" })
  T.ok(not ok, "an error inside a draw")
  T.ok(torch.equal(torch.rand(4), torch.rand(4)) == false, "and torch's stream still works after it")
end)

T.run("set_default_device", function()
  T.is(torch.get_default_device(), torch.device("cpu"), "the CPU by default")
  torch.set_default_device("cpu")
  T.ok(not torch.zeros(2).is_cuda and not torch.tensor({ 1 }).is_cuda, "cpu: factories on the CPU")
  torch.set_default_device(nil)
  T.is(torch.get_default_device(), torch.device("cpu"), "nil: the CPU")
  T.raises(function() torch.set_default_device("tpu") end, 'expected a device %("cpu", "cuda", "cuda:N"%), got string tpu',
           "an unknown device")
  T.raises(function() torch.set_default_device("cuda:" .. torch.cuda.device_count()) end, "no CUDA device",
           "a GPU this machine does not have")
  T.is(torch.get_default_device(), torch.device("cpu"), "a refused device changes nothing")
end)

T.done_testing()
