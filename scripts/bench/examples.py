# PyTorch's side of scripts/bench/examples: the same three models and
# steps as examples.lua (see there), "name ms" lines.
# usage: python3 examples.py [cpu|cuda]   (run from scripts/bench)
# On "cuda", convolutions go through cuDNN with PyTorch's defaults
# (torch.backends.cudnn.benchmark off, as the examples leave it).
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import timing  # scripts/bench/timing.py
from models import MnistCNN  # scripts/bench/models.py

device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
if device not in ("cpu", "cuda"):
    sys.exit(f"examples.py: device should be cpu or cuda, got {device}")
if device == "cuda" and not torch.cuda.is_available():
    print("no_gpu")
    sys.exit(0)
torch.set_num_threads(1)


def step_ms(f, n):
    return timing.gpu_ms(f, 10) if device == "cuda" else timing.cpu_ms(f, n)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (self.downsample(x) if self.downsample is not None else x))


class ResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.layers = nn.Sequential(BasicBlock(16, 16, 1), BasicBlock(16, 32, 2), BasicBlock(32, 64, 2))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.layers(self.stem(x))), 1))


class LM(nn.Module):
    def __init__(self, ntoken, ninp, nhid, nlayers, dropout):
        super().__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)

    def forward(self, x, hidden):
        out, hidden = self.rnn(self.drop(self.encoder(x)), hidden)
        return F.log_softmax(self.decoder(self.drop(out)).view(-1, self.ntoken), dim=1), hidden


torch.manual_seed(0)


def mnist_cnn():
    model = MnistCNN().to(device)
    x, y = torch.randn(64, 1, 28, 28).to(device), torch.randint(0, 10, (64,)).to(device)
    opt = torch.optim.Adadelta(model.parameters(), lr=1.0)

    def step():
        opt.zero_grad()
        F.nll_loss(F.log_softmax(model(x), dim=1), y).backward()
        opt.step()

    return step_ms(step, 5)


def resnet():
    model = ResNet().to(device)
    x, y = torch.randn(128, 1, 28, 28).to(device), torch.randint(0, 10, (128,)).to(device)
    crit = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)

    def step():
        opt.zero_grad()
        crit(model(x), y).backward()
        opt.step()

    return step_ms(step, 2)


def lstm_lm():
    ntoken, bsz, bptt, nhid, nlayers = 10000, 20, 35, 200, 2
    model = LM(ntoken, 200, nhid, nlayers, 0.2).to(device)
    x = torch.randint(0, ntoken, (bptt, bsz)).to(device)
    y = torch.randint(0, ntoken, (bptt * bsz,)).to(device)
    zeros = torch.zeros(nlayers, bsz, nhid).to(device)
    hidden = (zeros, zeros)
    opt = torch.optim.SGD(model.parameters(), lr=20)

    def step():
        nonlocal hidden
        hidden = tuple(h.detach() for h in hidden)
        opt.zero_grad()
        out, hidden = model(x, hidden)
        F.nll_loss(out, y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        opt.step()

    return step_ms(step, 2)


timing.row("mnist_cnn", mnist_cnn, 3)
timing.row("resnet", resnet, 3)
timing.row("lstm_lm", lstm_lm, 3)
