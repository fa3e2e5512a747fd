"""Progress of the writing epoch: examples, MB, rate and ETA, through a callback.

The library never prints. :func:`track` calls ``callback(ProgressUpdate)`` a few times a
second; the default callback draws a ``tqdm`` bar when stderr is a terminal and tqdm is
installed (``pip install tqdm``; it is optional), and otherwise logs a line every 10 seconds
on the ``snapcache`` logger at INFO level. Pass ``progress=False`` to ``snapshot()`` for
silence, or your own callable to route updates elsewhere.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from snapcache.runtime.autotune import nbytes_of

log = logging.getLogger("snapcache")

UPDATE_SECONDS = 0.25
LOG_SECONDS = 10.0


@dataclass(frozen=True)
class ProgressUpdate:
    """One report on a snapshot being written."""

    label: str
    examples: int
    bytes: int
    """Uncompressed payload bytes handed to the writer so far."""
    elapsed: float
    total: int | None
    """Examples expected in the epoch, when the pipeline's length is known."""
    done: bool = False

    @property
    def rate(self) -> float:
        return self.examples / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def eta(self) -> float | None:
        if self.total is None or self.rate <= 0:
            return None
        return max(0.0, (self.total - self.examples) / self.rate)

    def __str__(self) -> str:
        total = f"/{self.total:,}" if self.total is not None else ""
        eta = f", ETA {_clock(self.eta)}" if self.eta is not None and not self.done else ""
        state = "wrote" if self.done else "writing"
        return (f"{state} {self.label}: {self.examples:,}{total} examples, "
                f"{self.bytes / 1e6:,.1f} MB, {self.rate:,.0f} examples/s{eta}")


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def track(items: Iterator[Any], label: str, total: int | None,
          callback: Callable[[ProgressUpdate], None]) -> Iterator[Any]:
    """Yield ``items``, reporting progress to ``callback`` (also once at the end)."""
    start = time.perf_counter()
    last = start
    examples = 0
    nbytes = 0
    finished = False
    try:
        for item in items:
            examples += 1
            nbytes += nbytes_of(item)
            now = time.perf_counter()
            if now - last >= UPDATE_SECONDS:
                last = now
                callback(ProgressUpdate(label, examples, nbytes, now - start, total))
            yield item
        finished = True
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            close()
        callback(ProgressUpdate(label, examples, nbytes, time.perf_counter() - start, total,
                                done=finished))


class DefaultDisplay:
    """A tqdm bar on a terminal, log lines otherwise."""

    def __init__(self) -> None:
        self._bar: Any = None
        self._last_log = time.perf_counter()
        self._use_tqdm = False
        if getattr(sys.stderr, "isatty", lambda: False)():
            try:
                import tqdm  # noqa: F401
                self._use_tqdm = True
            except ImportError:
                pass

    def __call__(self, update: ProgressUpdate) -> None:
        if self._use_tqdm:
            self._draw(update)
        elif update.done or time.perf_counter() - self._last_log >= LOG_SECONDS:
            self._last_log = time.perf_counter()
            log.info("%s", update)

    def _draw(self, update: ProgressUpdate) -> None:
        from tqdm import tqdm

        if self._bar is None:
            self._bar = tqdm(total=update.total, desc=f"snapshot {update.label}",
                             unit="ex", unit_scale=True, leave=False)
        self._bar.update(update.examples - self._bar.n)
        self._bar.set_postfix_str(f"{update.bytes / 1e6:,.1f} MB")
        if update.done:
            self._bar.close()
            self._bar = None
            log.info("%s", update)
