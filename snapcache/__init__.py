"""snapcache: a persistent preprocessing cache and snapshot store for ML input pipelines.

    import snapcache as sc
    ds = sc.Dataset.range(10_000).map(expensive).snapshot("/tmp/snaps").shuffle(1000, seed=0)
    sc.ls("/tmp/snaps"); sc.purge("/tmp/snaps", older_than="7d")   # see and reclaim storage

The admin functions (the ``snapcache`` command line's API) all take the root first:
``ls(root)``, ``info(root, id)``, ``verify(root, ids)``, ``purge(root, ids=..., ...)``,
``open_snapshot(root, id)``, each with ``storage_options=``.
"""

from snapcache._version import __version__
from snapcache.admin import info, ls, purge, verify
from snapcache.errors import (
    CorruptSnapshotError,
    FingerprintError,
    SnapcacheError,
    SnapshotNotFoundError,
    SnapshotStateError,
    UnknownFormatVersionError,
    UnsupportedValueError,
)
from snapcache.options import AUTOTUNE, SnapshotOptions
from snapcache.pipeline.dataset import Dataset
from snapcache.pipeline.handle import Snapshot, open_snapshot

__all__ = [
    "AUTOTUNE",
    "CorruptSnapshotError",
    "Dataset",
    "FingerprintError",
    "SnapcacheError",
    "Snapshot",
    "SnapshotNotFoundError",
    "SnapshotStateError",
    "SnapshotOptions",
    "UnknownFormatVersionError",
    "UnsupportedValueError",
    "__version__",
    "info",
    "ls",
    "open_snapshot",
    "purge",
    "verify",
]
