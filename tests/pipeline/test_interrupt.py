"""Ctrl-C or SIGTERM in the first epoch keeps the examples already computed (the open shard is
finished and recorded) and the rerun resumes there; a failed epoch leaves no empty folder;
unusable roots give one clear line. Real subprocesses and signals; the child tells the parent
when it has consumed its examples (a line on stdout), so nothing depends on timing."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
from typing import Callable

import numpy as np
import pytest

import snapcache as sc
from snapcache.errors import StoreError
from snapcache.store.fs import Storage
from snapcache.store.protocol import best_progress

N, CONSUMED = 400, 137

CHILD = """
import sys, numpy as np, snapcache as sc
root, n, consumed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ds = sc.Dataset.range(n).map(lambda i: {"i": i, "x": np.full(32, i % 251, np.uint8)}).snapshot(
    root, progress=False)          # default 64 MB shards: every example is in the open shard
it = iter(ds)
for _ in range(consumed):
    next(it)
print("consumed", flush=True)      # the event: the parent signals only now
sys.stdin.readline()               # a training step, interrupted by the signal
print("not interrupted", flush=True)
assert consumed + sum(1 for _ in it) == n
"""


def counting_pipeline(root, calls):
    def make(i):
        calls.append(i)
        return {"i": i, "x": np.full(32, i % 251, np.uint8)}

    return sc.Dataset.range(N).map(make).snapshot(root, progress=False)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_first_epoch_keeps_its_examples_and_the_rerun_resumes(root, signum):
    child = subprocess.Popen([sys.executable, "-c", CHILD, root, str(N), str(CONSUMED)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "consumed"
    child.send_signal(signum)
    out, err = child.communicate(timeout=120)
    assert "not interrupted" not in out
    assert child.returncode != 0, err
    # The open shard was finished and recorded: its progress record covers every example the
    # child computed and wrote.
    [folder] = os.listdir(root)
    record = best_progress(Storage(root).child(folder), 0, 1)
    assert record is not None and record.rows >= CONSUMED, err
    assert not any(name.endswith(".tmp") for name in os.listdir(os.path.join(root, folder)))
    # The rerun (the same pipeline, so the same snapshot) reuses the kept shard and computes
    # only the rest: the committed manifest starts with the interrupted run's shard.
    rerun = subprocess.run([sys.executable, "-c", CHILD, root, str(N), "1"], input="\n", capture_output=True, text=True,
                           timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    snap = sc.open_snapshot(root, folder)
    assert snap.state == "committed" and len(snap) == N
    assert snap.manifest.shards[:len(record.shards)] == record.shards
    assert [int(snap[i]["i"]) for i in (0, CONSUMED - 1, CONSUMED, N - 1)] == [
        0, CONSUMED - 1, CONSUMED, N - 1]


def test_a_consumer_that_stops_early_keeps_what_was_written(root):
    calls: list[int] = []
    it = iter(counting_pipeline(root, calls))
    for _ in range(CONSUMED):
        next(it)
    it.close()
    again: list[int] = []
    assert [e["i"] for e in counting_pipeline(root, again)] == list(range(N))
    assert again == list(range(CONSUMED, N))


def test_a_failed_epoch_leaves_no_empty_folder(root):
    def broken(i):
        raise RuntimeError("decode failed")

    with pytest.raises(Exception, match="decode failed"):
        list(sc.Dataset.range(10).map(broken).snapshot(root, progress=False))
    assert os.listdir(root) == []
    assert sc.ls(root) == []


def test_a_root_that_is_a_file_gives_one_clear_line(tmp_path):
    path = tmp_path / "snaps"
    path.write_text("not a folder")
    with pytest.raises(StoreError) as caught:
        list(sc.Dataset.range(3).snapshot(str(path), progress=False))
    message = str(caught.value)
    assert "\n" not in message
    assert f"snapshot root {path} is a file, not a folder" in message
    assert "pass snapshot() a folder path" in message


def _make_read_only(path) -> Callable[[], None]:
    """A folder this process cannot write into: chmod for a user; for root (who ignores
    permission bits) the immutable attribute. Returns the undo."""
    if os.geteuid() != 0:
        path.chmod(stat.S_IRUSR | stat.S_IXUSR)
        return lambda: path.chmod(stat.S_IRWXU)
    if shutil.which("chattr") is None or subprocess.run(
            ["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("cannot make a folder read-only for root here (chattr +i)")
    return lambda: subprocess.run(["chattr", "-i", str(path)], check=True)


def test_a_read_only_root_gives_one_clear_line(tmp_path):
    path = tmp_path / "snaps"
    path.mkdir()
    undo = _make_read_only(path)
    try:
        with pytest.raises(StoreError) as caught:
            list(sc.Dataset.range(3).snapshot(str(path), progress=False))
    finally:
        undo()
    message = str(caught.value)
    assert "\n" not in message
    assert f"snapshot root {path} is not writable (permission denied)" in message
    assert "a folder you can write to" in message
