"""The manifest is untrusted input: every malformed field gives a clear error."""

from __future__ import annotations

import json

import pytest

from snapcache.errors import CorruptSnapshotError, UnknownFormatVersionError
from snapcache.store.manifest import (MAX_BATCH_ROWS, MAX_ROWS_PER_BYTE, MAX_UNLISTED_ROWS,
                                      Manifest, ShardInfo)

GOOD = Manifest(
    fingerprint="0123456789abcdef0123456789abcdef",
    schema={"structure": "single", "fields": []},
    shards=(ShardInfo(path="abcd1234-0000-000000.arrow", rows=3, bytes=100,
                      checksum="xxh3_64:0123456789abcdef", raw_bytes=24),),
    compression="zstd", created_at="t0", committed_at="t1", writer={"pid": 1})


def mutate(**changes):
    doc = json.loads(GOOD.dumps())
    for key, value in changes.items():
        if key.startswith("shard_"):
            doc["shards"][0][key[6:]] = value
        else:
            doc[key] = value
    return json.dumps(doc).encode()


def test_round_trip():
    again = Manifest.loads(GOOD.dumps(), where="x")
    assert again == GOOD
    assert again.num_examples == 3 and again.total_bytes == 100


@pytest.mark.parametrize("data, message", [
    (b"{not json", "not valid JSON"),
    (b"[]", "not a snapcache-snapshot manifest"),
    (mutate(format_version="1"), "format_version"),
    (mutate(fingerprint="../../etc"), "not a hex digest"),
    (mutate(shards={}), "'shards' must be a list"),
    (mutate(shard_path="../other/x.arrow"), "not a file inside the snapshot folder"),
    (mutate(shard_path="/etc/passwd.arrow"), "not a file inside the snapshot folder"),
    (mutate(shard_path="s3://other-bucket/x.arrow"), "not a file inside the snapshot folder"),
    (mutate(shard_rows=-1), "rows must be a non-negative int"),
    (mutate(shard_bytes="100"), "bytes must be a non-negative int"),
    (mutate(shard_checksum="md5:abc"), "checksum"),
    (mutate(num_examples=4), "disagrees with the shard list"),
    (mutate(schema=None), "shards without a schema"),
    (mutate(shard_compression="gzip"), "compression 'gzip' is not one of"),
    # counts a reader lays out before it opens a file: bounded by what the file can hold
    (mutate(shard_rows=2**62, num_examples=2**62), "rows cannot fit in 100 bytes"),
    (mutate(shard_rows=MAX_ROWS_PER_BYTE * 100 + 1), "rows cannot fit in 100 bytes"),
    (mutate(shard_batch_rows=[2, 2]), "batch_rows add up to 4 rows, the shard has 3"),
])
def test_malformed_manifests_are_rejected(data, message):
    with pytest.raises(CorruptSnapshotError, match=message) as info:
        Manifest.loads(data, where="snap")
    assert "delete the snapshot (`snapcache purge`" in str(info.value)  # and the way out


def with_shards(*shards: dict) -> bytes:
    doc = json.loads(GOOD.dumps())
    doc["shards"] = [{**doc["shards"][0], "path": f"abcd1234-0000-{i:06d}.arrow", **shard}
                     for i, shard in enumerate(shards)]
    for name in ("num_examples", "total_bytes"):
        doc.pop(name)
    return json.dumps(doc).encode()


def test_row_counts_are_bounded_by_the_bytes_and_by_what_readers_lay_out():
    # as many rows as the bytes can hold, in full record batches: read on
    batches = [MAX_BATCH_ROWS] * (MAX_ROWS_PER_BYTE * 100 // MAX_BATCH_ROWS)
    full = Manifest.loads(with_shards({"rows": MAX_ROWS_PER_BYTE * 100,
                                       "batch_rows": batches}), where="x")
    assert full.num_examples == MAX_ROWS_PER_BYTE * 100
    with pytest.raises(CorruptSnapshotError, match=f"a record batch of {MAX_BATCH_ROWS + 1} "
                                                   f"rows, more than the {MAX_BATCH_ROWS}"):
        Manifest.loads(with_shards({"rows": MAX_BATCH_ROWS + 1,
                                    "batch_rows": [MAX_BATCH_ROWS + 1]}), where="x")
    # shards without record batch lists (older snapshots): at most MAX_UNLISTED_ROWS together
    half = {"rows": MAX_UNLISTED_ROWS // 2, "bytes": 2**40}
    assert Manifest.loads(with_shards(half, half), where="x").num_examples == MAX_UNLISTED_ROWS
    with pytest.raises(CorruptSnapshotError, match="shards without batch_rows claim"):
        Manifest.loads(with_shards(half, half, {"rows": 1}), where="x")
    listed = {**half, "batch_rows": [MAX_BATCH_ROWS] * (MAX_UNLISTED_ROWS // 2 // MAX_BATCH_ROWS)}
    assert Manifest.loads(with_shards(half, half, listed), where="x")  # listed: not counted
    # totals are 64-bit counts
    huge = {"rows": 0, "bytes": 2**62}
    with pytest.raises(CorruptSnapshotError, match="total_bytes add up to .* 64-bit"):
        Manifest.loads(with_shards(huge, huge), where="x")


def test_newer_format_version_says_upgrade():
    with pytest.raises(UnknownFormatVersionError, match="upgrade snapcache"):
        Manifest.loads(mutate(format_version=99), where="snap")
