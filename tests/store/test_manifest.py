"""The manifest is untrusted input: every malformed field gives a clear error."""

from __future__ import annotations

import json

import pytest

from snapcache.errors import CorruptSnapshotError, UnknownFormatVersionError
from snapcache.store.manifest import Manifest, ShardInfo

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
])
def test_malformed_manifests_are_rejected(data, message):
    with pytest.raises(CorruptSnapshotError, match=message):
        Manifest.loads(data, where="snap")


def test_newer_format_version_says_upgrade():
    with pytest.raises(UnknownFormatVersionError, match="upgrade snapcache"):
        Manifest.loads(mutate(format_version=99), where="snap")
