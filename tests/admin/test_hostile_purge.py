"""Purge never deletes outside the root; temporary files and abandoned uploads are found."""

from __future__ import annotations

import errno
import importlib
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

import snapcache as sc
from admin_fixtures import (abandoned_write, expected_example, live_lease, make_snapshot,
                            run_cli, set_last_used)
from snapcache.errors import StoreError


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

    out = run_cli("ls", "--root", root)
    assert f"{fp[:12]} is a symbolic link to {os.path.realpath(target)}" in out.stdout

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


# -- temporary files -------------------------------------------------------------------------

def test_every_temporary_file_has_one_pattern():
    from snapcache.store import layout

    name = layout.tmp_name("manifest.json")
    assert re.fullmatch(r"manifest\.json\.[0-9a-f]{16}\.tmp", name) and layout.is_tmp(name)
    shard = layout.tmp_name(layout.shard_name("0123abcd", 0, 1))
    assert layout.is_tmp(shard) and layout.run_of(shard) == "0123abcd"
    assert layout.tmp_name("x") != layout.tmp_name("x")


def _fsync_failing_for(name):
    real = os.fsync

    def fsync(fd):
        if name in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd)
    return fsync


def test_disk_full_at_manifest_creation_leaves_no_tmp_and_no_thread_traceback(
        tmp_path, root, monkeypatch):
    uncaught = []
    monkeypatch.setattr(threading, "excepthook", uncaught.append)
    monkeypatch.setattr(os, "fsync", _fsync_failing_for("manifest.json"))
    ds = sc.Dataset.range(50).map(lambda i: {"x": i}).snapshot(root, progress=False)
    with pytest.raises(StoreError, match="No space left on device.*Nothing was committed"):
        list(ds)
    [folder] = os.listdir(root)
    left = os.listdir(os.path.join(root, folder))
    assert "manifest.json" not in left and [n for n in left if n.endswith(".tmp")] == []
    assert uncaught == []
    monkeypatch.undo()
    assert list(ds) == [{"x": i} for i in range(50)]     # the next run commits


def _age(path, seconds):
    when = time.time() - seconds
    os.utime(path, (when, when))


def test_purge_reads_lease_ttl_as_people_type_it(root):
    """A temporary file is stale once older than ``lease_ttl``: given as "5m" it is 300 s."""
    from snapcache.store import layout

    folder = os.path.join(root, make_snapshot(root, "snap"))
    path = os.path.join(folder, layout.tmp_name("x.arrow"))
    with open(path, "wb") as f:
        f.write(b"partial")
    _age(path, 120)
    assert sc.purge(root, incomplete=True, lease_ttl="5m").tidied == ()
    with pytest.raises(ValueError, match="lease_ttl must be a positive number of seconds"):
        sc.purge(root, incomplete=True, lease_ttl="soon")
    assert os.path.exists(path)
    assert len(sc.purge(root, incomplete=True, lease_ttl="1m").tidied) == 1
    assert not os.path.exists(path)


def test_purge_incomplete_removes_stale_temporary_files_and_ls_counts_them(root):
    fp = make_snapshot(root, "snap")
    folder = os.path.join(root, fp)
    from snapcache.store import layout

    stale = [os.path.join(folder, layout.tmp_name(n)) for n in ("manifest.json", "x.arrow")]
    fresh = os.path.join(folder, layout.tmp_name("progress-0001-0000-0123abcd.json"))
    for path in stale + [fresh]:
        with open(path, "wb") as f:
            f.write(b"partial")
    for path in stale:
        _age(path, 3600)
    [snap] = sc.ls(root)
    assert snap.tmp_files == 3 and snap.to_json()["tmp_files"] == 3
    out = run_cli("ls", "--root", root)
    assert "3 temporary files" in out.stdout and "purge --incomplete" in out.stdout

    assert sc.purge(root, older_than="7d").tidied == ()      # only --incomplete touches them
    report = sc.purge(root, incomplete=True)
    assert sorted(report.tidied) == sorted(f"{fp}/{os.path.basename(p)}" for p in stale)
    assert not any(os.path.exists(p) for p in stale) and os.path.exists(fresh)
    assert [e["i"] for e in sc.Dataset.range(40).map(lambda i: expected_example(i))
            .snapshot(root, key="snap")] == list(range(40))


