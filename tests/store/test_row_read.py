"""A first row read from a raw local shard reads and verifies only its pages: the writer records
each page's checksum (raw shards only), the row decoded straight from the pages equals the row
read in order for every field kind, a damaged page or inconsistent metadata is refused naming
the shard, and a record batch whose rows are read often is read and verified whole."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import numpy as np
import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import snapcache as sc
from snapcache.store import row_access, row_read
from snapcache.store.codec import Encoder, Schema, infer_schema
from snapcache.store.fs import Storage
from snapcache.store.indexed_file import HashingSink, IndexedFileWriter, page_size_for
from snapcache.store.manifest import ShardInfo
from snapcache.store.row_access import RowAccess
from snapcache.store.reader import SnapshotReader
from tests.equality import assert_same_example
from tests.store.test_codec import example_lists


def example(i):
    """About 3 KB of noise, a shape, a label and a string: several record batches a shard."""
    image = np.random.default_rng(i).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    return {"image": image, "label": np.int64(i), "name": f"n{i}" * (i % 3)}


def build(root, n=400, **kw):
    kw = {"shard_size": 256 << 10, "record_batch_size": 32 << 10, **kw}
    ds = sc.Dataset.range(n).map(example).snapshot(root, progress=False, **kw)
    assert sum(1 for _ in ds) == n
    snap = sc.open_snapshot(root)
    return snap, Storage(snap.url)


class Reads:
    """Every pread of a row read alone, and every other read of a shard."""

    def __init__(self, monkeypatch):
        self.preads: list[tuple[int, int]] = []
        self.others: list[tuple] = []
        real = os.pread
        monkeypatch.setattr(row_read, "_pread", lambda fd, n, at: (
            self.preads.append((at, n)), real(fd, n, at))[1])
        real_range = Storage.read_range
        monkeypatch.setattr(Storage, "read_range", lambda s, rel, a, b: (
            self.others.append((rel, a, b)), real_range(s, rel, a, b))[1])
        monkeypatch.setattr(Storage, "map_file", lambda *a, **k: 1 / 0)


def first_rows(snap):
    """(row, shard, record batch, row in it) of a few rows: firsts, middles and lasts."""
    out, row = [], 0
    for index, shard in enumerate(snap.shards):
        for j, rows in enumerate(shard.batch_rows):
            if (index + j) % 3 == 0:
                out.append((row + rows // 2, index, j, rows // 2))
            row += rows
    return out + [(len(snap) - 1, len(snap.shards) - 1, len(snap.shards[-1].batch_rows) - 1,
                   snap.shards[-1].batch_rows[-1] - 1)]


def test_the_writer_checksums_the_pages_of_raw_shards_only(tmp_path):
    snap, storage = build(str(tmp_path / "raw"))
    assert len(snap.shards) > 2
    for shard in snap.shards:
        data = storage.read_bytes(shard.path)
        assert shard.compression == "none" and shard.page_size == page_size_for(32 << 10)
        size = shard.page_size
        table = storage.read_bytes(shard.path + ".pages")  # beside the shard, not inline
        assert table == b"".join(
            xxhash.xxh3_64(data[a:a + size]).digest() for a in range(0, len(data), size))
        assert shard.pages_checksum == xxhash.xxh3_64(table).hexdigest()
    zeros = sc.Dataset.range(300).map(lambda i: np.zeros(1000, np.uint8)).snapshot(
        str(tmp_path / "zstd"), progress=False, compression="zstd", shard_size=256 << 10)
    assert sum(1 for _ in zeros) == 300
    packed = sc.open_snapshot(str(tmp_path / "zstd"))
    assert all(s.compression == "zstd" and s.pages_checksum is None for s in packed.shards)
    assert "pages_checksum" not in json.dumps(packed.manifest.to_json())
    assert not [n for n in os.listdir(packed.url) if n.endswith(".pages")]
    assert int(packed[7].sum()) == 0  # read its record batch whole, as before


def test_a_first_row_reads_only_its_pages(tmp_path, monkeypatch):
    snap, storage = build(str(tmp_path))
    reads = Reads(monkeypatch)
    for row, index, j, k in first_rows(snap):
        fresh = sc.open_snapshot(str(tmp_path))
        reads.preads.clear()
        assert_same_example(example(row), fresh[row])
        shard = snap.shards[index]
        size = shard.page_size
        batch = shard.batch_offsets[j + 1] - shard.batch_offsets[j]
        assert reads.preads and all(at % size == 0 for at, _ in reads.preads)
        assert sum(n for _, n in reads.preads) < batch, (reads.preads, batch)
    assert reads.others == []


def test_rows_of_a_record_batch_are_read_alone_until_it_is_worth_reading_whole_then_indexed(
        tmp_path, monkeypatch):
    monkeypatch.setattr(row_access, "WHOLE_AFTER", 3)
    snap, storage = build(str(tmp_path))
    reads = Reads(monkeypatch)
    shard = snap.shards[1]
    first = snap.shards[0].rows + shard.batch_rows[0]  # record batch 1 of shard 1
    assert shard.batch_rows[1] >= 5
    assert_same_example(example(first + 2), snap[first + 2])  # its pages (pread)
    assert reads.others == [] and reads.preads
    count = len(reads.preads)
    for row in (first, first + 3):  # the shard mapped and held: no system call
        assert_same_example(example(row), snap[row])
    assert reads.others == [] and len(reads.preads) == count
    assert_same_example(example(first + 4), snap[first + 4])  # the fourth: read whole
    assert reads.others == [(shard.path, shard.batch_offsets[1], shard.batch_offsets[2])]
    assert_same_example(example(first + 1), snap[first + 1])  # an index
    assert len(reads.others) == 1 and len(reads.preads) == count


def test_take_across_shards_and_every_row_alone_equal_rows_in_order(tmp_path):
    snap, storage = build(str(tmp_path))
    everything = list(snap.reader())
    order = [int(i) for i in np.random.default_rng(2).permutation(len(snap))[:60]]
    fresh = sc.open_snapshot(str(tmp_path))
    for e, got in zip([everything[i] for i in order], fresh.take(order), strict=True):
        assert_same_example(e, got)
    assert len({fresh._rows._locate(i)[0][0] for i in order}) == len(snap.shards)
    reader = SnapshotReader.open(storage)
    for i in order[:30]:  # a fresh handle each: every row is the first of its record batch
        assert_same_example(everything[i], RowAccess(reader)[i])
    assert_same_example(everything[-1], RowAccess(reader)[-1])


def test_take_reads_a_record_batch_asked_for_one_row_page_by_page(tmp_path, monkeypatch):
    monkeypatch.setattr(row_access, "WHOLE_AFTER", 1)  # a second row reads a batch whole
    snap, storage = build(str(tmp_path))
    batches = {(index, j): row for row, index, j, _ in reversed(first_rows(snap))}
    firsts = sorted(batches.values())  # one row each of distinct record batches
    reads = Reads(monkeypatch)
    fresh = sc.open_snapshot(str(tmp_path))
    got = fresh.take(firsts + [firsts[0] + 1, firsts[0]])  # batch 0: three rows, read whole
    assert [int(e["label"]) for e in got] == firsts + [firsts[0] + 1, firsts[0]]
    shard = snap.shards[0]
    assert reads.others == [(shard.path, shard.batch_offsets[0], shard.batch_offsets[1])]
    assert len(reads.preads) >= len(firsts) - 1
    for row, got_row in zip(firsts, fresh.take(firsts)):  # now: second rows, read whole
        assert_same_example(example(row), got_row)
    assert len(reads.others) == len(firsts)


def flip(storage, shard, at):
    path = os.path.join(storage.root, shard.path)
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x20]))


def test_a_flipped_byte_in_the_rows_pages_is_refused_naming_the_shard(tmp_path):
    snap, storage = build(str(tmp_path))
    shard, j = snap.shards[0], 1
    row = shard.batch_rows[0] + 3
    start = shard.batch_offsets[j]
    rows = RowAccess(SnapshotReader.open(storage))
    image = rows[row]["image"]  # where row's image lies in the file: its page is read alone
    flip(storage, shard, start + 8)  # the record batch's metadata
    with pytest.raises(sc.CorruptSnapshotError, match=r"record batch 1: page \d+ .*checksum") \
            as info:
        sc.open_snapshot(str(tmp_path))[row]
    message = str(info.value)
    assert shard.path in message and "snapcache purge --root" in message
    flip(storage, shard, start + 8)  # undone
    assert_same_example(example(row), sc.open_snapshot(str(tmp_path))[row])
    data = storage.read_bytes(shard.path)
    at = data.find(image.tobytes(), start)
    assert start < at < shard.batch_offsets[j + 1]
    flip(storage, shard, at + 100)  # the row's own image
    with pytest.raises(sc.CorruptSnapshotError, match=r"record batch 1: page \d+ .*checksum"):
        sc.open_snapshot(str(tmp_path))[row]
    assert_same_example(example(0), sc.open_snapshot(str(tmp_path))[0])  # batch 0 is intact


def test_damage_in_another_rows_page_is_found_by_the_second_row(tmp_path, monkeypatch):
    """A first row verifies only what it reads; the batch read whole (here at its second row)
    is verified whole."""
    monkeypatch.setattr(row_access, "WHOLE_AFTER", 1)
    snap, storage = build(str(tmp_path))
    shard = snap.shards[0]
    middle = shard.batch_rows[0] // 2
    data = storage.read_bytes(shard.path)
    at = data.find(example(middle)["image"].tobytes(), shard.batch_offsets[0]) + 100
    reads = Reads(monkeypatch)
    assert_same_example(example(0), sc.open_snapshot(str(tmp_path))[0])
    size = shard.page_size
    read = {page for a, n in reads.preads for page in range(a // size, (a + n) // size)}
    assert at // size not in read  # row 0 never reads the page about to be damaged
    flip(storage, shard, at)
    fresh = sc.open_snapshot(str(tmp_path))
    assert_same_example(example(0), fresh[0])
    with pytest.raises(sc.CorruptSnapshotError, match=r"record batch 0 is corrupt: checksum"):
        fresh[1]
    with pytest.raises(sc.CorruptSnapshotError, match=r"record batch 0: page"):
        sc.open_snapshot(str(tmp_path))[middle]


def manifest_doc(storage):
    return json.loads(storage.read_bytes("manifest.json"))


def write_manifest(storage, doc):
    storage.write_atomic("manifest.json", json.dumps(doc).encode())


def test_a_record_batch_slot_holding_the_schema_message_is_refused(tmp_path):
    snap, storage = build(str(tmp_path))
    doc = manifest_doc(storage)
    doc["shards"][0]["batch_offsets"][0] = 8  # the schema message (pages still match)
    write_manifest(storage, doc)
    with pytest.raises(sc.CorruptSnapshotError, match="record batch 0: an IPC message of "
                                                      "another type"):
        sc.open_snapshot(str(tmp_path))[0]


@pytest.mark.parametrize("change,problem", [
    ({"page_size": "12"}, "must both be given"),
    ({"page_size": None}, "must both be given"),
    ({"page_size": 0}, "must both be given"),
    ({"page_size": 1}, "page_size 1 is not a power of two of at least 4096 bytes"),
    ({"page_size": 2048}, "page_size 2048 is not a power of two"),
    ({"page_size": 6144}, "page_size 6144 is not a power of two"),
    ({"pages_checksum": "00"}, "pages_checksum must be"),
    ({"pages_checksum": "x"}, "pages_checksum must be"),
])
def test_malformed_page_checksums_are_a_corrupt_manifest(tmp_path, change, problem):
    snap, storage = build(str(tmp_path))
    doc = manifest_doc(storage)
    shard = doc["shards"][0]
    for key, value in change.items():
        if value is None:
            del shard[key]
        elif value == "x":
            shard[key] = "x" + shard[key][1:]
        else:
            shard[key] = value
    write_manifest(storage, doc)
    fresh = sc.open_snapshot(str(tmp_path))
    assert fresh.state == "corrupt" and problem in fresh.problem, fresh.problem


def test_a_manifest_without_page_checksums_reads_record_batches_as_before(tmp_path,
                                                                           monkeypatch):
    snap, storage = build(str(tmp_path))
    doc = manifest_doc(storage)
    for shard in doc["shards"]:
        del shard["page_size"], shard["pages_checksum"]
    write_manifest(storage, doc)
    reads = Reads(monkeypatch)
    old = sc.open_snapshot(str(tmp_path))
    assert_same_example(example(5), old[5])
    assert reads.preads == [] and len(reads.others) == 1


@pytest.mark.parametrize("eager", [True, False], ids=["tables-at-open", "tables-at-first-row"])
@pytest.mark.parametrize("claimed", [2**45, "one more"])
def test_a_shard_of_another_size_than_the_manifest_says_is_corrupt_before_its_pages_are_read(
        tmp_path, monkeypatch, claimed, eager):
    """The page file's read is sized from the shard's real size, never from the manifest's
    alone: a manifest claiming 32 TiB would have had a page table of 64 GiB read."""
    from snapcache.store import random_access

    if not eager:
        monkeypatch.setattr(random_access, "EAGER_PAGE_TABLES", 0)
    snap, storage = build(str(tmp_path))
    doc = manifest_doc(storage)
    real = doc["shards"][0]["bytes"]
    doc["shards"][0]["bytes"] = claimed = real + 1 if claimed == "one more" else claimed
    doc["total_bytes"] = sum(s["bytes"] for s in doc["shards"])
    write_manifest(storage, doc)
    reads = Reads(monkeypatch)
    fresh = sc.open_snapshot(str(tmp_path))   # the other shards' tables are read
    with pytest.raises(sc.CorruptSnapshotError,
                       match=f"has {real} bytes, the manifest says {claimed}.*snapcache purge"):
        fresh[0]
    assert all(n <= 8 * snap.shards[1].pages + 1 for _, n in reads.preads), reads.preads
    row = snap.shards[0].rows + 1  # the other shards still read
    assert_same_example(example(row), fresh[row])


def test_a_missing_shard_is_named(tmp_path):
    snap, storage = build(str(tmp_path))
    os.unlink(os.path.join(storage.root, snap.shards[0].path))
    with pytest.raises(sc.CorruptSnapshotError, match="the shard is missing"):
        sc.open_snapshot(str(tmp_path))[0]


# -- every field kind, pages of any size --------------------------------------------------------
def _shard_file(path: str, examples: list[Any], split: int, page_size: int
                ) -> tuple[Schema, ShardInfo, bytes]:
    schema = infer_schema(examples[0])
    encoder = Encoder(schema)
    sink = HashingSink(open(path, "wb"), page_size)
    writer = IndexedFileWriter(sink, schema.arrow_schema(), None)
    rows = []
    for part in (examples[:split], examples[split:]):
        if part:
            for e in part:
                encoder.add(e)
            writer.write_batch(encoder.flush())
            rows.append(len(part))
    writer.close()
    sink.close()
    table = sink.pages()
    with open(path + ".pages", "wb") as f:
        f.write(table)
    stored = Schema.from_json(json.loads(json.dumps(encoder.observed_schema().to_json())))
    return stored, ShardInfo(path=os.path.basename(path), rows=len(examples), bytes=sink.size,
                             checksum="xxh3_64:" + sink.hash.hexdigest(), batch_rows=tuple(rows),
                             compression="none", batch_offsets=tuple(writer.offsets),
                             batch_checksums=tuple(writer.checksums), page_size=page_size,
                             pages_checksum=xxhash.xxh3_64(table).hexdigest()), table


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(examples=example_lists(), data=st.data())
def test_rows_decoded_from_pages_equal_rows_decoded_by_arrow(examples, data):
    split = data.draw(st.integers(0, len(examples)), label="split")
    page_size = data.draw(st.sampled_from([8, 24, 64, 512, 4096]), label="page size")
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "shard.arrow")
        schema, shard, table = _shard_file(path, examples, split, page_size)
        assert row_read.load_pages(path, shard) == table
        decoder = row_read.RowDecoder(schema)
        row, names = 0, lambda: ("shard", "way out")
        mapped = row_read.map_shard(path, shard, table)  # held: pages checked as used
        with open(path, "rb") as f:
            whole = row_read.Held(f.read(), shard, None)  # held, verified whole
        for index, count in enumerate(shard.batch_rows):
            for k in range(count):
                got = row_read.read_row(decoder, path, shard, index, k, table=table,
                                        names=names)
                assert_same_example(examples[row], got)
                for held in (mapped, whole):
                    assert_same_example(examples[row], row_read.read_row(
                        decoder, path, shard, index, k, table=table, names=names,
                        held=lambda: held))
                for value in (got.values() if isinstance(got, dict) else
                              got if isinstance(got, tuple) else [got]):
                    if isinstance(value, np.ndarray):
                        assert not value.flags.writeable
                row += 1


# -- the page checksum file beside each shard ----------------------------------------------------
def test_the_manifest_does_not_grow_with_the_pages(tmp_path):
    """The page table lives beside its shard: a shard's manifest entry holds one checksum of
    it, so the manifest stays a few dozen bytes a record batch whatever the page count."""
    small = build(str(tmp_path / "small"), record_batch_size=256 << 10)[0]
    large = build(str(tmp_path / "large"), record_batch_size=256 << 10, shard_size=4 << 20)[0]
    for snap in (small, large):
        for shard in snap.manifest.to_json()["shards"]:
            assert len(json.dumps(shard)) < 400 + 40 * len(shard["batch_rows"]), shard
            assert shard["page_size"] and len(shard["pages_checksum"]) == 16
    assert max(s.pages for s in large.shards) > 4 * max(s.pages for s in small.shards)


@pytest.mark.parametrize("eager", [True, False], ids=["tables-at-open", "tables-at-first-row"])
@pytest.mark.parametrize("damage", ["missing", "flipped", "truncated"])
def test_an_unusable_page_file_falls_back_to_the_record_batch(tmp_path, monkeypatch, caplog,
                                                              damage, eager):
    """A snapshot of few shards reads their page files when opened (EAGER_PAGE_TABLES), a
    larger one when a row of the shard is first read; either way once, and an unusable one
    makes that shard's rows read with their record batches."""
    from snapcache.store import random_access

    if not eager:
        monkeypatch.setattr(random_access, "EAGER_PAGE_TABLES", 0)
    snap, storage = build(str(tmp_path))
    shard = snap.shards[0]
    pages = os.path.join(storage.root, shard.path + ".pages")
    if damage == "missing":
        os.unlink(pages)
    elif damage == "flipped":
        with open(pages, "r+b") as f:
            f.write(b"\x00" * 8)
    else:
        with open(pages, "r+b") as f:
            f.truncate(8)
    reads = Reads(monkeypatch)
    with caplog.at_level("WARNING"):
        fresh = sc.open_snapshot(str(tmp_path))
        at_open = list(reads.preads)
        reads.preads.clear()
        assert_same_example(example(3), fresh[3])
    assert "page checksum file" in caplog.text and shard.path in caplog.text
    # the page file, read once when it has the length its shard implies (else not at all)
    table = [(0, 8 * shard.pages + 1)] if damage == "flipped" else []
    if eager:
        assert [at for at, _ in at_open] == [0] * (len(snap.shards) - (not table))
        assert at_open[:1] == table or not table
        assert reads.preads == []
    else:
        assert at_open == [] and reads.preads == table
    assert reads.others == [(shard.path, shard.batch_offsets[0], shard.batch_offsets[1])]
    row = shard.rows + 1  # another shard's pages still serve its rows
    reads.preads.clear()
    assert_same_example(example(row), fresh[row])
    assert reads.preads and all(n != 8 * snap.shards[1].pages + 1 for _, n in reads.preads) \
        if eager else reads.preads[0] == (0, 8 * snap.shards[1].pages + 1)
    # take() of one row of a fresh batch of that shard falls back the same way
    later = shard.batch_rows[0] + shard.batch_rows[1] + 2
    for got, want in zip(sc.open_snapshot(str(tmp_path)).take([later, 5]), [later, 5],
                         strict=True):
        assert_same_example(example(want), got)


def test_page_files_go_with_their_shards(tmp_path):
    """Cleanup after a commit keeps the page file of every listed shard and removes those of a
    dead run's shards (and their temporaries)."""
    from snapcache.store.protocol import records

    snap, storage = build(str(tmp_path))
    names = set(os.listdir(storage.root))
    assert {s.path + ".pages" for s in snap.shards} <= names
    stale = "0badc0de-0000-000000.arrow"
    for name in (stale, stale + ".pages", stale + ".pages.0123456789abcdef.tmp"):
        storage.write_atomic(name, b"x")
    removed = records.cleanup(storage, snap.manifest)
    assert sorted(removed) == sorted([stale, stale + ".pages",
                                      stale + ".pages.0123456789abcdef.tmp"])
    assert set(os.listdir(storage.root)) == names
