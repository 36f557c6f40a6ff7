# PyTorch's side of scripts/bench/fashion_mnist: the training of
# examples/fashion_mnist.lua (784-256-128-10 MLP, Adam lr 1e-3, cosine
# schedule per epoch, batch 128, shuffled, pixels normalised with the
# training set's mean and std), printing one line per epoch:
#   epoch N <test accuracy> <seconds of training this epoch>
# usage: python3 fashion_mnist.py DATA_DIR DEVICE EPOCHS
import gzip
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn


def load_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    shape = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return torch.from_numpy(np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape).copy())


def main():
    data_dir, device, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    torch.manual_seed(0)
    train_x = load_idx(data_dir + "/train-images-idx3-ubyte.gz").float().div_(255)
    train_y = load_idx(data_dir + "/train-labels-idx1-ubyte.gz").long()
    test_x = load_idx(data_dir + "/t10k-images-idx3-ubyte.gz").float().div_(255)
    test_y = load_idx(data_dir + "/t10k-labels-idx1-ubyte.gz").long()
    mean, std = train_x.mean().item(), train_x.std().item()
    train_x.sub_(mean).div_(std)
    test_x.sub_(mean).div_(std)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(train_x, train_y), batch_size=128,
                                         shuffle=True)
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                          nn.Linear(128, 10)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs)
    crit = nn.CrossEntropyLoss()
    for epoch in range(1, epochs + 1):
        t0 = time.perf_counter()
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            opt.zero_grad()
            loss = crit(model(x), y)
            loss.backward()
            opt.step()
            loss.item()
        sched.step()
        seconds = time.perf_counter() - t0
        model.eval()
        correct = 0
        with torch.no_grad():
            for i in range(0, len(test_x), 1000):
                x, y = test_x[i:i + 1000].to(device), test_y[i:i + 1000].to(device)
                correct += (model(x).argmax(1) == y).sum().item()
        model.train()
        print("epoch %d %.4f %.3f" % (epoch, correct / len(test_x), seconds), flush=True)


if __name__ == "__main__":
    main()
