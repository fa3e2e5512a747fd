"""The writer compresses a shard only when that pays: the choice is made per shard from a sample
of its first record batch, recorded in the manifest, and a compressed shard is never larger than
the same shard stored raw."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pytest

import snapcache as sc
from snapcache.store import compression, writer as writer_mod
from snapcache.store.fs import Storage
from snapcache.store.manifest import Manifest
from snapcache.store.options import WriteOptions
from snapcache.store.writer import SnapshotWriter

FP = "0123456789abcdef0123456789abcdef"


def noisy_image(i):
    """6 bits of noise in every byte: zstd saves ~25%, below the threshold."""
    rng = np.random.default_rng(i)
    return {"image": rng.integers(0, 64, (32, 32, 3), dtype=np.uint8), "label": i}


def tokens(i):
    """Mostly padding: zstd saves well over half."""
    t = np.zeros(128, np.int32)
    t[:20] = np.random.default_rng(i).integers(1, 32000, 20)
    return {"tokens": t, "length": 20}


def two_bit_noise(i):
    """Bytes of 2 bits of noise: no repeats for lz4 to find, zstd's entropy coding keeps ~1/4."""
    return {"x": np.random.default_rng(i).integers(0, 4, 4096, dtype=np.uint8)}


def manifest(root):
    (folder,) = [d for d in os.listdir(root) if os.path.exists(os.path.join(root, d,
                                                                           "manifest.json"))]
    with open(os.path.join(root, folder, "manifest.json"), "rb") as f:
        return Manifest.loads(f.read(), where=folder), os.path.join(root, folder)


def write(root, make, n, **options):
    ds = sc.Dataset.range(n).map(make).snapshot(str(root), progress=False,
                                                shard_size=64 << 10, **options)
    assert sum(1 for _ in ds) == n
    return ds


def test_incompressible_shards_are_stored_raw_and_compressible_ones_compressed(tmp_path):
    for make, expected in ((noisy_image, "none"), (tokens, "zstd")):
        root = tmp_path / make.__name__
        ds = write(root, make, 1500, compression="zstd")
        m, folder = manifest(root)
        assert m.compression == "zstd"  # what was asked
        assert len(m.shards) > 1
        assert {s.compression for s in m.shards} == {expected}
        doc = json.load(open(os.path.join(folder, "manifest.json")))
        assert {s["compression"] for s in doc["shards"]} == {expected}
        for s in m.shards:  # the file says the same as the manifest
            with pa.memory_map(os.path.join(folder, s.path)) as f:
                reader = pa.ipc.open_file(f)
                assert reader.num_record_batches >= 1
        again = [e for e in ds]
        assert [int(np.asarray(e["label" if make is noisy_image else "length"]))
                for e in again][:3] == ([0, 1, 2] if make is noisy_image else [20, 20, 20])
        for i, e in enumerate(again):
            key = "image" if make is noisy_image else "tokens"
            np.testing.assert_array_equal(e[key], make(i)[key])


def test_compression_none_records_none(tmp_path):
    write(tmp_path, tokens, 200, compression="none")
    m, _ = manifest(tmp_path)
    assert {s.compression for s in m.shards} == {"none"}


def shard_sizes(storage):
    return {name: storage.size(name) for name in storage.listdir() if name.endswith(".arrow")}


@pytest.mark.parametrize("background", [False, True])
def test_a_compressed_shard_is_never_larger_than_raw(tmp_path, monkeypatch, background):
    """First batches compressible (zeros), the rest small batches of random ints (where each
    compressed buffer's framing outweighs what it saves): the sample says compress, the
    finished shard is rewritten raw, byte for byte the shard written with compression off.
    ``background``: the shard's file written out by a thread (as for rows of 16 KB or more)."""
    if background:
        monkeypatch.setattr(writer_mod, "BACKGROUND_ROW_BYTES", 0)
    rng = np.random.default_rng(0)
    examples = [0] * 256 + [int(x) for x in rng.integers(0, 2**62, 20_000)]
    sizes = {}
    infos = {}
    for compression in ("zstd", "none"):
        storage = Storage(str(tmp_path / compression))
        options = WriteOptions(compression=compression, record_batch_size=1 << 10,
                               shard_size=64 << 20)
        with SnapshotWriter(storage, fingerprint=FP, options=options) as w:
            for e in examples:
                w.write(e)
        m = Manifest.loads(storage.read_bytes("manifest.json"), where="t")
        infos[compression] = m.shards
        sizes[compression] = sum(s.bytes for s in m.shards)
        for s in m.shards:
            assert s.bytes == storage.size(s.path)
            table = pa.ipc.open_file(pa.py_buffer(storage.read_bytes(s.path))).read_all()
            assert table.num_rows == s.rows
    assert sizes["zstd"] == sizes["none"]
    assert [s.compression for s in infos["zstd"]] == ["none"]
    assert infos["zstd"][0].batch_rows == infos["none"][0].batch_rows


