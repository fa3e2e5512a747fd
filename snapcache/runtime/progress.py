"""Progress of the writing epoch: one report for the whole epoch, across streams.

A snapshot's first epoch may be written by several streams (DataLoader workers, ranks), each a
process. Each stream counts what it computes (:class:`EpochProgress`) and, when there are
several, publishes its counts in a tick file of a few bytes under the machine's temporary
folder (``<tmp>/snapcache-progress-<uid>/<key>/<stream>.json``, rewritten atomically a few
times a second). Stream 0 alone reports: it sums the tick files of the streams on its machine
and, for streams that have none there (other machines' ranks), the rows the snapshot folder's
progress records show (read every :data:`REMOTE_SECONDS`). Whoever commits the snapshot reports
the final line.

What is shown, with no optional package and no logging set up:

- on a terminal (stderr is a tty): one ``rich`` bar for the epoch with examples, MB, rate and
  ETA (when the pipeline's length is known), then one line when the snapshot is committed;
- otherwise: a line when writing starts, every :data:`LOG_SECONDS`, and at the commit.

Lines go to the ``snapcache`` logger at INFO level when logging has handlers (you configured
it), else straight to stderr. ``progress=False`` silences all of it; a callable receives the
:class:`ProgressUpdate` objects instead (in stream 0, and the final one in the committer).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from snapcache.machine import shared_folder
from snapcache.runtime.autotune import nbytes_of
from snapcache.store import layout

log = logging.getLogger("snapcache")

UPDATE_SECONDS = 0.25
"""How often a stream publishes its counts and stream 0 refreshes the report."""
LOG_SECONDS = 10.0
"""How often a line is written when stderr is not a terminal."""
REMOTE_SECONDS = 10.0
"""How often stream 0 reads the snapshot folder for streams with no tick file on its machine."""
STALE_SECONDS = 30.0
"""Tick files older than this when stream 0 starts belong to an earlier run and are ignored."""


@dataclass(frozen=True)
class ProgressUpdate:
    """One report on a snapshot being written: the whole epoch, all streams together."""

    label: str
    examples: int
    """Examples in the snapshot so far (including any reused from an interrupted run)."""
    bytes: int
    """Uncompressed payload bytes computed so far."""
    elapsed: float
    total: int | None
    """Examples expected in the epoch, when the pipeline's length is known."""
    done: bool = False
    streams: int = 1
    resumed: int = 0
    """Examples reused from an interrupted run (not computed now; left out of the rate)."""

    @property
    def rate(self) -> float:
        computed = self.examples - self.resumed
        return computed / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def eta(self) -> float | None:
        if self.total is None or self.rate <= 0:
            return None
        return max(0.0, (self.total - self.examples) / self.rate)

    def __str__(self) -> str:
        total = f"/{self.total:,}" if self.total is not None else ""
        eta = f", ETA {_clock(self.eta)}" if self.eta is not None and not self.done else ""
        state = "wrote" if self.done else "writing"
        streams = f" ({self.streams} streams)" if self.streams > 1 else ""
        return (f"{state} snapshot {self.label}{streams}: {self.examples:,}{total} examples, "
                f"{self.bytes / 1e6:,.1f} MB, {self.rate:,.0f} examples/s{eta}")


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def emit(line: str) -> None:
    """A line the user should see: through logging when it is set up, else on stderr."""
    if log.hasHandlers():
        log.info("%s", line)
    else:
        print(f"snapcache: {line}", file=sys.stderr, flush=True)


@dataclass
class _Tick:
    examples: int = 0
    bytes: int = 0
    resumed: int = 0
    done: bool = False


