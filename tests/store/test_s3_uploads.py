"""Shards of an S3 snapshot are uploaded whole from a background pool (store/upload.py): a
failed upload fails the build and commits nothing, a large shard goes up in parallel parts, a
build killed mid-way resumes with the shards it stored, and the pool holds a bounded number of
shards."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import s3server
import snapcache as sc
from snapcache.errors import StoreError
from snapcache.store import fs_s3, layout
from snapcache.store.fs import Storage
from snapcache.store.manifest import ShardInfo
from snapcache.store.reader import load_manifest
from snapcache.store.upload import Spool, Uploads

pytestmark = pytest.mark.skipif(s3server.missing_requirements() is not None,
                                reason=str(s3server.missing_requirements()))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def example(i):
    """4 KB of noise (stored raw, so shard counts follow example counts)."""
    return {"x": np.random.default_rng(i).integers(0, 256, 4096, dtype=np.uint8), "i": i}


def folder_of(root):
    storage = Storage(root)
    (name,) = [n for n in storage.listdir() if layout.is_fingerprint(n)]
    return storage.child(name)


class EndpointConnectionError(Exception):
    """What an S3 client's library might let through untranslated (as s3fs once did)."""


EndpointConnectionError.__module__ = "botocore.exceptions"


@pytest.mark.parametrize("fault", [OSError, EndpointConnectionError])
def test_a_failed_upload_fails_the_build_and_commits_nothing(s3_root, monkeypatch, fault):
    real = Storage.upload
    uploaded, attempts, lock = [], [], threading.Lock()

    def flaky(self, rel, data):
        with lock:
            attempts.append(rel)
            third = len(attempts) == 3
        if third:
            raise fault("injected: the connection was reset while uploading")
        real(self, rel, data)
        uploaded.append(rel)

    monkeypatch.setattr(Storage, "upload", flaky)
    ds = sc.Dataset.range(400).map(example).snapshot(s3_root, progress=False,
                                                     shard_size=160 << 10)
    with pytest.raises(StoreError, match="injected: the connection was reset.*"
                                         "Nothing was committed"):
        for _ in ds:
            pass
    folder = folder_of(s3_root)
    assert load_manifest(folder) is None
    names = folder.listdir()
    progress = [n for n in names if n.startswith("progress-")]
    assert len(progress) == 1
    listed = [s["path"] for s in json.loads(folder.read_bytes(progress[0]))["shards"]]
    # only shards that were stored, in order, and never one after the failed upload
    assert listed and set(listed) <= set(uploaded) and len(listed) <= 2
    assert sorted(n for n in names if n.endswith(".arrow")) == sorted(listed)
    # the next run reuses them and commits
    monkeypatch.setattr(Storage, "upload", real)
    assert [int(e["i"]) for e in ds] == list(range(400))
    assert set(listed) <= {s.path for s in load_manifest(folder).shards}


def test_a_large_shard_goes_up_in_parallel_parts(s3_root, monkeypatch):
    monkeypatch.setattr(fs_s3, "PART_BYTES", 5 << 20)  # S3's smallest part
    calls = []
    real = fs_s3.upload
    monkeypatch.setattr(fs_s3, "upload", lambda fs, path, data: (calls.append(len(data)),
                                                                  real(fs, path, data)))
    ds = sc.Dataset.range(3200).map(example).snapshot(s3_root, progress=False,
                                                      shard_size=12 << 20)
    assert [int(e["i"]) for e in ds] == list(range(3200))
    assert max(calls) >= 2 * fs_s3.PART_BYTES  # at least one multipart upload
    assert fs_s3.incomplete_uploads is not None
    assert Storage(s3_root).incomplete_uploads() == []
    manifest = load_manifest(folder_of(s3_root))
    assert sum(s.rows for s in manifest.shards) == 3200
    assert [int(e["i"]) for e in ds] == list(range(3200))  # read back, checksums verified


KILLABLE = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    import snapcache as sc
    root, n = sys.argv[1], int(sys.argv[2])

    def example(i):  # (the log's and the pause's names are read at call time: not in the
        with open(os.environ["CALLS_LOG"], "a") as f:  # fingerprint, the same pipeline each run)
            f.write(f"{i}\\n")
        if i == int(os.environ.get("PAUSE_AT", "-1")):  # waits there to be killed
            while True:
                time.sleep(1)
        return {"x": np.random.default_rng(i).integers(0, 256, 4096, dtype=np.uint8), "i": i}

    ds = sc.Dataset.range(n).map(example).snapshot(root, progress=False,
                                                   shard_size=160 << 10, lease_ttl=2)
    assert [int(e["i"]) for e in ds] == list(range(n))
