"""snapshot(..., on_corrupt="raise" | "rebuild"): a corrupt shard met in training either fails
the epoch (the default) or is rebuilt while the epoch carries on, each example once."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import numpy as np
import pytest

import snapcache as sc
from snapcache.errors import CorruptSnapshotError, UnknownFormatVersionError
from snapcache.pipeline.rebuild import CorruptSnapshotWarning

N = 300


def make(i):
    return {"i": i, "x": np.random.default_rng(i).integers(0, 255, 64, dtype=np.uint8)}


def pipeline(root, on_corrupt="raise"):
    return sc.Dataset.range(N).map(make).snapshot(root, shard_size=4096, progress=False,
                                                  on_corrupt=on_corrupt)


def corrupt_a_shard(root, which=2):
    snap = pipeline(root).open_snapshot()
    shard = snap.manifest.shards[which]
    path = os.path.join(root, snap.id, shard.path)
    with open(path, "r+b") as f:
        f.seek(shard.bytes // 2)
        byte = f.read(1)
        f.seek(shard.bytes // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    # shards are read record batch by record batch: those before the damaged one are yielded
    offsets = shard.batch_offsets
    (k,) = [j for j in range(len(offsets) - 1) if offsets[j] <= shard.bytes // 2 < offsets[j + 1]]
    return snap.id, sum(s.rows for s in snap.manifest.shards[:which]) + sum(shard.batch_rows[:k])


def test_the_default_raises(root):
    assert [e["i"] for e in pipeline(root)] == list(range(N))
    corrupt_a_shard(root)
    with pytest.raises(CorruptSnapshotError, match="checksum"):
        list(pipeline(root))


def test_rebuild_carries_on_with_each_example_once(root):
    assert [e["i"] for e in pipeline(root)] == list(range(N))
    fid, before = corrupt_a_shard(root)
    assert before > 0
    with pytest.warns(CorruptSnapshotWarning, match="rebuilt now") as caught:
        seen = [int(e["i"]) for e in pipeline(root, "rebuild")]
    assert seen == list(range(N))
    assert f"after its {before:,} examples already yielded" in str(caught[0].message)
    assert caught[0].filename == __file__  # the user's line, not snapcache's
    report = sc.verify(root, [fid])
    assert report.ok and sc.open_snapshot(root, fid).state == "committed"
    assert [int(e["i"]) for e in pipeline(root, "rebuild")] == list(range(N))


def test_rebuild_in_a_seeded_shuffled_batched_epoch(root):
    shaped = lambda on_corrupt: pipeline(root, on_corrupt).shuffle(50, seed=3).batch(32)
    reference = [b["i"].tolist() for b in shaped("raise").iterate(epoch=1)]
    corrupt_a_shard(root, which=4)
    with pytest.warns(CorruptSnapshotWarning) as caught:
        again = [b["i"].tolist() for b in shaped("rebuild").iterate(epoch=1)]
    assert caught[0].filename == __file__
    assert again == reference
    assert sorted(i for b in again for i in b) == list(range(N))


def test_on_corrupt_is_validated():
    with pytest.raises(ValueError, match="on_corrupt must be"):
        sc.Dataset.range(3).snapshot("/tmp/x", on_corrupt="ignore")


def test_a_rebuild_never_withdraws_the_snapshot_another_job_rebuilt(root):
    """Two jobs read one corrupt snapshot: the first rebuilds and commits a good one; the second,
    reading the old commit, meets the damage after that: it must not withdraw the good one
    (which a third job reads), only read it."""
    assert [e["i"] for e in pipeline(root)] == list(range(N))
    fid, before = corrupt_a_shard(root, which=4)
    late = iter(pipeline(root, "rebuild"))  # job B: on the corrupt commit
    assert int(next(late)["i"]) == 0
    with pytest.warns(CorruptSnapshotWarning, match="rebuilt now"):
        assert [int(e["i"]) for e in pipeline(root, "rebuild")] == list(range(N))  # job A
    good = sc.open_snapshot(root, fid).manifest
    reader = iter(pipeline(root))  # job C: reads the good one
    assert int(next(reader)["i"]) == 0
    with pytest.warns(CorruptSnapshotWarning, match="rebuilt by another process meanwhile"):
        assert [int(e["i"]) for e in late] == list(range(1, N))
    assert sc.open_snapshot(root, fid).manifest == good  # not withdrawn, not rebuilt again
    assert [int(e["i"]) for e in reader] == list(range(1, N))
    assert sc.verify(root, [fid]).ok


def load_file(path):
    value = int(open(path).read())
    return {"i": value, "x": np.full((64,), value % 256, np.uint8)}


def text_files(tmp_path, count):
    """A folder of ``count`` text files ``f000.txt``... holding their number, and the delta
    snapshot pipeline over them (``files(on_corrupt)``) rooted at ``tmp_path / "root"``."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(count):
        (src / f"f{i:03d}.txt").write_text(str(i))

    def files(on_corrupt="raise"):
        return (sc.Dataset.from_files(str(src / "*.txt")).map(load_file)
                .snapshot(str(tmp_path / "root"), shard_size=2048, progress=False,
                          on_corrupt=on_corrupt))
    return src, files


