"""NVIDIA DALI fed by snapshot batches: the CPU-side decode + resize is computed once and read
back from the snapshot; DALI's ``external_source`` takes the batches and runs the random
augmentation (crop, mirror, normalize) on the GPU, or on the CPU with ``--device cpu``.

    pip install nvidia-dali-cuda120     # see https://docs.nvidia.com/deeplearning/dali
    python examples/dali_external_source.py --examples 512 --epochs 2 [--device cpu]

snapcache does not depend on DALI; without it this script says how to install it and exits.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import numpy as np

import snapcache as sc

try:
    from nvidia.dali import fn, pipeline_def, types
except ImportError:
    raise SystemExit("this example needs NVIDIA DALI, which snapcache does not install: "
                     "pip install nvidia-dali-cuda120 "
                     "(see https://docs.nvidia.com/deeplearning/dali)")

SIZE, CROP = 72, 64


def decode_and_resize(i: int) -> dict:
    """Stands for JPEG decode + resize: deterministic and expensive, so it is snapshotted."""
    time.sleep(0.002)
    image = np.random.default_rng(i).integers(0, 255, (SIZE, SIZE, 3), dtype=np.uint8)
    return {"image": image, "label": np.int64(i % 10)}


class SnapshotBatches:
    """DALI's ``external_source`` source: one snapshot batch a call, an epoch per pass.

    ``batch=True`` sources return whole batches; StopIteration ends DALI's epoch, and the call
    after it (once ``pipe.reset()`` was called) starts the snapshot's next epoch: DALI takes the
    iterator once and keeps calling ``next`` on it."""

    def __init__(self, ds: sc.Dataset):
        self.ds = ds
        self.it = None

    def __iter__(self) -> "SnapshotBatches":
        return self

    def __next__(self) -> tuple[np.ndarray, np.ndarray]:
        if self.it is None:
            self.it = iter(self.ds)   # the next epoch of the snapshot (reshuffled)
        try:
            batch = next(self.it)
        except StopIteration:
            self.it = None
            raise
        return batch["image"], batch["label"]


def build(ds: sc.Dataset, batch_size: int, device: str):
    @pipeline_def(batch_size=batch_size, num_threads=2,
                  device_id=0 if device == "gpu" else None, prefetch_queue_depth=2)
    def augment():
        images, labels = fn.external_source(source=SnapshotBatches(ds), num_outputs=2,
                                            batch=True, layout=["HWC", ""],
                                            dtype=[types.UINT8, types.INT64])
        if device == "gpu":
            images = images.gpu()
        images = fn.crop_mirror_normalize(
            images, crop=(CROP, CROP), crop_pos_x=fn.random.uniform(range=(0.0, 1.0)),
            crop_pos_y=fn.random.uniform(range=(0.0, 1.0)), mirror=fn.random.coin_flip(),
            dtype=types.FLOAT, output_layout="CHW",
            mean=[0.485 * 255, 0.456 * 255, 0.406 * 255],
            std=[0.229 * 255, 0.224 * 255, 0.225 * 255])
        return images, labels

    return augment()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--device", choices=["gpu", "cpu"], default="gpu")
    parser.add_argument("--root", help="snapshot root (default: a temporary folder)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ds = (sc.Dataset.range(args.examples)
              .map(decode_and_resize, num_parallel_calls=2)
              .snapshot(args.root or tmp, progress=False)
              .shuffle(1024, seed=0)
              .batch(args.batch_size, drop_remainder=True))   # DALI batches are full
        pipe = build(ds, args.batch_size, args.device)
        pipe.build()
        epochs = []
        for epoch in range(args.epochs):
            count, shape = 0, None
            try:
                while True:
                    images, labels = pipe.run()
                    count += len(labels)
                    shape = list(images.as_cpu().at(0).shape) if args.device == "gpu" \
                        else list(images.at(0).shape)
            except StopIteration:
                pipe.reset()   # the next run() starts the next epoch of SnapshotBatches
            epochs.append({"examples": count, "shape": shape})
            if not args.json:
                print(f"epoch {epoch}: {count} examples through DALI, images {shape}")
        if args.json:
            print(json.dumps({"epochs": epochs}))


if __name__ == "__main__":
    main()
