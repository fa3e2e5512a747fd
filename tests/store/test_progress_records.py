"""A writer's progress record in files of PROGRESS_PART shards: recording a shard rewrites only
the file of the newest shards, whatever came before; the record reads back whole, or as the
prefix of it that a crash left; the first file alone is a record older releases read, and the
others are never taken for one; an interrupted epoch of many shards resumes after all of them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import snapcache as sc
from snapcache.store import layout
from snapcache.store.fs import Storage
from snapcache.store.manifest import ShardInfo
from snapcache.store.protocol import (
    StreamRecord, best_progress, commit_fields, try_commit, write_marker, write_progress)
from snapcache.store.options import WriteOptions
from snapcache.store.protocol.records import PROGRESS_PART, progress_records

RUN = "c0ffee00"


def shards(n: int, run: str = RUN) -> tuple[ShardInfo, ...]:
    return tuple(ShardInfo(f"{run}-0000-{i:06d}.arrow", rows=2, bytes=10, checksum="xxh3_64:0")
                 for i in range(n))


def with_files(tmp_path, record: StreamRecord) -> Storage:
    folder = Storage(str(tmp_path)).child("6" * 32)
    for shard in record.shards:
        folder.write_atomic(shard.path, b"x" * 10)
    return folder


def written(folder: Storage, shard_size: int = 4000):
    """400 rows of 200 bytes written by a SnapshotWriter into ``folder`` in record batches of
    1,000 bytes; the committed manifest."""
    from snapcache.store.writer import SnapshotWriter

    writer = SnapshotWriter(folder, fingerprint=os.path.basename(folder.root.rstrip("/")),
                            options=WriteOptions(shard_size=shard_size, record_batch_size=1000))
    for i in range(400):
        writer.write({"x": np.full(25, i, np.float64)})
    return writer.commit()


class Counting(Storage):
    """Storage that keeps the names of the files it writes and reads."""

    written: list
    read: list

    def write_atomic(self, name, data):
        type(self).written.append((name, len(data)))
        return super().write_atomic(name, data)

    def read_bytes(self, name):
        type(self).read.append(name)
        return super().read_bytes(name)


def test_recording_a_shard_rewrites_only_the_file_of_the_newest_shards(tmp_path):
    n = 2 * PROGRESS_PART + 40
    record = StreamRecord(0, 1, RUN, shards(n), {"fields": []})
    folder = Storage(str(tmp_path)).child("6" * 32)
    Counting.written = []
    counting = Counting(folder.url)
    write_progress(counting, StreamRecord(0, 1, RUN, record.shards[:1], None))
    for done in range(1, n):  # one shard at a time, as a writer records them
        write_progress(counting, StreamRecord(0, 1, RUN, record.shards[:done + 1], None), done)
    names = [name for name, _ in Counting.written]
    assert len(names) == n  # one file a shard
    assert names.count(layout.progress_name(1, 0, RUN)) == PROGRESS_PART
    assert names.count(layout.progress_name(1, 0, RUN, 1)) == PROGRESS_PART
    assert names.count(layout.progress_name(1, 0, RUN, 2)) == 40
    largest = max(size for _, size in Counting.written)
    assert largest < 2 * max(size for name, size in Counting.written
                             if name == layout.progress_name(1, 0, RUN))
    # Several shards recorded at once (finished uploads) write each file they reach.
    Counting.written = []
    write_progress(counting, record, PROGRESS_PART - 1)
    assert [name for name, _ in Counting.written] == [
        layout.progress_name(1, 0, RUN, part) for part in range(3)]


def test_the_record_reads_back_whole_or_as_the_prefix_a_crash_left(tmp_path):
    record = StreamRecord(1, 2, RUN, shards(2 * PROGRESS_PART + 7), {"fields": ["x"]}, "t")
    folder = with_files(tmp_path, record)
    write_progress(folder, record)
    assert {n for n in folder.listdir() if n.startswith("progress-")} == {
        layout.progress_name(2, 1, RUN), layout.progress_name(2, 1, RUN, 1),
        layout.progress_name(2, 1, RUN, 2)}
    assert all(layout.is_own_file(name) for name in folder.listdir())
    assert best_progress(folder, 1, 2) == record
    [whole] = progress_records(folder, folder.listdir())
    assert whole == record
    # File 0 alone is a record (what older releases read: a prefix, the rest computed again);
    # the later files are not records to them (no "shards").
    first = StreamRecord.loads(folder.read_bytes(layout.progress_name(2, 1, RUN)), where="0")
    assert first.shards == record.shards[:PROGRESS_PART]
    later = json.loads(folder.read_bytes(layout.progress_name(2, 1, RUN, 1)))
    assert "shards" not in later and later["part"] == 1
    # A file missing (or unreadable) ends the record there: what follows it is not used.
    folder.remove(layout.progress_name(2, 1, RUN, 1))
    assert best_progress(folder, 1, 2).shards == record.shards[:PROGRESS_PART]
    folder.write_atomic(layout.progress_name(2, 1, RUN, 1), b"{not json")
    assert best_progress(folder, 1, 2).shards == record.shards[:PROGRESS_PART]


def test_a_file_of_another_run_or_stream_is_never_joined(tmp_path):
    record = StreamRecord(0, 1, RUN, shards(PROGRESS_PART + 5), None)
    folder = with_files(tmp_path, record)
    write_progress(folder, record)
    other = StreamRecord(0, 2, RUN, shards(PROGRESS_PART + 5), None)
    folder.write_atomic(layout.progress_name(1, 0, RUN, 1), other.dumps_part(1))
    assert best_progress(folder, 0, 1).shards == record.shards[:PROGRESS_PART]
    # File 1 of a record whose file 0 is not full is not its continuation either.
    short = StreamRecord(0, 1, RUN, shards(PROGRESS_PART - 1), None)
    folder.write_atomic(layout.progress_name(1, 0, RUN), short.dumps_part(0))
    folder.write_atomic(layout.progress_name(1, 0, RUN, 1), record.dumps_part(1))
    assert best_progress(folder, 0, 1).shards == short.shards


def test_an_interrupted_epoch_of_many_shards_resumes_after_all_of_them(tmp_path):
    root = str(tmp_path / "snaps")
    n, consumed = 2 * PROGRESS_PART + 60, 2 * (PROGRESS_PART + 20)
    calls: list[int] = []

    def pipeline():
        def make(i):
            calls.append(i)
            return {"i": i, "x": np.full(1500, i % 251, np.uint8)}

        # ~1.5 KB an example in 2 KB shards: a shard holds one or two examples
        return sc.Dataset.range(n).map(make).snapshot(root, shard_size=2048, compression=None,
                                                       progress=False)

    it = iter(pipeline())
    assert [int(next(it)["i"]) for _ in range(consumed)] == list(range(consumed))
    it.close()
    [folder] = os.listdir(root)
    storage = Storage(root).child(folder)
    kept = best_progress(storage, 0, 1)
    assert kept is not None and kept.rows >= consumed and len(kept.shards) > PROGRESS_PART
    assert layout.progress_name(1, 0, kept.run_id, 1) in storage.listdir()
    calls.clear()
    assert [int(e["i"]) for e in pipeline()] == list(range(n))
    assert calls == list(range(kept.rows, n))  # only what no kept shard holds
    snap = sc.open_snapshot(root, folder)
    assert snap.state == "committed" and len(snap) == n
    assert snap.manifest.shards[:len(kept.shards)] == kept.shards
    assert not [name for name in os.listdir(os.path.join(root, folder))
                if name.startswith("progress-")]


def test_streams_finishing_one_by_one_read_the_markers_once(tmp_path):
    """Each stream that finishes looks whether it is the last; it reads no marker while some
    are missing, so n streams read n markers between them, not n(n+1)/2 (512 streams: 512
    reads, not 131,328)."""
    streams = 12
    folder = Storage(str(tmp_path)).child("8" * 32)
    folder.makedirs()
    Counting.read = []
    counting = Counting(folder.url)
    committed = []
    for stream in range(streams):
        write_marker(counting, StreamRecord(stream, streams, f"{stream:08x}", (), None))
        fields = commit_fields(WriteOptions(), key=None, name=None, fingerprint="8" * 32,
                               fingerprint_tree=None, pipeline="test", run_id=f"{stream:08x}")
        committed.append(try_commit(counting, streams, **fields))
    assert committed[:-1] == [None] * (streams - 1) and committed[-1] is not None
    assert len([name for name in Counting.read if name.startswith("stream-")]) == streams


KILLED_CHILD = """
import sys, numpy as np, snapcache as sc
root, n, consumed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ds = sc.Dataset.range(n).map(lambda i: {"i": i, "x": np.full(1500, i % 251, np.uint8)}).snapshot(
    root, shard_size=2048, compression=None, progress=False, key="many")
