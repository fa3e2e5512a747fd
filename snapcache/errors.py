"""Every exception snapcache raises on purpose.

The tree::

    SnapcacheError                      base of everything below
    ├── FingerprintError (TypeError)    a captured value cannot be hashed deterministically;
    │                                   the message names the value and where it was captured
    ├── FingerprintMismatchError        a cluster worker computed another fingerprint for the
    │                                   pipeline than the driver (different versions or code)
    ├── UnsupportedValueError (TypeError)
    │                                   an example holds a value that cannot be stored safely
    │                                   (arbitrary Python objects are never pickled)
    ├── SchemaMismatchError (ValueError)
    │                                   an example's structure, dtype or rank differs from the
    │                                   examples before it in the same snapshot
    ├── StoreError                      anything about the snapshot store
    │   ├── CorruptSnapshotError        a checksum mismatch, a malformed or lying manifest
    │   ├── UnknownFormatVersionError   written by a newer snapcache; upgrade to read it. Not
    │   │                               a CorruptSnapshotError: the snapshot is not damaged,
    │   │                               so nothing withdraws, rebuilds or advises purging it
    │   ├── LeaseTimeoutError (TimeoutError)
    │                                   waited too long for another writer's commit
    │   ├── LeaseLostError              another process took over this writer's lease
    │   ├── SnapshotNotFoundError (LookupError)
    │   │                               no snapshot (or more than one) matches a path and id
    │   └── SnapshotStateError          the snapshot is not committed (writing, abandoned,
    │                                   absent or corrupt) where a committed one is needed
    └── UserFunctionError               a user function raised; the original exception is the
                                        ``__cause__`` and the message names the op and position

Warnings::

    RandomnessWarning (UserWarning)     randomness upstream of a snapshot is frozen into it
    OptionConflictWarning (UserWarning) snapshot options that differ from the existing
                                        snapshot's (name, compression) have no effect
    RedundantSnapshotWarning (UserWarning)
                                        a snapshot that stores the examples of the one
                                        below it again
    CacheBypassedWarning (UserWarning)  a ``cache()`` that a DataLoader's workers or ranks
                                        read never replays: every epoch computes again

Errors that mean "you passed a bad argument" are plain ``ValueError``/``TypeError`` raised
eagerly, when the pipeline is built, not when it runs.

Warnings are issued with :func:`warn`, which attributes them to the user's line (the first
frame outside snapcache), so that ``-W error`` and filters by module or line apply to the
user's code, not to snapcache's.
"""

from __future__ import annotations

import functools
import os
import site
import sys
import sysconfig
import warnings

__all__ = [
    "SnapcacheError",
    "FingerprintError",
    "UnsupportedValueError",
    "SchemaMismatchError",
    "StoreError",
    "CorruptSnapshotError",
    "UnknownFormatVersionError",
    "LeaseTimeoutError",
    "LeaseLostError",
    "SnapshotNotFoundError",
    "SnapshotStateError",
    "FingerprintMismatchError",
    "UserFunctionError",
    "RandomnessWarning",
    "OptionConflictWarning",
    "RedundantSnapshotWarning",
    "CacheBypassedWarning",
]


class SnapcacheError(Exception):
    """Base class of all snapcache errors."""


class FingerprintError(SnapcacheError, TypeError):
    """A value captured by the upstream pipeline cannot be fingerprinted."""


class UnsupportedValueError(SnapcacheError, TypeError):
    """An example holds a value snapcache cannot store without pickling."""


class SchemaMismatchError(SnapcacheError, ValueError):
    """An example does not match the structure of the examples before it."""


class StoreError(SnapcacheError):
    """Base class of snapshot store errors."""


class CorruptSnapshotError(StoreError):
    """A snapshot's bytes or manifest cannot be trusted. ``shard``: the path (in its folder) of
    the shard found corrupt, when one was; ``manifest``: the manifest file (in its folder)
    found unreadable, when a delta snapshot's version was."""

    shard: str | None = None
    manifest: str | None = None


