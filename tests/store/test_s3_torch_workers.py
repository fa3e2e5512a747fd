"""A warm epoch read through a torch DataLoader with worker processes makes at most one request
in total (the manifest check is shared by the epoch's workers on this node), with
``persistent_workers`` False and True; a manifest replaced or withdrawn between epochs is
noticed at the next epoch. The pipelines whose epochs' requests are counted hold their read
lease with a ttl of 600 s: it is renewed in the background every ttl / 4, on its own clock,
never within a counted epoch."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import s3server
import snapcache as sc

from test_s3_requests import LoggedServer, bucket_url, logged  # noqa: F401  (fixtures)

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(s3server.missing_requirements() is not None,
                                reason=str(s3server.missing_requirements()))


def example(i):
    return {"x": np.full(1024, i % 251, dtype=np.uint8), "i": i}


def epoch(loader):
    return sorted(int(i) for batch in loader for i in batch["i"])


@pytest.mark.parametrize("persistent", [False, True], ids=["fresh-workers", "persistent"])
def test_a_warm_epoch_with_two_workers_makes_at_most_one_request(logged, bucket_url, tmp_path,
                                                                 persistent):
    ds = sc.Dataset.range(400).map(example).snapshot(
        bucket_url, progress=False, shard_size=64 << 10, local_cache=str(tmp_path / "cache"),
        lease_ttl=600)
    assert sum(1 for _ in ds) == 400  # build
    loader = torch.utils.data.DataLoader(ds.batch(32).to_torch(), batch_size=None,
                                         num_workers=2, persistent_workers=persistent)
    assert epoch(loader) == list(range(400))  # cold: fills the local cache
    for _ in range(2):
        since = logged.mark()
        assert epoch(loader) == list(range(400))  # warm
        reqs = logged.requests(since)
        assert len(reqs) <= 1, reqs
        assert [m for m, _ in reqs] in ([], ["HEAD"]), reqs  # the epoch's manifest check


def test_the_cache_fetching_reader_goes_with_its_pipeline(logged, bucket_url, tmp_path):
    """The reader that fills the node-local cache for a loader's workers lives as long as the
    pipeline: a sweep that drops each trial's pipeline and loader keeps none of their fetch
    threads."""
    import gc
    import threading

    def fetchers():
        return [t for t in threading.enumerate() if t.name.startswith("snapcache-cache-fill")]

    before = len(fetchers())
    for trial in range(3):
        ds = sc.Dataset.range(100).map(lambda i, t=trial: example(i + t)).snapshot(
            bucket_url, progress=False, shard_size=32 << 10, local_cache=str(tmp_path / "c"))
        train = ds.batch(20).to_torch()
        loader = torch.utils.data.DataLoader(train, batch_size=None, num_workers=2)
        for _ in range(2):
            assert len(epoch(loader)) == 100
        del ds, train, loader
    gc.collect()
    for thread in fetchers():
        thread.join(30)  # a dropped reader's pool is shut down; its threads end
    assert len(fetchers()) <= before


def manifest_path(logged, bucket_url):
    fs = logged.server.filesystem()
    (path,) = [p for p in fs.find(bucket_url[len("s3://"):]) if p.endswith("/manifest.json")]
    return path


@pytest.mark.parametrize("persistent", [False, True], ids=["fresh-workers", "persistent"])
def test_a_manifest_replaced_or_withdrawn_between_epochs_is_noticed(logged, bucket_url,
                                                                     tmp_path, persistent):
    ds = sc.Dataset.range(300).map(example).snapshot(
        bucket_url, progress=False, shard_size=64 << 10, local_cache=str(tmp_path / "cache"))
    assert sum(1 for _ in ds) == 300  # build
    loader = torch.utils.data.DataLoader(ds.batch(32).to_torch(), batch_size=None,
                                         num_workers=2, persistent_workers=persistent)
    assert epoch(loader) == list(range(300))
    assert epoch(loader) == list(range(300))
    fs = logged.server.filesystem()
    path = manifest_path(logged, bucket_url)
    # replaced: the next epoch's check sees a new version and fetches it
    manifest = json.loads(fs.cat_file(path))
    manifest["name"] = "replaced"
    fs.pipe_file(path, json.dumps(manifest).encode())
    since = logged.mark()
    assert epoch(loader) == list(range(300))
    gets = [p for m, p in logged.requests(since) if m == "GET" and p.endswith("manifest.json")]
    assert gets, "the replaced manifest was not fetched"
    # withdrawn: the next epoch does not read the old shards from the local cache as if
    # committed; the snapshot is written again (by the workers, as two streams) and committed
    first_run = manifest["writer"]["run_id"]
    fs.rm(path)
    since = logged.mark()
    assert epoch(loader) == list(range(300))
    reqs = logged.requests(since)
    assert [p for m, p in reqs if m == "PUT" and p.endswith(".arrow")], reqs
    rebuilt = json.loads(fs.cat_file(manifest_path(logged, bucket_url)))
    assert rebuilt["writer"]["run_id"] != first_run


def test_workers_started_afresh_leave_no_read_lease_behind(logged, bucket_url, tmp_path):
    """A loader made before the snapshot exists: its workers build it; before it forks the
    next epoch's workers the loader's process takes the read lease, which the workers use,
    so none of theirs is left when they exit (nor is the parent's released by them)."""
    ds = sc.Dataset.range(200).map(example).snapshot(bucket_url, progress=False,
                                                     shard_size=64 << 10)
    loader = torch.utils.data.DataLoader(ds.batch(32).to_torch(), batch_size=None,
                                         num_workers=2, persistent_workers=False)
    assert epoch(loader) == list(range(200))  # the workers build it (two streams)
    assert epoch(loader) == list(range(200))  # and read it
    assert epoch(loader) == list(range(200))
    fs = logged.server.filesystem()
    folder = manifest_path(logged, bucket_url).rsplit("/", 1)[0]
    left = [json.loads(fs.cat_file(p)) for p in fs.ls(folder, refresh=True) if "/reader-" in p]
    assert [lease["pid"] for lease in left] == [os.getpid()]


def test_a_loader_made_before_the_build_holds_one_lease_for_fresh_workers(logged, bucket_url,
                                                                          tmp_path):
    """Workers started afresh each epoch by a loader made before the snapshot existed: after
    the writing epoch, the loader's process holds the read lease (taken before it forks the
    next epoch's workers), so a warm epoch is still one request."""
    ds = sc.Dataset.range(200).map(example).snapshot(
        bucket_url, progress=False, shard_size=64 << 10, local_cache=str(tmp_path / "cache"),
        lease_ttl=600)
    loader = torch.utils.data.DataLoader(ds.batch(32).to_torch(), batch_size=None,
                                         num_workers=2, persistent_workers=False)
    assert epoch(loader) == list(range(200))  # the workers build it
    since = logged.mark()
    assert epoch(loader) == list(range(200))  # read: fills the local cache
    manifest = [m for m, p in logged.requests(since) if p.endswith("/manifest.json")]
    assert manifest == ["GET", "HEAD"], manifest  # one check (new to the loader's process),
    # one look after its lease was taken (was the snapshot purged meanwhile?)
    since = logged.mark()
    assert epoch(loader) == list(range(200))  # warm
    reqs = logged.requests(since)
    assert [m for m, _ in reqs] in ([], ["HEAD"]), reqs


def _note_s3_clients(path, worker_id):
    """A worker_init_fn: any S3 client this worker asks for is noted in ``path``."""
    from snapcache.store import fs_s3

    real = fs_s3.S3Clients.client

    def client(self):
        with open(path, "a") as f:
            f.write(f"worker {worker_id}\n")
        return real(self)

    fs_s3.S3Clients.client = client


def test_fresh_workers_find_the_shards_and_the_check_the_loaders_process_made(
        logged, bucket_url, tmp_path):
    """Workers started afresh each epoch (torch's default), with a node-local cache: before
    it forks them the loader's process checks the manifest under the token they compute and
    fetches the shards into the cache in the order they need them, so they make no request
    and ask for no S3 client, cold or warm (a forked worker cannot use its parent's obstore
    runtime and would start s3fs, ~0.5 CPU s, to fetch). Without the cache they fetch the
    shards themselves (which shows the note-taking works)."""
    import functools

    def loader(**kw):
        ds = sc.Dataset.range(300).map(example).snapshot(
            bucket_url, progress=False, shard_size=64 << 10, lease_ttl=600, **kw)
        return ds, torch.utils.data.DataLoader(
            ds.batch(32).to_torch(), batch_size=None, num_workers=2, persistent_workers=False,
            worker_init_fn=functools.partial(_note_s3_clients, str(notes)))

    notes = tmp_path / "clients.txt"
    ds, cached = loader(local_cache=str(tmp_path / "cache"))
    assert sum(1 for _ in ds) == 300  # build
    since = logged.mark()
    assert epoch(cached) == list(range(300))  # cold
    shards = [p for m, p in logged.requests(since) if m == "GET" and p.endswith(".arrow")]
    assert shards and len(shards) == len(set(shards))  # each fetched once, by the loader
    assert not notes.exists(), notes.read_text()
    for _ in range(2):
        since = logged.mark()
        assert epoch(cached) == list(range(300))  # warm
        assert [m for m, _ in logged.requests(since)] == ["HEAD"]
        assert not notes.exists(), notes.read_text()
    _, uncached = loader()
    assert epoch(uncached) == list(range(300))
    assert set(notes.read_text().splitlines()) == {"worker 0", "worker 1"}


READER = r'''
import os, sys
import numpy as np
import snapcache as sc
import torch

def example(i):
    return {"x": np.full(1024, i % 251, dtype=np.uint8), "i": i}

def note(path, worker_id):
    from snapcache.store import fs_s3
    with open(path, "a") as f:
        f.write(f"{'s3fs' in sys.modules}/{fs_s3.inherited_session({}) is not None}\n")

url, notes, cache, persistent, mode = sys.argv[1:6]
ds = sc.Dataset.range(200).map(example).snapshot(url, progress=False, shard_size=64 << 10,
                                                 local_cache=None if cache == "-" else cache)
if mode == "build":
    assert sum(1 for _ in ds) == 200
    sys.exit(0)
import functools
loader = torch.utils.data.DataLoader(ds.batch(32).to_torch(), batch_size=None, num_workers=2,
                                     persistent_workers=persistent == "persistent",
                                     worker_init_fn=functools.partial(note, notes))
before = "s3fs" in sys.modules
assert sorted(int(i) for b in loader for i in b["i"]) == list(range(200))
print(f"parent before the loader: {before}")
'''


@pytest.mark.parametrize("cache,persistent,imported", [
    (False, "afresh", True), (True, "persistent", True), (True, "afresh", False)])
def test_workers_that_will_use_s3_inherit_the_s3fs_import(logged, bucket_url, tmp_path, cache,
                                                          persistent, imported):
    """A forked worker cannot use its parent's obstore runtime and reads through s3fs. Where
    workers will make requests (no node-local cache: they fetch the shards; persistent: they
    check the manifest of each later epoch), the loader's process imports s3fs before it forks
    them (once), and parses the S3 service model in a botocore session they use, so that no
    worker pays for them (~0.5 CPU s each); where the loader's
    process fetches everything for workers started afresh, it imports nothing. In fresh
    processes, which had not imported s3fs."""
    import subprocess
    import sys

    script = tmp_path / "reader.py"
    script.write_text(READER)
    env = {**os.environ, **logged.server.env}
    args = [sys.executable, str(script), bucket_url, str(tmp_path / "notes"),
            str(tmp_path / "cache") if cache else "-", persistent]
    subprocess.run(args + ["build"], env=env, check=True, timeout=300)
    done = subprocess.run(args + ["read"], env=env, check=True, timeout=300,
                          capture_output=True, text=True)
    assert "parent before the loader: False" in done.stdout, done.stdout + done.stderr
    assert (tmp_path / "notes").read_text().split() == [f"{imported}/{imported}"] * 2
