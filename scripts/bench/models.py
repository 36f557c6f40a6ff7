# The models the PyTorch benches share (scripts/bench/*.py import this
# module from their own folder): the seed's SimpleNN (10-10-2) and the
# 784-256-128-10 MLP and pytorch/examples' MNIST CNN, the same as models.lua
# builds for dplua.
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


class MnistCNN(nn.Module):
    """pytorch/examples mnist/main.py's Net, returning logits."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = torch.relu(self.conv1(x))
        x = torch.relu(self.conv2(x))
        x = self.dropout1(nn.functional.max_pool2d(x, 2))
        x = torch.flatten(x, 1)
        x = self.dropout2(torch.relu(self.fc1(x)))
        return self.fc2(x)