def test_choose_compression_on_a_sample():
    options = WriteOptions(compression="lz4")
    zeros = pa.record_batch({"x": pa.array(np.zeros(100_000, np.int64))})
    noise = pa.record_batch({"x": pa.array(np.random.default_rng(1).integers(
        0, 2**62, 100_000))})
    assert compression.choose_compression(zeros, options) == "lz4"
    assert compression.choose_compression(noise, options) == "none"
    assert compression.choose_compression(zeros, WriteOptions(compression="none")) == "none"


def test_the_default_picks_per_shard_the_codec_that_reads_fastest_locally(tmp_path):
    """``auto`` (the default) on a local root: lz4 where it saves enough (it decodes ~3x
    faster than zstd), zstd only where it leaves at most half of lz4's bytes, raw where
    neither saves 30%. Every shard reads back exactly; the manifest records the choice."""
    assert WriteOptions().compression == "auto"
    for make, expected in ((tokens, "lz4"), (two_bit_noise, "zstd"), (noisy_image, "none")):
        root = tmp_path / make.__name__
        ds = write(root, make, 1500)
        m, folder = manifest(root)
        assert m.compression == "auto"
        assert {s.compression for s in m.shards} == {expected}, make.__name__
        for s in m.shards:  # the file holds what the manifest says
            with pa.memory_map(os.path.join(folder, s.path)) as f:
                assert rewritten_size(pa.ipc.open_file(f), expected) == s.bytes
        for i, e in enumerate(ds):
            for key, value in make(i).items():
                np.testing.assert_array_equal(e[key], value)


def rewritten_size(file_reader, codec):
    """Bytes of the shard's batches written again with ``codec`` (the writer's IPC options
    produce the same bytes for the same batches)."""
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=None if codec == "none" else codec)
    with pa.ipc.new_file(sink, file_reader.schema, options=options) as w:
        for i in range(file_reader.num_record_batches):
            w.write_batch(file_reader.get_batch(i))
    return sink.getvalue().size


def test_the_default_picks_zstd_on_remote_storage_and_an_explicit_codec_is_kept(tmp_path):
    """Where every byte is downloaded (not a local path), ``auto`` takes zstd wherever it saves
    enough; an explicit codec is what a shard gets whenever it saves enough."""
    batch = pa.record_batch({"x": pa.array(np.concatenate(
        [tokens(i)["tokens"] for i in range(2000)]))})
    auto = WriteOptions()
    assert compression.choose_compression(batch, auto, local=True) == "lz4"
    assert compression.choose_compression(batch, auto, local=False) == "zstd"
    for codec in ("zstd", "lz4"):
        for local in (True, False):
            assert compression.choose_compression(
                batch, WriteOptions(compression=codec), local=local) == codec
    storage = Storage(f"memory://choice-{os.getpid()}/snap")
    with SnapshotWriter(storage, fingerprint=FP, options=auto) as w:
        for i in range(1500):
            w.write(tokens(i))
    m = Manifest.loads(storage.read_bytes("manifest.json"), where="t")
    assert {s.compression for s in m.shards} == {"zstd"}
    assert m.compression == "auto"


def test_a_level_needs_an_explicit_codec():
    with pytest.raises(ValueError, match="compression_level needs .*picks the codec per shard"):
        WriteOptions(compression_level=3)
    assert WriteOptions(compression="zstd", compression_level=3).compression_level == 3
