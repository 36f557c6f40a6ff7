-- A first look at dplua's tensors: run with `./dplua examples/demo.lua`.
local torch = require("dplua")

torch.manual_seed(0)
local x = torch.rand(4, 3)
print("x =", x)
print("x:sum(1) =", x:sum(1))
print("x @ x^T =", x:matmul(x:t()))
print("softmax over rows:", x:softmax(1))
print("row 0, columns 1..2 (0-based, half-open):", x[{0, {1, 3}}])
print("mean, std:", x:mean():item(), x:std():item())
