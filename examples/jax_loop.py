"""A JAX training loop fed by ``ds.as_numpy_iterator()``: batches are dicts of numpy arrays,
moved to the device with ``jax.device_put``. snapcache does not depend on JAX.

    pip install jax && python examples/jax_loop.py --examples 2000 --epochs 3
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np

import snapcache as sc

try:
    import jax
    import jax.numpy as jnp
except ImportError:
    raise SystemExit("this example needs JAX, which snapcache does not install: pip install jax")

WEIGHTS = np.array([1.0, -2.0, 0.5, 3.0], np.float32)


def preprocess(i):
    time.sleep(0.002)  # stands for decoding, resizing, tokenizing...
    x = np.random.default_rng(i).normal(size=4).astype(np.float32)
    return {"x": x, "y": np.float32(x @ WEIGHTS)}


@jax.jit
def step(w, x, y, lr=0.1):
    grad = jax.grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
    return w - lr * grad


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--root", default=None, help="snapshot folder (default: temporary)")
    args = parser.parse_args()
    root = args.root or tempfile.mkdtemp(prefix="snapcache-jax-")

    ds = (sc.Dataset.range(args.examples)
          .map(preprocess, num_parallel_calls=4)
          .snapshot(root, progress=False)
          .shuffle(1000, seed=0)
          .batch(64, drop_remainder=True))  # fixed shapes: jit compiles once
    w = jnp.zeros(4)
    for epoch in range(args.epochs):
        start = time.perf_counter()
        for batch in ds.as_numpy_iterator():
            batch = jax.device_put(batch)  # the dict of numpy arrays, onto the device
            w = step(w, batch["x"], batch["y"])
        error = float(jnp.mean((w - WEIGHTS) ** 2))
        print(f"epoch {epoch}: weight error {error:.5f}, {time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main()
