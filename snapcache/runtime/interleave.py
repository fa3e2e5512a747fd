"""Interleave: open several sources at once and take examples from them in turn.

The order is tf.data's ``interleave`` order: ``cycle_length`` slots are visited round-robin,
``block_length`` examples from each; a slot whose source is exhausted is refilled with the next
input element the next time the cycle reaches it (and produces from it at once).

With ``parallelism > 1`` every open source, and up to ``cycle_length`` sources opened ahead of
need, is pumped by its own thread into a small queue, so opening and reading latency overlaps;
a semaphore keeps at most ``parallelism`` of them inside the user's code at once. The consumer
still takes examples in the deterministic order above unless ``deterministic=False``, where it
takes whatever slot has an example ready.
"""

from __future__ import annotations

import collections
import queue
import threading
from typing import Any, Callable, Iterable, Iterator

from snapcache import lifecycle
from snapcache.runtime.errors import Locate, annotate

_END = object()


class _Failure:
    def __init__(self, error: BaseException):
        self.error = error


def _open(fn: Callable[[Any], Iterable[Any]], element: Any) -> Iterator[Any]:
    produced = fn(element)
    try:
        return iter(produced)
    except TypeError:
        raise TypeError(f"interleave's fn returned {type(produced).__name__}, not an iterable "
                        "(a Dataset, generator, list, ...)") from None


def interleave(fn: Callable[[Any], Iterable[Any]], items: Iterable[Any], *, cycle_length: int,
               block_length: int = 1, parallelism: int = 1, deterministic: bool = True,
               label: str = "interleave", locate: Locate | None = None) -> Iterator[Any]:
    """Yield the examples of ``fn(item)`` for every item, interleaved (see the module doc).
    An exception names ``label`` and the item (``locate``, see
    :func:`~snapcache.runtime.errors.annotate`)."""
    if parallelism <= 1:
        return _serial(fn, items, cycle_length, block_length, label, locate)
    return _parallel(fn, items, cycle_length, block_length, parallelism, deterministic, label,
                     locate)


def _serial(fn, items, cycle_length, block_length, label, locate) -> Iterator[Any]:
    source = iter(items)
    slots: list[Iterator[Any] | None] = [None] * cycle_length
    positions = [0] * cycle_length
    index = 0
    consumed = 0
    open_count = 0
    end_of_input = False
    try:
        while not end_of_input or open_count:
            it = slots[index]
            if it is None:
                if end_of_input:
                    index = (index + 1) % cycle_length
                    continue
                try:
                    element = next(source)
                except StopIteration:
                    end_of_input = True
                    continue
                try:
                    slots[index] = _open(fn, element)
                except Exception as e:
                    raise annotate(e, label, consumed, locate)
                positions[index] = consumed
                consumed += 1
                open_count += 1
                continue
            for _ in range(block_length):
                try:
                    value = next(it)
                except StopIteration:
                    slots[index] = None
                    open_count -= 1
                    break
                except Exception as e:
                    raise annotate(e, label, positions[index], locate)
                yield value
            index = (index + 1) % cycle_length
    finally:
        for it in slots:
            close = getattr(it, "close", None)
            if close is not None:
                close()
        close = getattr(source, "close", None)
        if close is not None:
            close()


class _Producer:
    """One source pumped by its own thread into a bounded queue."""

    def __init__(self, fn, element, position, gate: threading.Semaphore, stop: threading.Event,
                 buffer: int, ready: threading.Condition):
        self.position = position
        self.queue: queue.Queue = queue.Queue(maxsize=buffer)
        self._stop, self._gate, self._ready = stop, gate, ready
        # At interpreter exit a producer must leave library code before finalization starts.
        self.thread = lifecycle.background(lambda: self._run(fn, element), stop.set,
                                           "snapcache-interleave")

    def _put(self, value: Any) -> bool:
        while not self._stop.is_set():
            try:
                self.queue.put(value, timeout=0.05)
                with self._ready:
                    self._ready.notify_all()
                return True
            except queue.Full:
                continue
        return False

    def _run(self, fn, element) -> None:
        it = None
        try:
            with self._gate:
                it = _open(fn, element)
            while not self._stop.is_set():
                with self._gate:
                    try:
                        value = next(it)
                    except StopIteration:
                        break
                if not self._put(value):
                    return
            self._put(_END)
        except BaseException as e:  # handed to the consumer
            self._put(_Failure(e))
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()


def _parallel(fn, items, cycle_length, block_length, parallelism, deterministic, label,
              locate) -> Iterator[Any]:
    source = iter(items)
    stop = threading.Event()
    gate = threading.Semaphore(parallelism)
    ready = threading.Condition()
    buffer = max(2, block_length)
    ahead: collections.deque[_Producer] = collections.deque()
    slots: list[_Producer | None] = [None] * cycle_length
    consumed = 0
    end_of_input = False
    started: list[_Producer] = []

    def stop_all(timeout: float) -> None:
        stop.set()
        for producer in started:
            producer.thread.join(timeout=timeout)

    def refill_ahead() -> None:
        nonlocal consumed, end_of_input
        if len(started) > 4 * cycle_length:  # keep only the producers that may still run
            started[:] = [p for p in started if p.thread.is_alive()]
        while not end_of_input and len(ahead) < cycle_length:
            try:
                element = next(source)
            except StopIteration:
                end_of_input = True
                return
            producer = _Producer(fn, element, consumed, gate, stop, buffer, ready)
            started.append(producer)
            ahead.append(producer)
            consumed += 1

    def take(producer: _Producer) -> Any:
        item = producer.queue.get()
        if isinstance(item, _Failure):
            raise annotate(item.error, label, producer.position, locate)
        return item

    try:
        refill_ahead()
        index = 0
        while ahead or any(s is not None for s in slots):
            if deterministic:
                producer = slots[index]
                if producer is None:
                    if ahead:
                        slots[index] = ahead.popleft()
                        refill_ahead()
                    else:
                        index = (index + 1) % cycle_length
                    continue
                for _ in range(block_length):
                    item = take(producer)
                    if item is _END:
                        slots[index] = None
                        break
                    yield item
                index = (index + 1) % cycle_length
                continue
            # Non-deterministic: fill empty slots, then take from any slot with an item ready.
            for i in range(cycle_length):
                if slots[i] is None and ahead:
                    slots[i] = ahead.popleft()
                    refill_ahead()
            with ready:
                while not any(s is not None and not s.queue.empty() for s in slots):
                    ready.wait(0.05)
            for i, producer in enumerate(slots):
                if producer is None or producer.queue.empty():
                    continue
                item = take(producer)
                if item is _END:
                    slots[i] = None
                else:
                    yield item
    finally:
        stop_all(1.0)  # a producer still busy ends on its own, and forgets itself
        close = getattr(source, "close", None)
        if close is not None:
            close()
