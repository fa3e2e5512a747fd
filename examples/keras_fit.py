"""Keras ``model.fit`` on a snapshot through ``ds.to_tf()``.

``to_tf()`` builds the snapshot if needed and derives the ``element_spec`` from it; every
``fit`` epoch is a new snapcache epoch (a new shuffle order, fresh augmentation).

    python examples/keras_fit.py --examples 2000 --epochs 3
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np

import snapcache as sc

try:
    import tensorflow as tf
except ImportError:
    raise SystemExit("this example needs TensorFlow: pip install 'snapcache[tf]'")

WEIGHTS = np.array([1.0, -2.0, 0.5, 3.0], np.float32)


def preprocess(i):
    time.sleep(0.002)  # stands for decoding, resizing, tokenizing...
    x = np.random.default_rng(i).normal(size=4).astype(np.float32)
    return {"x": x, "y": np.float32(x @ WEIGHTS)}


def to_inputs_and_target(example):  # Keras wants (inputs, target) pairs
    noise = np.random.normal(scale=0.01, size=4).astype(np.float32)
    return example["x"] + noise, example["y"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--root", default=None, help="snapshot folder (default: temporary)")
    args = parser.parse_args()
    root = args.root or tempfile.mkdtemp(prefix="snapcache-keras-")

    ds = (sc.Dataset.range(args.examples)
          .map(preprocess, num_parallel_calls=4)
          .snapshot(root, progress=False)
          .map(to_inputs_and_target)
          .shuffle(1000, seed=0)
          .batch(64))
    train_data = ds.to_tf()
    print("element_spec:", train_data.element_spec)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.1), loss="mse")
    model.fit(train_data, epochs=args.epochs, verbose=2, shuffle=False)


if __name__ == "__main__":
    main()
