-- test_print.lua -- tostring(t) must equal PyTorch's str(t) exactly.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local dir = os.getenv("DPLUA_TEST_DIR") or (here .. "/..")
package.path = dir .. "/lua/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")

T.run_ref(torch, "print")

T.run("printing by hand", function()
    T.is(tostring(torch.tensor({{1, 2}, {3, 4}}, {dtype = torch.float32})), "tensor([[1., 2.],\n        [3., 4.]])", "tensor([[1., 2.], [3., 4.]])")
    T.is(tostring(torch.tensor({1.5}, {dtype = torch.float64})), "tensor([1.5000], dtype=torch.float64)",
         "dtype shown for float64")
    T.is(tostring(torch.arange(3)), "tensor([0, 1, 2])", "int64 without dtype")
    T.is(tostring(torch.tensor(true)), "tensor(True)", "bool 0-d")
    T.is("x = " .. tostring(torch.zeros(1)), "x = tensor([0.])", "concatenation with tostring")
    T.is(tostring(torch.float32), "torch.float32", "tostring of a dtype")
    T.is(tostring(torch.zeros({1}, {dtype = torch.int32}).dtype), "torch.int32", "tostring of t.dtype")
    -- print() goes to stdout: keep it on a TAP comment line
    io.write("# print: ")
    local ok, err = pcall(print, torch.tensor({1, 2}))
    if not ok then io.write("\n") end
    T.ok(ok, "print(t) works", err)
end)

T.done_testing()