class UnknownFormatVersionError(StoreError):
    """The snapshot was written in a format this version cannot read: by a newer snapcache.
    It is not damaged, so it is no :class:`CorruptSnapshotError`: ``on_corrupt="rebuild"``
    never withdraws nor rewrites it (that would destroy the newer release's snapshot), and
    every message says to upgrade, never to purge."""


class LeaseTimeoutError(StoreError, TimeoutError):
    """Waiting for another process to commit a snapshot took too long."""


class LeaseLostError(StoreError):
    """Another process took over a lease this process believed it held (it stopped renewing
    it for longer than the lease's ttl); this writer must not commit."""


class SnapshotNotFoundError(StoreError, LookupError):
    """No snapshot, or more than one, matches the path and id given; the message names the
    candidates."""


class SnapshotStateError(StoreError):
    """An operation needs a committed snapshot and this one is not (the message says its
    state and what to do)."""


class FingerprintMismatchError(SnapcacheError):
    """A worker computed another fingerprint for the pipeline than the driver did (different
    package versions, or source files that differ between machines)."""


class UserFunctionError(SnapcacheError):
    """A user-supplied function raised while the pipeline ran."""


class RandomnessWarning(UserWarning):
    """Random draws upstream of a snapshot are computed once and replayed every epoch."""


class OptionConflictWarning(UserWarning):
    """``snapshot(name=..., compression=...)`` differs from what the existing snapshot has:
    such options do not change the examples, so they are not in the fingerprint and the
    snapshot is read as it is."""


class RedundantSnapshotWarning(UserWarning):
    """A snapshot whose upstream, back to the snapshot below it, computes nothing of an
    example (only shuffle, take, shard, repeat, prefetch or cache between them): it stores
    the same examples a second time and saves no computation."""


class CacheBypassedWarning(UserWarning):
    """A ``cache()`` in a pipeline read in a way it never replays: as several streams
    (DataLoader workers, ranks), each of which computes its share every epoch, or in
    DataLoader workers that end with each epoch (``persistent_workers=False``), whose caches
    end with them. A ``.snapshot()`` shares computed examples between workers, ranks and
    runs."""


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn(message: str, category: type[Warning]) -> None:
    """``warnings.warn(message, category)`` from the user's line: the first frame, going out
    from here, whose code is not snapcache's (the loop that iterates the pipeline, a function
    a pipeline calls that iterates another one). Python 3.12's ``skip_file_prefixes`` does
    the same; this works on 3.11 too, and sees a package installed anywhere."""
    level, frame = 1, sys._getframe(0)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        level, frame = level + 1, frame.f_back
    # Then past the libraries that called into snapcache (a DataLoader's fetch, the standard
    # library's threads), when a frame of the user's comes after them.
    first_outside, below = level, frame
    libraries = library_folders() + ("<frozen ",)  # frozen modules: the standard library's
    while below is not None and below.f_code.co_filename.startswith(libraries):
        level, below = level + 1, below.f_back
    if below is None:  # only libraries (a DataLoader worker): the first frame outside snapcache
        level = first_outside
    # Every frame snapcache's (its own entry point run by path): warn from its caller.
    warnings.warn(message, category, stacklevel=level if frame is not None else 2)


@functools.lru_cache(maxsize=2)
def library_folders(*, resolved: bool = False) -> tuple[str, ...]:
    """The folders of the standard library and of installed packages (site-packages, the
    user's too), each ending in a separator: as sysconfig and site name them, the way frames'
    ``co_filename`` spell them (:func:`warn`); or ``resolved`` through symbolic links, to
    compare with a path resolved the same way (which modules the fingerprints count as
    installed, ``snapcache.fingerprint.origin``)."""
    paths = sysconfig.get_paths()
    dirs = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    dirs |= set(getattr(site, "getsitepackages", lambda: [])())
    dirs.add(site.getusersitepackages())
    return tuple(os.path.join(os.path.realpath(d) if resolved else d, "") for d in dirs if d)