it = iter(ds)
for _ in range(consumed):
    next(it)
print("consumed", flush=True)
sys.stdin.readline()  # killed here
"""


def test_a_writer_killed_after_hundreds_of_shards_is_resumed_from_all_it_recorded(tmp_path):
    """SIGKILL: nothing is finished or recorded on the way out, and what the record's files say
    is what the rerun keeps: every shard recorded before the kill, across several files."""
    root = str(tmp_path / "snaps")
    n, consumed = 2 * PROGRESS_PART + 100, 2 * (PROGRESS_PART + 40)
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(sc.__file__))}
    child = subprocess.Popen([sys.executable, "-c", KILLED_CHILD, root, str(n), str(consumed)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout.readline().strip() == "consumed"
        [folder] = os.listdir(root)
        storage = Storage(root).child(folder)
        # The background writer records what it has finished; the child waits, so the record
        # stops growing. Wait for it to cover all but the shard in progress.
        deadline = time.monotonic() + 120
        while True:
            kept = best_progress(storage, 0, 1)
            if kept is not None and kept.rows >= consumed - 2:
                break
            assert time.monotonic() < deadline, kept
            time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    finally:
        child.kill()
        child.stdin.close()
    kept = best_progress(storage, 0, 1)
    assert len(kept.shards) > PROGRESS_PART
    calls: list[int] = []

    def make(i):
        calls.append(i)
        return {"i": i, "x": np.full(1500, i % 251, np.uint8)}

    ds = sc.Dataset.range(n).map(make).snapshot(root, shard_size=2048, compression=None,
                                                 progress=False, key="many")  # the same one
    assert [int(e["i"]) for e in ds] == list(range(n))
    assert calls == list(range(kept.rows, n))
    assert sc.open_snapshot(root, folder).manifest.shards[:len(kept.shards)] == kept.shards


def test_a_finished_stream_waiting_for_the_others_reads_each_marker_once(tmp_path):
    """A stream whose marker is written polls whether some other stream has neither a marker
    nor a live writer (then it stops waiting after the lease's ttl). Each marker is read at
    most once while it waits (it used to read every marker, each a full shard list, at every
    poll), and none of a stream being written."""
    from snapcache.store.protocol import WriteLease
    from snapcache.store.protocol.negotiate import _pending_without_writer
    streams = 8
    folder = Storage(str(tmp_path)).child("9" * 32)
    folder.makedirs()
    for stream in range(3):
        write_marker(folder, StreamRecord(stream, streams, f"{stream:08x}", (), None))
    leases = [WriteLease.acquire(folder, run_id=f"{stream:08x}", stream=stream, streams=streams)
              for stream in range(3, streams)]
    Counting.read = []
    counting = Counting(folder.url)
    confirmed: set = set()

    def pending() -> bool:
        return _pending_without_writer(counting, streams, counting.listdir(), confirmed)

    for _ in range(5):  # polls
        assert not pending()
    assert sorted(name for name in Counting.read if name.startswith("stream-")) == [
        layout.marker_name(streams, i) for i in range(3)]
    leases[-1].release()  # the last stream: no writer, no marker
    assert pending()
    write_marker(folder, StreamRecord(streams - 1, streams, "f" * 8, (), None))
    assert not pending()
    os.remove(os.path.join(folder.root, layout.marker_name(streams, 0)))  # a restarted stream
    assert pending()
    with open(os.path.join(folder.root, layout.marker_name(streams, 0)), "w") as f:
        f.write("{not json")  # a damaged marker counts as missing
    assert pending()
    for lease in leases[:-1]:
        lease.release()


def test_progress_records_are_written_off_the_callers_thread_in_order(tmp_path):
    """A progress record (a PUT on S3, a durable write on local disk) is written by the
    writer's recorder thread, one at a time and in order, so the caller's thread does not
    wait for it; the commit waits for the last one."""
    import threading

    class Recording(Storage):
        seen: list = []

        def write_atomic(self, name, data, **kwargs):
            if name.startswith("progress-"):
                type(self).seen.append((threading.current_thread().name,
                                        len(json.loads(data)["shards"])))
            return super().write_atomic(name, data, **kwargs)

    folder = Recording(Storage(str(tmp_path)).child("7" * 32).url)
    manifest = written(folder)
    counts = [shards for _, shards in Recording.seen]
    assert len(counts) > 3 and counts == sorted(counts)
    assert counts[-1] == len(manifest.shards)
    assert {name.split("_")[0] for name, _ in Recording.seen} == {"snapcache-record"}


def test_a_progress_record_lists_only_shards_already_flushed_to_the_disk(tmp_path):
    """Every marker and manifest lists only recorded shards, and a progress record is written
    only once the bytes of the shards it adds are flushed to the disk (fdatasync): a power
    loss never leaves a record, marker or manifest listing a shard that was still only in the
    page cache (torn or empty after the reboot). Local disk; an object store's upload is
    stored once it returns."""

    class Syncing(Storage):
        events: list = []

        def make_durable(self, rel):
            assert os.path.getsize(self.full(rel)) > 0  # in place, whole
            type(self).events.append(("durable", rel))
            return super().make_durable(rel)

        def write_atomic(self, name, data, **kwargs):
            if name.startswith("progress-"):
                listed = [s["path"] for s in json.loads(data)["shards"]]
                type(self).events.append(("record", listed))
            return super().write_atomic(name, data, **kwargs)

    folder = Syncing(Storage(str(tmp_path)).child("8" * 32).url)
    manifest = written(folder)
    durable: set = set()
    records = 0
    for kind, what in Syncing.events:
        if kind == "durable":
            durable.add(what)
        else:
            records += 1
            assert set(what) <= durable, f"recorded before flushed: {set(what) - durable}"
    assert records > 3 and durable == {s.path for s in manifest.shards}


def test_a_shard_in_progress_is_flushed_to_the_disk_early(tmp_path, monkeypatch):
    """Every FLUSH_BYTES written to a local shard, the recorder flushes it to the disk through
    a descriptor of its own, so that the flush before its record (and before the commit, at
    the end of an epoch) has little left to write; the descriptors are all closed."""
    from snapcache.store import recorder as recorder_module
    from snapcache.store import writer as writer_module

    monkeypatch.setattr(writer_module, "FLUSH_BYTES", 4000)
    flushed = []
    real = os.fdatasync

    def fdatasync(fd):
        flushed.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd)

    monkeypatch.setattr(recorder_module.os, "fdatasync", fdatasync)
    open_before = len(os.listdir("/proc/self/fd"))
    folder = Storage(str(tmp_path)).child("9" * 32)
    manifest = written(folder, shard_size=20_000)
    early = [p for p in flushed if p.endswith(".tmp")]
    assert len(early) >= 3 * len(manifest.shards) - 3
    assert {os.path.basename(p) for p in flushed if not p.endswith(".tmp")} == \
        {s.path for s in manifest.shards}
    assert len(os.listdir("/proc/self/fd")) == open_before


def test_the_first_failure_stops_the_recorder_and_is_raised_on_the_callers_thread(tmp_path):
    """A progress record that fails (a full disk) stops the recorder: nothing is written
    after it (a later record rewrites only its newest file, over a record torn half-way),
    and the failure comes out of check() once done and out of wait()."""
    from snapcache.store.recorder import Recorder

    class Failing(Storage):
        writes: list = []

        def write_atomic(self, name, data, **kwargs):
            type(self).writes.append(name)
            if len(type(self).writes) == 2:
                raise OSError(28, "No space left on device")
            return super().write_atomic(name, data, **kwargs)

    folder = Failing(Storage(str(tmp_path)).child("a" * 32).url)
    recorder = Recorder(folder)
    records = [StreamRecord(0, 1, RUN, shards(k), None) for k in (1, 2, 3)]
    for record in records:
        recorder.record([], record, 0)
    fd = os.open(str(tmp_path), os.O_RDONLY)
    recorder.flush_early(fd)  # skipped after the failure, its descriptor closed
    with pytest.raises(OSError) as raised:
        recorder.wait()
    assert raised.value.errno == 28 and len(Failing.writes) == 2
    with pytest.raises(OSError):
        recorder.check()
    with pytest.raises(OSError):
        recorder.stop()
    with pytest.raises(OSError):
        os.fstat(fd)
