"""One store conformance suite, run against local disk, ``memory://`` and S3 over HTTP (moto).

Everything goes through the public API (``snapcache.Dataset ... .snapshot(root)``); files are
inspected and tampered with through :class:`snapcache.store.fs.Storage`, so the same test body
works on every filesystem.
"""

from __future__ import annotations

import json
import os
import uuid

import fsspec
import numpy as np
import pytest

import snapcache as sc
from snapcache.store import layout
from snapcache.store.fs import Storage

from equality import assert_same_example


@pytest.fixture(params=["local", "memory", "s3"])
def any_root(request, tmp_path):
    """A fresh, empty snapshot root on each kind of filesystem."""
    if request.param == "local":
        yield str(tmp_path / "snaps")
    elif request.param == "memory":
        path = f"/snapcache-conformance-{uuid.uuid4().hex}"
        yield f"memory://{path}"
        fs = fsspec.filesystem("memory")
        if fs.exists(path):
            fs.rm(path, recursive=True)
    else:
        yield request.getfixturevalue("s3_root")


# -- helpers -----------------------------------------------------------------------------------
def make_example(i: int) -> dict:
    return {
        "image": np.full((3, 4), i % 251, dtype=np.uint8),
        "tokens": np.arange(i % 5, dtype=np.int32),   # ragged
        "label": i,
        "name": f"ex-{i}",
        "blob": bytes([i % 256]) * (i % 3),
    }


def snapshot_folders(root: str) -> list[str]:
    return [name for name in Storage(root).listdir() if layout.is_fingerprint(name)]


def committed(root: str) -> list[str]:
    storage = Storage(root)
    return [fp for fp in snapshot_folders(root) if storage.child(fp).exists(layout.MANIFEST)]


def read_manifest(root: str) -> tuple[Storage, dict]:
    """The folder and parsed manifest of the one committed snapshot in ``root``."""
    (fp,) = committed(root)
    folder = Storage(root).child(fp)
    return folder, json.loads(folder.read_bytes(layout.MANIFEST))


def counted(counter):
    def expensive(i: int) -> dict:
        counter.hit()
        return make_example(i)
    return expensive


# -- the suite ---------------------------------------------------------------------------------
def test_first_epoch_writes_and_later_epochs_read(any_root, counter):
    ds = sc.Dataset.range(120).map(counted(counter)).snapshot(any_root)
    first = list(ds)
    assert counter.count == 120 and len(committed(any_root)) == 1
    second = list(ds)
    assert counter.count == 120, "epoch 2 must read the snapshot, not call the map"
    for a, b in zip(first, second, strict=True):
        assert_same_example(a, b)
    for i, example in enumerate(second):
        assert_same_example(example, make_example(i))
    # an identical pipeline built afresh hits the same snapshot
    assert len(list(sc.Dataset.range(120).map(counted(counter)).snapshot(any_root))) == 120
    assert counter.count == 120


@pytest.mark.parametrize("compression", ["zstd", "lz4", "none"])
def test_many_shards_round_trip_with_each_compression(any_root, compression):
    ds = sc.Dataset.range(150).map(make_example).snapshot(
        any_root, compression=compression, shard_size=2 << 10)
    first = list(ds)
    folder, manifest = read_manifest(any_root)
    assert manifest["compression"] == compression
    assert len(manifest["shards"]) > 2 and manifest["num_examples"] == 150
    for shard in manifest["shards"]:
        assert folder.size(shard["path"]) == shard["bytes"]
    for a, b, i in zip(first, list(ds), range(150), strict=True):
        assert_same_example(a, b)
        assert_same_example(b, make_example(i))


def test_an_abandoned_epoch_leaves_no_manifest(any_root, counter):
    ds = sc.Dataset.range(300).map(counted(counter)).snapshot(any_root, shard_size=2 << 10)
    it = iter(ds)
    for _ in range(100):
        next(it)
    it.close()
    assert committed(any_root) == []
    list(ds.take(5))
    assert committed(any_root) == []
    assert len(list(ds)) == 300
    assert len(committed(any_root)) == 1


