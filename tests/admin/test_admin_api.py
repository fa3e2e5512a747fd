"""The Python API behind the CLI: snapcache.ls / purge, snapcache.admin.info / verify."""

from __future__ import annotations

import glob
import importlib
import json
import logging
import os

import numpy as np
import pytest

import snapcache as sc
from admin_fixtures import (abandoned_write, exists, live_lease, make_snapshot,
                            run_cli, set_last_used, two_versions)
from snapcache import admin
from snapcache.admin.verify import VERIFY_THREADS
from snapcache.store.fs import Storage


def used(root, days: dict, **make) -> dict:
    """Committed snapshots named as ``days``' keys, each last used that many days ago."""
    ids = {name: make_snapshot(root, name, **make) for name in days}
    for name, ago in days.items():
        set_last_used(root, ids[name], ago)
    return ids


def not_committed(root) -> None:
    """A snapshot being written, an abandoned write and a corrupt manifest."""
    abandoned_write(root, "a" * 32)
    live_lease(root, "b" * 32, kind="write")
    Storage(root).child("c" * 32).write_atomic("manifest.json", b"{not json")


NOT_COMMITTED = [(None, "writing"), (None, "abandoned"), (None, "corrupt")]


@pytest.fixture
def three(root):
    """Three committed snapshots used 1, 10 and 100 days ago."""
    return used(root, {"new": 1, "mid": 10, "old": 100})


def test_ls_reports_every_state(root, three):
    not_committed(root)
    snaps = sc.ls(root)
    assert [(s.name, s.state) for s in snaps] == [
        ("new", "committed"), ("mid", "committed"), ("old", "committed"), *NOT_COMMITTED]
    new = snaps[0]
    assert new.id == three["new"] and new.num_examples == 40 and new.num_shards >= 1
    assert new.size_bytes == sum(os.path.getsize(os.path.join(root, new.id, f))
                                 for f in os.listdir(os.path.join(root, new.id)))
    assert new.compression_ratio is not None and new.pipeline.startswith("range(0, 40)")
    assert 0.9 * 86400 < (snaps[0].last_used - snaps[1].last_used).total_seconds() / 9 < 1.1 * 86400
    assert snaps[4].num_shards == 1 and snaps[4].size_bytes > 3000
    assert "not valid JSON" in snaps[5].problem
    assert snaps[3].leased and not snaps[4].leased
    assert new.to_json()["state"] == "committed"


def test_ls_of_an_s3_root_describes_its_folders_at_once_and_in_the_same_order(s3_root):
    """On S3 each folder is a few requests, so `ls` describes the folders on threads: the
    same list, in the same order, as describing them one by one."""
    used(s3_root, {"a": 3, "b": 1, "c": 2}, shard_size=1 << 20)
    not_committed(s3_root)
    snaps = sc.ls(s3_root)
    assert [(s.name, s.state) for s in snaps] == [
        ("b", "committed"), ("c", "committed"), ("a", "committed"), *NOT_COMMITTED]
    storage = Storage(s3_root)
    one_by_one = sorted((admin.inventory.describe(storage.child(s.id), s.id) for s in snaps),
                        key=admin.inventory._order)
    assert [s.to_json() for s in snaps] == [s.to_json() for s in one_by_one]


