"""Damaged and crafted shards, built from the documented format (docs/format.md).

Used by ``test_hostile_shards.py``, whose reads run in a child process (``python
shard_crafting.py CASE...``) so that a regression that makes reading crash with a signal fails
the test instead of killing pytest. The child prints one JSON line per case:
``{"case": ..., "outcome": "ok" | "corrupt" | "<foreign exception type>", "message": ...}``.
"""

from __future__ import annotations

import json
import os
import random
import sys

import numpy as np
import pyarrow as pa
import xxhash

FP = "0123456789abcdef0123456789abcdef"
CODECS = ("none", "zstd", "lz4")


def make_snapshot(root: str, codec: str, rows: int = 120):
    """A committed snapshot of one shard holding every column kind, written with ``codec``."""
    from snapcache.store.fs import Storage
    from snapcache.store.options import WriteOptions
    from snapcache.store.writer import SnapshotWriter

    storage = Storage(root).child(FP)
    writer = SnapshotWriter(storage, fingerprint=FP,
                            options=WriteOptions(compression=codec, record_batch_size=4000))
    for i in range(rows):
        writer.write({"s": "héllo" * (i % 7), "b": b"\x00xy" * (i % 5),
                      "t": np.arange(i % 9, dtype=np.float32),
                      "m": np.full((2, i % 4), i, dtype=np.int16), "k": i})
    manifest = writer.commit()
    assert len(manifest.shards) == 1 and manifest.shards[0].compression == codec, manifest
    return storage


def shard_path(storage) -> str:
    doc = json.loads(storage.read_bytes("manifest.json"))
    return os.path.join(storage.url, doc["shards"][0]["path"])


def replace_shard(storage, data: bytes, *, fix_checksum: bool = True) -> None:
    """Write ``data`` as the snapshot's only shard; with ``fix_checksum`` the manifest's
    size and checksum are recomputed to match, as a hostile writer would."""
    path = shard_path(storage)
    os.unlink(path)                     # never truncate a file someone may have mapped
    with open(path, "wb") as f:
        f.write(data)
    if fix_checksum:
        doc = json.loads(storage.read_bytes("manifest.json"))
        shard = doc["shards"][0]
        shard["checksum"] = "xxh3_64:" + xxhash.xxh3_64(data).hexdigest()
        shard["bytes"] = doc["total_bytes"] = len(data)
        shard.pop("batch_offsets", None), shard.pop("batch_checksums", None)
        index = batch_index(data, len(shard["batch_rows"]))
        if index is not None:  # so that random access reads these batches alone too
            shard["batch_offsets"], shard["batch_checksums"] = index
        if "page_size" in shard:  # and a first row its pages alone
            size = shard["page_size"]
            table = b"".join(xxhash.xxh3_64(data[a:a + size]).digest()
                             for a in range(0, len(data), size))
            with open(path + ".pages", "wb") as f:
                f.write(table)
            shard["pages_checksum"] = xxhash.xxh3_64(table).hexdigest()
        with open(os.path.join(storage.url, "manifest.json"), "w") as f:
            json.dump(doc, f)


def batch_index(data: bytes, batches: int) -> tuple[list[int], list[str]] | None:
    """The record batches' offsets and checksums of the Arrow IPC file ``data``, found by
    walking its messages from the schema on (None where they cannot be walked)."""
    stream = pa.BufferReader(pa.py_buffer(data))
    try:
        stream.seek(8)
        pa.ipc.read_message(stream)  # the schema
        offsets = [stream.tell()]
        for _ in range(batches):
            pa.ipc.read_message(stream)
            offsets.append(stream.tell())
    except (pa.ArrowException, OSError, ValueError):
        return None
    return offsets, [xxhash.xxh3_64(data[a:b]).hexdigest() for a, b in zip(offsets, offsets[1:])]


