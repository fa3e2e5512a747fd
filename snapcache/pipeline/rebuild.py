"""``snapshot(..., on_corrupt="rebuild")``: an epoch that meets a corrupt snapshot carries on.

Every shard is checked before any of its examples is handed out, so a corrupt shard (or an
unreadable manifest) is met before a wrong example is yielded. With ``on_corrupt="raise"`` (the
default) the epoch fails with :class:`~snapcache.errors.CorruptSnapshotError`. With
``"rebuild"``, :class:`Rebuilding` withdraws the corrupt snapshot's manifest, warns, and starts
the epoch again on a rebuilt snapshot: the upstream is recomputed and written, and the examples
this epoch had already yielded are written but not yielded again, so the epoch goes on where it
was. The shards no new manifest lists are removed by the rebuilt snapshot's commit.

The examples skipped are counted, so the epoch goes on exactly where it was when its order does
not depend on the snapshot's layout: no shuffle, or a seeded shuffle over a snapshot rebuilt
with the same layout (the same streams). At most one rebuild per epoch: a rebuilt snapshot
that is corrupt again raises.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterator

from snapcache.errors import CorruptSnapshotError, warn
from snapcache.store import layout
from snapcache.store.fs import Storage
from snapcache.store.protocol import withdraw_manifest

log = logging.getLogger("snapcache")

ON_CORRUPT = ("raise", "rebuild")


class CorruptSnapshotWarning(UserWarning):
    """A corrupt snapshot was withdrawn and is being rebuilt (``on_corrupt="rebuild"``)."""


class Rebuilding:
    """An epoch's iterator that survives one corrupt snapshot (see the module docstring).
    ``make()`` starts the epoch afresh; ``folder()`` is the snapshot's folder."""

    def __init__(self, make: Callable[[], Iterator[Any]], folder: Callable[[], Storage]):
        self._make, self._folder = make, folder
        self._read = self._manifest()  # the commit this epoch reads (None: not committed yet)
        self._it: Iterator[Any] = make()
        self._yielded = 0
        self._rebuilt = False

    def _manifest(self) -> bytes | None:
        try:
            return self._folder().read_bytes(layout.MANIFEST)
        except (FileNotFoundError, OSError):
            return None

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
        if withdraw_manifest(folder, lambda: "", expected=self._read) == "replaced":
            what = "was rebuilt by another process meanwhile: this epoch reads that one"
        else:
            what = "was withdrawn and is rebuilt now"
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


__all__ = ["ON_CORRUPT", "CorruptSnapshotWarning", "Rebuilding"]