def flip_a_byte(folder: Storage, name: str) -> None:
    data = bytearray(folder.read_bytes(name))
    data[len(data) // 2] ^= 0x01
    folder.write_atomic(name, bytes(data))


def test_a_corrupt_shard_raises_naming_it_before_any_of_its_examples(any_root):
    ds = sc.Dataset.range(150).map(make_example).snapshot(any_root, shard_size=2 << 10)
    list(ds)
    folder, manifest = read_manifest(any_root)
    first, second = manifest["shards"][:2]
    flip_a_byte(folder, second["path"])
    seen = []
    with pytest.raises(sc.CorruptSnapshotError, match=second["path"]):
        for example in ds:
            seen.append(example)
    assert len(seen) == first["rows"], "only the examples of the sound shard before it"


ESCAPING_PATHS = ["../x.arrow", "../../x.arrow", "/abs.arrow", "s3://other/x.arrow"]
MALFORMED_MANIFESTS = [b"{not json", b"", b"[]", b'{"format": "snapcache-snapshot"']


def test_a_shard_path_escaping_the_folder_is_refused(any_root, counter):
    ds = sc.Dataset.range(40).map(counted(counter)).snapshot(any_root)
    list(ds)
    folder, manifest = read_manifest(any_root)
    shard = manifest["shards"][0]["path"]
    # a valid shard where "../x.arrow" points, so that following the path would "work"
    Storage(any_root).write_atomic("x.arrow", folder.read_bytes(shard))
    for bad_path in ESCAPING_PATHS:
        manifest["shards"][0]["path"] = bad_path
        folder.write_atomic(layout.MANIFEST, json.dumps(manifest).encode())
        with pytest.raises(sc.CorruptSnapshotError, match="path") as info:
            next(iter(ds))
        assert repr(bad_path) in str(info.value), "the message names the offending path"
    assert counter.count == 40, "a corrupt snapshot is reported, not silently recomputed"


def test_a_malformed_manifest_is_refused(any_root, counter):
    ds = sc.Dataset.range(40).map(counted(counter)).snapshot(any_root)
    list(ds)
    folder, _ = read_manifest(any_root)
    for text in MALFORMED_MANIFESTS:
        folder.write_atomic(layout.MANIFEST, text)
        with pytest.raises(sc.CorruptSnapshotError, match="manifest"):
            next(iter(ds))
    assert counter.count == 40


def test_explain_reports_the_hit_after_writing(any_root):
    ds = sc.Dataset.range(30).map(make_example).snapshot(any_root)
    before = ds.explain()
    assert not before.hit and before.state == "absent"
    list(ds)
    after = ds.explain()
    assert after.hit and after.num_examples == 30
    assert str(after).startswith("hit:")
    miss = sc.Dataset.range(31).map(make_example).snapshot(any_root).explain()
    assert not miss.hit and miss.closest == after.fingerprint


def read_url(url: str) -> dict:
    with fsspec.open(url, "rb") as f:
        return {"url": url, "data": f.read()}


def _rewrite_in_place(any_root: str, name: str, data: bytes) -> None:
    """Rewrite an object as another writer would: through a filesystem instance of its own,
    so no listing cached in this process learns of it."""
    storage = Storage(any_root)
    fs = type(storage.fs)(skip_instance_cache=True, **storage.fs.storage_options)
    fs.pipe_file(storage.full(name), data)
    if storage.local:  # local mtimes are coarse: make the rewrite visibly later
        st = os.stat(storage.full(name))
        os.utime(storage.full(name), ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


def write_sources(any_root: str) -> str:
    storage = Storage(any_root)
    for i in range(3):
        storage.write_atomic(f"data/{i}.bin", bytes([i]) * 100)
    storage.write_atomic("data/skip.txt", b"not matched")
    return f"{any_root}/data/*.bin"


def test_from_files_reads_source_objects(any_root, counter):
    pattern = write_sources(any_root)

    def read(url: str) -> dict:
        counter.hit()
        return read_url(url)

    ds = sc.Dataset.from_files(pattern).map(read).snapshot(f"{any_root}/snaps")
    for _ in range(2):
        examples = list(ds)
        assert [e["data"] for e in examples] == [bytes([i]) * 100 for i in range(3)]
        assert [e["url"].rsplit("/", 1)[1] for e in examples] == ["0.bin", "1.bin", "2.bin"]
    assert counter.count == 3


# Known gaps in snapcache.store.fs, pinned so that fixing them turns these into XPASS failures
# (remove the entry then).


def test_from_files_fingerprint_follows_rewrites(any_root):
    pattern = write_sources(any_root)
    before = sc.Dataset.from_files(pattern).fingerprint()
    assert sc.Dataset.from_files(pattern).fingerprint() == before, \
        "nothing changed: the same fingerprint"
    _rewrite_in_place(any_root, "data/1.bin", b"\xff" * 100)  # same size, new content
    assert sc.Dataset.from_files(pattern).fingerprint() != before, \
        "a rewritten object must change the fingerprint"