def test_rebuild_of_a_delta_snapshot_withdraws_every_version_listing_the_corrupt_shard(
        tmp_path):
    """A file source's snapshot is a lineage of versions that share shards: the versions that
    list the corrupt shard are withdrawn (the lineage stays), the next build keeps none of its
    segment, and the epoch goes on."""
    src = tmp_path / "src"
    src.mkdir()

    def write(i):
        (src / f"f{i:03d}.txt").write_text(str(i))

    def files(on_corrupt="raise"):
        return (sc.Dataset.from_files(str(src / "*.txt")).map(load_file)
                .snapshot(str(tmp_path / "root"), shard_size=2048, progress=False,
                          on_corrupt=on_corrupt))
    for i in range(30):
        write(i)
    assert sorted(int(e["i"]) for e in files()) == list(range(30))
    for i in range(30, 40):
        write(i)
    assert sorted(int(e["i"]) for e in files()) == list(range(40))  # version 2 keeps v1's
    snap = files().open_snapshot()
    shard = snap.manifest.shards[1]  # written for version 1, listed by both
    (lineage,) = os.listdir(tmp_path / "root")
    path = tmp_path / "root" / lineage / shard.path
    data = bytearray(path.read_bytes())
    data[shard.batch_offsets[-2] + 8] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptSnapshotError):
        list(files())
    with pytest.warns(CorruptSnapshotWarning, match="rebuilt now"):
        assert sorted(int(e["i"]) for e in files("rebuild")) == list(range(40))
    assert sorted(int(e["i"]) for e in files()) == list(range(40))
    assert sc.verify(str(tmp_path / "root")).ok
    assert not path.exists()  # the corrupt shard is no version's: cleaned up


def test_rebuild_of_an_unreadable_manifest(root):
    assert [e["i"] for e in pipeline(root)] == list(range(N))
    snap = pipeline(root).open_snapshot()
    path = os.path.join(root, snap.id, "manifest.json")
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])  # bit rot: a truncated manifest
    with pytest.raises(CorruptSnapshotError, match="not valid JSON"):
        list(pipeline(root))
    with pytest.warns(CorruptSnapshotWarning, match="rebuilt now"):
        assert [int(e["i"]) for e in pipeline(root, "rebuild")] == list(range(N))
    assert [int(e["i"]) for e in pipeline(root)] == list(range(N))


