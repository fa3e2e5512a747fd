"""Build and read snapshots on Ray: ``snapcache.ray.build(ds, num_tasks=64)`` writes a
snapshot with a cluster's tasks, ``snapcache.ray.read(ds)`` reads one as a
``ray.data.Dataset``. Needs ``pip install 'snapcache[ray]'``; see ``docs/ray.md``.
"""

from snapcache.adapters.ray import (  # noqa: F401
    BuildResult,
    FingerprintMismatchError,
    PendingBuild,
    StreamOutcome,
    build,
    read,
)

__all__ = ["BuildResult", "FingerprintMismatchError", "PendingBuild", "SnapshotDatasource",
           "StreamOutcome", "build", "read"]


def __getattr__(name: str):
    if name == "SnapshotDatasource":
        from snapcache.adapters.ray import __getattr__ as lazy

        return lazy(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
