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
import signal, sys, numpy as np, snapcache as sc
# Ctrl-C raises KeyboardInterrupt, as in a terminal: a child of a process that ignores SIGINT
# (one started in the background by a non-interactive shell, as CI runners may be) would
# otherwise inherit the ignoring and never see it.
signal.signal(signal.SIGINT, signal.default_int_handler)
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
    # stdin stays open until the child has exited: only the signal can end its step
    child.wait(timeout=120)
    out, err = child.stdout.read(), child.stderr.read()
    child.stdin.close()
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


def _numbers(root, kind: str, files=None) -> sc.Dataset:
    """An ordinary snapshot of a range, or a delta snapshot of files."""
    if kind == "range":
        source = sc.Dataset.range(5).map(lambda i: np.full(3, i))
    else:
        source = sc.Dataset.from_files(str(files / "*.npy")).map(np.load)
    return source.snapshot(str(root), progress=False)


@pytest.fixture
def npy_files(tmp_path):
    folder = tmp_path / "files"
    folder.mkdir()
    for i in range(5):
        np.save(folder / f"f{i}.npy", np.full(3, i))
    return folder


@pytest.mark.parametrize("kind", ["range", "files"])
def test_a_root_inside_a_file_gives_one_clear_line(tmp_path, npy_files, kind):
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    with pytest.raises(StoreError) as caught:
        list(_numbers(afile / "snaps", kind, npy_files))
    message = str(caught.value)
    assert "\n" not in message
    assert f"snapshot root {afile / 'snaps'} is inside {afile}, which is a file" in message
    assert "pass snapshot() a folder path (or set $SNAPCACHE_ROOT)" in message


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_a_root_that_cannot_be_created_gives_one_clear_line():
    with pytest.raises(StoreError) as caught:
        list(sc.Dataset.range(3).snapshot("/proc/snaps", progress=False))
    assert str(caught.value).startswith("snapshot root /proc/snaps cannot be created (")
    assert "pass snapshot() a folder you can write to, or set $SNAPCACHE_ROOT" in str(
        caught.value)


def test_a_read_only_root_reads_its_snapshots_and_names_the_way_out_for_new_ones(
        tmp_path, npy_files):
    root = tmp_path / "snaps"
    expected = {kind: [e.tolist() for e in _numbers(root, kind, npy_files)]
                for kind in ("range", "files")}
    undo = [_make_read_only(folder) for folder in [*root.iterdir(), root]]
    try:
        for kind, examples in expected.items():  # a new pipeline object: read, not computed
            assert [e.tolist() for e in _numbers(root, kind, npy_files)] == examples
        with pytest.raises(StoreError) as caught:
            list(sc.Dataset.range(7).snapshot(str(root), progress=False))
    finally:
        for step in reversed(undo):
            step()
    message = str(caught.value)
    assert f"snapshot root {root} is not writable (permission denied)" in message
    assert "reading a snapshot that already exists from a read-only root works" in message


READ_ONLY_CHILD = """
import signal, sys, numpy as np, snapcache as sc
# Ctrl-C raises KeyboardInterrupt, as in a terminal: a child of a process that ignores SIGINT
# (one started in the background by a non-interactive shell, as CI runners may be) would
# otherwise inherit the ignoring and never see it.
signal.signal(signal.SIGINT, signal.default_int_handler)
from snapcache.errors import StoreError
root, files, mode = sys.argv[1:]
for source in (sc.Dataset.range(5).map(lambda i: np.full(3, i)),
               sc.Dataset.from_files(files + "/*.npy").map(np.load)):
    print(len(list(source.snapshot(root, progress=False))))
for pipeline in (sc.Dataset.range(7), sc.Dataset.from_files(files + "/f[12].npy")) \
        if mode == "read-only" else ():
    try:
        list(pipeline.snapshot(root, progress=False))
    except StoreError as e:
        print(e)
"""


def test_a_read_only_file_system_reads_and_refuses_in_one_line(tmp_path, npy_files):
    """A root on a read-only mount (EROFS, not a permission error): the audit's repro. The
    child builds two snapshots, then, on the root mounted read-only, reads them and is
    refused new ones."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare to mount a read-only file system")
    root = tmp_path / "snaps"
    child = [sys.executable, "-c", READ_ONLY_CHILD, str(root), str(npy_files)]
    built = subprocess.run([*child, "build"], capture_output=True, text=True, timeout=120)
    assert built.returncode == 0 and built.stdout.splitlines() == ["5", "5"], built.stderr
    script = f'mount --bind {root} {root} && mount -o remount,bind,ro {root} && exec "$@"'
    proc = subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", *child, "read-only"],
                          capture_output=True, text=True, timeout=120)
    if "mount" in proc.stderr and proc.returncode != 0:
        pytest.skip(f"cannot mount here: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[:2] == ["5", "5"]  # both snapshots read from the read-only root
    assert len(lines) == 4, proc.stdout
    for line in lines[2:]:
        assert line.startswith(f"snapshot root {root} is not writable (read-only file "
                               "system): pass snapshot() a folder you can write to, or set "
                               "$SNAPCACHE_ROOT; reading a snapshot that already exists")


def test_a_url_with_a_slash_missing_is_refused_when_the_pipeline_is_built(tmp_path,
                                                                        monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"'s3:/bucket/snaps' looks like a URL with a slash "
                                         r"missing: write 's3://bucket/snaps'"):
        sc.Dataset.range(3).snapshot("s3:/bucket/snaps")
    monkeypatch.setenv("SNAPCACHE_ROOT", "gs:/bucket/snaps")
    with pytest.raises(ValueError, match="write 'gs://bucket/snaps'"):
        sc.Dataset.range(3).snapshot()
    assert os.listdir(tmp_path) == []