def test_temporary_files_of_a_live_writer_are_kept(root):
    fp = "d" * 32
    live_lease(root, fp, kind="write")
    from snapcache.store import layout

    path = os.path.join(root, fp, layout.tmp_name("x.arrow"))
    with open(path, "wb") as f:
        f.write(b"partial")
    _age(path, 3600)
    report = sc.purge(root, incomplete=True)
    assert report.tidied == () and os.path.exists(path)


# -- S3 multipart uploads --------------------------------------------------------------------

KILLED_UPLOAD = """
import os, signal, sys
from snapcache.store.fs import Storage
storage = Storage(sys.argv[1])
# a shard upload as s3fs does it for a large file: parts of at least 5 MB (smallest allowed)
f = storage.fs.open(storage.full(sys.argv[2]), "wb", block_size=5 << 20)
f.write(b"x" * (6 << 20))
f.flush()                      # a multipart upload is started and its first part sent
os.kill(os.getpid(), signal.SIGKILL)   # killed mid-upload, as a preempted writer would be
"""


def test_purge_incomplete_aborts_abandoned_multipart_uploads(s3_root):
    from snapcache.store.fs import Storage

    fp = make_snapshot(s3_root, "snap")
    key = f"{fp}/0123abcd-0000-000001.arrow"
    proc = subprocess.run([sys.executable, "-c", KILLED_UPLOAD, s3_root, key],
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert proc.returncode == -signal.SIGKILL
    storage = Storage(s3_root)
    [upload] = storage.incomplete_uploads()
    assert upload.path == key

    # (moto reports every upload as started in 2010, so only "older than the ttl" is seen here;
    # the ttl gate itself is the one of temporary files, tested above on local disk)
    dry = sc.purge(s3_root, incomplete=True, dry_run=True)
    assert len(dry.aborted_uploads) == 1 and storage.incomplete_uploads() == [upload]
    report = sc.purge(s3_root, incomplete=True)
    [text] = report.aborted_uploads
    assert key in text and "multipart upload started" in text
    assert storage.incomplete_uploads() == []
    assert [s.state for s in sc.ls(s3_root)] == ["committed"]


# -- folders that are not snapcache's ----------------------------------------------------------

def user_folder(root, name, files=("notes.txt",)):
    folder = os.path.join(root, name)
    os.makedirs(folder, exist_ok=True)
    for file in files:
        path = os.path.join(folder, file)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write("my notes, not a snapshot")
        _age(path, 100 * 86400)
    return folder


@pytest.mark.parametrize("name", ["20240101", "deadbeefcafe", "a" * 32, "b" * 64])
def test_a_user_folder_named_in_hex_is_no_snapshot_and_no_purge_touches_it(root, name):
    """Snapshot folders are 32 hex digits and hold snapcache's files: a folder named like a
    date or a hash, holding only its owner's files (older than any age limit), is not listed
    and survives every purge (an audit found `20240101/notes.txt` deleted as an abandoned
    write)."""
    fp = make_snapshot(root, "snap")
    folder = user_folder(root, name, ["notes.txt", "sub/more.txt"])
    assert [s.id for s in sc.ls(root)] == [fp]
    for criteria in ({"incomplete": True}, {"max_size": 0}, {"older_than": "1d"}):
        report = sc.purge(root, dry_run=True, **criteria)
        assert name not in {i.snapshot.id for i in report.deleted + report.kept}, criteria
    proc = run_cli("purge", root, "--incomplete", "--max-size", "0", "--yes")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(os.listdir(folder)) == ["notes.txt", "sub"] and not os.path.exists(
        os.path.join(root, fp))
    proc = run_cli("purge", root, name[:8])
    assert proc.returncode == 2 and "no snapshot" in proc.stderr


def test_a_snapshot_folder_holding_other_files_is_left_alone_with_them_named(root):
    """An abandoned write with a user's file in it is "not a snapshot, left alone", whatever
    selects it (also --force); a committed snapshot holding one too. ls says so."""
    abandoned_write(root, "ab" * 16)
    user_folder(root, "ab" * 16, ["notes.txt"])
    fp = make_snapshot(root, "snap")
    user_folder(root, fp, ["README.md"])
    [snap, mixed] = sc.ls(root)
    assert (mixed.state, mixed.foreign_files) == ("abandoned", ("notes.txt",))
    assert snap.foreign_files == ("README.md",) and snap.to_json()["foreign_files"] == [
        "README.md"]
    out = run_cli("ls", root).stdout
    assert "abababababab holds 1 file snapcache does not write (notes.txt): purge leaves it " \
           "alone" in out
    assert "abandoned writes hold" not in out

    report = sc.purge(root, incomplete=True, max_size=0, ids=[fp], force=True)
    assert report.deleted == ()
    reasons = {item.snapshot.id: item.reason for item in report.kept}
    assert reasons["ab" * 16].startswith("not a snapshot, left alone: it holds files snapcache "
                                         "does not write (notes.txt)")
    assert reasons[fp].startswith("not only a snapshot, left alone") and "README.md" in \
        reasons[fp] and "move them out of the folder" in reasons[fp]
    proc = run_cli("purge", root, "--incomplete")
    assert proc.returncode == 1 and "not a snapshot, left alone" in proc.stdout
    assert sorted(os.listdir(os.path.join(root, "ab" * 16))) == [
        "0badc0de-0000-000000.arrow", "lease-0001-0000-000001.json", "notes.txt",
        "progress-0001-0000-0badc0de.json"]
    os.unlink(os.path.join(root, "ab" * 16, "notes.txt"))  # moved out: purge may go on
    assert [i.snapshot.id for i in sc.purge(root, incomplete=True).deleted] == ["ab" * 16]


def test_a_file_put_in_a_folder_while_purge_runs_keeps_it(root, monkeypatch):
    """The folder is looked at again just before it goes."""
    purge_module = importlib.import_module("snapcache.admin.purge")
    abandoned_write(root, "cd" * 16)
    real_scan = purge_module.scan

    def scan_then_a_user_writes(storage):
        found = real_scan(storage)
        user_folder(root, "cd" * 16, ["late.txt"])
        return found

    monkeypatch.setattr(purge_module, "scan", scan_then_a_user_writes)
    report = sc.purge(root, incomplete=True)
    assert report.deleted == () and "late.txt" in report.kept[0].reason
    assert os.path.exists(os.path.join(root, "cd" * 16, "late.txt"))


def test_tidying_a_committed_snapshot_removes_only_snapcache_files(root):
    fp = make_snapshot(root, "snap")
    names = ["progress-report.json", "stream-of-thought.json", "lease-notes.json"]
    user_folder(root, fp, names)
    leftover = os.path.join(root, fp, "progress-0001-0000-0123abcd.json")
    with open(leftover, "w") as f:
        f.write("{}")
    report = sc.purge(root, older_than="1000d")
    assert report.tidied == (f"{fp}/progress-0001-0000-0123abcd.json",)
    assert all(os.path.exists(os.path.join(root, fp, name)) for name in names)


def test_every_file_snapcache_writes_in_a_snapshot_folder_is_recognised():
    from snapcache.store import layout
    from snapcache.store.protocol import versions

    shard = layout.shard_name("0badc0de", 1, 2)
    ours = [layout.MANIFEST, layout.LAST_USED, shard, layout.pages_name(shard),
            layout.progress_name(4, 3, "0badc0de"), layout.marker_name(4, 3),
            "lease-0004-0003-000002.json", "reader-0badc0de.json",
            "progress-000004-000003-0badc0de.json",  # a delta build's, per task
            versions.manifest_name(7), versions.units_name(7, "0badc0de"),
            versions.segment_name("0badc0de", 5)]
    ours += [layout.tmp_name(n) for n in ours] + [n + ".tmp" for n in ours]  # older: <n>.tmp
    assert [n for n in ours if not layout.is_own_file(n)] == []
    theirs = ["notes.txt", "manifest.json.bak", "data.arrow", "sub/manifest.json",
              "0badc0de-0001-000002.arrow.orig", "x.tmp", "progress-report.json"]
    assert [n for n in theirs if layout.is_own_file(n)] == []
    assert layout.is_fingerprint("0123456789abcdef" * 2)
    assert not any(map(layout.is_fingerprint, ["20240101", "0123abcd" * 3, "f" * 64, "A" * 32]))
