"""Options are small frozen dataclasses owned by the layer that uses them, validated when built
and given at construction."""

from __future__ import annotations

import dataclasses
import math
import warnings
from datetime import timedelta

import pytest

import snapcache as sc
from snapcache.options import SnapshotOptions
from snapcache.pipeline import snapshot_exec
from snapcache.store.fs import Storage
from snapcache.store.options import CoordinationOptions, ReadOptions, WriteOptions
from snapcache.store.reader import SnapshotReader, load_manifest


@pytest.mark.parametrize("cls, kwargs, match", [
    (WriteOptions, dict(compression="gzip"), "compression must be one of"),
    (WriteOptions, dict(compression="none", compression_level=3), "compression_level"),
    (WriteOptions, dict(shard_size=0), "shard_size"),
    (WriteOptions, dict(record_batch_size=True), "record_batch_size"),
    (ReadOptions, dict(prefetch_bytes=-1), "prefetch_bytes"),
    (ReadOptions, dict(local_cache=3), "local_cache"),
    (ReadOptions, dict(local_cache_limit=0), "local_cache_limit"),
    (CoordinationOptions, dict(on_busy="spin"), "on_busy"),
    (CoordinationOptions, dict(wait_timeout=-1), "wait_timeout"),
    (CoordinationOptions, dict(lease_ttl=0), "lease_ttl"),
])
def test_each_part_validates_its_own_fields(cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cls(**kwargs)


@pytest.mark.parametrize("cls, name, given, kept", [
    (WriteOptions, "shard_size", "256MiB", 256 << 20),
    (WriteOptions, "shard_size", "64MB", 64_000_000),
    (WriteOptions, "record_batch_size", "1.5 MiB", 3 << 19),
    (WriteOptions, "shard_size", 12345, 12345),
    (ReadOptions, "prefetch_bytes", "2GiB", 2 << 30),
    (ReadOptions, "local_cache_limit", "1TB", 10**12),
    (CoordinationOptions, "lease_ttl", "2m", 120.0),
    (CoordinationOptions, "lease_ttl", timedelta(seconds=90), 90.0),
    (CoordinationOptions, "lease_ttl", 5, 5.0),
    (CoordinationOptions, "wait_timeout", "1h", 3600.0),
    (CoordinationOptions, "wait_timeout", "0s", 0.0),
])
def test_sizes_and_durations_as_people_type_them_are_kept_as_bytes_and_seconds(
        cls, name, given, kept):
    value = getattr(cls(**{name: given}), name)
    assert value == kept and type(value) is type(kept)


@pytest.mark.parametrize("cls, kwargs, match", [
    (WriteOptions, dict(shard_size="64XB"), r"shard_size must be a positive number of bytes or "
                                            r"a size such as '64MB' or '1GiB'; got '64XB'"),
    (WriteOptions, dict(shard_size="0MB"), "shard_size must be a positive"),
    (WriteOptions, dict(shard_size=1.5e6), "shard_size"),
    (ReadOptions, dict(prefetch_bytes="lots"), "prefetch_bytes must be None or a positive"),
    (CoordinationOptions, dict(lease_ttl="30"), r"lease_ttl must be a positive number of "
                                                r"seconds, a timedelta or a duration such as "
                                                r"'90s' or '5m'; got '30'"),
    (CoordinationOptions, dict(lease_ttl=math.nan), "lease_ttl"),
    (CoordinationOptions, dict(lease_ttl="0s"), "lease_ttl"),
    (CoordinationOptions, dict(wait_timeout="-5s"), "wait_timeout must be None or seconds >= 0"),
    (CoordinationOptions, dict(wait_timeout=timedelta(seconds=-1)), "wait_timeout"),
])
def test_a_size_or_duration_that_does_not_parse_names_the_option_and_the_way(cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cls(**kwargs)


def test_a_snapshot_given_sizes_and_durations_as_strings_is_the_one_given_numbers(tmp_path):
    root = str(tmp_path)
    written = sc.Dataset.range(1000).snapshot(root, shard_size="4KiB", lease_ttl="1m",
                                              wait_timeout="30s", progress=False)
    assert list(written) == list(range(1000))
    assert len(written.open_snapshot().manifest.shards) > 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "options differ from the snapshot's" warning
        again = sc.Dataset.range(1000).snapshot(root, shard_size=4096, lease_ttl=60.0,
                                                progress=False)
        assert list(again) == list(range(1000))
    assert again.fingerprint() == written.fingerprint()
    assert again.explain().hit


@pytest.mark.parametrize("cls", [WriteOptions, ReadOptions, CoordinationOptions,
                                 SnapshotOptions])
def test_options_are_frozen(cls):
    options = cls()
    field = dataclasses.fields(cls)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(options, field, getattr(options, field))


def test_snapshot_keywords_reach_the_part_that_owns_them():
    options = SnapshotOptions.from_keywords(compression="lz4", shard_size=1 << 20,
                                            verify=False, prefetch_bytes=1 << 20,
                                            on_busy="compute", lease_ttl=5.0, key="v1",
                                            name="n")
    assert options.write == WriteOptions(compression="lz4", shard_size=1 << 20)
    assert options.read == ReadOptions(verify=False, prefetch_bytes=1 << 20)
    assert options.coordination == CoordinationOptions(on_busy="compute", lease_ttl=5.0)
    assert (options.key, options.name) == ("v1", "n")
    with pytest.raises(TypeError, match="unknown snapshot option 'shardsize'"):
        SnapshotOptions.from_keywords(shardsize=3)
    with pytest.raises(TypeError, match="WriteOptions"):
        SnapshotOptions(write=ReadOptions())


def test_dataset_snapshot_keeps_its_keyword_api_and_validates_eagerly(tmp_path):
    ds = sc.Dataset.range(3)
    with pytest.raises(ValueError, match="lease_ttl"):
        ds.snapshot(str(tmp_path), lease_ttl=-1)
    with pytest.raises(ValueError, match="compression must be one of"):
        ds.snapshot(str(tmp_path), compression="gzip")
    assert list(ds.snapshot(str(tmp_path), compression="lz4", shard_size=1 << 16,
                            prefetch_bytes=1 << 20, lease_ttl=5, progress=False)) == [0, 1, 2]


def test_the_reader_gets_its_options_at_construction(tmp_path):
    root = str(tmp_path)
    ds = sc.Dataset.range(10).snapshot(root, prefetch_bytes=12345, verify=False, progress=False)
    list(ds)
    storage = Storage(root).child(ds.fingerprint())
    options = SnapshotOptions.from_keywords(prefetch_bytes=12345, verify=False)
    reader = snapshot_exec.open_reader(storage, load_manifest(storage), options)
    assert (reader.prefetch_bytes, reader.verify, reader.cache) == (12345, False, None)
    # no class-level defaults to be patched from outside: they are constructor arguments
    for name in ("prefetch_bytes", "read_threads", "cache"):
        assert name not in vars(SnapshotReader)
