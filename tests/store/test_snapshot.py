"""Snapshots end to end on local disk: write on the first epoch, read back afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import snapcache as sc
from snapcache.store import layout

from equality import assert_same_example


def snapshot_dirs(root):
    return sorted(d for d in os.listdir(root) if layout.is_fingerprint(d)) if os.path.isdir(root) \
        else []


def committed(root):
    return [d for d in snapshot_dirs(root) if os.path.exists(os.path.join(root, d, "manifest.json"))]


def make_example(i):
    return {
        "image": np.full((4, 5, 3), i % 251, dtype=np.uint8),
        "tokens": np.arange(i % 7, dtype=np.int32),      # ragged
        "label": i,
        "weight": np.float32(i / 3),
        "name": f"ex-{i}",
        "blob": bytes([i % 256]) * (i % 4),
    }


def test_first_epoch_writes_later_epochs_read(root, counter):
    def expensive(i):
        counter.hit()
        return make_example(i)

    ds = sc.Dataset.range(300).map(expensive).snapshot(root)
    first = list(ds)
    assert counter.count == 300
    assert len(committed(root)) == 1
    second = list(ds)
    assert counter.count == 300, "epoch 2 must read the snapshot, not call the map"
    for a, b in zip(first, second, strict=True):
        assert_same_example(a, b)
    # a freshly built identical pipeline hits the same snapshot
    again = list(sc.Dataset.range(300).map(expensive).snapshot(root))
    assert counter.count == 300 and len(again) == 300


@pytest.mark.parametrize("compression", ["zstd", "lz4", "none"])
def test_round_trip_with_each_compression_and_many_shards(root, compression):
    ds = sc.Dataset.range(500).map(make_example).snapshot(
        root, compression=compression, shard_size=4 << 10)
    first = list(ds)
    (fp,) = committed(root)
    manifest = json.load(open(os.path.join(root, fp, "manifest.json")))
    assert manifest["compression"] == compression
    assert len(manifest["shards"]) > 2
    assert manifest["num_examples"] == 500
    for a, b in zip(first, list(ds), strict=True):
        assert_same_example(a, b)


def test_manifest_records_what_a_reader_needs(root):
    ds = sc.Dataset.range(10).map(make_example).snapshot(root, name="tiny")
    list(ds)
    (fp,) = committed(root)
    manifest = json.load(open(os.path.join(root, fp, "manifest.json")))
    assert manifest["format"] == "snapcache-snapshot" and manifest["format_version"] == 1
    assert manifest["fingerprint"] == fp  # the folder is named by the fingerprint
    assert manifest["name"] == "tiny"
    assert manifest["library_version"] == sc.__version__
    for key in ("schema", "shards", "num_examples", "total_bytes", "created_at", "committed_at",
                "writer", "fingerprint_tree", "pipeline"):
        assert key in manifest, key
    shard = manifest["shards"][0]
    assert shard["checksum"].startswith("xxh3_64:") and shard["rows"] == 10
    assert shard["bytes"] == os.path.getsize(os.path.join(root, fp, shard["path"]))
    assert "map `make_example`" in manifest["pipeline"]


def test_snapshot_folder_is_the_upstream_fingerprint(root):
    upstream = sc.Dataset.range(20).map(make_example)
    list(upstream.snapshot(root))
    assert committed(root) == [upstream.fingerprint()]


@pytest.mark.parametrize("make", [
    lambda i: (np.arange(i, dtype=np.float64), i, "x" * i),
    lambda i: np.ones((i % 3, 2), dtype=np.bool_),
    lambda i: f"single string {i}",
    lambda i: i * 1.5,
    lambda i: {"only": np.complex64(i + 1j)},
])
def test_examples_of_every_structure_round_trip(root, make):
    ds = sc.Dataset.range(12).map(make).snapshot(root)
    expected = [make(i) for i in range(12)]
    for got_first, got_again, want in zip(list(ds), list(ds), expected, strict=True):
        assert_same_example(got_first, want)
        assert_same_example(got_again, want)


def test_abandoned_epoch_leaves_no_snapshot_and_the_next_epoch_resumes(root, counter):
    def f(i):
        counter.hit()
        return {"x": np.zeros(1000) + i}

    ds = sc.Dataset.range(1000).map(f).snapshot(root, shard_size=4 << 10)
    it = iter(ds)
    for _ in range(500):
        next(it)
    it.close()
    assert committed(root) == []
    (folder,) = snapshot_dirs(root)
    leftovers = os.listdir(os.path.join(root, folder))
    assert not [n for n in leftovers if n.endswith(".tmp") or n.startswith("lease-")]
    assert any(n.startswith("progress-") for n in leftovers)  # finished shards, recorded
    # take() stops early too: still nothing committed
    list(ds.take(10))
    assert committed(root) == []
    calls = counter.count
    out = list(ds)
    assert [int(e["x"][0]) for e in out] == list(range(1000))
    assert len(committed(root)) == 1
    assert counter.count - calls < 600, "finished shards of the abandoned epoch are reused"
    # after the commit only the manifest, the shards it lists and last-use records remain
    manifest = json.load(open(os.path.join(root, folder, "manifest.json")))
    listed = {s["path"] for s in manifest["shards"]}
    assert set(os.listdir(os.path.join(root, folder))) == listed | {"manifest.json"}


def test_error_mid_epoch_commits_nothing(root):
    def f(i):
        if i == 50:
            raise KeyError("missing file")
        return i

    with pytest.raises(KeyError):
        list(sc.Dataset.range(100).map(f).snapshot(root))
    assert committed(root) == []


def test_unsupported_values_fail_clearly_and_commit_nothing(root):
    ds = sc.Dataset.range(5).map(lambda i: {"x": i, "obj": object()}).snapshot(root)
    with pytest.raises(sc.UnsupportedValueError, match="obj"):
        list(ds)
    assert committed(root) == []


def test_downstream_ops_share_one_snapshot(root, counter):
    def f(i):
        counter.hit()
        return {"x": np.float32(i)}

    base = sc.Dataset.range(64).map(f).snapshot(root)
    list(base.shuffle(10, seed=1).batch(8))
    list(base.map(lambda e: e).batch(16, drop_remainder=True).prefetch(2))
    list(base.shuffle(5, seed=2))
    assert counter.count == 64
    assert len(committed(root)) == 1


def test_changed_upstream_is_a_miss(root):
    list(sc.Dataset.range(10).map(lambda i: i + 1).snapshot(root))
    list(sc.Dataset.range(10).map(lambda i: i + 2).snapshot(root))
    list(sc.Dataset.range(11).map(lambda i: i + 2).snapshot(root))
    assert len(committed(root)) == 3


def test_empty_snapshot(root):
    ds = sc.Dataset.range(0).snapshot(root)
    assert list(ds) == [] and list(ds) == []
    assert len(committed(root)) == 1


def corrupt_first_shard(root, offset_from_end=64):
    (fp,) = committed(root)
    manifest = json.load(open(os.path.join(root, fp, "manifest.json")))
    path = os.path.join(root, fp, manifest["shards"][0]["path"])
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))
    return manifest["shards"][0]["path"]


def test_corrupt_shard_raises_naming_it_before_yielding_anything(root):
    ds = sc.Dataset.range(200).map(make_example).snapshot(root)
    list(ds)
    shard = corrupt_first_shard(root)
    it = iter(ds)
    with pytest.raises(sc.CorruptSnapshotError, match=shard):
        next(it)


def test_verify_false_skips_the_checksum(root):
    ds = sc.Dataset.range(20).map(lambda i: {"x": np.zeros(10_000) + i}).snapshot(
        root, compression="none", verify=False)
    list(ds)
    corrupt_first_shard(root)
    assert len(list(ds)) == 20  # a flipped payload bit goes unnoticed without verification


def test_missing_shard_is_reported(root):
    list(sc.Dataset.range(10).snapshot(root))
    (fp,) = committed(root)
    manifest = json.load(open(os.path.join(root, fp, "manifest.json")))
    os.remove(os.path.join(root, fp, manifest["shards"][0]["path"]))
    with pytest.raises(sc.CorruptSnapshotError, match="missing"):
        list(sc.Dataset.range(10).snapshot(root))


PIPELINE_SCRIPT = textwrap.dedent('''
    import json, sys
    import numpy as np
    import snapcache as sc

    CALLS = 0
    SCALE = 3

    def expensive(i):
        global CALLS
        CALLS += 1
        return {"x": np.arange(i % 5, dtype=np.int16) * SCALE, "i": i}

    ds = sc.Dataset.range(100).map(expensive, num_parallel_calls=2).snapshot(sys.argv[1])
    out = [(e["i"], e["x"].tolist()) for e in ds]
    fingerprint = sc.Dataset.range(100).map(expensive, num_parallel_calls=2).fingerprint()
    print(json.dumps({"calls": CALLS, "fingerprint": fingerprint, "data": out}))
''')


def test_a_later_process_reads_the_snapshot(tmp_path, root):
    script = tmp_path / "pipeline.py"
    script.write_text(PIPELINE_SCRIPT)
    runs = []
    for seed, cwd in (("0", tmp_path), ("4242", "/")):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        proc = subprocess.run([sys.executable, str(script), root], capture_output=True,
                              text=True, env=env, cwd=cwd, check=True)
        runs.append(json.loads(proc.stdout))
    assert runs[0]["calls"] == 100
    assert runs[1]["calls"] == 0, "a new process must read the committed snapshot"
    assert runs[0]["data"] == runs[1]["data"]
    assert runs[0]["fingerprint"] == runs[1]["fingerprint"]
    assert len(committed(root)) == 1


def test_default_root_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("SNAPCACHE_ROOT", str(tmp_path / "envroot"))
    list(sc.Dataset.range(3).snapshot())
    assert len(committed(str(tmp_path / "envroot"))) == 1


def test_memory_filesystem(counter):
    import fsspec

    def f(i):
        counter.hit()
        return {"v": np.arange(3) + i}

    url = "memory://snapcache-test-root"
    ds = sc.Dataset.range(30).map(f).snapshot(url)
    first = list(ds)
    second = list(ds)
    assert counter.count == 30
    for a, b in zip(first, second, strict=True):
        assert_same_example(a, b)
    fs = fsspec.filesystem("memory")
    assert any(p.endswith("manifest.json") for p in fs.find("/snapcache-test-root"))
    fs.rm("/snapcache-test-root", recursive=True)


def rewrite_manifest(root, change):
    (fp,) = committed(root)
    path = os.path.join(root, fp, "manifest.json")
    doc = json.load(open(path))
    change(doc)
    doc["num_examples"] = sum(s["rows"] for s in doc["shards"])
    doc["total_bytes"] = sum(s["bytes"] for s in doc["shards"])
    json.dump(doc, open(path, "w"))


@pytest.mark.parametrize("field, delta, message", [
    ("bytes", 1, "bytes, the manifest says"),
    ("rows", 1, "rows, the manifest says"),
])
def test_a_manifest_that_disagrees_with_its_files_is_refused(root, field, delta, message):
    ds = sc.Dataset.range(30).snapshot(root)
    list(ds)

    def bump(doc):
        doc["shards"][0][field] += delta
        if field == "rows":  # the manifest agrees with itself (its record batches add up)
            doc["shards"][0]["batch_rows"][-1] += delta

    rewrite_manifest(root, bump)
    with pytest.raises(sc.CorruptSnapshotError, match=message):
        list(ds)


def test_readers_hold_a_read_lease_and_record_last_use(root):
    ds = sc.Dataset.range(50).snapshot(root)
    list(ds)
    (fp,) = committed(root)
    it = iter(ds)
    next(it)
    names = os.listdir(os.path.join(root, fp))
    assert any(n.startswith("reader-") for n in names)
    assert "last-used.json" in names
    list(it)
    # held by the pipeline object until it is collected (tests/pipeline/test_held_read_lease.py)
    assert any(n.startswith("reader-") for n in os.listdir(os.path.join(root, fp)))


def test_low_memory_reads_are_correct_and_still_verified(root):
    """Shards larger than the prefetch budget are read with their pages released early."""
    ds = sc.Dataset.range(300).map(lambda i: {"x": np.random.default_rng(i).random(2000)})
    snap = ds.snapshot(root, shard_size=1 << 20, prefetch_bytes=256 << 10, compression="none")
    first = list(snap)
    again = list(snap)
    for a, b in zip(first, again, strict=True):
        assert_same_example(a, b)
    batched = list(snap.batch(64))
    assert np.array_equal(np.concatenate([b["x"] for b in batched]),
                          np.stack([e["x"] for e in first]))
    corrupt_first_shard(root)
    with pytest.raises(sc.CorruptSnapshotError, match="corrupt"):
        list(snap)