class EpochProgress:
    """The progress of one stream of a writing epoch (see the module docstring).

    ``total`` is the whole epoch's expected examples (None if unknown); ``resumed`` the rows
    this stream reuses from an interrupted run; ``key`` names the epoch among the tick
    folders (the same in all its streams, e.g. a digest of the snapshot's URL); ``remote()``
    returns ``{stream: rows}`` from the snapshot folder's progress records.
    """

    def __init__(self, label: str, total: int | None, *, stream: int = 0, streams: int = 1,
                 key: str = "", resumed: int = 0,
                 callback: Callable[[ProgressUpdate], None] | None = None,
                 remote: Callable[[], dict[int, int]] | None = None):
        self.label, self.total = label, total
        self.stream, self.streams = stream, streams
        self.owner = stream == 0
        self._callback = callback
        self._display: _Display | None = None
        self._remote, self._remote_rows, self._remote_at = remote, {}, -1e9
        self._mine = _Tick(examples=resumed, resumed=resumed)
        self._start = time.perf_counter()
        self._wall_start = time.time()
        self._dir = os.path.join(shared_folder("progress"), key) if streams > 1 else None

    # -- counting (every stream) -----------------------------------------------------------
    def wrap(self, items: Iterator[Any]) -> Iterator[Any]:
        """Yield ``items``, counting and reporting them."""
        last = time.perf_counter() - UPDATE_SECONDS  # the first example reports at once
        mine = self._mine
        try:
            for item in items:
                mine.examples += 1
                mine.bytes += nbytes_of(item)
                now = time.perf_counter()
                if now - last >= UPDATE_SECONDS:
                    last = now
                    self._publish()
                    self._report(done=False)
                yield item
            mine.done = True
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()
            self._publish()
            if self._display is not None:
                self._display.close()

    def finish(self) -> None:
        """This stream committed the snapshot: report the epoch's final numbers, and remove
        the epoch's tick files (every stream is done)."""
        self._mine.done = True
        self._report(done=True)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None  # nothing is published after the commit

    # -- publishing and aggregating ----------------------------------------------------------
    def _publish(self) -> None:
        if self._dir is None:
            return
        try:
            os.makedirs(self._dir, exist_ok=True)
            path = os.path.join(self._dir, f"{self.stream}.json")
            tmp = layout.tmp_name(path)
            try:
                with open(tmp, "w") as f:
                    json.dump(vars(self._mine), f)
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.remove(tmp)
                raise
        except OSError as e:  # a full or read-only temp folder: only the bar is less exact
            log.debug("cannot publish snapshot progress in %s: %s", self._dir, e)
            self._dir = None

    def _aggregate(self) -> _Tick:
        total = _Tick(**vars(self._mine))
        if self.streams == 1:
            return total
        seen = {self.stream}
        if self._dir is not None:
            for i in range(self.streams):
                if i == self.stream:
                    continue
                tick = self._read_tick(i)
                if tick is not None:
                    seen.add(i)
                    total.examples += tick.examples
                    total.bytes += tick.bytes
                    total.resumed += tick.resumed
        missing = set(range(self.streams)) - seen
        if missing and self._remote is not None:
            now = time.perf_counter()
            if now - self._remote_at >= REMOTE_SECONDS:
                self._remote_at = now
                try:
                    self._remote_rows = self._remote()
                except Exception as e:  # the bar is best effort; the write goes on
                    log.debug("cannot read the progress records of %s: %s", self.label, e)
            total.examples += sum(self._remote_rows.get(i, 0) for i in missing)
        return total

    def _read_tick(self, stream: int) -> _Tick | None:
        path = os.path.join(self._dir or "", f"{stream}.json")
        try:
            if os.stat(path).st_mtime < self._wall_start - STALE_SECONDS:
                return None
            with open(path) as f:
                return _Tick(**json.load(f))
        except (OSError, ValueError, TypeError):
            return None

    def _report(self, done: bool) -> None:
        if not (self.owner or done):
            return
        tick = self._aggregate()
        update = ProgressUpdate(self.label, tick.examples, tick.bytes,
                                time.perf_counter() - self._start, self.total, done=done,
                                streams=self.streams, resumed=tick.resumed)
        if self._callback is not None:
            self._callback(update)
            return
        if done:
            if self._display is not None:
                self._display.close()
            emit(str(update))
            return
        if self._display is None:
            self._display = _Display.open()
            emit(f"writing snapshot {self.label}"
                 + (f" ({self.streams} streams)" if self.streams > 1 else "")
                 + (f": {self.total:,} examples expected" if self.total is not None else ""))
        self._display.show(update)


class _Display:
    """A rich bar on a terminal, a line every :data:`LOG_SECONDS` otherwise."""

    @staticmethod
    def open() -> "_Display":
        if getattr(sys.stderr, "isatty", lambda: False)():
            return _Bar()
        return _Lines()

    def show(self, update: ProgressUpdate) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class _Lines(_Display):
    def __init__(self) -> None:
        self._last = time.perf_counter()

    def show(self, update: ProgressUpdate) -> None:
        now = time.perf_counter()
        if now - self._last >= LOG_SECONDS:
            self._last = now
            emit(str(update))


class _Bar(_Display):
    """One ``rich`` progress bar, refreshed by our own updates (no refresh thread)."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn

        self._progress = Progress(
            TextColumn("[bold]snapshot[/] {task.description}"), BarColumn(),
            TextColumn("{task.fields[counts]}"), console=Console(stderr=True),
            auto_refresh=False, redirect_stdout=False, redirect_stderr=False)
        self._task: Any = None
        self._open = False

    def show(self, update: ProgressUpdate) -> None:
        eta = f" ETA {_clock(update.eta)}" if update.eta is not None else ""
        total = f"/{update.total:,}" if update.total is not None else ""
        counts = (f"{update.examples:,}{total} ex  {update.bytes / 1e6:,.1f} MB  "
                  f"{update.rate:,.0f} ex/s{eta}")
        if self._task is None:
            self._progress.start()
            self._open = True
            self._task = self._progress.add_task(update.label, total=update.total,
                                                 counts=counts)
        self._progress.update(self._task, completed=update.examples, counts=counts)
        self._progress.refresh()

    def close(self) -> None:
        if self._open:
            self._open = False
            self._progress.stop()
