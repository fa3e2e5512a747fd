"""BackgroundFile: a local shard file written out by a thread, one record batch at a time."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest

from snapcache.store import background_write
from snapcache.store.background_write import BackgroundFile


def test_pieces_reach_the_file_in_order_small_ones_copied_large_ones_not(tmp_path):
    path = str(tmp_path / "f")
    f = BackgroundFile(path)
    big = np.arange(1 << 20, dtype=np.uint8)
    expected = b""
    for k in range(5):  # more record batches than may be in flight at once
        for piece in (b"head%d" % k, big.tobytes(), b"x" * 10, memoryview(big)[:70_000]):
            f.write(piece)
            expected += bytes(piece)
        f.flush()
    f.write(b"footer")
    f.close()
    assert open(path, "rb").read() == expected + b"footer"


def test_a_short_writev_is_finished(tmp_path, monkeypatch):
    real = os.writev

    def short(fd, pieces):  # at most 1000 bytes a call, as a signal or a pipe may make it
        data = b"".join(bytes(p) for p in pieces)[:1000]
        return real(fd, [data])

    monkeypatch.setattr(background_write.os, "writev", short)
    path = str(tmp_path / "f")
    f = BackgroundFile(path)
    data = os.urandom(300_000)
    f.write(b"a" * 10)
    f.write(data)
    f.write(b"b" * 10)
    f.close()
    assert open(path, "rb").read() == b"a" * 10 + data + b"b" * 10


def test_a_failed_write_is_raised_on_the_callers_thread_and_nothing_after_it_is_written(
        tmp_path, monkeypatch):
    writes = []

    def full(fd, pieces):
        writes.append(len(pieces))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(background_write.os, "writev", full)
    f = BackgroundFile(str(tmp_path / "f"))
    f.write(b"x" * 100_000)
    f.flush()
    with pytest.raises(OSError, match="No space left"):
        for _ in range(10):  # raised at a later flush, or at the latest at close
            f.write(b"y" * 100_000)
            f.flush()
        f.close()
    assert writes == [1]  # nothing more was tried after the failure
    f.abandon()  # what the writer does with a failed shard: no second error


def test_abandon_drops_what_is_pending_and_raises_nothing(tmp_path, monkeypatch):
    def failing(fd, pieces):
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(background_write.os, "writev", failing)
    f = BackgroundFile(str(tmp_path / "f"))
    f.write(b"x" * 100_000)
    f.flush()
    f.abandon()
    f.abandon()
    assert f.closed


def test_the_file_gets_the_permissions_open_would_give_it(tmp_path):
    """The umask decides, as for ``open(path, "wb")``: a root shared by a group
    (umask 002) keeps its shards group-writable."""
    old = os.umask(0o002)
    try:
        f = BackgroundFile(str(tmp_path / "background"))
        f.write(b"x")
        f.close()
        with open(tmp_path / "plain", "wb") as g:
            g.write(b"x")
    finally:
        os.umask(old)
    mode = os.stat(tmp_path / "background").st_mode & 0o777
    assert mode == os.stat(tmp_path / "plain").st_mode & 0o777 == 0o664
