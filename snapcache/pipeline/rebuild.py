"""``snapshot(..., on_corrupt="rebuild")``: an epoch that meets a corrupt snapshot carries on.

Every shard is checked before any of its examples is handed out, so a corrupt shard (or an
unreadable manifest) is met before a wrong example is yielded. With ``on_corrupt="raise"`` (the
default) the epoch fails with :class:`~snapcache.errors.CorruptSnapshotError`. With
``"rebuild"``, :class:`Rebuilding` withdraws the corrupt snapshot's manifest, warns, and starts
the epoch again on a rebuilt snapshot: the upstream is recomputed and written, and the examples
this epoch had already yielded are written but not yielded again, so the epoch goes on where it
was. The shards no new manifest lists are removed by the rebuilt snapshot's commit.

A snapshot written in a newer format (:class:`~snapcache.errors.UnknownFormatVersionError`)
is not corrupt: it is never withdrawn nor rebuilt, whatever ``on_corrupt`` says; the epoch
fails with the error's "upgrade snapcache".

The examples skipped are counted, so the epoch goes on exactly where it was when its order does
not depend on the snapshot's layout: no shuffle, or a seeded shuffle over a snapshot rebuilt
with the same layout (the same streams). At most one rebuild per epoch: a rebuilt snapshot
that is corrupt again raises.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterator

from snapcache.errors import CorruptSnapshotError, UnknownFormatVersionError, warn
from snapcache.store import layout
from snapcache.store.fs import Storage
from snapcache.store.protocol import versions, withdraw_manifest

log = logging.getLogger("snapcache")

ON_CORRUPT = ("raise", "rebuild")


class CorruptSnapshotWarning(UserWarning):
    """A corrupt snapshot was withdrawn and is being rebuilt (``on_corrupt="rebuild"``)."""


class Rebuilding:
    """An epoch's iterator that survives one corrupt snapshot (see the module docstring).
    ``make()`` starts the epoch afresh; ``folder()`` is the snapshot's folder."""

    def __init__(self, make: Callable[[], Iterator[Any]], folder: Callable[[], Storage],
                 commit: Callable[[], str | None] = lambda: layout.MANIFEST,
                 delta: bool = False):
        self._make, self._folder, self._commit, self._delta = make, folder, commit, delta
        # The commit this epoch reads: its manifest's name (a delta snapshot's version) and
        # bytes (None: not committed yet, or unreadable).
        self._name: str | None = None
        self._read: bytes | None = None
        try:
            try:
                self._name = commit()
            except CorruptSnapshotError:  # an unreadable manifest: its bytes, as they are
                self._name = None if delta else layout.MANIFEST
            if self._name is not None:
                self._read = folder().read_bytes(self._name)
        except (CorruptSnapshotError, UnknownFormatVersionError, OSError):
            pass  # a newer format: the epoch meets it and fails, nothing here withdraws it
        try:
            self._it: Iterator[Any] = make()
        except CorruptSnapshotError as error:  # met when the epoch starts: rebuilt at next()
            self._it = _raising(error)
        self._yielded = 0
        self._rebuilt = False

    def __iter__(self) -> "Rebuilding":
        return self

    def __next__(self) -> Any:
        while True:
            try:
                item = next(self._it)
            except CorruptSnapshotError as error:
                if self._rebuilt:
                    raise
                self._rebuild(error)
                continue
            self._yielded += 1
            return item

    def _rebuild(self, error: CorruptSnapshotError) -> None:
        self._close_current()
        folder = self._folder()
        # Only the commit this epoch read is withdrawn: another process meeting the same damage
        # may have rebuilt it meanwhile, and that snapshot is good (and may be being read).
        name, expected = self._name, self._read
        withdrawn = replaced = False
        if self._delta:
            # A version of a delta snapshot: every version listing the corrupt shard goes (the
            # next build must not keep its segment), or the version whose manifest or source
            # record cannot be read; the lineage itself stays.
            if error.manifest:
                expected = versions.still_unreadable(folder, error.manifest)
                name = error.manifest if expected is not None else None
                replaced = name is None  # it reads now: another process rebuilt it
            elif error.shard and versions.withdraw_listing(folder, error.shard):
                name, withdrawn = None, True
            elif name is None:  # the epoch that built it: the version it committed
                try:
                    name = self._commit()
                except (CorruptSnapshotError, OSError):
                    name = None
        elif name is None:
            name = layout.MANIFEST
        if name is not None:
            outcome = withdraw_manifest(folder, lambda: "", expected=expected, name=name)
            replaced, withdrawn = outcome == "replaced", outcome != "replaced"
        if not (withdrawn or replaced):  # nothing to take back: a rebuild would meet it again
            raise error
        what = "was rebuilt by another process meanwhile: this epoch reads that one" \
            if replaced else "was withdrawn and is rebuilt now"
        warn(f"{error} -- on_corrupt='rebuild': the snapshot {folder.url} {what}; this epoch "
             f"goes on after its {self._yielded:,} examples already yielded",
             CorruptSnapshotWarning)
        self._rebuilt = True
        self._it = self._make()
        for _ in range(self._yielded):  # computed and written again, not yielded again
            next(self._it)

    def state_dict(self) -> dict:
        get = getattr(self._it, "state_dict", None)
        if get is None:
            raise ValueError("this iteration cannot be resumed exactly")
        return get()

    @property
    def started(self) -> bool:
        return bool(getattr(self._it, "started", True))

    def _close_current(self) -> None:
        close = getattr(self._it, "close", None)
        if close is not None:
            close()

    def close(self) -> None:
        self._close_current()


def _raising(error: BaseException) -> Iterator[Any]:
    raise error
    yield  # a generator


__all__ = ["ON_CORRUPT", "CorruptSnapshotWarning", "Rebuilding"]
