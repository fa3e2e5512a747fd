"""numpy (and JAX): examples and batches as numpy values only.

Batches come out as dicts (or tuples) of numpy arrays, ready for ``jax.device_put(batch)``,
which copies them to the device; Python scalars become 0-d arrays, ``str``/``bytes`` stay as
they are (JAX has no string arrays: drop such fields before ``device_put``).
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np


def as_numpy_iterator(dataset: Any, epoch: int | None = None) -> Iterator[Any]:
    for example in dataset.iterate(epoch):
        yield as_numpy(example)


def as_numpy(value: Any) -> Any:
    """``value`` with every number a numpy array, recursively through dicts and tuples."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, dict):
        return {k: as_numpy(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(as_numpy(v) for v in value)
    if isinstance(value, list):
        return [as_numpy(v) for v in value]
    if isinstance(value, (bool, int, float, complex, np.generic)):
        return np.asarray(value)
    return value
