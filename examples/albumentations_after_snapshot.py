"""Albumentations augmentations after the snapshot: JPEGs are decoded and resized once (the
expensive, deterministic part, stored in the snapshot as uint8), and an ``albumentations.Compose``
runs on the decoded images every epoch (random: new crops and flips each time).

    pip install albumentations && python examples/albumentations_after_snapshot.py --images 64

The script writes ``--images`` synthetic JPEGs to a temporary folder first (use your own with
``--glob 'data/*.jpg'``). snapcache does not depend on albumentations or OpenCV.
"""

from __future__ import annotations

import argparse
import glob as globbing
import json
import os
import tempfile

import numpy as np

import snapcache as sc

try:
    import albumentations as A
    import cv2
except ImportError:
    raise SystemExit("this example needs albumentations, which snapcache does not install: "
                     "pip install albumentations")

SIZE = 96   # stored size (decode + resize once, before the snapshot)
CROP = 80   # trained size (random crop each epoch, after it)


def decode_and_resize(path: str) -> dict:
    """The expensive part: decode a JPEG, resize it; deterministic, so it is snapshotted."""
    image = cv2.imdecode(np.fromfile(path, np.uint8), cv2.IMREAD_COLOR)
    image = cv2.cvtColor(cv2.resize(image, (SIZE, SIZE), interpolation=cv2.INTER_AREA),
                         cv2.COLOR_BGR2RGB)
    label = int(os.path.basename(path).split("_")[0])
    return {"image": image, "label": np.int64(label)}


AUGMENT = A.Compose([
    A.RandomCrop(CROP, CROP),
    A.HorizontalFlip(p=0.5),
    A.RandomBrightnessContrast(p=0.5),
    A.Normalize(),            # float32, ImageNet mean/std
])


def augment(example: dict) -> dict:
    """Random, cheap: after the snapshot, so each epoch sees new crops and flips."""
    return {"image": AUGMENT(image=example["image"])["image"], "label": example["label"]}


def write_jpegs(folder: str, count: int) -> str:
    rng = np.random.default_rng(0)
    for i in range(count):
        image = rng.integers(0, 255, (128, 160, 3), dtype=np.uint8)
        cv2.imwrite(os.path.join(folder, f"{i % 10}_{i:05d}.jpg"), image)
    return os.path.join(folder, "*.jpg")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--glob", help="your own JPEGs (file names start with '<label>_')")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--root", help="snapshot root (default: a temporary folder)")
    parser.add_argument("--json", action="store_true", help="print a JSON summary")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        pattern = args.glob or write_jpegs(tmp, args.images)
        root = args.root or os.path.join(tmp, "snaps")
        ds = (sc.Dataset.from_files(pattern)
              .map(decode_and_resize, num_parallel_calls=2)
              .snapshot(root, progress=False)
              .map(augment)
              .shuffle(256, seed=0)
              .batch(16))
        epochs = []
        for epoch in range(args.epochs):
            shapes, dtypes, count, first = set(), set(), 0, None
            for batch in ds:
                shapes.add(batch["image"].shape[1:])
                dtypes.add(str(batch["image"].dtype))
                count += len(batch["label"])
                if first is None:
                    first = float(batch["image"][0].mean())
            epochs.append({"examples": count, "shapes": sorted(map(list, shapes)),
                           "dtypes": sorted(dtypes), "first_mean": first})
            if not args.json:
                print(f"epoch {epoch}: {count} examples, images {sorted(shapes)} "
                      f"{sorted(dtypes)}")
        summary = {"epochs": epochs, "snapshots": len(sc.ls(root)),
                   "files": len(globbing.glob(pattern))}
        if args.json:
            print(json.dumps(summary))


if __name__ == "__main__":
    main()
