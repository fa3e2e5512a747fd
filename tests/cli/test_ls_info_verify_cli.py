"""`snapcache ls / info / verify` through the console script, on local disk and S3."""

from __future__ import annotations

import json
import os

import pytest

from admin_fixtures import (abandoned_write, assert_one_line_error, end, live_lease,
                            make_snapshot, run_cli, set_last_used, stopped_writer, two_versions)
from snapcache.store import layout
from snapcache.store.fs import Storage


@pytest.fixture(params=["local", "s3"])
def any_root(request, root):
    return root if request.param == "local" else request.getfixturevalue("s3_root")


@pytest.fixture
def filled(any_root):
    """Two committed snapshots ("train" used 3 days ago, "val" today) and an abandoned write."""
    ids = {"train": make_snapshot(any_root, "train", 60), "val": make_snapshot(any_root, "val")}
    set_last_used(any_root, ids["train"], 3)
    abandoned_write(any_root, "ab" * 16)
    return any_root, ids


def test_ls_table_and_json(filled):
    root, ids = filled
    proc = run_cli("ls", root)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"snapshots in {root}"
    assert lines[1].split()[:4] == ["ID", "NAME", "STATE", "EXAMPLES"]
    rows = [line.split() for line in lines[2:5]]
    assert [(r[0], r[1], r[2]) for r in rows] == [
        (ids["val"][:12], "val", "committed"), (ids["train"][:12], "train", "committed"),
        ("abababababab", "-", "abandoned")]
    assert "3 days ago" in lines[3] and "range(0, 60) -> map `make_snapshot" in lines[3]
    assert lines[5].split()[:2] == ["3", "total"] and "100" in lines[5]  # 60 + 40 examples
    assert "purge --incomplete" in proc.stdout and proc.stdout == "\n".join(
        line.rstrip() for line in proc.stdout.splitlines()) + "\n"

    doc = json.loads(run_cli("ls", "--root", root, "--json").stdout)
    assert doc["root"] == root and doc["totals"]["snapshots"] == 3
    by_name = {s["name"]: s for s in doc["snapshots"]}
    train = by_name["train"]
    assert train["id"] == ids["train"] and train["num_examples"] == 60
    assert train["state"] == "committed" and train["size_bytes"] > 0
    assert train["compression_ratio"] > 0 and train["last_used"] < by_name["val"]["last_used"]
    assert by_name[None]["state"] == "abandoned"
    assert doc["totals"]["size_bytes"] == sum(s["size_bytes"] for s in doc["snapshots"])


def test_ls_shows_a_snapshot_being_read(root):
    fid = make_snapshot(root, "busy")
    live_lease(root, fid)
    proc = run_cli("ls", root)
    assert "committed (being read)" in proc.stdout
    assert json.loads(run_cli("ls", root, "--json").stdout)["snapshots"][0]["live_leases"]


def test_ls_default_root_from_environment(tmp_path):
    make_snapshot(str(tmp_path), "env")
    proc = run_cli("ls", env={"SNAPCACHE_ROOT": str(tmp_path)})
    assert proc.returncode == 0 and " env " in proc.stdout


def test_info_by_prefix(filled):
    root, ids = filled
    proc = run_cli("info", ids["train"][:5], "--root", root)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith(f"snapshot {ids['train'][:12]} (train)")
    for fragment in ("examples   60 in", "schema (dict)", "x      tensor", "int64",
                     "(16,)", "i      scalar (python)", "shards (", "xxh3_64:",
                     "fingerprint snapshot key", "key: train"):
        assert fragment in out, (fragment, out)
    doc = json.loads(run_cli("info", "val", "--root", root, "--json").stdout)
    assert doc["id"] == ids["val"] and doc["manifest"]["num_examples"] == 40


def test_info_of_an_abandoned_write(filled):
    root, _ = filled
    proc = run_cli("info", "abab", "--root", root)
    assert proc.returncode == 0 and "abandoned" in proc.stdout and "3 files" in proc.stdout


def test_info_errors_are_one_line(filled):
    root, ids = filled
    abandoned_write(root, "ab" * 15 + "cd")
    assert_one_line_error(run_cli("info", "ab", "--root", root), "'ab' is ambiguous",
                          "matches 2 snapshots")
    assert_one_line_error(run_cli("info", "ffffffff", "--root", root), "no snapshot 'ffffffff'")


