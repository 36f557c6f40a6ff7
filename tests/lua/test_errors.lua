-- test_errors.lua -- misuse raises a Lua error whose message names the
-- problem (shapes, sizes, dims, dtypes), and never crashes the process.
-- Cases that could crash an unguarded C core (division by zero in integer
-- kernels, absurd allocations) come last, so a crash still shows which one.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local dir = os.getenv("DPLUA_TEST_DIR") or (here .. "/..")
package.path = dir .. "/lua/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
torch.manual_seed(0)   -- random inputs, the same in every run

local function long(v) return torch.tensor(v, {dtype = torch.int64}) end

-- A shape written as [2, 3], (2, 3) or 2x3.
local function shp(...)
    local n = {...}
    local s = table.concat(n, ", ?")
    local alts = {"%[" .. s .. "%]", "%(" .. s .. ",?%)"}
    if #n > 1 then alts[3] = table.concat(n, "x") end
    return alts
end

local RANGE = {"out of range", "out of bounds", "range", "bound", "exceed", "invalid index"}
local DIM = {"[Dd]im"}
local NEG = {"[Nn]egative", "non%-negative", ">= ?0", "< ?0"}
local TYPE = {"number", "integer", "int", "size", "shape", "expected", "bad argument"}
local DTYPE = {"int64", "[Ll]ong", "dtype", "[Ff]loat", "integer", "type"}
local SIZE = {"[Ss]ize", "shape", "match"}

-- ---------------------------------------------------------------- numbers past what C takes

-- A Lua number past int64 (a size, a start) or past a C int (a dim) would
-- reach C as some other number: each is refused by name, with its value.
T.raises(function() return torch.zeros(1e300) end, {"zeros", "1e%+300", "out of range"}, "a size of 1e300")
T.raises(function() return torch.randint(0, 2 ^ 63, {2}) end, {"randint", "high", "out of range"}, "randint's high of 2^63")
T.raises(function() return torch.ones(2, 3):narrow(0, 1e300, 1) end, {"narrow", "start", "out of range"},
         "a narrow from 1e300")
T.raises(function() return torch.ones(2, 3):sum(2 ^ 32) end, {"sum", "dim 4294967296", "out of range"}, "a dim of 2^32")
T.raises(function() return torch.ones(2, 3):transpose(0, 2 ^ 40) end, {"transpose", "dim1 1099511627776"},
         "transpose's dim1 of 2^40")
T.raises(function() return torch.arange(0, 1e18, 1e-18) end, {"arange", "1e%+36 elements", "too many"},
         "an arange of 1e36 elements")
