# The models the PyTorch benches share (scripts/bench/*.py import this
# module from their own folder): the seed's SimpleNN (10-10-2) and the
# 784-256-128-10 MLP, the same as models.lua builds for dplua.
import torch
import torch.nn as nn


class SimpleNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(10, 10)
        self.fc2 = nn.Linear(10, 2)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def mlp():
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
