"""Train a small PyTorch model from a snapshot, with DataLoader workers.

The first epoch runs the expensive preprocessing in the DataLoader's workers, each writing its
share of the snapshot (cooperating streams, one snapshot); later epochs read it back.

    python examples/torch_train.py --examples 2000 --epochs 3 --workers 2
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np

import snapcache as sc

try:
    import torch
    from torch.utils.data import DataLoader
except ImportError:
    raise SystemExit("this example needs PyTorch: pip install 'snapcache[torch]'")

WEIGHTS = np.array([1.0, -2.0, 0.5, 3.0], np.float32)


def preprocess(i):
    time.sleep(0.002)  # stands for decoding, resizing, tokenizing...
    x = np.random.default_rng(i).normal(size=4).astype(np.float32)
    return {"x": x, "y": np.float32(x @ WEIGHTS)}


def augment(example):  # random: after the snapshot, so every epoch draws anew
    return {**example, "x": example["x"] + np.random.normal(scale=0.01, size=4).astype(np.float32)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--root", default=None, help="snapshot folder (default: temporary)")
    args = parser.parse_args()
    root = args.root or tempfile.mkdtemp(prefix="snapcache-torch-")

    ds = (sc.Dataset.range(args.examples)
          .map(preprocess, num_parallel_calls=4)
          .snapshot(root, progress=False)
          .map(augment)
          .shuffle(1000, seed=0)
          .batch(64))
    train_data = ds.to_torch()
    loader = DataLoader(train_data, batch_size=None, num_workers=args.workers)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(args.epochs):
        train_data.set_epoch(epoch)  # a new shuffle order each epoch
        start, seen, total = time.perf_counter(), 0, 0.0
        for batch in loader:
            loss = torch.nn.functional.mse_loss(model(batch["x"]).squeeze(1), batch["y"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            seen += len(batch["y"])
            total += loss.item() * len(batch["y"])
        print(f"epoch {epoch}: {seen} examples, loss {total / seen:.4f}, "
              f"{time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main()