""")


def progress_shards(s3_server, root):
    """Shards listed by any progress record under ``root`` (read with the fixture's own
    client)."""
    fs = s3_server.filesystem()
    found = set()
    for path in fs.find(root[len("s3://"):]):
        if os.path.basename(path).startswith("progress-"):
            try:
                record = json.loads(fs.cat_file(path))
            except FileNotFoundError:
                continue
            found |= {s["path"] for s in record["shards"]}
    return found


def test_sigkill_mid_build_resumes_with_the_stored_shards(s3_server, s3_root, tmp_path):
    script = tmp_path / "killable.py"
    script.write_text(KILLABLE)
    n = 2000  # ~50 shards; the child pauses at example 1000 until killed
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    first_calls = tmp_path / "first"
    proc = subprocess.Popen([sys.executable, str(script), s3_root, str(n)],
                            env={**env, "CALLS_LOG": str(first_calls), "PAUSE_AT": "1000"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if len(progress_shards(s3_server, s3_root)) >= 2:  # the event: 2 shards stored
                break
            time.sleep(0.05)
        # paused at example 1000 (of 2000): never finished, however fast the machine
        assert proc.poll() is None, proc.communicate()[1]
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    stored = progress_shards(s3_server, s3_root)
    assert len(stored) >= 2
    second_calls = tmp_path / "second"
    done = subprocess.run([sys.executable, str(script), s3_root, str(n)],
                          env={**env, "CALLS_LOG": str(second_calls)}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    manifest = load_manifest(folder_of(s3_root))
    assert manifest is not None and stored <= {s.path for s in manifest.shards}
    recomputed = [int(line) for line in second_calls.read_text().split()]
    reused = sum(s.rows for s in manifest.shards if s.path in stored)
    assert recomputed == list(range(reused, n))  # the stored shards' examples: not again


class _BlockingStorage:
    """A storage whose uploads wait for the test: counts how many run at once."""

    def __init__(self):
        self.release = threading.Event()
        self.running = self.most = 0
        self.lock = threading.Lock()
        self.stored: list[str] = []

    def upload(self, rel, data):
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        self.release.wait(60)
        with self.lock:
            self.running -= 1
            self.stored.append(rel)


def _info(i):
    return ShardInfo(path=f"s{i}.arrow", rows=1, bytes=1, checksum="xxh3_64:0")


def test_the_upload_pool_holds_at_most_in_flight_shards_and_reports_in_order():
    storage = _BlockingStorage()
    uploads = Uploads(storage, in_flight=2)
    assert uploads.submit(_info(0), Spool()) == []
    assert uploads.submit(_info(1), Spool()) == []
    third = threading.Thread(target=lambda: reported.extend(uploads.submit(_info(2), Spool())))
    reported: list[ShardInfo] = []
    third.start()
    third.join(0.5)
    assert third.is_alive(), "a third shard was taken while two were uploading"
    storage.release.set()
    third.join(60)
    reported += uploads.finish()
    assert [s.path for s in reported] == ["s0.arrow", "s1.arrow", "s2.arrow"]
    assert storage.most == 2


def test_a_spool_moves_to_a_local_file_when_large_and_removes_it():
    spool = Spool(limit=10)
    spool.write(b"12345")
    assert spool.content() == b"12345"
    spool.write(b"6789012345")
    path = spool.content()
    assert isinstance(path, str) and open(path, "rb").read() == b"123456789012345"
    assert spool.read() == b"123456789012345"
    spool.discard()
    assert not os.path.exists(path)


def test_a_shard_larger_than_the_memory_spool_goes_up_from_a_local_file(s3_root, monkeypatch,
                                                                         tmp_path):
    import snapcache.store.upload as upload

    monkeypatch.setattr(upload, "SPOOL_BYTES", 1 << 20)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)  # TMPDIR read again
    sent = []
    real = Storage.upload
    monkeypatch.setattr(Storage, "upload", lambda self, rel, data: (sent.append(data),
                                                                    real(self, rel, data)))
    ds = sc.Dataset.range(1600).map(example).snapshot(s3_root, progress=False,
                                                      shard_size=3 << 20)
    assert [int(e["i"]) for e in ds] == list(range(1600))
    files = [d for d in sent if isinstance(d, str)]
    assert files and all(d.startswith(str(tmp_path)) for d in files)
    assert not [f for f in os.listdir(tmp_path) if f.startswith("snapcache-shard-")]
    assert [int(e["i"]) for e in ds] == list(range(1600))  # read back, checksums verified