-- a value its dtype cannot hold (PyTorch: "cannot be converted ... without
-- overflow"), where it was wrapped or saturated silently
T.raises(function() return torch.full({2}, 1e300, {dtype = torch.int64}) end,
         {"full", "1e%+300", "int64", "overflow"}, "full of 1e300 as int64")
T.raises(function() return torch.zeros(2, {dtype = torch.uint8}):fill_(256) end, {"fill_", "256", "uint8"},
         "fill_ of 256 into uint8")
T.raises(function() return torch.full({1}, 0 / 0, {dtype = torch.int32}) end, {"full", "int32"}, "full of NaN as int32")
T.raises(function() return torch.full({1}, 1e39, {dtype = torch.float32}) end, {"full", "float32"}, "full of 1e39 as float32")
T.raises(function() return torch.tensor({1, 2 ^ 63}, {dtype = torch.int64}) end, {"tensor", "int64", "overflow"},
         "tensor of 2^63 as int64")
T.is(tonumber(torch.full({1}, -2 ^ 63, {dtype = torch.int64}):item()), -2 ^ 63, "-2^63 is an int64")
T.is(torch.tensor({255, 0}, {dtype = torch.uint8}):tolist(), {255, 0}, "255 is a uint8")
T.is(torch.full({1}, 1 / 0):item(), 1 / 0, "an infinity is a float32")
-- but a number beside a tensor in an op converts as the op's kernel
-- converts it (PyTorch's arithmetic, not full's check)
T.is((torch.ones(2) * 1e39):tolist(), {1 / 0, 1 / 0}, "float32 times 1e39: infinities")
T.is(torch.ones(2):gt(1e39):tolist(), {false, false}, "a comparison with 1e39")
T.is((torch.tensor({1, 2}, {dtype = torch.uint8}) + (-1)):tolist(), {0, 1}, "uint8 plus -1")
local xc = torch.ones(3):requires_grad_()
xc:clamp(-1e300, 1e300):sum():backward()
T.is(xc.grad:tolist(), {1, 1, 1}, "the backward of a clamp to +-1e300")
T.raises(function() return torch.full({1}, 3.4e38, {dtype = torch.bfloat16}) end, {"full", "bfloat16"},
         "full of 3.4e38 as bfloat16 (its largest is 3.39e38)")
T.is(torch.tensor({-2 ^ 31 - 0.5}, {dtype = torch.int32}):tolist(), {-2 ^ 31}, "tensor: -2^31 - 0.5 as int32, as full takes it")

-- ---------------------------------------------------------------- shapes

T.raises(function() return torch.ones(2, 3) + torch.ones(4) end, {shp(2, 3), shp(4)},
         "broadcast [2,3] + [4] names both shapes")
T.raises(function() return torch.ones(2, 3):mul(torch.ones(2, 4)) end, {shp(2, 3), shp(2, 4)},
         "broadcast [2,3] * [2,4] names both shapes")
T.raises(function() return torch.ones(3, 1, 2):sub(torch.ones(4, 3)) end, {shp(3, 1, 2), shp(4, 3)},
         "broadcast [3,1,2] - [4,3] names both shapes")
T.raises(function() return torch.ones(2, 3):lt(torch.ones(3, 2)) end, {shp(2, 3), shp(3, 2)},
         "comparison of non-broadcastable shapes")
T.raises(function() return torch.device("cuda", true) end, {"device", "index", "integer", "boolean"},
         "a device index that is not a number")
T.raises(function() return torch.full({ 2 }, 1.5, true) end, {"full", "options", "table", "boolean"},
         "creation options that are not a table")
T.raises(function() return torch.ones(3):masked_fill(torch.ones(3), 1) end, {"masked_fill", "bool", "float32"},
         "masked_fill with a mask that is not bool")
T.raises(function() return torch.ones(3):masked_fill(torch.ones(3):bool(), torch.ones(2)) end,
         {"masked_fill", "0%-d"}, "masked_fill with a value of more than one element")
T.raises(function() return torch.ones(3, {dtype = torch.int64}):norm() end, {"norm", "floating", "int64"},
         "norm of an integer tensor")
T.raises(function() return torch.ones(3):norm("nuc") end, {"norm", "p", "nuc"}, "norm with an unknown p")
T.raises(function() return torch.device("cuda", -1) end, {"device", "index", "integer"}, "a negative device index")
T.raises(function() return torch.ones(2, 3):isclose(torch.ones(3, 2)) end, {"isclose", shp(2, 3), shp(3, 2)},
         "isclose of non-broadcastable shapes names itself and both shapes")
T.raises(function() return torch.allclose(torch.ones(2), 1) end, {"isclose", "tensor", "number"},
         "allclose with a number for other")
T.raises(function() return torch._linear_act(torch.ones(2, 3), torch.ones(4, 3), nil, "tanh") end,
         {"relu", "gelu", "gelu_tanh", "tanh"}, "a fused Linear's unknown activation names the ones there are")
T.raises(function() return torch.where(torch.ones(2):bool(), torch.ones(3), torch.ones(3)) end,
         {shp(2), shp(3)}, "where with non-broadcastable cond")
T.raises(function() return torch.ones(3):add_(torch.ones(2, 3)) end, {shp(3), shp(2, 3)},
         "in-place add_ cannot grow self")
T.raises(function() return torch.ones(3):copy_(torch.ones(4)) end, {"3", "4"},
         "copy_ from a non-broadcastable source")
T.raises(function() local t = torch.zeros(3, 4); t[0] = torch.ones(5) end, {"4", "5"},
         "assigning a tensor of the wrong size")
T.raises(function() return torch.ones(2, 3):expand(4, 3) end, {shp(2, 3), shp(4, 3)},
         "expand to an incompatible size")
T.raises(function() return torch.ones(2, 3):expand(3) end, nil, "expand to fewer dims")

-- ---------------------------------------------------------------- matmul

T.raises(function() return torch.ones(2, 3):matmul(torch.ones(4, 5)) end, {shp(2, 3), shp(4, 5)},
         "matmul inner-size mismatch names both shapes")
T.raises(function() return torch.ones(2, 3):mm(torch.ones(4, 5)) end, {shp(2, 3), shp(4, 5)},
         "mm inner-size mismatch names both shapes")
T.raises(function() return torch.ones(2, 3, 4):bmm(torch.ones(2, 5, 6)) end, {shp(2, 3, 4), shp(2, 5, 6)},
         "bmm inner-size mismatch")
T.raises(function() return torch.ones(2, 3, 4):bmm(torch.ones(3, 4, 5)) end, {{"batch", "shape", "size"}, "2", "3"},
         "bmm batch mismatch")
T.raises(function() return torch.ones(3):matmul(torch.ones(4)) end, {"3", "4"}, "dot of sizes 3 and 4")
T.raises(function() return torch.ones(2, 3, 4):matmul(torch.ones(3, 4, 5)) end,
         {{"broadcast", "batch", "shape", "size"}, "2", "3"}, "matmul batch dims that do not broadcast")
T.raises(function() return torch.ones(3):mm(torch.ones(3, 2)) end, {{"2%-?[Dd]", "matri", "[Dd]im"}},
         "mm of a 1-D tensor")
T.raises(function() return torch.ones(2, 3):bmm(torch.ones(3, 2)) end, {{"3%-?[Dd]", "batch", "[Dd]im"}},
         "bmm of 2-D tensors")
T.raises(function() return torch.zeros({}):matmul(torch.ones(2)) end, {{"0%-?[Dd]", "[Dd]im", "scalar", "at least"}},
         "matmul of a 0-d tensor")
T.raises(function() return torch.ones(2, 2):mm(torch.ones({2, 2}, {dtype = torch.float64})) end, {DTYPE},
         "mm of float32 and float64")

-- ---------------------------------------------------------------- indices

T.raises(function() return torch.arange(5)[5] end, {RANGE, "5"}, "t[5] of size 5 is out of range")
T.raises(function() return torch.arange(5)[-6] end, {RANGE, "%-6"}, "t[-6] of size 5 is out of range")
T.raises(function() return torch.ones(2, 3)[{0, 3}] end, {RANGE, "3"}, "t[{0, 3}] of [2, 3]")
T.raises(function() return torch.ones(2, 3):select(1, 3) end, {RANGE, "3"}, "select(1, 3) of [2, 3]")
T.raises(function() return torch.ones(2, 3):narrow(1, 2, 2) end, {RANGE}, "narrow past the end")
T.raises(function() return torch.ones(2, 3):narrow(1, -5, 1) end, {RANGE}, "narrow with a start before 0")
T.raises(function() local t = torch.zeros(3); t[3] = 1 end, {RANGE, "3"}, "assignment t[3] of size 3")
T.raises(function() return torch.ones(3):index_select(0, long({3})) end, {RANGE}, "index_select index 3 of size 3")
T.raises(function() return torch.ones(3):index_select(0, long({-4})) end, {RANGE}, "index_select index -4")
T.raises(function() return torch.ones(3):index_select(0, torch.tensor({0.5})) end, {DTYPE},
         "index_select with a float index")
T.raises(function() return torch.ones(2, 3):gather(1, long({{0, 3}, {1, 0}})) end, {RANGE},
         "gather index 3 out of bounds")
T.raises(function() return torch.ones(2, 3):gather(1, long({{0, -1}, {1, 0}})) end, {RANGE},
         "gather index -1 out of bounds")
T.raises(function() return torch.ones(2, 3):gather(1, long({0, 1})) end, {DIM},
         "gather index with the wrong number of dims")
T.raises(function() return torch.ones(2, 3):gather(1, torch.zeros(2, 1)) end, {DTYPE}, "gather with a float index")
T.raises(function() return torch.ones(2, 2)[{0, 0, 0}] end, {{"too many", "ind", "[Dd]im"}}, "too many indices")
T.raises(function() return torch.tensor(1)[0] end, {{"0%-d", "0%-dim", "scalar", "[Dd]im"}}, "indexing a 0-d tensor")
T.raises(function() return torch.arange(5)[{{0, 5, 0}}] end, {"step"}, "slice step 0")
T.raises(function() return torch.arange(5)[{{4, 0, -1}}] end, {"step"}, "negative slice step")

-- ---------------------------------------------------------------- dims

T.raises(function() return torch.ones(2, 3):sum(2) end, {DIM, "2"}, "sum(2) of a 2-D tensor")
T.raises(function() return torch.ones(2, 3):sum(-3) end, {DIM, "%-3"}, "sum(-3) of a 2-D tensor")
T.raises(function() return torch.ones(2, 3):max(2) end, {DIM, "2"}, "max(2) of a 2-D tensor")
T.raises(function() return torch.ones(2, 3):transpose(0, 2) end, {DIM, "2"}, "transpose(0, 2) of 2-D")
T.raises(function() return torch.ones(2, 3):softmax(5) end, {DIM, "5"}, "softmax(5) of 2-D")
T.raises(function() return torch.ones(2, 3):unsqueeze(3) end, {DIM, "3"}, "unsqueeze(3) of 2-D")
T.raises(function() return torch.ones(2, 3):squeeze(2) end, {DIM, "2"}, "squeeze(2) of 2-D")
T.raises(function() return torch.ones(2, 3):size(2) end, {DIM, "2"}, "size(2) of 2-D")
T.raises(function() return torch.ones(2, 3):narrow(2, 0, 1) end, {DIM, "2"}, "narrow(2, ...) of 2-D")
T.raises(function() return torch.ones(2, 3):flatten(0, 2) end, {DIM, "2"}, "flatten(0, 2) of 2-D")
T.raises(function() return torch.cat({torch.ones(2, 3), torch.ones(2, 3)}, 2) end, {DIM, "2"}, "cat along dim 2 of 2-D")
T.raises(function() return torch.stack({torch.ones(2), torch.ones(2)}, 3) end, {DIM, "3"}, "stack along dim 3 of 1-D")
T.raises(function() return torch.ones(2, 3):permute(0, 0) end, {{"repeat", "duplicate", "twice", "permut", "[Dd]im"}},
         "permute with a repeated dim")
T.raises(function() return torch.ones(2, 3):permute(0) end, {{"[Dd]im", "number", "match", "permut"}},
         "permute with too few dims")

-- ---------------------------------------------------------------- sizes

T.raises(function() return torch.zeros(-1, 2) end, {NEG, "%-1"}, "zeros(-1, 2) negative size")
T.raises(function() return torch.ones({2, -3}) end, {NEG, "%-3"}, "ones({2, -3}) negative size")
T.raises(function() return torch.empty(-1) end, {NEG}, "empty(-1) negative size")
T.raises(function() return torch.full({-2}, 1) end, {NEG}, "full({-2}) negative size")
T.raises(function() return torch.rand(3, -1) end, {NEG}, "rand(3, -1) negative size")
T.raises(function() return torch.eye(-1) end, {NEG}, "eye(-1)")
T.raises(function() return torch.linspace(0, 1, -1) end, {NEG}, "linspace with negative steps")
T.raises(function() return torch.arange(0, 5, 0) end, {{"step", "zero", "nonzero"}}, "arange with step 0")
T.raises(function() return torch.arange(5, 0, 1) end, {{"step", "sign", "range", "bound", "end"}},
         "arange with a step of the wrong sign")
T.raises(function() return torch.randint(5, 5, {3}) end, {{"low", "high", "from", "less", ">=", "range"}},
         "randint with low >= high")
T.raises(function() return torch.ones(2, 3):view(4) end, {"4", "6"}, "view(4) of 6 elements")
T.raises(function() return torch.ones(6):view(4, -1) end, {"4", "6"}, "view(4, -1) of 6 elements")
T.raises(function() return torch.ones(2, 3):reshape(5) end, {"5", "6"}, "reshape(5) of 6 elements")
T.raises(function() return torch.ones(2, 3):view(-1, -1) end, {{"one", "only", "%-1"}}, "view with two -1")
T.raises(function() return torch.ones(2, 3):t():view(6) end, {{"contiguous", "stride", "reshape", "compatible"}},
         "view of a transpose that needs a copy")

-- ---------------------------------------------------------------- argument types

T.raises(function() return torch.zeros("a") end, {TYPE}, 'zeros("a") wrong argument type')
T.raises(function() return torch.zeros(2.5) end, {{"integer", "int", "whole"}}, "zeros(2.5) non-integer size")
T.raises(function() return torch.ones(2):add("x") end, {TYPE}, 'add("x") wrong argument type')
T.raises(function() return torch.ones(2):add({}) end, {TYPE}, "add({}) wrong argument type")
T.raises(function() return torch.ones(2) + "x" end, {TYPE}, 't + "x"')
T.raises(function() return torch.tensor({1, "a"}) end, {TYPE}, 'tensor({1, "a"})')
T.raises(function() return torch.tensor("abc") end, {TYPE}, 'tensor("abc")')
T.raises(function() return torch.ones(2):view("x") end, {TYPE}, 'view("x")')
T.raises(function() return torch.ones(2, 2):sum("x") end, {TYPE}, 'sum("x")')
T.raises(function() return torch.ones({2}, {dtype = "float17"}) end, {"float17"}, "unknown dtype string is named")
T.raises(function() return torch.ones(2):to("float17") end, {"float17"}, "to() an unknown dtype")
T.raises(function() return torch.ones({2}, {device = "tpu"}) end, {"tpu"}, "unknown device string is named")
T.raises(function() return torch.cat(torch.ones(2)) end, {{"table", "list", "sequence", "tensors"}},
         "cat of a tensor instead of a list")
T.raises(function() return torch.cat({}, 0) end, {{"empty", "at least", "non%-empty", "no tensor", "zero"}},
         "cat of an empty list")
T.raises(function() return torch.tensor({{1, 2}, {3}}) end,
         {{"ragged", "length", "size", "shape", "sequence", "dimension", "inconsistent"}}, "ragged tensor({{1,2},{3}})")
T.raises(function() return torch.tensor({{1, 2}, 3}) end,
         {{"ragged", "length", "size", "shape", "sequence", "dimension", "inconsistent", "mix", "table", "number"}},
         "mixed nesting tensor({{1,2},3})")
T.raises(function() return torch.cat({torch.ones(2, 3), torch.ones(2, 4)}, 0) end, {SIZE}, "cat of mismatched shapes")
T.raises(function() return torch.cat({torch.ones(2, 3), torch.ones(3)}, 0) end, {{"[Dd]im", "[Ss]ize", "shape"}},
         "cat of different ndim")
T.raises(function() return torch.stack({torch.ones(3), torch.ones(4)}) end, {shp(3), shp(4)},
         "stack of unequal shapes names them")

-- ---------------------------------------------------------------- dtypes

T.raises(function() return torch.arange(5):mean() end, {DTYPE}, "mean of int64 is a dtype error")
T.raises(function() return torch.arange(5):mean(0) end, {DTYPE}, "mean(0) of int64 is a dtype error")
T.raises(function() return torch.arange(5):var() end, {DTYPE}, "var of int64 is a dtype error")
T.raises(function() return torch.arange(5):std() end, {DTYPE}, "std of int64 is a dtype error")
T.raises(function() return torch.tensor({true}) - torch.tensor({false}) end, {"[Bb]ool"}, "subtraction of bools")
T.raises(function() return -torch.tensor({true}) end, {"[Bb]ool"}, "negation of a bool tensor")
T.raises(function() return torch.arange(3):pow(-1) end, {{"negative", "[Ii]nteger"}},
         "integer to a negative integer power")
T.raises(function() return torch.arange(3):div_(2) end, {{"cast", "[Ff]loat", "dtype", "int64", "[Ll]ong"}},
         "int64 div_ would need a float result")
T.raises(function() return torch.arange(3):add_(1.5) end, {{"cast", "[Ff]loat", "dtype", "int64", "[Ll]ong"}},
         "int64 add_(1.5) would need a float result")
T.raises(function() return torch.arange(3):exp_() end, {{"cast", "[Ff]loat", "dtype", "int64", "[Ll]ong"}},
         "int64 exp_ would need a float result")
T.raises(function() return torch.ones(2):item() end, {{"one element", "1 element", "numel", "elements", "single"}},
         "item of two elements")
T.raises(function() return torch.zeros(0):item() end, {{"one element", "1 element", "numel", "elements", "empty", "single"}},
         "item of an empty tensor")

-- ---------------------------------------------------------------- CUDA

local CUDA = {"[Cc][Uu][Dd][Aa]"}
local has_cuda = pcall(function() return torch.zeros(1):to("cuda") end)
if has_cuda then
    T.skip("a CUDA device is present", 'to("cuda") without a GPU')
    T.skip("a CUDA device is present", "cuda() without a GPU")
    T.skip("a CUDA device is present", 'zeros(2, {device="cuda"}) without a GPU')
else
    T.raises(function() return torch.zeros(2):to("cuda") end, CUDA, 'to("cuda") without a GPU mentions CUDA')
    T.raises(function() return torch.zeros(2):cuda() end, CUDA, "cuda() without a GPU mentions CUDA")
    T.raises(function() return torch.zeros({2}, {device = "cuda"}) end, CUDA,
             'zeros(2, {device="cuda"}) without a GPU mentions CUDA')
end
T.raises(function() return torch.zeros(2):to("cuda:99") end, {CUDA}, 'to("cuda:99") is not a device')
-- streams, events and graphs: wrong arguments on any machine, no device without a GPU
T.raises(function() torch.cuda.set_stream("s") end, "expected a torch.cuda.Stream", "set_stream of a string")
T.raises(function() torch.cuda.stream({}, function() end) end, "expected a torch.cuda.Stream", "stream() of a table")
T.raises(function() torch.cuda.graph(42) end, "expected a function to capture", "graph() of a number")
T.raises(function() torch.cuda.Stream("cpu") end, "expected a CUDA device, got cpu", "a Stream on the CPU")
-- a named device past the machine's: every torch.cuda function that takes one says so
for _, f in ipairs({ "current_stream", "default_stream", "Stream", "synchronize", "set_device", "memory_reserved",
                     "max_memory_reserved", "mem_get_info", "get_device_properties", "get_device_name",
                     "get_device_capability" }) do
    T.raises(function() return torch.cuda[f]("cuda:99") end, {"cuda." .. f, "cuda:99", "not available"},
             "torch.cuda." .. f .. '("cuda:99") names the missing device')
end
T.raises(function() return torch.cuda.Event({ device = "cuda:99" }) end, {"cuda.Event", "cuda:99", "not available"},
         'torch.cuda.Event({device = "cuda:99"}) names the missing device')
-- the allocation counters of a device without allocations (or without a GPU) are 0, as in PyTorch
T.is(torch.cuda.memory_allocated("cuda:99"), 0, "memory_allocated of a device that is not there: 0")
T.is(torch.cuda.max_memory_allocated("cuda:99"), 0, "max_memory_allocated of a device that is not there: 0")
if not has_cuda then
    T.raises(function() return torch.cuda.Stream() end, CUDA, "Stream() without a GPU mentions CUDA")
    T.raises(function() return torch.cuda.Event({ enable_timing = true }) end, CUDA, "Event() without a GPU mentions CUDA")
    T.raises(function() return torch.cuda.graph(function() end) end, CUDA, "graph() without a GPU mentions CUDA")
    T.ok(torch.cuda.current_stream() == torch.cuda.default_stream(), "current_stream() is the default stream")
    T.lives(function() torch.cuda.empty_cache() end, "empty_cache() without a GPU does nothing, as in PyTorch")
    T.ok(torch.cuda.is_bf16_supported() == false, "is_bf16_supported() is false without a GPU")
    T.raises(function() return torch.cuda.get_device_name() end, CUDA, "get_device_name() without a GPU mentions CUDA")
    T.raises(function() return torch.cuda.mem_get_info() end, CUDA, "mem_get_info() without a GPU mentions CUDA")
    T.raises(function() torch.cuda.init() end, "no CUDA device", "cuda.init() without a GPU says so")
    T.ok(torch.cuda.device_of(torch.ones(2), function() return true end), "device_of a CPU tensor runs fn where it is")
end
T.raises(function() torch.cuda.device("cuda:99", function() end) end, {"cuda.set_device", "cuda:99", "not available"},
         "cuda.device of a missing device names it")
T.raises(function() torch.cuda.device(0, 42) end, "expected %(device, function%)", "cuda.device without a function")
T.is(torch.cuda.device(-1, function(a) return a + 1 end, 1), 2, "cuda.device(-1, fn): PyTorch's no-op device")
T.ok(torch.cuda.memory_cached == torch.cuda.memory_reserved and
     torch.cuda.reset_max_memory_allocated == torch.cuda.reset_peak_memory_stats, "cuda's older names")

-- ---------------------------------------------------------------- crash-prone last

T.raises(function() return torch.arange(3):remainder(0) end, {{"[Zz]ero", "division", "divide"}},
         "int64 remainder by 0 raises instead of crashing")
T.raises(function() return torch.arange(3):remainder(long({1, 0, 1})) end, {{"[Zz]ero", "division", "divide"}},
         "int64 remainder by a 0 element raises")
T.raises(function() return torch.arange(0, 3, {dtype = torch.int32}):remainder(0) end, {{"[Zz]ero", "division", "divide"}},
         "int32 remainder by 0 raises")
T.raises(function() return torch.empty(1e15) end, {{"memory", "alloc", "large", "overflow", "bytes"}},
         "empty(1e15) is a memory error, not a crash")
T.raises(function() return torch.empty(2 ^ 40, 2 ^ 40) end,
         {{"memory", "alloc", "large", "overflow", "bytes", "too many"}},
         "empty(2^40, 2^40) overflows and says so")
T.lives(function() return torch.zeros(3) end, "still alive after the errors")

-- NaNs with any bit pattern (uninitialised memory from torch.empty, found
-- by the API fuzzer) read back as NaN, never as one of LuaJIT's tagged
-- values, which crashed the process
do
  local ffi = require("ffi")
  local t = torch.empty(5, {dtype = torch.float64})
  local bits = ffi.cast("uint64_t *", t:data_ptr())
  bits[0] = 0xfffa000000000001ULL; bits[1] = 0xffffffffffffffffULL; bits[2] = 0x7ff8000000000001ULL
  bits[3] = 0xfff8000000000000ULL; bits[4] = 0x3ff0000000000000ULL
  local list = t:tolist()
  local nans = 0
  for i = 1, 4 do if type(list[i]) == "number" and list[i] ~= list[i] then nans = nans + 1 end end
  T.is(nans, 4, "tolist: the four NaN patterns are Lua NaNs")
  T.is(list[5], 1, "and the number after them is read as it is")
  T.is(tostring(t), "tensor([nan, nan, nan, nan, 1.], dtype=torch.float64)", "printing them")
  local s = t:sum():item()
  T.ok(type(s) == "number" and s ~= s, "item() of a sum that keeps such a NaN's bits")
  T.ok(t[0]:item() ~= t[0]:item(), "item() of the element itself")
end

T.done_testing()
