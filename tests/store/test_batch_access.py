"""Random access reads one record batch, not its shard: the manifest records where each record
batch of a shard lies and its checksum, the writer records them for every codec (and for a
shard it rewrote uncompressed), a reader of one row fetches and verifies that record batch
alone, and a damaged or malformed batch index is refused. Manifests without the index (older
snapshots) still read, whole shard by whole shard."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pytest
import xxhash

import snapcache as sc
from snapcache.store.fs import Storage
from snapcache.store.row_access import RowAccess
from snapcache.store.reader import SnapshotReader
from tests.equality import assert_same_example


def example(i):
    """About 1 KB, noise: compressed or not, 600 of them fill several 64 KiB shards."""
    x = np.random.default_rng(i).integers(0, 1 << 30, (16, 16), dtype=np.int32)
    return {"x": x, "i": i, "s": f"s{i}" * (i % 4)}


def build(root, make=example, n=600, **kw):
    kw.setdefault("shard_size", 64 << 10)
    ds = sc.Dataset.range(n).map(make).snapshot(root, progress=False, **kw)
    assert sum(1 for _ in ds) == n
    snap = sc.open_snapshot(root)
    return snap, Storage(snap.url)


def manifest_doc(storage):
    return json.loads(storage.read_bytes("manifest.json"))


def write_manifest(storage, doc):
    storage.write_atomic("manifest.json", json.dumps(doc).encode())


def without_page_checksums(storage):
    """The manifest as a writer before page checksums wrote it: a first row reads its whole
    record batch (as on S3, and for compressed shards; rows read page by page:
    tests/store/test_row_read.py)."""
    doc = manifest_doc(storage)
    for shard in doc["shards"]:
        shard.pop("page_size", None), shard.pop("pages_checksum", None)
    write_manifest(storage, doc)
    return sc.open_snapshot(storage.url)


def check_index(storage, shard):
    """The recorded offsets and checksums are the record batches of the file as Arrow reads
    them."""
    data = storage.read_bytes(shard.path)
    file = pa.ipc.open_file(pa.py_buffer(data))
    assert len(shard.batch_checksums) == file.num_record_batches == len(shard.batch_rows)
    for j, (a, b) in enumerate(zip(shard.batch_offsets, shard.batch_offsets[1:])):
        assert xxhash.xxh3_64(data[a:b]).hexdigest() == shard.batch_checksums[j]
        message = pa.ipc.read_message(pa.py_buffer(data[a:b]))
        assert pa.ipc.read_record_batch(message, file.schema).equals(file.get_batch(j))


@pytest.mark.parametrize("compression", ["none", "zstd", "lz4"])
def test_the_writer_records_each_record_batchs_place_and_checksum(tmp_path, compression):
    snap, storage = build(str(tmp_path), compression=compression)
    assert len(snap.shards) > 2
    for shard in snap.shards:
        assert shard.batch_index and len(shard.batch_rows) > 1
        check_index(storage, shard)


def test_a_shard_rewritten_uncompressed_has_the_index_of_its_new_bytes(tmp_path):
    """The first record batches compress (zeros), the later ones do not and are small enough
    that compression's framing outweighs what it saves: the writer stores the shard raw
    (never more bytes than uncompressed) and indexes the raw file."""
    from snapcache.store.options import WriteOptions
    from snapcache.store.writer import SnapshotWriter

    rng = np.random.default_rng(0)
    examples = [0] * 256 + [int(x) for x in rng.integers(0, 2**62, 20_000)]
    fingerprint = "0123456789abcdef0123456789abcdef"
    storage = Storage(str(tmp_path)).child(fingerprint)
    with SnapshotWriter(storage, fingerprint=fingerprint, options=WriteOptions(
            compression="zstd", shard_size=64 << 20, record_batch_size=1 << 10)) as writer:
        for e in examples:
            writer.write(e)
    snap = sc.open_snapshot(storage.url)
    [shard] = snap.shards
    assert shard.compression == "none" and len(shard.batch_rows) > 2
    check_index(storage, shard)
    for i in (0, 255, 256, len(examples) - 1):
        assert snap[i] == examples[i]


def test_a_row_reads_and_verifies_its_record_batch_alone(tmp_path, monkeypatch):
    snap, storage = build(str(tmp_path))
    snap = without_page_checksums(storage)
    shard = snap.shards[1]
    first = shard.rows and snap.shards[0].rows
    ranges, wholes = [], []
    real_range = Storage.read_range
    monkeypatch.setattr(Storage, "read_range", lambda self, rel, a, b: (
        ranges.append((rel, a, b)), real_range(self, rel, a, b))[1])
    monkeypatch.setattr(Storage, "map_file", lambda *a, **k: wholes.append(a) or 1 / 0)
    monkeypatch.setattr(Storage, "read_bytes", lambda *a, **k: wholes.append(a) or 1 / 0)
    j = 1
    row = first + sum(shard.batch_rows[:j])
    assert shard.batch_rows[j] > 1
    assert_same_example(example(row), snap[row])
    assert ranges == [(shard.path, shard.batch_offsets[j], shard.batch_offsets[j + 1])]
    assert wholes == []
    # a later row of the same record batch is decoded already: no read at all
    assert_same_example(example(row + 1), snap[row + 1])
    assert len(ranges) == 1
    assert [e["i"] for e in snap.take([0, row, len(snap) - 1])] == [0, row, len(snap) - 1]


def test_a_damaged_record_batch_is_refused_and_the_others_still_read(tmp_path):
    snap, storage = build(str(tmp_path))
    shard = snap.shards[0]
    path = os.path.join(storage.root, shard.path)
    with open(path, "r+b") as f:  # flip a byte in the middle of record batch 1
        at = (shard.batch_offsets[1] + shard.batch_offsets[2]) // 2
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x40]))
    fresh = without_page_checksums(storage)
    in_batch_1 = shard.batch_rows[0] + 1
    with pytest.raises(sc.CorruptSnapshotError, match=r"record batch 1 is corrupt: checksum") \
            as info:
        fresh[in_batch_1]
    assert shard.path in str(info.value) and "snapcache purge --root" in str(info.value)
    assert_same_example(example(0), fresh[0])  # batch 0 is intact and verified alone
    with pytest.raises(sc.CorruptSnapshotError):  # a sequential read checks the whole shard
        list(fresh.reader())


def test_a_record_batch_slot_holding_another_message_is_refused(tmp_path):
    """A hostile manifest pointing a record batch at the file's schema message, its checksum
    made to match, is refused, not decoded."""
    snap, storage = build(str(tmp_path))
    doc = manifest_doc(storage)
    shard = doc["shards"][0]
    data = storage.read_bytes(shard["path"])
    shard["batch_offsets"][0] = 8
    shard["batch_checksums"][0] = xxhash.xxh3_64(
        data[8:shard["batch_offsets"][1]]).hexdigest()
    del shard["page_size"], shard["pages_checksum"]  # (read page by page: test_row_read.py)
    write_manifest(storage, doc)
    with pytest.raises(sc.CorruptSnapshotError, match="record batch 0 is damaged.*schema"):
        sc.open_snapshot(str(tmp_path))[0]


@pytest.mark.parametrize("field,value,problem", [
    ("batch_offsets", "12", "must both be lists"),
    ("batch_offsets", [8, 9], "record batches"),
    ("batch_checksums", ["00" * 8], "record batches"),
    ("batch_offsets", "decreasing", "must increase"),
    ("batch_offsets", "past the end", "must increase"),
    ("batch_checksums", "not hex", "16 hex digits"),
])
def test_a_malformed_batch_index_is_a_corrupt_manifest(tmp_path, field, value, problem):
    snap, storage = build(str(tmp_path))
    doc = manifest_doc(storage)
    shard = doc["shards"][0]
    if value == "decreasing":
        shard["batch_offsets"][1], shard["batch_offsets"][2] = \
            shard["batch_offsets"][2], shard["batch_offsets"][1]
    elif value == "past the end":
        shard["batch_offsets"][-1] = shard["bytes"] + 1
    elif value == "not hex":
        shard["batch_checksums"][0] = "xyz" + shard["batch_checksums"][0][3:]
    else:
        shard[field] = value
    write_manifest(storage, doc)
    fresh = sc.open_snapshot(str(tmp_path))
    assert fresh.state == "corrupt" and problem in fresh.problem, fresh.problem


def test_a_manifest_without_the_index_reads_whole_shards_as_before(tmp_path, monkeypatch):
    """Snapshots written before the index was recorded (the fields absent) read the same,
    verifying whole shards; this writer's manifests stay format version 1."""
    snap, storage = build(str(tmp_path))
    doc = manifest_doc(storage)
    assert doc["format_version"] == 1
    for shard in doc["shards"]:
        del shard["batch_offsets"], shard["batch_checksums"]
    write_manifest(storage, doc)
    ranges = []
    monkeypatch.setattr(Storage, "read_range", lambda *a: ranges.append(a) or 1 / 0)
    old = sc.open_snapshot(str(tmp_path))
    assert not any(s.batch_index for s in old.shards)
    order = np.random.default_rng(0).permutation(len(old))[:50]
    for i in order:
        assert_same_example(example(int(i)), old[int(i)])
    assert ranges == []
    assert "batch_offsets" not in json.dumps(old.manifest.to_json())


def test_rows_read_alone_equal_rows_read_in_order(tmp_path):
    snap, storage = build(str(tmp_path), compression="zstd")
    everything = list(snap.reader())
    rows = RowAccess(SnapshotReader.open(storage), budget=1)  # nothing kept: every row reads
    for i in np.random.default_rng(1).permutation(len(everything))[:120]:
        assert_same_example(everything[int(i)], rows[int(i)])
