"""The benchmark workloads: deterministic example makers, shared by every system measured.

image-like: ``{"image": uint8[128, 128, 3], "label": int64}`` (~49 KB; pixel values 0..63, so
general-purpose compressors save only a little), token-like: ``{"tokens": int32[128],
"length": int}`` (~520 B).
"""

from __future__ import annotations

import numpy as np

IMAGE_SHAPE = (128, 128, 3)
TOKENS = 128


def make_image(i):
    rng = np.random.default_rng(i)
    return {"image": rng.integers(0, 64, IMAGE_SHAPE, dtype=np.uint8), "label": np.int64(i)}


def make_token(i):
    rng = np.random.default_rng(i)
    length = int(rng.integers(16, TOKENS + 1))
    tokens = np.zeros(TOKENS, np.int32)
    tokens[:length] = rng.integers(1, 32000, length, dtype=np.int32)
    return {"tokens": tokens, "length": length}


MAKERS = {"image": make_image, "token": make_token}


def example_bytes(workload: str) -> int:
    return 128 * 128 * 3 + 8 if workload == "image" else TOKENS * 4 + 8


def staging(workload: str, batch_size: int) -> dict:
    """Preallocated host buffers every system copies its batches into (as a H2D copy would)."""
    if workload == "image":
        return {"image": np.empty((batch_size, *IMAGE_SHAPE), np.uint8),
                "label": np.empty(batch_size, np.int64)}
    return {"tokens": np.empty((batch_size, TOKENS), np.int32),
            "length": np.empty(batch_size, np.int64)}


def consume(stage: dict, batch: dict) -> int:
    """Copy a batch into the staging buffers; return its number of examples."""
    n = 0
    for key, buffer in stage.items():
        value = np.asarray(batch[key])
        n = len(value)
        np.copyto(buffer[:n], value, casting="unsafe")
    return n


def consume_one(stage: dict, example: dict, row: int) -> None:
    for key, buffer in stage.items():
        buffer[row] = example[key]
