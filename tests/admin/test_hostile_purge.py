"""Purge never deletes outside the root; temporary files and abandoned uploads are found."""

from __future__ import annotations

import os

import snapcache as sc
from admin_fixtures import make_snapshot, set_last_used


def linked_snapshot(tmp_path, root):
    """A committed snapshot living on "another disk", linked into ``root`` under its id."""
    elsewhere = str(tmp_path / "other-disk")
    fp = make_snapshot(elsewhere, "outside")
    os.makedirs(root, exist_ok=True)
    os.symlink(os.path.join(elsewhere, fp), os.path.join(root, fp))
    return fp, os.path.join(elsewhere, fp)


def test_purge_of_a_symlinked_snapshot_removes_only_the_link(tmp_path, root):
    fp, target = linked_snapshot(tmp_path, root)
    inside = make_snapshot(root, "inside")
    before = sorted(os.listdir(target))
    [linked] = [s for s in sc.ls(root) if s.id == fp]
    assert linked.link_target == os.path.realpath(target) and linked.size_bytes == 0
    assert linked.state == "committed" and linked.to_json()["link_target"] == linked.link_target

    report = sc.purge(root, ids=[fp[:10]])
    [item] = report.deleted
    assert item.snapshot.id == fp and os.path.realpath(target) in item.reason
    assert "only the link is removed" in item.reason
    assert report.freed_bytes == 0
    assert not os.path.lexists(os.path.join(root, fp))
    assert sorted(os.listdir(target)) == before          # manifest and shards untouched
    assert [s.id for s in sc.ls(root)] == [inside]


def test_age_and_size_purges_never_reach_through_a_link(tmp_path, root):
    fp, target = linked_snapshot(tmp_path, root)
    set_last_used(target.rsplit(os.sep, 1)[0], fp, 100)   # written through the real path
    before = sorted(os.listdir(target))
    report = sc.purge(root, older_than="7d", max_size=0)
    assert [item.snapshot.id for item in report.deleted] == [fp] and report.freed_bytes == 0
    assert report.tidied == ()
    assert sorted(os.listdir(target)) == before