def test_rebuild_of_a_delta_snapshot_whose_newest_version_manifest_is_unreadable(tmp_path):
    """A version's manifest damaged (truncated): the default raises naming it; "rebuild"
    withdraws that version only and builds it again from the older one's segments."""
    src, files = text_files(tmp_path, 20)
    assert sorted(int(e["i"]) for e in files()) == list(range(20))
    for i in range(20, 25):
        (src / f"f{i:03d}.txt").write_text(str(i))
    assert sorted(int(e["i"]) for e in files()) == list(range(25))
    (lineage,) = os.listdir(tmp_path / "root")
    folder = tmp_path / "root" / lineage
    newest = folder / "manifest-000002.json"
    newest.write_bytes(newest.read_bytes()[:100])
    with pytest.raises(CorruptSnapshotError, match="manifest-000002.json") as e:
        list(files())
    assert e.value.manifest == "manifest-000002.json"
    with pytest.warns(CorruptSnapshotWarning, match="rebuilt now"):
        assert sorted(int(e["i"]) for e in files("rebuild")) == list(range(25))
    assert (folder / "manifest-000001.json").exists()  # the good version stays
    assert sorted(int(e["i"]) for e in files()) == list(range(25))
    assert sc.verify(str(tmp_path / "root")).ok
    # another job meeting the same damage later finds the version readable: it withdraws nothing
    from snapcache.store.fs import Storage
    from snapcache.store.protocol import versions
    assert versions.still_unreadable(Storage(str(folder)), "manifest-000002.json") is None


def test_a_damaged_old_version_does_not_stop_the_next_build_or_explain(tmp_path, caplog):
    """An old version's manifest damaged (no version needs it): the source grows, and the
    next build is planned against the newest version, explained and run, with a warning naming
    the damaged version and its way out; nothing is withdrawn or deleted. Before, looking for
    a version built from the new source read every version's manifest and failed on it."""
    src, files = text_files(tmp_path, 20)
    assert len(list(files())) == 20
    (src / "f020.txt").write_text("20")
    assert len(list(files())) == 21  # version 2
    (lineage,) = os.listdir(tmp_path / "root")
    old = tmp_path / "root" / lineage / "manifest-000001.json"
    damaged = old.read_bytes()[:100]
    old.write_bytes(damaged)
    (src / "f021.txt").write_text("21")
    with caplog.at_level("WARNING"):
        why = files().explain(str(tmp_path / "root"))
        assert not why.hit and "builds version 3" in str(why)
        assert "computing 1 of 22 units" in str(why)
        assert sorted(int(e["i"]) for e in files()) == list(range(22))
    assert "manifest-000001.json: manifest is not valid JSON" in caplog.text
    assert "--old-versions" in caplog.text and "Passed over meanwhile" in caplog.text
    assert old.read_bytes() == damaged  # kept for purge to remove: nothing is withdrawn
    assert sorted(int(e["i"]) for e in files()) == list(range(22))  # version 3 is read
    (src / "f021.txt").unlink()  # back to version 2's files: still found
    assert sorted(int(e["i"]) for e in files()) == list(range(21))


def as_a_newer_release_writes_it(path: Path) -> bytes:
    """Rewrite the manifest at ``path`` as a newer snapcache would: a format version this one
    does not know, with a field of that format. Returns its bytes."""
    doc = json.loads(path.read_text())
    doc["format_version"] = 4
    doc["a_field_of_format_4"] = {"whatever": 1}
    path.write_text(json.dumps(doc))
    return path.read_bytes()


def test_a_newer_format_is_refused_and_never_rebuilt(root):
    """A manifest of a newer format is a newer release's good snapshot, not a corrupt one:
    on_corrupt="rebuild" refuses it as "raise" does, and leaves it as it is."""
    assert [e["i"] for e in pipeline(root)] == list(range(N))
    folder = Path(root, pipeline(root).open_snapshot().id)
    newer = as_a_newer_release_writes_it(folder / "manifest.json")
    files = sorted(n for n in os.listdir(folder) if not n.startswith("reader-"))
    for on_corrupt in ("raise", "rebuild"):
        with warnings.catch_warnings():
            warnings.simplefilter("error", CorruptSnapshotWarning)  # nothing is withdrawn
            with pytest.raises(UnknownFormatVersionError, match="upgrade snapcache"):
                list(pipeline(root, on_corrupt))
    assert (folder / "manifest.json").read_bytes() == newer
    assert sorted(n for n in os.listdir(folder) if not n.startswith("reader-")) == files
    # not damaged, so not a CorruptSnapshotError: no `except` of one takes it for damage
    assert not issubclass(UnknownFormatVersionError, CorruptSnapshotError)