def _arrow_file(batches: list[pa.RecordBatch], codec: str) -> bytes:
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=None if codec == "none" else codec)
    with pa.ipc.new_file(sink, batches[0].schema, options=options) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def crafted_offsets(storage, codec: str, column: str, mode: str) -> None:
    """Rewrite the shard with ``column``'s offsets going up then down (``mode="down"``) or one
    offset far past its buffer (``"past"``), last offset intact so Arrow's quick validation
    passes; the manifest checksum is recomputed."""
    with open(shard_path(storage), "rb") as f:
        reader = pa.ipc.open_file(pa.py_buffer(f.read()))
    batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
    batch = batches[0]
    index = batch.schema.get_field_index(column)
    array = batch.column(index)
    offsets = np.frombuffer(array.buffers()[1], np.int64).copy()
    n = len(array)
    if mode == "down":
        offsets[n // 2] = offsets[-1]
        offsets[n // 2 + 1] = 0
    else:
        offsets[n // 2] = offsets[-1] + (64 << 20)
    buffers = array.buffers()
    buffers[1] = pa.py_buffer(offsets)
    if isinstance(array.type, pa.LargeListType):
        bad = pa.LargeListArray.from_buffers(array.type, n, buffers[:2], children=[array.values])
    else:
        bad = pa.Array.from_buffers(array.type, n, buffers)
    columns = list(batch.columns)
    columns[index] = bad
    batches[0] = pa.RecordBatch.from_arrays(columns, schema=batch.schema)
    replace_shard(storage, _arrow_file(batches, codec))


def crafted_shapes(storage, codec: str, row: int) -> None:
    """Rewrite the shard with the 2-d tensor column ``m``'s shape of ``row`` claiming more
    elements than its list holds; the manifest's checksums are recomputed."""
    with open(shard_path(storage), "rb") as f:
        reader = pa.ipc.open_file(pa.py_buffer(f.read()))
    batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
    batch = batches[0]
    index = batch.schema.get_field_index("m.shape")
    shapes = batch.column(index)
    values = np.asarray(shapes.values.to_numpy(zero_copy_only=False), np.int32).copy()
    values[row * 2 + 1] += 3
    columns = list(batch.columns)
    columns[index] = pa.FixedSizeListArray.from_arrays(pa.array(values, pa.int32()), 2)
    batches[0] = pa.RecordBatch.from_arrays(columns, schema=batch.schema)
    replace_shard(storage, _arrow_file(batches, codec))


def resplit(storage, codec: str) -> None:
    """Rewrite the shard with the same rows cut into two record batches, as a snapshot from
    before the record batch index (the manifest keeps its one ``batch_rows`` entry, without
    offsets): the file's record batches then disagree with the manifest's."""
    with open(shard_path(storage), "rb") as f:
        table = pa.ipc.open_file(pa.py_buffer(f.read())).read_all()
    half = table.num_rows // 2
    batches = [b for part in (table.slice(0, half), table.slice(half))
               for b in part.combine_chunks().to_batches()]
    replace_shard(storage, _arrow_file(batches, codec))
    doc = json.loads(storage.read_bytes("manifest.json"))
    doc["shards"][0].pop("batch_offsets", None), doc["shards"][0].pop("batch_checksums", None)
    with open(os.path.join(storage.url, "manifest.json"), "w") as f:
        json.dump(doc, f)


def forged_lengths(storage, how: str) -> None:
    """Change the uncompressed length that precedes every zstd frame in the body (IPC body
    compression: int64 length, then the frame) to ``how``: "huge", "short" or "long"."""
    with open(shard_path(storage), "rb") as f:
        data = bytearray(f.read())
    magic = b"\x28\xb5\x2f\xfd"
    start = 0
    while (at := data.find(magic, start)) >= 0:
        length = int.from_bytes(data[at - 8:at], "little", signed=True)
        new = {"huge": 1 << 50, "short": max(0, length - 7), "long": length + 1000}[how]
        data[at - 8:at] = new.to_bytes(8, "little", signed=True)
        start = at + 4
    replace_shard(storage, bytes(data))


def flip_bits(storage, pristine: bytes, rng: random.Random, *, fix_checksum: bool) -> str:
    data = bytearray(pristine)
    flips = []
    for _ in range(rng.randint(1, 6)):
        at, bit = rng.randrange(len(data)), rng.randrange(8)
        data[at] ^= 1 << bit
        flips.append((at, bit))
    replace_shard(storage, bytes(data), fix_checksum=fix_checksum)
    return f"flips {flips}"


def read_everything(storage, verify: bool, only_rows: bool = False) -> None:
    """Read the snapshot every way a user can: all examples, a range, random access (only
    that with ``only_rows``: one record batch at a time, never the whole shard)."""
    from snapcache.store.row_access import RowAccess
    from snapcache.store.reader import SnapshotReader

    if not only_rows:
        reader = SnapshotReader.open(storage, verify=verify)
        for _ in reader:
            pass
        for _ in reader.examples_range(10, 50):
            pass
    rows = RowAccess(SnapshotReader.open(storage, verify=verify))
    for i in (0, len(rows) // 2, len(rows) - 1):
        rows[i]


def outcome(case: str, action) -> dict:
    from snapcache.errors import CorruptSnapshotError

    try:
        action()
    except CorruptSnapshotError as e:
        return {"case": case, "outcome": "corrupt", "message": str(e)}
    except Exception as e:  # what the test must never see
        return {"case": case, "outcome": type(e).__name__, "message": repr(e)}
    return {"case": case, "outcome": "ok", "message": ""}


def run_case(workdir: str, case: str) -> list[dict]:
    """``case`` is ``kind:codec:arg:verify[:rows]``; kinds: offsets (arg column/mode),
    zstd-length (arg how), shapes (arg row), resplit (arg unused), fuzz (arg seed, 60
    rounds); ``rows``: read by
    random access only."""
    kind, codec, arg, verify, *how = case.split(":")
    verify_flag, only_rows = verify == "verify", how == ["rows"]
    root = os.path.join(workdir, case.replace(":", "_").replace("/", "-"))
    storage = make_snapshot(root, codec)
    if kind == "offsets":
        column, mode = arg.split("/")
        crafted_offsets(storage, codec, column, mode)
    elif kind == "zstd-length":
        forged_lengths(storage, arg)
    elif kind == "shapes":
        crafted_shapes(storage, codec, int(arg))
    elif kind == "resplit":
        resplit(storage, codec)
    if kind != "fuzz":
        return [outcome(case, lambda: read_everything(storage, verify_flag, only_rows))]
    with open(shard_path(storage), "rb") as f:
        pristine = f.read()
    rng = random.Random(int(arg))
    results = []
    for _ in range(60):
        # verify: a hostile writer recomputed the checksum; no verify: plain damage
        what = flip_bits(storage, pristine, rng, fix_checksum=verify_flag)
        print(json.dumps({"case": case, "starting": what}), flush=True)
        results.append(outcome(f"{case} {what}",
                               lambda: read_everything(storage, verify_flag, only_rows)))
    return results


if __name__ == "__main__":
    workdir = sys.argv[1]
    for case in sys.argv[2:]:
        print(json.dumps({"case": case, "starting": ""}), flush=True)
        for result in run_case(workdir, case):
            print(json.dumps(result), flush=True)