def test_missing_root_and_default_root(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        sc.ls(str(tmp_path / "nope"))
    monkeypatch.setenv("SNAPCACHE_ROOT", str(tmp_path))
    make_snapshot(str(tmp_path), "env")
    assert [s.name for s in sc.ls()] == ["env"]


def test_a_missing_default_root_says_it_is_the_default_and_how_to_choose(tmp_path,
                                                                         monkeypatch):
    monkeypatch.delenv("SNAPCACHE_ROOT", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with pytest.raises(FileNotFoundError) as caught:
        sc.ls()
    message = str(caught.value)
    assert f"the default snapshot root {tmp_path}/cache/snapcache does not exist" in message
    assert "the first `.snapshot()` without a path creates it" in message
    assert "pass a root" in message and "set $SNAPCACHE_ROOT" in message
    monkeypatch.setenv("SNAPCACHE_ROOT", str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match=r"snapshot root .*/nope \(from \$SNAPCACHE_ROOT\) "
                                                r"does not exist"):
        sc.ls()


def test_a_snapshot_folder_given_as_the_root_is_that_snapshot(root, three):
    fid = three["mid"]
    folder = os.path.join(root, fid)
    assert [s.id for s in sc.ls(folder)] == [fid]
    assert admin.info(folder).id == fid and admin.info(folder).manifest is not None
    report = admin.verify(folder)
    assert report.ok and report.root == root and [c.snapshot.id for c in report.checks] == [fid]
    with pytest.raises(ValueError, match=f"{folder} is the folder of snapshot {fid[:12]}, not a "
                                         f"snapshot root: purge it by id from its root"):
        sc.purge(folder, older_than="1d")
    with pytest.raises(ValueError, match="give the folder alone, or its root and an id"):
        admin.info(folder, "new")
    assert exists(root, fid)


def test_info_without_an_id_takes_the_only_snapshot(tmp_path, three, root):
    with pytest.raises(ValueError, match=r"holds 3 snapshots \(.* \(new\), .*\): give one id"):
        admin.info(root)
    alone = str(tmp_path / "alone")
    fid = make_snapshot(alone, "only")
    assert admin.info(alone).id == fid
    assert admin.info(alone).id == sc.open_snapshot(alone).id


def test_info_by_prefix_name_and_errors(root, three):
    fid = three["mid"]
    assert admin.info(root, fid[:6]).name == "mid"
    assert admin.info(root, fid).manifest.fingerprint == fid
    assert admin.info(root, "mid").id == fid
    abandoned_write(root, "ab" + "0" * 30)
    abandoned_write(root, "ab" + "1" * 30)
    with pytest.raises(ValueError, match=r"'ab' is ambiguous .* matches 2 snapshots"):
        admin.info(root, "ab")
    with pytest.raises(ValueError, match="no snapshot 'zzz'"):
        admin.info(root, "zzz")


def test_verify_finds_a_flipped_byte(root, three):
    assert admin.verify(root=root).ok
    snap = admin.info(root, "old")
    shard = snap.manifest.shards[-1].path
    path = os.path.join(root, snap.id, shard)
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(path, "wb").write(bytes(data))
    seen = []
    report = admin.verify(root=root, progress=lambda p: seen.append(p.bytes_done))
    assert not report.ok and [c.snapshot.name for c in report.failed] == ["old"]
    assert shard in report.failed[0].problems[0] and "checksum" in report.failed[0].problems[0]
    assert seen == sorted(seen) and seen[-1] == sum(
        c.snapshot.manifest.total_bytes for c in report.checks)
    assert admin.verify(root, ["new"]).ok


def test_verify_on_s3_checks_shards_at_once_and_reports_them_in_order(s3_root):
    """On remote storage the shards are checked several at a time: the same report, each
    damaged shard named, progress in the order of the shards."""
    ids = used(s3_root, {"many": 1}, n=400, shard_size=4096)
    snap = admin.info(s3_root, "many")
    shards = [s.path for s in snap.manifest.shards]
    assert len(shards) > 2 * VERIFY_THREADS
    storage = Storage(s3_root).child(ids["many"])
    for bad in (shards[1], shards[-2]):  # a flipped byte in two of them
        data = bytearray(storage.read_bytes(bad))
        data[len(data) // 2] ^= 0xFF
        storage.write_atomic(bad, bytes(data))
    seen = []
    report = admin.verify(root=s3_root, progress=lambda p: seen.append(p.shard))
    [check] = report.failed
    assert [problem.count(bad) for problem, bad in zip(check.problems, (shards[1], shards[-2]))
            ] == [1, 1] and len(check.problems) == 2
    assert seen == shards


@pytest.mark.parametrize("damage", ["a digit of a batch checksum", "two batches' rows swapped"])
def test_verify_checks_the_record_batch_index_that_reads_use(root, damage):
    """Local sequential reads and ``snap[i]`` read record batches through the manifest's index
    (``batch_offsets``, ``batch_checksums``, ``batch_rows``), not the whole-shard checksum: an
    index that disagrees with a shard that matches its checksum fails every read, so verify
    fails too, naming the record batch and the way out (whose first step is verify)."""
    ds = sc.Dataset.range(300).map(lambda i: {"x": np.full(8, i), "i": i}).snapshot(
        root, key="indexed", name="indexed", record_batch_size=2048, progress=False)
    assert [e["i"] for e in ds] == list(range(300))
    assert admin.verify(root=root).ok
    snap = admin.info(root, "indexed")
    folder = Storage(root).child(snap.id)
    doc = json.loads(folder.read_bytes("manifest.json"))
    shard = doc["shards"][0]
    if damage.startswith("a digit"):
        digest = shard["batch_checksums"][0]
        shard["batch_checksums"][0] = ("0" if digest[0] != "0" else "1") + digest[1:]
        expected = "record batch 0 is corrupt: checksum"
    else:
        rows = shard["batch_rows"]
        assert rows[0] != rows[-1], rows
        rows[0], rows[-1] = rows[-1], rows[0]
        expected = f"record batch 0 has {rows[-1]} rows, the manifest says {rows[0]}"
    folder.write_atomic("manifest.json", json.dumps(doc).encode())

    report = admin.verify(root=root)
    assert not report.ok and [c.snapshot.id for c in report.failed] == [snap.id]
    [problem] = report.failed[0].problems
    assert shard["path"] in problem and expected in problem, problem
    assert "snapcache purge" in problem and "rerun the pipeline" in problem
    with pytest.raises(sc.CorruptSnapshotError, match=expected):  # what verify spares readers
        list(ds)


def test_purge_needs_a_selection(root, three):
    with pytest.raises(ValueError, match="nothing selected"):
        sc.purge(root)
    with pytest.raises(ValueError, match="invalid size '12XB'"):
        sc.purge(root, max_size="12XB")


def test_purge_dry_run_then_older_than(root, three):
    plan = sc.purge(root, older_than="7d", dry_run=True)
    assert sorted(i.snapshot.name for i in plan.deleted) == ["mid", "old"]
    assert plan.freed_bytes == sum(i.snapshot.size_bytes for i in plan.deleted)
    assert all(exists(root, fid) for fid in three.values())
    report = sc.purge(root, older_than=30 * 86400)
    assert [i.snapshot.name for i in report.deleted] == ["old"]
    assert not exists(root, three["old"]) and exists(root, three["mid"])


def test_purge_max_size_evicts_least_recently_used_abandoned_first(root, three):
    abandoned_write(root, "a" * 32)
    total = sum(s.size_bytes for s in sc.ls(root))
    sizes = {s.name: s.size_bytes for s in sc.ls(root)}
    budget = total - sizes[None] - sizes["old"] - 1  # the abandoned write and "old": not enough
    report = sc.purge(root, max_size=budget, dry_run=True)
    assert [i.snapshot.name for i in report.deleted] == [None, "old", "mid"]
    assert report.budget_met and report.size_after <= budget
    assert sc.purge(root, max_size=0, dry_run=True).size_after == 0


def test_purge_incomplete_only_takes_abandoned_writes(root, three):
    abandoned_write(root, "a" * 32)
    live_lease(root, "b" * 32, kind="write")
    report = sc.purge(root, incomplete=True)
    assert [i.snapshot.id for i in report.deleted] == ["a" * 32]
    assert not exists(root, "a" * 32) and exists(root, "b" * 32)


def test_purge_keeps_leased_snapshots_unless_forced(root, three):
    live_lease(root, three["old"])
    report = sc.purge(root, ids=["old"])
    assert not report.deleted and "read lease of pid" in report.kept[0].reason
    assert exists(root, three["old"], "manifest.json")
    report = sc.purge(root, max_size=0)
    assert {i.snapshot.name for i in report.deleted} == {"new", "mid"}
    assert report.budget_met is False
    assert sc.purge(root, ids=["old"], force=True).deleted
    assert not exists(root, three["old"])


def test_purge_deletes_the_manifest_first(root, three, monkeypatch):
    def crash(self, rel, recursive=False):
        if recursive:
            raise PermissionError("simulated crash half-way")
        os.remove(self.full(rel))

    monkeypatch.setattr(Storage, "remove", crash)
    report = sc.purge(root, ids=["old"])
    assert not report.deleted and "could not delete" in report.kept[0].reason
    monkeypatch.undo()
    states = {s.id: s.state for s in sc.ls(root)}
    assert states[three["old"]] == "abandoned"  # never a valid-looking snapshot
    assert sc.purge(root, incomplete=True).deleted


def test_purge_puts_the_manifest_back_if_a_reader_arrives(root, three, monkeypatch):
    purge_module = importlib.import_module("snapcache.admin.purge")
    from snapcache.store.protocol import LeaseInfo

    calls = []
    reader = LeaseInfo("read", "r", "host", 1, 0.0, 30.0, name="reader-r.json")

    def leases(folder):
        calls.append(folder.url)
        return [] if len(calls) == 1 else [reader]

    monkeypatch.setattr(purge_module, "live_leases", leases)
    report = sc.purge(root, ids=["old"])
    assert not report.deleted and "just now" in report.kept[0].reason
    assert admin.info(root, "old").state == "committed"


def test_purge_tidies_leftovers_of_committed_snapshots(root, three):
    folder = Storage(root).child(three["new"])
    folder.write_atomic("progress-0001-0000-0badc0de.json", b"{}")
    folder.write_atomic("0badc0de-0000-000000.arrow", b"x" * 100)
    mine = live_lease(root, three["new"])
    report = sc.purge(root, incomplete=True)
    assert sorted(report.tidied) == [f"{three['new']}/0badc0de-0000-000000.arrow",
                                     f"{three['new']}/progress-0001-0000-0badc0de.json"]
    assert report.tidied_bytes == 102 and folder.exists(mine)
    assert admin.verify(root, ["new"]).ok


def shards_of(folder: str, version: int) -> set[str]:
    with open(os.path.join(folder, f"manifest-{version:06d}.json")) as f:
        return {shard["path"] for shard in json.load(f)["shards"]}


@pytest.mark.parametrize("damage", ["truncated", "newer format"])
def test_purge_never_tidies_what_an_unreadable_version_may_list(tmp_path, root, damage,
                                                                caplog):
    """An old version whose manifest this release cannot read (damaged, or written by a newer
    snapcache) may list any shard: tidying the lineage keeps every shard, and `ls` names the
    version (no raw log line); `--old-versions` removes a damaged one, never a newer one's."""
    fid, folder = two_versions(tmp_path, root)
    only_v1 = shards_of(folder, 1) - shards_of(folder, 2)
    assert only_v1
    path = os.path.join(folder, "manifest-000001.json")
    if damage == "truncated":
        os.truncate(path, 60)
    else:
        with open(path) as f:
            doc = json.load(f)
        doc["format_version"] = 4
        with open(path, "w") as f:
            json.dump(doc, f)
    caplog.set_level(logging.WARNING)
    for criteria in (dict(incomplete=True), dict(older_than="30d")):
        report = sc.purge(root, **criteria)
        assert not report.deleted and not report.tidied, report
    assert all(os.path.exists(os.path.join(folder, name)) for name in only_v1)
    [snap] = sc.ls(root)
    assert snap.state == "committed" and [u.version for u in snap.unreadable_versions] == [1]
    assert snap.unreadable_versions[0].newer == (damage == "newer format")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    listed = run_cli("ls", root).stdout
    said = "newer format version 1 of" if damage == "newer format" else "unreadable version 1 of"
    assert f"{said} {fid[:12]}: " in listed, listed
    report = sc.purge(root, old_versions=True)
    if damage == "truncated":  # the way out its message names
        assert [old.versions for old in report.old_versions] == [(1,)]
        assert not any(os.path.exists(os.path.join(folder, name)) for name in only_v1)
        assert sc.verify(root).ok
    else:
        assert not report.old_versions and "newer snapcache" in report.kept[0].reason
        assert os.path.exists(path) and all(
            os.path.exists(os.path.join(folder, name)) for name in only_v1)


@pytest.mark.parametrize("version", [2, 1])
@pytest.mark.parametrize("damage", ["a flipped bit", "deleted"])
def test_verify_checks_each_versions_source_record(tmp_path, root, version, damage):
    """The source record of a delta snapshot's version (units-<v>-<run>.arrow) is checked
    against the manifest's record_checksum: the next build of a changed source needs the
    newest one. The advice names what works: on_corrupt="rebuild" (the newest), or
    `purge --old-versions` (an old one)."""
    fid, folder = two_versions(tmp_path, root)
    assert sc.verify(root).ok
    [record] = glob.glob(os.path.join(folder, f"units-{version:06d}-*.arrow"))
    if damage == "deleted":
        os.remove(record)
    else:
        with open(record, "r+b") as f:
            f.seek(os.path.getsize(record) // 2)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 1]))
    report = sc.verify(root)
    assert not report.ok
    [check] = report.failed
    [problem] = check.problems
    assert os.path.basename(record) in problem and f"version {version}" in problem
    assert "purge version" not in problem  # no command does that
    if version == 2:
        assert 'on_corrupt="rebuild"' in check.advice and "--old-versions" not in check.advice
    else:
        assert f"`snapcache purge {root} --old-versions`" in check.advice
        assert "on_corrupt" not in check.advice


def test_info_and_open_snapshot_of_a_root_count_only_snapshot_folders(tmp_path, root):
    """A user's folder named by 32 hex digits is no snapshot (`ls` does not list it): a root
    holding one snapshot beside it has exactly one, a root holding only it has none."""
    user = "0123456789abcdef" * 2
    fid = make_snapshot(root, "only")
    for where in (root, str(tmp_path / "alone")):
        os.makedirs(os.path.join(where, user))
        with open(os.path.join(where, user, "notes.txt"), "w") as f:
            f.write("my notes\n")
    assert admin.info(root).id == fid
    assert sc.open_snapshot(root).id == fid
    with pytest.raises(sc.SnapshotNotFoundError, match="no snapshot '0123'"):
        sc.open_snapshot(root, "0123")
    alone = str(tmp_path / "alone")
    assert sc.ls(alone) == []
    with pytest.raises(ValueError, match="no snapshots in"):
        admin.info(alone)
    with pytest.raises(sc.SnapshotNotFoundError, match="no snapshot in"):
        sc.open_snapshot(alone)