def test_a_delta_version_of_a_newer_format_is_refused_and_never_rebuilt(tmp_path):
    src, files = text_files(tmp_path, 12)
    assert sorted(int(e["i"]) for e in files()) == list(range(12))
    (src / "f100.txt").write_text("100")
    assert len(list(files())) == 13  # version 2
    (lineage,) = os.listdir(tmp_path / "root")
    folder = tmp_path / "root" / lineage
    newer = as_a_newer_release_writes_it(folder / "manifest-000002.json")
    before = sorted(n for n in os.listdir(folder) if not n.startswith("reader-"))
    (src / "f101.txt").write_text("101")  # and the source grows: a build would start
    for on_corrupt in ("raise", "rebuild"):
        with warnings.catch_warnings():
            warnings.simplefilter("error", CorruptSnapshotWarning)
            with pytest.raises(UnknownFormatVersionError, match="upgrade snapcache"):
                list(files(on_corrupt))
    assert (folder / "manifest-000002.json").read_bytes() == newer
    assert sorted(n for n in os.listdir(folder) if not n.startswith("reader-")) == before


def test_rebuild_of_a_delta_snapshot_whose_newest_source_record_is_damaged(tmp_path):
    """The next build of a changed source compares it with the newest version's source record:
    a damaged one fails it by default, naming what works; "rebuild" withdraws that version
    (and says so only because it did) and builds again, reusing the older version's
    segments."""
    src, files = text_files(tmp_path, 20)
    assert len(list(files())) == 20
    for i in range(20, 25):
        (src / f"f{i:03d}.txt").write_text(str(i))
    assert len(list(files())) == 25  # version 2
    (lineage,) = os.listdir(tmp_path / "root")
    folder = tmp_path / "root" / lineage
    (record,) = folder.glob("units-000002-*.arrow")
    data = bytearray(record.read_bytes())
    data[len(data) // 2] ^= 1
    record.write_bytes(bytes(data))
    (src / "f100.txt").write_text("100")  # the source grows: the build needs the record
    with pytest.raises(CorruptSnapshotError, match="source record of version 2") as e:
        list(files())
    assert e.value.manifest == "manifest-000002.json"
    assert 'on_corrupt="rebuild"' in str(e.value) and "purge version" not in str(e.value)
    with pytest.warns(CorruptSnapshotWarning, match="withdrawn and is rebuilt now"):
        got = sorted(int(e["i"]) for e in files("rebuild"))
    assert got == list(range(25)) + [100]
    assert (folder / "manifest-000001.json").exists() and not record.exists()
    assert sorted(int(e["i"]) for e in files()) == got
    assert sc.verify(str(tmp_path / "root")).ok


def test_format_version_0_is_damage_and_len_does_not_stop_a_rebuild(root):
    """A flipped bit can make format_version 0, which no release wrote: damage, not a newer
    format. len() (and list(), which asks it) falls back to the upstream's length, so
    on_corrupt="rebuild" still gets to rebuild."""
    assert len(list(pipeline(root))) == N
    folder = Path(root, pipeline(root).open_snapshot().id)
    doc = json.loads((folder / "manifest.json").read_text())
    doc["format_version"] = 0
    (folder / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(CorruptSnapshotError, match="never written"):
        list(pipeline(root))
    assert len(pipeline(root, "rebuild")) == N
    with pytest.warns(CorruptSnapshotWarning, match="rebuilt now"):
        assert len(list(pipeline(root, "rebuild"))) == N
