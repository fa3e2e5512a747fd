"""The store protocol on S3 over HTTP: leases by conditional PUT, concurrent processes,
streams, crashes, and the local shard cache."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np

import snapcache as sc
from snapcache.store import layout
from snapcache.store.fs import Storage
from snapcache.store.protocol import WriteLease
from snapcache.store.reader import load_manifest

from test_concurrency import KILLABLE, WORKER, expected, run_many


def committed(root):
    storage = Storage(root)
    return [n for n in storage.listdir() if layout.is_fingerprint(n)
            and load_manifest(storage.child(n)) is not None]


def test_eight_processes_on_s3_one_writer(s3_root, tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    results = run_many(str(worker), s3_root, 8, 60, 0.01)
    assert sum(r["calls"] for r in results) == 60
    assert all(r["data"] == expected(60) for r in results)
    assert len(committed(s3_root)) == 1


def test_s3_lease_is_a_conditional_create(s3_root):
    folder = Storage(s3_root).child("1" * 32)
    first = WriteLease.acquire(folder, run_id="0000000a", ttl=30)
    assert first is not None
    assert WriteLease.acquire(folder, run_id="0000000b", ttl=30) is None
    first.release()
    third = WriteLease.acquire(folder, run_id="0000000c", ttl=30)
    assert third is not None
    third.release()  # else its heartbeat outlives the server and warns at exit


def test_streams_on_s3(s3_root, counter):
    ds = sc.Dataset.range(40).map(lambda i: (counter.hit(), {"i": i})[1]).snapshot(
        s3_root, shard_size=512)
    parts = [[e["i"] for e in ds.iterate(epoch=0, stream=(k, 2))] for k in range(2)]
    assert sorted(parts[0] + parts[1]) == list(range(40))
    assert len(committed(s3_root)) == 1
    assert [e["i"] for e in ds] == list(range(0, 40, 2)) + list(range(1, 40, 2))
    assert counter.count == 40


def test_sigkill_on_s3_then_resume(s3_root, tmp_path):
    script = tmp_path / "killable.py"
    script.write_text(KILLABLE)
    proc = subprocess.Popen([sys.executable, str(script), s3_root, "300"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(2.0)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert len(committed(s3_root)) <= 1
    done = subprocess.run([sys.executable, str(script), s3_root, "300"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert len(committed(s3_root)) == 1


def test_local_cache_keeps_remote_shards(s3_root, tmp_path):
    cache = tmp_path / "cache"
    ds = sc.Dataset.range(200).map(lambda i: {"x": np.full(100, i)}).snapshot(
        s3_root, shard_size=4096, local_cache=str(cache), local_cache_limit=1 << 20)
    first = [int(e["x"][0]) for e in ds]
    second = [int(e["x"][0]) for e in ds]
    assert first == second == list(range(200))
    copies = [f for _, _, files in os.walk(cache) for f in files]
    assert copies, "the second epoch read the shards through the local cache"
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(cache) for f in fs)
    assert total <= 1 << 20
    # a damaged local copy is detected by its checksum, dropped, and read from S3 again
    victim = next(os.path.join(d, f) for d, _, fs in os.walk(cache) for f in fs)
    data = bytearray(open(victim, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(victim, "wb").write(bytes(data))
    assert [int(e["x"][0]) for e in ds] == list(range(200))


def test_a_local_cache_that_cannot_be_written_is_warned_of_and_the_snapshot_read(s3_root,
                                                                                 tmp_path,
                                                                                 caplog):
    """``local_cache=`` a folder this process cannot write (a read-only mount, another user's;
    here a path below a regular file, which stops root too): the snapshot is read from S3,
    with a warning naming the option and the way out."""
    (tmp_path / "file").write_bytes(b"not a folder")
    where = str(tmp_path / "file" / "cache")
    ds = sc.Dataset.range(200).map(lambda i: {"x": np.full(10, i)}).snapshot(
        s3_root, shard_size=4096, progress=False)
    assert [int(e["x"][0]) for e in ds] == list(range(200))  # built
    cached = sc.Dataset.range(200).map(lambda i: {"x": np.full(10, i)}).snapshot(
        s3_root, shard_size=4096, progress=False, local_cache=where)
    with caplog.at_level("WARNING", logger="snapcache.store.cache"):
        assert [int(e["x"][0]) for e in cached] == list(range(200))
    assert any(f"local_cache={where!r}" in r.getMessage() for r in caplog.records)
