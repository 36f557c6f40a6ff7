-- test_nn.lua -- torch.nn: Module registration, traversal, state dicts,
-- printing, train/eval, layer initialisation, nn.init, clip_grad_norm_,
-- argument errors, and the forward values of the composite functional ops
-- against PyTorch (literals from scripts/gen_nn_reference.py).
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local dir = os.getenv("DPLUA_TEST_DIR") or (here .. "/..")
package.path = dir .. "/lua/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local nn = torch.nn
local F = nn.functional

torch.manual_seed(0)
local f64 = { dtype = torch.float64 }

local function names(pairs_list)
  local out = {}
  for i, e in ipairs(pairs_list) do out[i] = e[1] end
  return out
end

local SimpleNN = require("models").SimpleNN

---------------------------------------------------------------- registration

T.run("registration order and names", function()
  local Net = nn.Module:extend("Net")
  function Net:__init()
    self.scale = nn.Parameter(torch.ones(1))
    self.body = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    self.hidden = 7                                  -- a plain field
    self:register_buffer("running", torch.zeros(2))
    self:register_buffer("scratch", torch.zeros(1), false)  -- not persistent
    self.head = nn.Linear(2, 1, false)
    self.offset = nn.Parameter(torch.zeros(1))
  end
  local m = Net()
  T.is(names(m:named_parameters()), { "scale", "offset", "body.0.weight", "body.0.bias", "body.2.weight", "body.2.bias",
          "head.weight" }, "named_parameters: own parameters first, then children in registration order")
  T.is(#m:parameters(), 7, "parameters() lists the same tensors")
  T.ok(m:parameters()[3] == m.body[0].weight, "parameters() returns the registered tensors themselves")
  T.is(names(m:named_children()), { "body", "head" }, "named_children")
  T.is(names(m:named_modules()), { "", "body", "body.0", "body.1", "body.2", "head" }, "named_modules, pre-order")
  T.is(#m:modules(), 6, "modules()")
  T.is(names(m:named_buffers()), { "running", "scratch" }, "named_buffers")
  T.is(m:state_dict():keys(), { "scale", "offset", "running", "body.0.weight", "body.0.bias", "body.2.weight",
          "body.2.bias", "head.weight" }, "state_dict keys: parameters, persistent buffers, then children")
  T.is(m.hidden, 7, "plain fields stay plain")
  T.ok(m.head.bias == nil, "Linear(bias=false) has no bias")
  local seen = {}
  for name, p in m:named_parameters() do seen[#seen + 1] = name .. ":" .. p:numel() end
  T.is(seen[1], "scale:1", "named_parameters() can be iterated with a generic for")
  T.is(m:num_parameters(), 1 + 1 + 12 + 4 + 8 + 2 + 2, "num_parameters counts elements")
  local shared = nn.Linear(2, 2)
  local S = nn.Sequential(shared, shared)
  T.is(#S:parameters(), 2, "a shared module's parameters are listed once")
  T.is(S:state_dict():len(), 4, "state_dict lists them under both names, as PyTorch")
end)

T.run("nn.Buffer, set_submodule, compile", function()
  local Net = nn.Module:extend("BufNet")
  function Net:__init()
    self.steps = nn.Buffer(torch.zeros(1))
    self.cache = nn.Buffer(torch.ones(2), false)
    self.body = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
  end
  local m = Net()
  T.is(names(m:named_buffers()), { "steps", "cache" }, "nn.Buffer registers buffers")
  T.ok(torch.is_tensor(m.steps), "reading gives the tensor")
  T.is(m:state_dict():keys(), { "steps", "body.0.weight", "body.0.bias" }, "persistent = false stays out of the state dict")
  m.steps = nn.Buffer(torch.ones(3))
  T.is(m.steps:tolist(), { 1, 1, 1 }, "a Buffer assigned again replaces it")
  local tanh = nn.Tanh()
  m:set_submodule("body.1", tanh)
  T.is(m.body[1], tanh, "set_submodule replaces a child by its dotted path")
  m:set_submodule("extra", nn.Identity())
  T.ok(nn.is_module(m.extra), "or adds one")
  T.raises(function() m:set_submodule("nothing.here", nn.ReLU()) end, "has no attribute `nothing`", "a missing parent")
  T.raises(function() m:set_submodule("body.1", 5) end, "is not an nn.Module", "not a module")
  T.raises(function() nn.Buffer(3) end, "Buffer: expected a tensor", "a Buffer of a number")
  T.is(m:compile(), nil, "compile: runs as it is")
  T.is(m.body(torch.ones(1, 2)):size(), { 1, 2 }, "and still runs")
end)

T.run("assignment rules", function()
  local m = nn.Module()
  m.w = nn.Parameter(torch.randn(2))
  T.raises(function() m.w = torch.randn(2) end, "cannot assign 'Tensor' as parameter 'w'",
           "a plain tensor over a parameter is refused")
  m.w = nil
  T.is(#m:parameters(), 0, "assigning nil drops the parameter")
  m.w = nn.Parameter(torch.randn(3))
  T.is(m:named_parameters()[1][1], "w", "re-registering keeps the name")
  m.child = nn.ReLU()
  T.raises(function() m.child = 5 end, "cannot assign 'number' as child module 'child'", "a number over a child is refused")
  m.child = nn.Tanh()
  T.is(tostring(m.child), "Tanh()", "a module can replace a module")
  m.x = "plain"
  m.x = nn.Identity()
  T.is(names(m:named_children()), { "child", "x" }, "a module over a plain field registers it")
  T.raises(function() m:register_buffer("a.b", torch.zeros(1)) end, 'can\'t contain "."', "names with dots are refused")
  T.raises(function() m:register_parameter("p", torch.zeros(1)) end, "nn.Parameter or nil required",
           "register_parameter wants a Parameter")
  T.raises(function() m:add_module("y", 3) end, "is not a Module", "add_module wants a Module")
  T.raises(function() nn.Module()(torch.zeros(1)) end, 'missing the required "forward"', "a module without forward")
  local p = nn.Parameter(torch.ones(2))
  T.ok(p.requires_grad and p.is_leaf, "Parameter is a leaf that requires grad")
  T.ok(not nn.Parameter(torch.ones(2), false).requires_grad, "Parameter(t, false)")
  T.ok(nn.is_parameter(p) and not nn.is_parameter(torch.ones(1)), "is_parameter")
end)

T.run("subclass of a subclass", function()
  local Base = nn.Module:extend("Base")
  function Base:__init(n) self.fc = nn.Linear(n, n) end
  function Base:forward(x) return self.fc(x) end
  local Derived = Base:extend("Derived")
  function Derived:__init(n)
    Base.__init(self, n)
    self.extra = nn.Linear(n, 1)
  end
  function Derived:forward(x) return self.extra(Base.forward(self, x)) end
  local d = Derived(3)
  T.is(names(d:named_parameters()), { "fc.weight", "fc.bias", "extra.weight", "extra.bias" }, "parent __init registered first")
  T.is(d(torch.zeros(2, 3)):size()[2], 1, "forward through the parent's forward")
  T.is(tostring(d), "Derived(\n  (fc): Linear(in_features=3, out_features=3, bias=True)\n  (extra): Linear(in_features=3, out_features=1, bias=True)\n)",
       "the class name is the subclass's")
  T.raises(function() nn.Module.extend("x") end, "extend", "extend without a colon")
end)

---------------------------------------------------------------- printing

-- Expected strings: print(repr(m)) in PyTorch 1.13 for the same modules.
T.run("printing matches PyTorch", function()
  T.is(tostring(SimpleNN()), "SimpleNN(\n  (fc1): Linear(in_features=10, out_features=10, bias=True)\n"
       .. "  (fc2): Linear(in_features=10, out_features=2, bias=True)\n)", "SimpleNN")
  local seq = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.1)))
  T.is(tostring(seq), "Sequential(\n  (0): Linear(in_features=2, out_features=3, bias=True)\n  (1): ReLU()\n"
       .. "  (2): Sequential(\n    (0): Linear(in_features=3, out_features=3, bias=True)\n"
       .. "    (1): Dropout(p=0.1, inplace=False)\n  )\n)", "nested Sequential")
  local cases = {
    { nn.GELU(), "GELU(approximate='none')" },
    { nn.GELU("tanh"), "GELU(approximate='tanh')" },
    { nn.Dropout(0.5), "Dropout(p=0.5, inplace=False)" },
    { nn.Dropout(), "Dropout(p=0.5, inplace=False)" },
    { nn.LayerNorm(10), "LayerNorm((10,), eps=1e-05, elementwise_affine=True)" },
    { nn.LayerNorm({ 2, 3 }, { eps = 1e-6 }), "LayerNorm((2, 3), eps=1e-06, elementwise_affine=True)" },
    { nn.Conv2d(1, 32, 3), "Conv2d(1, 32, kernel_size=(3, 3), stride=(1, 1))" },
    { nn.Conv2d(1, 32, 3, { padding = 1, bias = false, stride = 2 }),
      "Conv2d(1, 32, kernel_size=(3, 3), stride=(2, 2), padding=(1, 1), bias=False)" },
    { nn.Conv2d(1, 2, 3, { padding = "same" }), "Conv2d(1, 2, kernel_size=(3, 3), stride=(1, 1), padding=same)" },
    { nn.MaxPool2d(2), "MaxPool2d(kernel_size=2, stride=2, padding=0, dilation=1, ceil_mode=False)" },
    { nn.Embedding(10, 3), "Embedding(10, 3)" },
    { nn.Embedding(10, 3, { padding_idx = 0 }), "Embedding(10, 3, padding_idx=0)" },
    { nn.Flatten(), "Flatten(start_dim=1, end_dim=-1)" },
    { nn.ReLU(), "ReLU()" }, { nn.Tanh(), "Tanh()" }, { nn.Sigmoid(), "Sigmoid()" }, { nn.Identity(), "Identity()" },
    { nn.CrossEntropyLoss(), "CrossEntropyLoss()" }, { nn.MSELoss(), "MSELoss()" },
    { nn.BCEWithLogitsLoss(), "BCEWithLogitsLoss()" }, { nn.NLLLoss(), "NLLLoss()" },
    { nn.Linear(4, 5, false), "Linear(in_features=4, out_features=5, bias=False)" },
  }
  for _, c in ipairs(cases) do T.is(tostring(c[1]), c[2], c[2]) end
end)

---------------------------------------------------------------- containers

-- Sequential runs a Linear followed by a ReLU as one fused op: the same
-- values and gradients, bit for bit, as the two modules one after the other.
T.run("Sequential fuses Linear then ReLU", function()
  torch.manual_seed(3)
  local seq = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
  local x = torch.randn(6, 5, f64):requires_grad_()
  seq:to(torch.float64)
  local y = seq(x)
  local function plain(v)
    for i = 0, 4 do v = seq[i]:forward(v) end
    return v
  end
  local y2 = plain(x)
  T.ok(y:eq(y2):all():item(), "the same output as the modules one by one")
  y:pow(2):sum():backward()
  local g = {}
  for i, p in ipairs(seq:parameters()) do g[i] = p.grad:clone() end
  local gx = x.grad:clone()
  seq:zero_grad()
  x.grad = nil
  y2:pow(2):sum():backward()
  local same = x.grad:eq(gx):all():item()
  for i, p in ipairs(seq:parameters()) do same = same and p.grad:eq(g[i]):all():item() end
  T.ok(same, "the same gradients, bit for bit")
  local h = nn.Sequential(nn.Linear(5, 4), nn.ReLU()):to(torch.float64)
  T.is(torch._grad_fn_name(h(x)), "ReluBackward0", "a Sequential ending in Linear, ReLU")
  h[1].forward = function(_, v) return v end   -- an instance's own forward is honoured
  T.ok(h(x):lt(0):any():item(), "no fusion when the ReLU's forward was replaced")
  T.raises(function() return seq(torch.randn(6, 7, f64)) end, "do not fit",
           "a wrong input shape names linear's problem")
end)

T.run("Sequential", function()
  local a, b, c = nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)
  local s = nn.Sequential(a, b, c)
  T.ok(s[0] == a and s[1] == b and s[2] == c, "s[i] is 0-based like PyTorch")
  T.ok(s[-1] == c, "negative indices count from the end")
  T.is(s:len(), 3, "len()")
  T.raises(function() return s[3] end, "out of range", "an index past the end")
  T.is(names(s:named_children()), { "0", "1", "2" }, "children are named 0, 1, 2")
  local x = torch.randn(5, 3)
  T.tensor_close(s(x), c(b(a(x))), 0, 0, "forward chains the children")
  local s2 = nn.Sequential({ a, b })
  T.is(s2:len(), 2, "Sequential({...}) takes a table too")
  s2:append(c)
  T.ok(s2[2] == c, "append")
  T.raises(function() nn.Sequential(a, 5) end, "expected a Module at position 2", "non-modules are refused")
  local ml = nn.ModuleList({ nn.Linear(1, 1), nn.Linear(1, 1) })
  T.is(#ml:parameters(), 4, "ModuleList registers its modules")
end)

T.run("ipairs over containers", function()
  local a, b, c = nn.Linear(1, 2), nn.ReLU(), nn.Linear(2, 1)
  local function seen(container)
    local out = {}
    for i, m in ipairs(container) do out[#out + 1] = { i, m } end
    return out
  end
  for _, case in ipairs({ { "ModuleList", nn.ModuleList({ a, b, c }) }, { "Sequential", nn.Sequential(a, b, c) } }) do
    local got = seen(case[2])
    T.is(#got, 3, case[1] .. ": ipairs visits every module")
    T.ok(got[1][1] == 1 and got[1][2] == a and got[2][2] == b and got[3][1] == 3 and got[3][2] == c,
         case[1] .. ": in order, numbered from 1")
  end
  local ml = nn.ModuleList()
  T.is(#seen(ml), 0, "an empty ModuleList: no iteration")
  ml:append(a)
  T.ok(#seen(ml) == 1 and seen(ml)[1][2] == a, "a module appended is visited")
  -- a model that loops over its blocks, as GPT-style scripts do
  local Net = nn.Module:extend("Net")
  function Net:__init() self.blocks = nn.ModuleList({ nn.Linear(2, 2, false), nn.Linear(2, 2, false) }) end
  function Net:forward(x)
    for _, blk in ipairs(self.blocks) do x = blk(x) end
    return x
  end
  local net = Net()
  local x = torch.randn(3, 2)
  T.tensor_close(net(x), x:mm(net.blocks[0].weight:t()):mm(net.blocks[1].weight:t()), 1e-6, 1e-6,
                 "a forward that loops over a ModuleList runs every block")
  T.raises(function() for _ in ipairs(nn.Linear(1, 1)) do end end, "Linear is not iterable",
           "ipairs over a module that is no list raises")
  local plain = {}
  for i, v in ipairs({ 10, 20, nil, 40 }) do plain[i] = v end
  T.ok(plain[1] == 10 and plain[2] == 20 and plain[4] == nil, "plain tables iterate as before")
end)

---------------------------------------------------------------- modes, grads, apply, to

T.run("train and eval", function()
  local m = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Dropout(0.5)))
  T.ok(m.training and m[1][0].training, "modules start in training mode")
  T.ok(m:eval() == m, "eval returns the module")
  T.ok(not m.training and not m[0].training and not m[1][0].training, "eval reaches every descendant")
  m:train()
  T.ok(m[1][0].training, "train() sets it back")
  m:train(false)
  T.ok(not m[1].training, "train(false)")
  local d = nn.Dropout(0.5)
  local x = torch.ones(1000)
  local y = d(x)
  local zeros = y:eq(0):sum():item()
  T.ok(zeros > 400 and zeros < 600, "training dropout zeroes about p of the elements (" .. zeros .. ")")
  T.ok(y:max():item() == 2, "and scales the rest by 1/(1-p)")
  d:eval()
  T.tensor_close(d(x), x, 0, 0, "eval dropout is the identity")
end)

T.run("zero_grad and requires_grad_", function()
  local m = SimpleNN()
  m(torch.randn(3, 10)):sum():backward()
  T.ok(m.fc1.weight.grad ~= nil, "backward fills the gradients")
  m:zero_grad({ set_to_none = false })
  T.is(m.fc1.weight.grad:abs():sum():item(), 0, "zero_grad({set_to_none=false}) zeroes them")
  m:zero_grad()
  T.ok(m.fc1.weight.grad == nil and m.fc2.bias.grad == nil, "zero_grad() drops them (set_to_none=true)")
  m:requires_grad_(false)
  T.ok(not m.fc1.weight.requires_grad, "requires_grad_(false)")
end)

T.run("apply", function()
  local m = SimpleNN()
  local visited = {}
  m:apply(function(mod) visited[#visited + 1] = mod:_get_name() end)
  T.is(visited, { "Linear", "Linear", "SimpleNN" }, "apply visits children first, then the module")
  m:apply(function(mod) if mod:_get_name() == "Linear" then nn.init.zeros_(mod.bias) end end)
  T.is(m.fc1.bias:abs():sum():item(), 0, "apply can re-initialise")
end)

T.run("to(dtype)", function()
  local m = SimpleNN()
  m:register_buffer("steps", torch.zeros(1, { dtype = torch.int64 }))
  local before = m.fc1.weight:detach():clone()
  T.ok(m:to(torch.float64) == m, "to returns the module")
  T.is(tostring(m.fc1.weight.dtype), "torch.float64", "parameters are cast")
  T.ok(nn.is_parameter(m.fc1.weight) and m.fc1.weight.requires_grad, "and stay Parameters")
  T.is(tostring(m.steps.dtype), "torch.int64", "integer buffers keep their dtype")
  T.tensor_close(m.fc1.weight, before:double(), 0, 0, "values are kept")
  T.is(names(m:named_parameters()), { "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias" }, "names and order are kept")
  local y = m(torch.randn(2, 10, f64))
  T.is(tostring(y.dtype), "torch.float64", "the model runs in float64")
  m:float()
  T.is(tostring(m.fc2.bias.dtype), "torch.float32", "float()")
  m:to("cpu")
  T.raises(function() m:to(torch.int64) end, "only floating point", "to(int64) is refused")
  local Tied = nn.Module:extend("Tied")
  function Tied:__init()
    self.enc, self.dec = nn.Linear(3, 3), nn.Linear(3, 3)
    self.dec.weight = self.enc.weight
  end
  local t = Tied():double()
  T.ok(t.enc.weight == t.dec.weight and #t:parameters() == 3, "tied weights stay tied through to()")
end)

---------------------------------------------------------------- state dicts

T.run("state_dict values", function()
  local m = SimpleNN()
  local sd = m:state_dict()
  T.is(sd:keys(), { "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias" }, "keys as PyTorch")
  T.ok(not sd["fc1.weight"].requires_grad, "values are detached")
  torch.no_grad(function() m.fc1.bias:fill_(3) end)
  T.is(sd["fc1.bias"]:sum():item(), 30, "and share storage with the parameters")
  local ks = {}
  for k in sd:items() do ks[#ks + 1] = k end
  T.is(ks, sd:keys(), "items() iterates in order")
end)

T.run("load_state_dict", function()
  local a, b = SimpleNN(), SimpleNN()
  local r = b:load_state_dict(a:state_dict())
  T.tensor_close(b.fc2.weight, a.fc2.weight, 0, 0, "values are copied")
  T.ok(b.fc2.weight ~= a.fc2.weight and nn.is_parameter(b.fc2.weight), "into b's own parameters")
  T.is(r.missing_keys, {}, "no missing keys")
  local plain = {}
  for k, v in a:state_dict():items() do plain[k] = v:clone() end
  T.lives(function() b:load_state_dict(plain) end, "a plain table works as a state dict")

  local sd = a:state_dict()
  sd["fc2.weight"], sd["fc2.bias"] = nil, nil
  sd["fc3.weight"] = torch.zeros(1)
  T.raises(function() b:load_state_dict(sd) end,
           { "Error%(s%) in loading state_dict for SimpleNN:",
             'Missing key%(s%) in state_dict: "fc2.weight", "fc2.bias"%.',
             'Unexpected key%(s%) in state_dict: "fc3.weight"%.' },
           "missing and unexpected keys are named")
  local r2 = b:load_state_dict(sd, { strict = false })
  T.is(r2.missing_keys, { "fc2.weight", "fc2.bias" }, "strict=false returns the missing keys")
  T.is(r2.unexpected_keys, { "fc3.weight" }, "and the unexpected ones")
  T.tensor_close(b.fc1.weight, a.fc1.weight, 0, 0, "and loads what matches")

  local bad = a:state_dict()
  bad["fc1.weight"] = torch.zeros(2, 10)
  T.raises(function() b:load_state_dict(bad, false) end,
           "size mismatch for fc1%.weight: copying a param with shape torch%.Size%(%[2, 10%]%) from checkpoint, "
           .. "the shape in current model is torch%.Size%(%[10, 10%]%)%.",
           "a shape mismatch is an error, also with strict=false")
  T.raises(function() b:load_state_dict(5) end, "expected a state dict", "a non-table is refused")
end)

---------------------------------------------------------------- initialisation

T.run("Linear and Conv2d initialisation", function()
  local l = nn.Linear(400, 300)
  local bound = 1 / math.sqrt(400)
  T.ok(l.weight:abs():max():item() <= bound, "weight within kaiming_uniform(a=sqrt(5)) bound 1/sqrt(in)")
  T.ok(l.weight:abs():max():item() > 0.95 * bound, "and fills it")
  T.ok(l.bias:abs():max():item() <= bound, "bias within 1/sqrt(in)")
  T.close(l.weight:var():item(), bound * bound / 3, 0.03, 0, "weight variance is bound^2/3 (uniform)")
  T.close(l.weight:mean():item(), 0, 0, 1e-3, "weight mean 0")
  local c = nn.Conv2d(8, 16, 3)
  local cb = 1 / math.sqrt(8 * 9)
  T.ok(c.weight:abs():max():item() <= cb and c.weight:abs():max():item() > 0.9 * cb, "Conv2d weight bound 1/sqrt(in*kh*kw)")
  T.ok(c.bias:abs():max():item() <= cb, "Conv2d bias bound")
  T.is(c.weight:size(), torch.Size and c.weight:size() or { 16, 8, 3, 3 }, "Conv2d weight shape")
  local e = nn.Embedding(1000, 20)
  T.close(e.weight:std():item(), 1, 0.05, 0, "Embedding weight ~ N(0, 1)")
  local ln = nn.LayerNorm(5)
  T.is(ln.weight:tolist(), { 1, 1, 1, 1, 1 }, "LayerNorm weight ones")
  T.is(ln.bias:tolist(), { 0, 0, 0, 0, 0 }, "LayerNorm bias zeros")
  torch.manual_seed(42)
  local w1 = nn.Linear(3, 3).weight:detach():clone()
  torch.manual_seed(42)
  local w2 = nn.Linear(3, 3).weight
  T.tensor_close(w2, w1, 0, 0, "initialisation is reproducible from manual_seed")
  local d = nn.Linear(2, 2, { dtype = torch.float64 })
  T.is(tostring(d.weight.dtype), "torch.float64", "Linear({dtype=}) creates parameters of that dtype")
end)

T.run("nn.init", function()
  local init = nn.init
  local w = torch.empty(64, 32, 3, 3)
  local fi, fo = init._calculate_fan_in_and_fan_out(w)
  T.is({ fi, fo }, { 32 * 9, 64 * 9 }, "fans of a conv weight")
  T.raises(function() init._calculate_fan_in_and_fan_out(torch.empty(3)) end, "fewer than 2 dimensions", "1-D has no fans")
  T.close(init.calculate_gain("relu"), math.sqrt(2), 1e-15, 0, "gain relu")
  T.close(init.calculate_gain("leaky_relu"), math.sqrt(2 / (1 + 0.0001)), 1e-15, 0, "gain leaky_relu default slope")
  T.close(init.calculate_gain("tanh"), 5 / 3, 1e-15, 0, "gain tanh")
  T.is(init.calculate_gain("linear"), 1, "gain linear")
  init.kaiming_uniform_(w, { a = 0, nonlinearity = "relu" })
  local b = math.sqrt(3) * math.sqrt(2) / math.sqrt(32 * 9)
  T.ok(w:abs():max():item() <= b and w:abs():max():item() > 0.95 * b, "kaiming_uniform_ bound sqrt(6/fan_in)")
  init.kaiming_uniform_(w, 0, "fan_out", "relu")
  local bo = math.sqrt(3) * math.sqrt(2) / math.sqrt(64 * 9)
  T.ok(w:abs():max():item() <= bo, "kaiming_uniform_ mode=fan_out (positional form)")
  local big = torch.empty(500, 400)
  init.kaiming_normal_(big, { nonlinearity = "relu" })
  T.close(big:std():item(), math.sqrt(2 / 400), 0.02, 0, "kaiming_normal_ std")
  init.xavier_uniform_(big, 2)
  local xb = 2 * math.sqrt(6 / 900)
  T.ok(big:abs():max():item() <= xb and big:abs():max():item() > 0.95 * xb, "xavier_uniform_ bound with gain")
  init.xavier_normal_(big)
  T.close(big:std():item(), math.sqrt(2 / 900), 0.02, 0, "xavier_normal_ std")
  init.normal_(big, 3, 0.5)
  T.close(big:mean():item(), 3, 0, 0.01, "normal_ mean")
  T.close(big:std():item(), 0.5, 0.02, 0, "normal_ std")
  init.uniform_(big, -2, -1)
  T.ok(big:min():item() >= -2 and big:max():item() < -1, "uniform_ range")
  init.constant_(big, 0.25)
  T.is(big:mean():item(), 0.25, "constant_")
  init.ones_(big); T.is(big:sum():item(), 200000, "ones_")
  init.zeros_(big); T.is(big:sum():item(), 0, "zeros_")
  local p = nn.Parameter(torch.empty(3, 3))
  init.xavier_uniform_(p)
  T.ok(p.is_leaf and p.requires_grad and p.grad_fn == nil, "init of a Parameter leaves it a leaf (no_grad)")
  T.raises(function() init.kaiming_uniform_(w, { mode = "fan_x" }) end, "mode fan_x not supported", "bad mode")
end)

---------------------------------------------------------------- clip_grad_norm_

T.run("clip_grad_norm_", function()
  local U = nn.utils
  local function params()
    local a = nn.Parameter(torch.zeros(2))
    local b = nn.Parameter(torch.zeros(1))
    a.grad = torch.tensor({ 3, 4 })
    b.grad = torch.tensor({ -12 })
    return a, b
  end
  local a, b = params()
  local total = U.clip_grad_norm_({ a, b }, 1.0)
  T.ok(torch.is_tensor(total), "returns a tensor")
  T.close(total:item(), 13, 1e-6, 0, "total 2-norm sqrt(9 + 16 + 144) = 13")
  local coef = 1 / (13 + 1e-6)
  T.tensor_close(a.grad, { 3 * coef, 4 * coef }, 1e-6, 0, "gradients scaled by max_norm / (total + 1e-6)")
  T.tensor_close(b.grad, { -12 * coef }, 1e-6, 0, "every gradient")
  a, b = params()
  U.clip_grad_norm_({ a, b }, 100)
  T.tensor_close(a.grad, { 3, 4 }, 0, 0, "the coefficient is clamped to 1")
  a, b = params()
  T.close(U.clip_grad_norm_({ a, b }, 6, math.huge):item(), 12, 0, 0, "inf-norm: the largest |g|")
  T.tensor_close(b.grad, { -12 * 6 / (12 + 1e-6) }, 1e-6, 0, "inf-norm clipping")
  a, b = params()
  T.close(U.clip_grad_norm_({ a, b }, 1000, 1):item(), 19, 1e-6, 0, "1-norm")
  a, b = params()
  T.close(U.clip_grad_norm_({ a, b }, 1000, 3):item(), (27 + 64 + 1728) ^ (1 / 3), 1e-6, 0, "3-norm")
  local c = nn.Parameter(torch.zeros(2))
  T.is(U.clip_grad_norm_({ c }, 1):item(), 0, "no gradients: total 0")
  a, b = params()
  T.close(U.clip_grad_norm_(a, 1):item(), 5, 1e-6, 0, "a single tensor")
  local m = SimpleNN()
  m(torch.randn(4, 10)):sum():backward()
  local n = U.clip_grad_norm_(m:parameters(), 0.01):item()
  local sq = 0
  for _, p in ipairs(m:parameters()) do sq = sq + p.grad:square():sum():item() end
  T.close(math.sqrt(sq), 0.01 * n / (n + 1e-6), 1e-4, 0, "a model's gradients end with norm max_norm")
  -- error_if_nonfinite as PyTorch's fourth argument, or in a table
  local d = nn.Parameter(torch.zeros(1))
  d.grad = torch.tensor({ math.huge })
  T.raises(function() U.clip_grad_norm_({ d }, 1, 2, true) end, "non%-finite", "error_if_nonfinite = true, positional")
  T.raises(function() U.clip_grad_norm_({ d }, 1, 2, { error_if_nonfinite = true }) end, "non%-finite",
           "error_if_nonfinite = true, in a table")
  T.raises(function() U.clip_grad_norm_({ d }, 1, 2, "yes") end, "expected error_if_nonfinite",
           "error_if_nonfinite of the wrong type")
  a, b = params()
  T.close(U.clip_grad_norm_({ a, b }, 1000, 2, false):item(), 13, 1e-6, 0, "error_if_nonfinite = false, positional")
  -- its two halves: get_total_norm and clip_grads_with_norm_
  a, b = params()
  T.close(U.get_total_norm({ a.grad, b.grad }):item(), 13, 1e-6, 0, "get_total_norm: the 2-norm of all")
  T.close(U.get_total_norm(a.grad, 1):item(), 7, 1e-6, 0, "of one tensor, 1-norm")
  T.close(U.get_total_norm({ a.grad, b.grad }, { norm_type = math.huge }):item(), 12, 0, 0, "options in a table")
  T.is(U.get_total_norm({}):item(), 0, "of nothing: 0")
  U.clip_grads_with_norm_({ a, b }, 1.0, torch.tensor(26.0))
  T.values_close(a.grad:tolist(), { 3 / (26 + 1e-6), 4 / (26 + 1e-6) }, 1e-6, 0, "clip_grads_with_norm_ scales by the norm given")
  U.clip_grads_with_norm_({ a, b }, 100, 1.0)
  T.values_close(a.grad:tolist(), { 3 / (26 + 1e-6), 4 / (26 + 1e-6) }, 1e-6, 0, "never up")
  T.raises(function() U.get_total_norm({ 1 }) end, "expected tensors%[1%] to be a tensor", "get_total_norm of a number")
  T.raises(function() U.clip_grads_with_norm_({ a }, 1, "x") end, "total_norm to be a tensor or a number", "a bad norm")
  T.raises(function() U.get_total_norm({ d.grad }, 2, true) end, "non%-finite", "get_total_norm: error_if_nonfinite")
end)

---------------------------------------------------------------- errors

T.run("argument errors", function()
  local l = nn.Linear(3, 2)
  T.raises(function() l(torch.zeros(4, 5)) end, { "linear", "%[4, 5%]", "%[2, 3%]" }, "Linear with the wrong in_features")
  T.raises(function() nn.Linear(3.5, 2) end, "in_features", "Linear with a non-integer size")
  T.raises(function() F.cross_entropy(torch.zeros(4, 3), torch.zeros(4)) end,
           "int64 tensor of class indices", "cross_entropy with a float target of the wrong shape")
  T.raises(function() F.cross_entropy(torch.zeros(4, 3), torch.zeros(4, { dtype = torch.int32 })) end,
           { "int64", "int32" }, "cross_entropy with an int32 target")
  T.raises(function() F.cross_entropy(torch.zeros(4, 3), torch.zeros(5, { dtype = torch.int64 })) end,
           { "target of shape %[4%]", "%[5%]" }, "cross_entropy with the wrong batch size")
  T.raises(function() F.cross_entropy(torch.zeros(4, 3), torch.zeros(4, { dtype = torch.int64 }), { reduction = "avg" }) end,
           "reduction", "a bad reduction")
  T.raises(function() F.cross_entropy(torch.zeros(4, 3), torch.zeros(4, { dtype = torch.int64 }), { weight = torch.ones(4) }) end,
           "weight", "a weight of the wrong size")
  T.raises(function() F.binary_cross_entropy_with_logits(torch.zeros(4), torch.zeros(3)) end,
           "Target size", "bce_with_logits shape mismatch")
  T.raises(function() nn.Conv2d(1, 2, 3)(torch.zeros(1, 3, 5, 5)) end, "expected input", "conv2d channel mismatch")
  T.raises(function() nn.Conv2d(1, 2, 3)(torch.zeros(5, 5)) end, "3-D", "conv2d with 2-D input")
  T.raises(function() nn.MaxPool2d(2)(torch.zeros(1, 1, 1, 1)) end, "too small", "pooling a too small input")
  -- sizes past int64 once multiplied: the output's element count must not
  -- wrap around (to 0, and a write past the end)
  T.raises(function() F.conv2d(torch.randn(1, 1, 4, 4), torch.randn(1, 1, 1, 1), nil, 1, 2 ^ 31 - 2) end,
           { "conv2d", "4294967296 x 4294967296 positions are too many" }, "conv2d with a padding of 2^31 - 2")
  T.raises(function() F.conv2d(torch.randn(1, 1, 4, 4), torch.randn(1, 1, 1, 1), nil, 1, 2 ^ 62) end,
           { "padding 4611686018427387904", "too large" }, "conv2d with a padding of 2^62")
  T.raises(function() F.conv2d(torch.randn(1, 1, 4, 4), torch.randn(1, 1, 3, 3), nil, 1, 0, 2 ^ 62) end,
           { "too small for kernel %(3, 3%) with dilation %(4611686018427387904, 4611686018427387904%)" },
           "conv2d with a dilation of 2^62")
  T.raises(function() nn.LayerNorm(4)(torch.zeros(2, 3)) end, "normalized_shape", "layer_norm shape mismatch")
  T.raises(function() nn.Embedding(4, 2)(torch.zeros(3)) end, "int64", "embedding with float indices")
  T.raises(function() nn.Dropout(1.5) end, "between 0 and 1", "a bad dropout probability")
  T.raises(function() nn.CrossEntropyLoss({ reductio = "sum" }) end, "unknown option", "a misspelled option")
end)

---------------------------------------------------------------- forward values against PyTorch

local ref = {  -- generated by scripts/gen_nn_reference.py with torch 1.13.0a0
  bce = 0.84135986306992772,
  bce_none = {{20.000000002061153, 50, 56}, {0, 10.000045398899218, 24.000000000000092}, {40, 10.000000002061153, 5.0067153484891183}, {6.1441934777474324e-06, 6.9144689973630849e-13, 1.1253516840233601e-07}},
  bce_pw_w = 8.0064145422881428,
  ce_ignore1_none = {0.23262198310203266, 0.33067260940722409, 0, 0},
  ce_kdim = {{0.23262198310203266, 0.33067260940722409, 0.57062596849955427, 0.69474147386557528}},
  ce_mean = 0.45716550871859657,
  ce_none = {0.23262198310203266, 0.33067260940722409, 0.57062596849955427, 0.69474147386557528},
  ce_probs = 1.5631979680431389,
  ce_sum = 1.8286620348743863,
  ce_weight = 0.53252452020767993,
  ce_weight_ignore_ls = 0.62962828763247147,
  conv = {{{{0.10853375933897949, 0.16433962718113621, 0.16099193851034888}, {0.034354884527264679, 0.088360549353100032, 0.15306747142561813}, {0.054224166821057199, 0.029057028802682336, 0.069114531332847423}}, {{-0.15541501542499656, -0.18141074018515935, -0.22449734469032279}, {-0.18108510527099048, -0.15536447794368799, -0.17068154374770236}, {-0.23385410382172758, -0.19326644034326979, -0.15886958055980782}}, {{0.35034666116437929, 0.26020997051812311, 0.20665604947638203}, {0.39062475752122122, 0.37058661263685982, 0.28565146162101196}, {0.30106697238670965, 0.37983553509191237, 0.38520367501404457}}}, {{{0.089611044445638999, 0.15390719344666165, 0.16864131739858265}, {0.029224768367094006, 0.070260736930114184, 0.13863884680994976}, {0.070236441791048293, 0.029220997840399235, 0.053279442061195309}}, {{-0.15526204270030669, -0.17129188822118163, -0.21371583931726187}, {-0.1924787751815582, -0.15855017876052813, -0.16273035683142384}, {-0.24047098316097426, -0.20519261801912067, -0.16514018381747259}}, {{0.36947139694975611, 0.28400569829272337, 0.21324508686385918}, {0.38070801246106067, 0.38447928210619298, 0.31058068937906202}, {0.27631622544843937, 0.36392145728449105, 0.39275759608208499}}}},
  conv_d2 = {{{{0.62366723918607625, 0.37223984885176087, -0.43823685875830221, -0.10974538012131835, -0.3031692267433066}, {0.26073670533433391, 0.60636231337449531, 0.66034778524918292, 0.37080307625606657, -0.0051470671540998214}, {-0.5955934202488059, -0.12768823732231721, 1.077557103235123, 0.45899760085101349, 0.62936527440551571}, {-0.0069829175925485709, -0.40176206180825758, -0.40893563485670326, -0.22847513768448877, 0.12975865133761319}, {0.57558013218359694, 0.14469741738306044, -0.66694146027343904, -0.22933648574748774, -0.28420553694077444}}, {{0.050808531627067888, -0.33870181948349265, -0.84618326848411152, -0.68260408768032665, -0.45582180261757993}, {0.18363421918373762, 0.13187338874868565, 0.41376103966877115, -0.34251500461608408, -0.66501924054947237}, {-0.45011716421747, 0.079840120965731121, 0.9990622343168023, 0.41336678844102465, 0.0035985616364092032}, {-0.56239740971046936, -0.58252458234749127, -0.83675864921161902, -0.12748206780875032, 0.22242356830478444}, {-0.090015407093919225, -0.48596158493971825, -1.2219271789744923, -0.61616463089374129, -0.25762823334111151}}, {{0.10755888882095721, -0.15541410658937016, -0.015134358777356804, -0.1275977050031033, 0.36532240554029255}, {0.64590346422805323, 0.231920773850185, 0.55020555347591138, -0.1590131537030316, -0.20897288122547936}, {0.66528033514595775, 0.8972544523437509, 0.90596455185260205, 0.75103507652822743, 0.039513789640450547}, {-0.071611211719848467, 0.29658731573198333, -0.031989115530022871, 0.72424474223087576, 0.82810802887785417}, {-0.030330803492979952, -0.12234784228637008, -0.28264972149775208, 0.079735567428752152, 0.60809976625732576}}}, {{{0.60865702531597488, 0.48012030191587673, -0.22428678696529672, -0.012022574172976253, -0.28652276532652554}, {0.1242983080638134, 0.55343460726121962, 0.83147633529675091, 0.43972306101780201, 0.1006884198798027}, {-0.61741558858931078, -0.2982425152799143, 0.85519690969779882, 0.34184170505214928, 0.63357513532181786}, {0.13519373411793026, -0.33300982099884058, -0.56145085243787007, -0.28158410868623107, 0.021282490981850588}, {0.62510228195670448, 0.28388962140681284, -0.56034596950190607, -0.15348429029168317, -0.30870734565393698}}, {{0.1275230839152372, -0.2322722409415558, -0.60545866647543733, -0.66723384159392085, -0.55423968052949735}, {0.13134466600567007, 0.18395524717146694, 0.61669954118575099, -0.21653617148203314, -0.6148233535482317}, {-0.57074709087347086, -0.055095943325712576, 0.72635711242329415, 0.43172832856246252, 0.15341648484816406}, {-0.4914808281701315, -0.61767703137416508, -1.0446424752942871, -0.24951941598382743, 0.15907058870283258}, {0.013824635084029258, -0.39347382008752252, -1.0912148217794728, -0.65372678119691141, -0.37566292855452788}}, {{0.22388090397374344, -0.12274010172825245, 0.08882452301310631, -0.20502205035009174, 0.21870200577318105}, {0.71328653023838351, 0.35362952258939129, 0.64708437002370045, -0.061561281657754041, -0.24851800251527972}, {0.52779459131603257, 0.88960765470867265, 0.76818124856988357, 0.8924398357896508, 0.23315848450644872}, {-0.12013305606504948, 0.18141157606654429, -0.15401222542104054, 0.61618711317301078, 0.85291812733718664}, {0.057281676403651227, -0.13939761343001417, -0.21662210540960641, -0.045722458912570207, 0.47672101216665524}}}},
  conv_s2_p1 = {{{{0.59795544102741083, -0.25219488267370949, -0.024288694115869716}, {-0.16459373760738352, -0.011639450646899981, -0.074889003846121793}, {0.38130124135619098, 0.12057099783234526, -0.011103429276714039}}, {{0.13900501008075514, -0.42034702779537308, 0.48012946066293716}, {0.018378925062463605, 0.044635522056312014, -0.20799688767148336}, {0.098806157987182383, -0.28357761228488648, 0.2563487855912292}}, {{-0.41438077965549175, -0.30292944875433814, 0.65836370410778255}, {0.18886556020400458, 0.070586612636859836, -0.19979863653837315}, {-0.25081452736350923, -0.49507306878369012, 0.34964620180464978}}}, {{{0.53443209306630046, -0.14543398942106411, -0.00043629084919131908}, {-0.11093325965944197, -0.029739263069885818, -0.11074709165098542}, {0.22657477233155221, 0.23479572634672718, 0.033202473686972489}}, {{0.10703194606224385, -0.41338782077487024, 0.43221261762873225}, {0.062740408526866742, 0.041449821239471898, -0.19692084755379841}, {0.031729712537469063, -0.19458463567857973, 0.16003976068328324}}, {{-0.39308212846474222, -0.40049978066344838, 0.5712307167175148}, {0.19379033972414109, 0.084479282106193002, -0.14931316003173173}, {-0.18467145365900708, -0.4917706985590341, 0.17815138223813931}}}},
  layer_norm = {{2.0188236207959251, -1.3823620795925211, 1.9537301203268773}, {2.3802478892992953, 0.36419718239310866, 0.058433797925553622}, {1.5798605374451682, 1.8058388701028558, 1.4239245027580285}, {2.0659896052562137, 2.1497401314053368, -0.055833684099415554}},
  mse = 1.4935937500000003,
  mse_sum = 17.923125000000002,
  nll = 0.53252452020767993,
  pool = {{{{0.8414709848078965, 0.98935824662338179}, {0.65028784015711683, 0.42016703682664092}}, {{0.76255845047960269, 0.99991186010726718}, {0.74511316047934883, 0.29636857870938532}}}, {{{0.67022917584337471, 0.99287264808453712}, {0.82682867949010341, 0.16735570030280691}}, {{0.56610763689818033, 0.99952015858073129}, {0.89399666360055785, 0.03539830273366068}}}},
  pool_3_2_1 = {{{{0.8414709848078965, 0.98935824662338179, 0.98935824662338179}, {0.65028784015711683, 0.98935824662338179, 0.99060735569487035}, {0.91294525072762767, 0.83665563853605607, 0.14987720966295234}}, {{0.76255845047960269, 0.99991186010726718, 0.99991186010726718}, {0.74511316047934883, 0.99991186010726718, 0.99991186010726718}, {0.90178834764880922, 0.90178834764880922, 0.017701925105413577}}}, {{{0.67022917584337471, 0.99287264808453712, 0.99287264808453712}, {0.82682867949010341, 0.99287264808453712, 0.99287264808453712}, {0.95105465325437466, 0.95105465325437466, -0.11478481378318722}}, {{0.56610763689818033, 0.99952015858073129, 0.96836446110018537}, {0.89399666360055785, 0.96836446110018537, 0.96836446110018537}, {0.98358774543434491, 0.98358774543434491, -0.24525198546765434}}}},
}

T.run("functional forward values against PyTorch", function()
  local X = torch.tensor({ { 0.5, -1.25, 2.0 }, { 1.5, 0.25, -0.75 }, { -2.0, 0.5, 0.125 }, { 0.3, 0.7, -0.4 } }, f64)
  local Y = torch.tensor({ 2, 0, 1, 1 }, { dtype = torch.int64 })
  local W = torch.tensor({ 0.3, 1.5, 0.8 }, f64)
  local BT = torch.tensor({ { 0, 1, 0.3 }, { 1, 0, 0.8 }, { 0.5, 0.5, 0 }, { 1, 1, 0 } }, f64)
  local PW = torch.tensor({ 2, 0.5, 1 }, f64)
  local IMG = torch.arange(100, f64):view(2, 2, 5, 5):sin()
  local KER = torch.arange(54, f64):view(3, 2, 3, 3):cos()
  local KB = torch.tensor({ 0.1, -0.2, 0.3 }, f64)
  local tol = 1e-12
  local function is(name, got) T.tensor_close(got, ref[name], tol, tol, name) end
  is("ce_mean", F.cross_entropy(X, Y))
  is("ce_sum", F.cross_entropy(X, Y, { reduction = "sum" }))
  is("ce_none", F.cross_entropy(X, Y, { reduction = "none" }))
  is("ce_weight", F.cross_entropy(X, Y, { weight = W }))
  is("ce_weight_ignore_ls", F.cross_entropy(X, torch.tensor({ 2, 0, -100, 1 }, { dtype = torch.int64 }),
                                            { weight = W, label_smoothing = 0.1 }))
  is("ce_ignore1_none", F.cross_entropy(X, Y, { ignore_index = 1, reduction = "none" }))
  is("ce_probs", F.cross_entropy(X, BT:softmax(1), { label_smoothing = 0.2 }))
  is("ce_kdim", F.cross_entropy(X:t():reshape(1, 3, 4), Y:view(1, 4), { reduction = "none" }))
  is("nll", F.nll_loss(X:log_softmax(1), Y, { weight = W }))
  is("mse", F.mse_loss(X, BT))
  is("mse_sum", F.mse_loss(X, BT, "sum"))
  is("bce", F.binary_cross_entropy_with_logits(X, BT))
  is("bce_pw_w", F.binary_cross_entropy_with_logits(X, BT, { pos_weight = PW, weight = W, reduction = "sum" }))
  is("bce_none", F.binary_cross_entropy_with_logits(X * 40, BT, { reduction = "none" }))
  is("layer_norm", F.layer_norm(X, { 3 }, W, PW))
  is("conv", F.conv2d(IMG, KER, KB))
  is("conv_s2_p1", F.conv2d(IMG, KER, nil, 2, 1))
  is("conv_d2", F.conv2d(IMG, KER, KB, { dilation = 2, padding = 2 }))
  is("pool", F.max_pool2d(IMG, 2))
  is("pool_3_2_1", F.max_pool2d(IMG, 3, 2, 1))
  local loss = nn.CrossEntropyLoss({ weight = W, label_smoothing = 0.1 })
  is("ce_weight_ignore_ls", loss(X, torch.tensor({ 2, 0, -100, 1 }, { dtype = torch.int64 })))
  T.is(loss:state_dict():keys(), { "weight" }, "a loss's class weight is a buffer, as in PyTorch")
  is("bce_pw_w", nn.BCEWithLogitsLoss({ pos_weight = PW, weight = W, reduction = "sum" })(X, BT))
end)

T.run("a training loop lowers the loss", function()
  torch.manual_seed(3)
  local m = SimpleNN()
  local x = torch.randn(64, 10)
  local y = x:narrow(1, 0, 1):squeeze(1):gt(0):long()
  local crit = nn.CrossEntropyLoss()
  local first, last
  for i = 1, 100 do
    m:zero_grad()
    local loss = crit(m(x), y)
    loss:backward()
    torch.no_grad(function()
      for _, p in ipairs(m:parameters()) do p:sub_(p.grad * 0.5) end
    end)
    if i == 1 then first = loss:item() end
    last = loss:item()
  end
  T.ok(last < first * 0.5, ("plain gradient descent by hand: %.3f -> %.3f"):format(first, last))
end)

T.run("nn.init: orthogonal_, eye_, dirac_, sparse_", function()
  local I, F = nn.init, nn.functional
  for _, shape in ipairs({ { 6, 4 }, { 3, 8 }, { 4, 2, 3 } }) do
    local w = torch.empty(shape, { dtype = torch.float64 })
    I.orthogonal_(w, 1.5)
    local m = w:reshape(shape[1], -1)
    local small = math.min(m:size(0), m:size(1))
    local gram = m:size(0) >= m:size(1) and m:t():mm(m) or m:mm(m:t())
    T.tensor_close(gram, torch.eye(small, { dtype = torch.float64 }) * 2.25, 0, 1e-12,
                   "orthogonal_ of " .. table.concat(shape, "x") .. ": orthonormal rows or columns times gain")
  end
  T.raises(function() I.orthogonal_(torch.empty(3)) end, "2 or more dimensions", "orthogonal_ of a vector")
  T.tensor_close(I.eye_(torch.empty(2, 3)), torch.eye(2, 3), 0, 0, "eye_")
  local conv = torch.empty(6, 2, 3, 3)
  I.dirac_(conv, 3)
  local x = torch.randn(1, 6, 5, 5)
  local y = F.conv2d(x, conv, nil, 1, 1, 1, 3)
  T.tensor_close(y, x, 0, 1e-6, "dirac_ with groups: a convolution that passes its input through")
  local sp = torch.empty(20, 7)
  I.sparse_(sp, 0.25, 0.5)
  T.is(sp:eq(0):sum(0):tolist(), { 5, 5, 5, 5, 5, 5, 5 }, "sparse_ zeroes ceil(sparsity * rows) of each column")
  T.close(sp:masked_select(sp:ne(0)):std():item(), 0.5, 0.3, 0, "sparse_'s std")
  T.raises(function() I.sparse_(sp, 1.5) end, "expected sparsity in %[0, 1%]", "sparse_'s sparsity")
  local leaf = nn.Linear(4, 4).weight
  I.orthogonal_(leaf)
  T.ok(leaf.requires_grad and leaf.grad_fn == nil, "a parameter stays a leaf")
end)

T.run("lazy modules take their input size from the first call", function()
  local x = torch.randn(4, 7)
  torch.manual_seed(11)
  local plain = nn.Linear(7, 5)
  torch.manual_seed(11)
  local lazy = nn.LazyLinear(5)
  T.ok(lazy:has_uninitialized_params(), "uninitialized before the first call")
  T.is(#lazy:parameters(), 0, "no parameters yet")
  T.tensor_close(lazy(x), plain(x), 0, 0, "the first call: a Linear(7, 5) initialised as one")
  T.ok(nn.isinstance(lazy, nn.Linear), "it is a Linear now")
  T.is(tostring(lazy), "Linear(in_features=7, out_features=5, bias=True)", "and prints as one")
  T.is(#lazy:parameters(), 2, "with its parameters")
  local conv = nn.LazyConv2d(4, 3, { stride = 2, bias = false })
  T.is(T.shape(conv(torch.randn(2, 3, 9, 9))), { 2, 4, 4, 4 }, "LazyConv2d")
  T.is(T.shape(conv.weight), { 4, 3, 3, 3 }, "in_channels from the input's dim 1")
  local c1 = nn.LazyConv1d(2, 3)
  T.is(T.shape(c1(torch.randn(5, 10))), { 2, 8 }, "LazyConv1d on an unbatched input: channels from dim 0")
  local bn = nn.LazyBatchNorm1d({ momentum = 0.2 })
  bn(torch.randn(8, 6))
  T.is({ bn.num_features, bn.momentum }, { 6, 0.2 }, "LazyBatchNorm1d keeps its options")
  local ct = nn.LazyConvTranspose2d(3, 2)
  T.is(T.shape(ct(torch.randn(1, 5, 4, 4))), { 1, 3, 5, 5 }, "LazyConvTranspose2d")
  T.raises(function() nn.LazyLinear(3)("x") end, "LazyLinear: expected the input to be a tensor", "a bad input")
end)

T.run("get_buffer, type, half", function()
  local m = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
  T.ok(rawequal(m:get_buffer("1.running_var"), m[1].running_var), "get_buffer by dotted path")
  T.raises(function() m:get_buffer("1.running_std") end, "BatchNorm1d has no buffer `running_std`", "a missing buffer")
  T.is(m:type(torch.float64)[0].weight.dtype, torch.float64, "type(dtype) is to(dtype)")
  T.raises(function() m:half() end, "float16 is not a dplua dtype", "half says why")
end)

T.run("older names and DataParallel", function()
  local x = torch.randn(2, 3, 4, 4)
  local logp = x:log_softmax(1)
  local target = torch.randint(0, 3, { 2, 4, 4 })
  T.tensor_close(nn.NLLLoss2d()(logp, target), nn.NLLLoss()(logp, target), 0, 0, "NLLLoss2d is NLLLoss")
  T.tensor_close(nn.CrossMapLRN2d(3, 1e-3)(x), nn.LocalResponseNorm(3, 1e-3)(x), 0, 0, "CrossMapLRN2d is LocalResponseNorm")
  T.raises(function() nn.CrossMapLRN2d(3)(torch.randn(2, 3, 4)) end, "expected a 4%-D input", "CrossMapLRN2d of 3-D input")
  local y, i = F.max_pool2d_with_indices(x, 2)
  local y2, i2 = F.max_pool2d(x, 2, { return_indices = true })
  T.ok(torch.equal(y, y2) and torch.equal(i, i2), "max_pool2d_with_indices")
  local _, ai = F.adaptive_max_pool2d_with_indices(x, 2)
  T.ok(torch.equal(ai, select(2, F.adaptive_max_pool2d(x, 2, true))), "adaptive_max_pool2d_with_indices")
  local lin = nn.Linear(3, 2)
  local dp = nn.DataParallel(lin)
  T.is(T.sorted_keys(dp:state_dict()), { "module.bias", "module.weight" }, "DataParallel: PyTorch's module. keys")
  local v = torch.randn(4, 3)
  T.tensor_close(dp(v), lin(v), 0, 0, "on one device it runs the module")
  T.raises(function() nn.DataParallel(lin, { 0, 1 })(v) end, "dplua runs data parallelism as DistributedDataParallel",
           "several devices: a pointer to DDP")
  local inorm = nn.LazyInstanceNorm1d({ affine = true })
  inorm(torch.randn(2, 5, 7))
  T.is(T.shape(inorm.weight), { 5 }, "LazyInstanceNorm1d")
end)

T.done_testing()
