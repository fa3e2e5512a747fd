"""The public snapshot handle: found by root + id prefix or name, or by folder; one state
vocabulary; random access by row; the id is what ``snapcache ls`` shows."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

import snapcache as sc
from snapcache.store import layout
from snapcache.store.fs import Storage
from snapcache.store.protocol import WriteLease
from tests.equality import assert_same_example


def example(i):
    return {"x": np.full((4,), i, np.float32), "i": i, "s": f"s{i}"}


def build(root, n=300, name=None, **kw):
    ds = sc.Dataset.range(n).map(example).snapshot(root, shard_size=3000, name=name,
                                                   progress=False, **kw)
    list(ds)
    return ds


@pytest.mark.parametrize("where", ["local", "s3"])
def test_open_snapshot_by_id_prefix_name_folder_or_only_one(where, tmp_path, request):
    root = str(tmp_path) if where == "local" else request.getfixturevalue("s3_root")
    ds = build(root, name="train")
    snap = ds.open_snapshot()
    assert snap.state == "committed" and snap.name == "train"
    assert [info.id for info in sc.ls(root)] == [snap.id]
    assert ds.fingerprint() == snap.id  # the snapshot is the pipeline's last op
    for found in (sc.open_snapshot(root), sc.open_snapshot(root, snap.id[:6]),
                  sc.open_snapshot(root, "train"), sc.open_snapshot(snap.url)):
        assert found == snap and found.id == snap.id and found.url == snap.url
    assert len(snap) == snap.num_examples == 300
    rows = sc.open_snapshot(root, "train")
    for i in (0, 7, 150, 299, -1):
        assert_same_example(rows[i], example(i % 300))
    assert [e["i"] for e in rows.take([299, 3, 3, 150])] == [299, 3, 3, 150]
    assert [f.name for f in snap.schema.fields] == ["x", "i", "s"]


def test_lookup_errors_name_the_candidates(tmp_path):
    root = str(tmp_path)
    with pytest.raises(sc.SnapshotNotFoundError, match="does not exist"):
        sc.open_snapshot(str(tmp_path / "nowhere"))
    with pytest.raises(sc.SnapshotNotFoundError, match="no snapshot in"):
        sc.open_snapshot(root)
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(sc.SnapshotNotFoundError, match="is a file"):
        sc.open_snapshot(str(tmp_path / "a-file"))
    a = build(root, n=10, name="a").open_snapshot()
    b = build(root, n=20).open_snapshot()
    with pytest.raises(sc.SnapshotNotFoundError, match="holds 2 snapshots") as e:
        sc.open_snapshot(root)
    assert a.id[:12] in str(e.value) and "(a)" in str(e.value) and b.id[:12] in str(e.value)
    with pytest.raises(sc.SnapshotNotFoundError, match="no snapshot 'zzz'"):
        sc.open_snapshot(root, "zzz")
    assert sc.open_snapshot(root, "a") == a
    file = tmp_path / "file"
    file.write_text("x")
    with pytest.raises(sc.SnapshotNotFoundError, match="is a file"):
        sc.open_snapshot(str(file))


def test_states_absent_writing_abandoned_committed_corrupt(tmp_path):
    ds = sc.Dataset.range(50).map(example).snapshot(str(tmp_path), progress=False)
    snap = ds.open_snapshot()
    assert snap.state == "absent"
    with pytest.raises(sc.SnapshotStateError, match="absent: nothing is there"):
        snap[0]
    folder = Storage(snap.url)
    folder.makedirs()
    folder.write_atomic("notes.txt", b"not snapcache's")
    assert snap.state == "absent"  # a folder of someone else's files is no snapshot
    assert ds.explain().state == "absent"  # explain says the same (it said "abandoned")
    lease = WriteLease.acquire(folder, run_id="feedbeef")
    try:
        assert snap.state == "writing"
    finally:
        lease.release()
    folder.write_atomic("feedbeef-0000-000000.arrow", b"partial")
    assert snap.state == "abandoned" and ds.explain().state == "abandoned"
    with pytest.raises(sc.SnapshotStateError, match="purge --incomplete"):
        len(snap)
    list(ds)
    assert snap.state == "committed" and len(snap) == 50
    folder.write_atomic(layout.MANIFEST, b"{not json")
    fresh = sc.open_snapshot(snap.url)
    assert fresh.state == "corrupt"
    with pytest.raises(sc.SnapshotStateError, match="corrupt"):
        fresh.num_examples


def test_a_handle_pickles_without_its_open_files_and_feeds_a_map_style_loader(tmp_path):
    torch = pytest.importorskip("torch")
    snap = build(str(tmp_path)).open_snapshot()
    snap[5]  # opens a shard in this process
    copy = pickle.loads(pickle.dumps(snap))
    assert_same_example(copy[5], example(5))
    loader = torch.utils.data.DataLoader(snap.to_torch_map_style(), batch_size=32,
                                         shuffle=True, num_workers=2,
                                         generator=torch.Generator().manual_seed(0))
    seen = sorted(int(i) for batch in loader for i in batch["i"])
    assert seen == list(range(300))


def test_open_snapshot_without_a_snapshot_says_so():
    with pytest.raises(ValueError, match="has no .snapshot"):
        sc.Dataset.range(3).open_snapshot()


def test_manifest_json_is_read_once_committed(tmp_path):
    snap = build(str(tmp_path), n=20).open_snapshot()
    assert snap.num_examples == 20
    doc = json.loads(Storage(snap.url).read_bytes(layout.MANIFEST))
    assert doc["fingerprint"] == snap.id


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_pipeline_handle_builds_its_snapshot_stream_by_stream(where, tmp_path, request):
    """What a distributed build (snapcache.ray.build, or any driver) uses: write one stream,
    commit when all are done; the same protocol as local writers."""
    root = str(tmp_path) if where == "local" else request.getfixturevalue("s3_root")
    ds = sc.Dataset.range(40).map(example).snapshot(root, shard_size=300, progress=False)
    snap = ds.open_snapshot()
    assert snap.state == "absent" and snap.stream_status(2).missing == [0, 1]

    first = snap.write_stream(0, 2)
    assert (first.stream, first.status, first.examples) == (0, "written", 20)
    assert snap.commit(2) is None                 # stream 1 is missing: nothing committed
    assert snap.stream_status(2).missing == [1] and snap.state == "abandoned"
    assert snap.write_stream(0, 2).status == "complete"   # not redone

    second = snap.write_stream(1, 2)              # the last stream commits
    assert second.status == "written" and snap.state == "committed"
    assert snap.write_stream(1, 2).status == "committed"
    assert sorted(e["i"] for e in ds) == list(range(40))
    assert snap.commit(2).num_examples == 40


def test_a_handle_opened_from_a_path_reads_but_does_not_build(tmp_path):
    ds = build(str(tmp_path), n=10)
    for snap in (sc.open_snapshot(str(tmp_path)), pickle.loads(pickle.dumps(ds.open_snapshot()))):
        assert snap.num_examples == 10
        with pytest.raises(sc.SnapshotStateError, match=r"opened from a path .* ds.open_snapshot"):
            snap.write_stream(0, 1)
        with pytest.raises(sc.SnapshotStateError, match="ds.open_snapshot"):
            snap.commit(1)


def test_a_delta_snapshots_newest_version_is_indexed_at_open(tmp_path, monkeypatch):
    """A file source makes a delta lineage by default: open_snapshot reads its newest version,
    and a row reads its record batch alone, as for an ordinary snapshot."""
    src = tmp_path / "src"
    src.mkdir()
    for k in range(3):
        np.save(src / f"f{k}.npy", np.arange(50) + 100 * k)
    ds = sc.Dataset.from_files(str(src / "*.npy")).map(
        lambda p: {"x": np.load(p)}).snapshot(str(tmp_path / "snaps"), progress=False)
    assert sum(1 for _ in ds) == 3
    snap = sc.open_snapshot(str(tmp_path / "snaps"))
    assert snap.manifest.version == 1
    ranges = []
    real = Storage.read_range
    monkeypatch.setattr(Storage, "read_range", lambda self, rel, a, b: (
        ranges.append(rel), real(self, rel, a, b))[1])
    monkeypatch.setattr(Storage, "map_file", lambda *a, **k: 1 / 0)
    assert sorted(int(snap[i]["x"][0]) for i in range(3)) == [0, 100, 200]
    assert ranges