def test_verify_ok_and_after_a_flipped_byte(filled):
    root, ids = filled
    proc = run_cli("verify", "--root", root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all 2 snapshots match their checksums" in proc.stdout
    assert "verifying" in proc.stderr  # plain progress lines: stderr is not a terminal
    info = json.loads(run_cli("info", "train", "--root", root, "--json").stdout)
    shard = info["manifest"]["shards"][1]["path"]
    folder = Storage(root).child(ids["train"])
    data = bytearray(folder.read_bytes(shard))
    data[100] ^= 0x01
    folder.write_atomic(shard, bytes(data))
    proc = run_cli("verify", "--root", root)
    assert proc.returncode == 1
    assert f"FAILED {ids['train'][:12]} (train)" in proc.stdout
    assert shard in proc.stdout and "checksum" in proc.stdout
    assert "1 of 2 snapshots failed verification" in proc.stdout
    proc = run_cli("verify", "val", "--root", root, "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["ok"] is True


def test_bad_input_is_one_line_without_traceback(tmp_path, root):
    make_snapshot(root, "one")
    missing = str(tmp_path / "missing")
    assert_one_line_error(run_cli("ls", missing), "snapcache ls: error:", "does not exist")
    assert_one_line_error(run_cli("verify", "nope", "--root", root), "no snapshot 'nope'")
    assert_one_line_error(run_cli("purge", "--max-size", "12XB", "--root", root),
                          "invalid size '12XB': use a number with B, KB, MB, GB, TB (or KiB")
    assert_one_line_error(run_cli("purge", "--older-than", "7x", "--root", root),
                          "invalid duration '7x'")
    assert_one_line_error(run_cli("purge", "--root", root), "say what to purge")
    assert_one_line_error(run_cli("info", "x", "--root", missing), "does not exist")
    assert_one_line_error(run_cli("ls", root, "--root", missing), "two roots given")


def test_s3_bucket_that_does_not_exist(s3_root):
    proc = run_cli("ls", "s3://snapcache-no-such-bucket-4242/snaps")
    assert_one_line_error(proc, "does not exist")


def test_verify_reports_and_repairs_damaged_page_checksum_files(root):
    """A page checksum file beside a sound shard is an index, not data: verify names a missing
    or damaged one without failing, and --repair-index rewrites it, byte for byte what the
    writer wrote (its content is pinned by the manifest's pages_checksum)."""
    snap = make_snapshot(root, "raw", 60)
    info = json.loads(run_cli("info", "raw", "--root", root, "--json").stdout)
    shards = [s["path"] for s in info["manifest"]["shards"]]
    assert len(shards) >= 2 and all(s.get("pages_checksum") for s in info["manifest"]["shards"])
    folder = Storage(root).child(snap)
    tables = {s: folder.read_bytes(layout.pages_name(s)) for s in shards}
    folder.remove(layout.pages_name(shards[0]))
    damaged = bytearray(tables[shards[1]])
    damaged[3] ^= 0x10
    folder.write_atomic(layout.pages_name(shards[1]), bytes(damaged))

    proc = run_cli("verify", "--root", root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "the snapshot matches its checksums" in proc.stdout
    assert f"index shard {shards[0]!r}: page checksum file missing" in proc.stdout
    assert f"index shard {shards[1]!r}: page checksum file damaged" in proc.stdout
    assert "2 page checksum files missing or damaged" in proc.stdout
    assert "--repair-index" in proc.stdout
    report = json.loads(run_cli("verify", "--root", root, "--json").stdout)
    assert report["ok"] and len(report["snapshots"][0]["index_problems"]) == 2

    proc = run_cli("verify", "--root", root, "--repair-index")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("rewritten from the verified shard") == 2
    assert {s: folder.read_bytes(layout.pages_name(s)) for s in shards} == tables
    proc = run_cli("verify", "--root", root)
    assert proc.returncode == 0 and "index" not in proc.stdout and "repaired" not in proc.stdout
    assert not [name for name in os.listdir(folder.root) if layout.is_tmp(name)]


def test_verify_of_a_damaged_shard_does_not_touch_its_page_checksum_file(root):
    snap = make_snapshot(root, "raw", 60)
    info = json.loads(run_cli("info", "raw", "--root", root, "--json").stdout)
    shard = info["manifest"]["shards"][0]["path"]
    folder = Storage(root).child(snap)
    folder.remove(layout.pages_name(shard))
    data = bytearray(folder.read_bytes(shard))
    data[200] ^= 0x01
    folder.write_atomic(shard, bytes(data))
    proc = run_cli("verify", "--root", root, "--repair-index")
    assert proc.returncode == 1 and "checksum" in proc.stdout
    assert "repaired" not in proc.stdout and not folder.exists(layout.pages_name(shard))


def test_a_missing_default_root_says_it_is_the_default_and_how_to_choose(tmp_path):
    """The first command a new user types after the demo, on a fresh machine."""
    env = {"HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": "", "SNAPCACHE_ROOT": ""}
    proc = run_cli("ls", env=env)
    default = tmp_path / "home" / ".cache" / "snapcache"
    assert_one_line_error(proc, f"the default snapshot root {default} does not exist",
                          "the first `.snapshot()` without a path creates it",
                          "pass a root (`snapcache ls ROOT`) or set $SNAPCACHE_ROOT")


def test_a_snapshot_folder_given_as_the_root(any_root):
    root = any_root
    fid = make_snapshot(root, "train")
    folder = f"{root}/{fid}"
    proc = run_cli("ls", folder)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"{folder} is the folder of one snapshot, in root {root}"
    assert lines[2].split()[:3] == [fid[:12], "train", "committed"]
    doc = json.loads(run_cli("ls", folder, "--json").stdout)
    assert doc["root"] == root and [s["id"] for s in doc["snapshots"]] == [fid]
    for args in ([folder], [root]):  # the snapshot's folder, or a root holding only it
        proc = run_cli("info", *args)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith(f"snapshot {fid[:12]} (train)\nid         {fid}")
    proc = run_cli("verify", folder)
    assert proc.returncode == 0 and f"ok     {fid[:12]} (train)" in proc.stdout, proc.stderr
    assert_one_line_error(run_cli("purge", folder, "--older-than", "1d"),
                          f"{folder} is the folder of snapshot {fid[:12]}, not a snapshot root",
                          f"(`snapcache purge {root} {fid[:12]}`)")


def test_info_without_an_id_on_a_root_of_several_names_them(filled):
    root, ids = filled
    assert_one_line_error(run_cli("info", root), f"{root} holds 3 snapshots (",
                          f"{ids['val'][:12]} (val)", "give one id")
    assert_one_line_error(run_cli("info", root, "train", "val"),
                          "`snapcache info` takes one snapshot id (or name)")


def test_a_mistyped_root_taken_for_an_id_says_so(root):
    """`snapcache verify snpas`: not a path, so an id in the default root; say both readings."""
    make_snapshot(root, "train")
    proc = run_cli("verify", "snpas", env={"SNAPCACHE_ROOT": root})
    assert_one_line_error(proc, f"no snapshot 'snpas' in {root}",
                          "if 'snpas' is meant as a root folder, it does not exist")
    proc = run_cli("verify", "snpas", "--root", root)  # the root was given: an id, surely
    assert_one_line_error(proc, f"no snapshot 'snpas' in {root}")
    assert "root folder" not in proc.stderr


def test_a_damaged_old_version_is_that_versions_damage(tmp_path, root):
    """A truncated old version manifest of a delta snapshot (its newest version reads fine):
    verify reports it as that snapshot's problem and checks the root's other snapshots, info
    shows the snapshot, ls says it under the table (no raw log line), and the way out each
    names, `purge --old-versions`, works."""
    sound = make_snapshot(root, "sound")
    fid, folder = two_versions(tmp_path, root)
    os.truncate(os.path.join(folder, "manifest-000001.json"), 60)

    proc = run_cli("verify", root, "--json")
    assert proc.returncode == 1, proc.stderr
    checks = {c["id"]: c for c in json.loads(proc.stdout)["snapshots"]}
    assert checks[sound]["ok"] is True and checks[sound]["shards_checked"] > 0
    assert checks[fid]["ok"] is False and checks[fid]["shards_checked"] > 0
    [problem] = checks[fid]["problems"]
    assert "manifest-000001.json" in problem and "Version 1 is an old version" in problem
    assert f"`snapcache purge {root} --old-versions`" in problem
    assert f"`snapcache purge {root} --old-versions`" in checks[fid]["advice"]
    proc = run_cli("verify", root)
    assert proc.returncode == 1 and f"ok     {sound[:12]} (sound)" in proc.stdout
    assert proc.stdout.splitlines()[-1].startswith(
        f"1 of 2 snapshots failed verification: `snapcache purge {root} --old-versions`")

    proc = run_cli("info", root, fid[:8])
    assert proc.returncode == 0, proc.stderr
    assert "versions   1, 2 (newest 2; version 1 unreadable: see problem)" in proc.stdout
    assert "problem    version 1: " in proc.stdout
    for args in ([], ["--json"]):
        proc = run_cli("ls", root, *args)
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert f"unreadable version 1 of {fid[:12]}: " in run_cli("ls", root).stdout
    [listed] = [s for s in json.loads(proc.stdout)["snapshots"] if s["id"] == fid]
    assert listed["state"] == "committed" and listed["unreadable_versions"][0]["version"] == 1

    proc = run_cli("purge", root, "--old-versions")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert f"removed version 1 of {fid[:12]} (logs)" in proc.stdout
    proc = run_cli("verify", root)
    assert proc.returncode == 0 and "all 2 snapshots match their checksums" in proc.stdout


def test_verify_and_explain_never_advise_purging_a_newer_release_snapshot(root):
    """A snapshot in a format this release does not know is a newer release's, not damaged:
    verify skips it (exit 0) saying so, explain says to upgrade; neither says to purge or
    rebuild it."""
    import snapcache as sc

    fid = make_snapshot(root, "newer")
    path = os.path.join(root, fid, "manifest.json")
    with open(path) as f:
        doc = json.load(f)
    doc["format_version"] = 4
    with open(path, "w") as f:
        json.dump(doc, f)
    for args in ([], [fid[:8]]):
        proc = run_cli("verify", root, *args)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stdout.startswith(f"skipped {fid[:12]}: written by a newer snapcache")
        assert "upgrade snapcache" in proc.stdout and "not damaged" in proc.stdout
        assert "snapcache purge" not in proc.stdout and "on_corrupt" not in proc.stdout
        assert "FAILED" not in proc.stdout
    [check] = json.loads(run_cli("verify", root, "--json").stdout)["snapshots"]
    assert check["ok"] is None and "newer snapcache" in check["skipped"]
    listed = run_cli("ls", root).stdout
    assert f"newer format {fid[:12]}: " in listed and "It is not damaged" in listed
    [row] = [line for line in listed.splitlines() if line.startswith(fid[:12])]
    assert "newer format" in row and "corrupt" not in listed, listed
    info = run_cli("info", root, fid[:8]).stdout
    assert "newer format" in info and "corrupt" not in info, info
    [shown] = json.loads(run_cli("ls", root, "--json").stdout)["snapshots"]
    assert shown["state"] == "corrupt" and shown["newer_format"] is True
    text = str(sc.Dataset.range(1).snapshot(root, key="newer").explain())
    assert "written by a newer snapcache" in text and "upgrade snapcache" in text
    assert "purge it" not in text


def test_verify_skips_a_snapshot_being_written(root):
    """A snapshot a live process is writing (stopped half-way, its lease live) has nothing to
    verify yet: skipped with who writes it, not FAILED, no purge advice."""
    make_snapshot(root, "done")
    writer = stopped_writer(root, 5000)
    try:
        [writing] = [s for s in json.loads(run_cli("ls", root, "--json").stdout)["snapshots"]
                     if s["state"] == "writing"]
        proc = run_cli("verify", root, writing["id"][:8])
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stdout.startswith(f"skipped {writing['id'][:12]}: being written by pid "
                                      f"{writer.pid} on ")
        assert "wait for its commit" in proc.stdout
        assert "FAILED" not in proc.stdout and "purge" not in proc.stdout
    finally:
        end(writer)


def test_info_files_of_a_snapshot_that_is_not_a_delta_snapshot(root):
    fid = make_snapshot(root, "plain")
    proc = run_cli("info", root, fid[:8], "--files")
    assert proc.returncode == 0, proc.stderr
    assert "source files (" not in proc.stdout
    assert proc.stdout.rstrip().endswith(
        f"--files: snapshot {fid[:12]} has no source file list: it is not a delta snapshot "
        "(only snapshots of from_files / from_parquet sources, built by file, record their "
        "source files)")
    proc = run_cli("info", root, fid[:8], "--files", "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["files"] is None
    assert "not a delta snapshot" in proc.stderr
