-- dplua's side of scripts/bench/examples: a training step of three models
-- people copy from pytorch/examples, at those programs' batch sizes, as
-- "name ms" lines (examples.py builds the same models for PyTorch):
--   mnist_cnn  mnist/main.py's Net, batch 64, log_softmax + nll_loss, Adadelta lr 1.0
--   resnet     a small ResNet on 1x28x28 input (one BasicBlock each at widths
--              16, 32 stride 2, 64 stride 2), batch 128, SGD momentum 0.9,
--              weight_decay 5e-4
--   lstm_lm    word_language_model's LSTM model (10000 tokens, 200 wide, 2
--              layers, dropout 0.2), batch 20 x bptt 35, the hidden state
--              carried and detached, clip_grad_norm_(0.25), SGD lr 20
-- usage: [DPLUA_BENCH_KERNELS=1] dplua scripts/bench/examples.lua [cpu|cuda]
-- On "cpu" (one thread) a row is the best of a few repeats of the process's
-- CPU time (os.clock); on "cuda" it is CUDA events around a few steps after
-- as many untimed. Without a CUDA device, "cuda" prints "no_gpu" only.
local torch = require("dplua")
local nn, F = torch.nn, torch.nn.functional
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local models = dofile(here .. "/models.lua")
local T = dofile(here .. "/timing.lua")

local device = arg[1] or "cpu"
if device ~= "cpu" and device ~= "cuda" then error("examples.lua: device should be cpu or cuda, got " .. device) end
if device == "cuda" and not torch.cuda.is_available() then print("no_gpu"); return end
torch.set_num_threads(1)

-- DPLUA_BENCH_KERNELS=1 on "cuda": each row's kernels over two more steps
-- (torch.cuda.profile_kernels, the 15 longest), on stderr
local kernels = device == "cuda" and os.getenv("DPLUA_BENCH_KERNELS") == "1"

local function step_ms(f, n)
  if device ~= "cuda" then return T.cpu_ms(f, n) end
  local ms = T.gpu_ms(f, 10)
  if kernels then io.stderr:write(torch.cuda.profile_kernels(function() f(); f() end):table(15), "\n") end
  return ms
end

-- torchvision's BasicBlock: two 3x3 convolutions with BatchNorm, the input
-- added back (through a strided 1x1 convolution + BatchNorm where the shape
-- changes)
local BasicBlock = nn.Module:extend("BasicBlock")
function BasicBlock:__init(cin, cout, stride)
  self.conv1 = nn.Conv2d(cin, cout, 3, { stride = stride, padding = 1, bias = false })
  self.bn1 = nn.BatchNorm2d(cout)
  self.conv2 = nn.Conv2d(cout, cout, 3, { padding = 1, bias = false })
  self.bn2 = nn.BatchNorm2d(cout)
  if stride ~= 1 or cin ~= cout then
    self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, { stride = stride, bias = false }), nn.BatchNorm2d(cout))
  end
end
function BasicBlock:forward(x)
  local out = F.relu(self.bn1(self.conv1(x)))
  out = self.bn2(self.conv2(out))
  return F.relu(out + (self.downsample and self.downsample(x) or x))
end

local ResNet = nn.Module:extend("ResNet")
function ResNet:__init()
  self.stem = nn.Sequential(nn.Conv2d(1, 16, 3, { padding = 1, bias = false }), nn.BatchNorm2d(16), nn.ReLU())
  self.layers = nn.Sequential(BasicBlock(16, 16, 1), BasicBlock(16, 32, 2), BasicBlock(32, 64, 2))
  self.pool = nn.AdaptiveAvgPool2d(1)
  self.fc = nn.Linear(64, 10)
end
function ResNet:forward(x) return self.fc(torch.flatten(self.pool(self.layers(self.stem(x))), 1)) end

-- word_language_model's RNNModel with an LSTM: dropout on the embedding,
-- between the layers and on the output
local LM = nn.Module:extend("LM")
function LM:__init(ntoken, ninp, nhid, nlayers, dropout)
  self.ntoken = ntoken
  self.drop = nn.Dropout(dropout)
  self.encoder = nn.Embedding(ntoken, ninp)
  self.rnn = nn.LSTM(ninp, nhid, nlayers, { dropout = dropout })
  self.decoder = nn.Linear(nhid, ntoken)
end
function LM:forward(x, hidden)
  local out
  out, hidden = self.rnn(self.drop(self.encoder(x)), hidden)
  return F.log_softmax(self.decoder(self.drop(out)):view(-1, self.ntoken), 1), hidden
end

torch.manual_seed(0)

T.row("mnist_cnn", function()
  local model = models.MnistCNN():to(device)
  local x, y = torch.randn(64, 1, 28, 28):to(device), torch.randint(0, 10, { 64 }):to(device)
  local opt = torch.optim.Adadelta(model:parameters(), { lr = 1.0 })
  return step_ms(function()
    opt:zero_grad(); F.nll_loss(F.log_softmax(model(x), 1), y):backward(); opt:step()
  end, 5)
end, 3)

T.row("resnet", function()
  local model = ResNet():to(device)
  local x, y = torch.randn(128, 1, 28, 28):to(device), torch.randint(0, 10, { 128 }):to(device)
  local crit = nn.CrossEntropyLoss()
  local opt = torch.optim.SGD(model:parameters(), { lr = 0.1, momentum = 0.9, weight_decay = 5e-4 })
  return step_ms(function() opt:zero_grad(); crit(model(x), y):backward(); opt:step() end, 2)
end, 3)

T.row("lstm_lm", function()
  local ntoken, bsz, bptt, nhid, nlayers = 10000, 20, 35, 200, 2
  local model = LM(ntoken, 200, nhid, nlayers, 0.2):to(device)
  local x = torch.randint(0, ntoken, { bptt, bsz }):to(device)
  local y = torch.randint(0, ntoken, { bptt * bsz }):to(device)
  local zeros = torch.zeros(nlayers, bsz, nhid):to(device)
  local hidden = { zeros, zeros }
  local opt = torch.optim.SGD(model:parameters(), { lr = 20 })
  return step_ms(function()
    hidden = { hidden[1]:detach(), hidden[2]:detach() }
    opt:zero_grad()
    local out
    out, hidden = model(x, hidden)
    F.nll_loss(out, y):backward()
    nn.utils.clip_grad_norm_(model:parameters(), 0.25)
    opt:step()
  end, 2)
end, 3)
