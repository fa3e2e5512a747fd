"""Failures on the wire to S3, through both clients (obstore, and s3fs as a forked DataLoader
worker uses it): a conditional create whose answer is lost is settled by reading the object
back (ours if it holds our bytes), so a commit that landed is neither reported as failed nor
left untidied, and a lease that landed is held rather than waited on; errors say what failed,
where, and what to do, the same through both clients."""

from __future__ import annotations

import numpy as np
import pytest

import s3server
import snapcache as sc
from snapcache.errors import StoreError
from snapcache.store import layout
from snapcache.store.fs import Storage
from snapcache.store.reader import load_manifest

pytestmark = pytest.mark.skipif(s3server.missing_requirements() is not None,
                                reason=str(s3server.missing_requirements()))


@pytest.fixture(params=["auto", "s3fs"])
def client(request, monkeypatch):
    monkeypatch.setenv("SNAPCACHE_S3_CLIENT", request.param)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")  # botocore's retries (s3fs), to be quick
    return request.param


def example(i):
    return {"i": i, "x": np.full(64, i, np.int64)}


def folder_of(root):
    storage = Storage(root)
    (name,) = [n for n in storage.listdir() if layout.is_fingerprint(n)]
    return storage.child(name)


def pipeline(root, **options):
    return sc.Dataset.range(300).map(example).snapshot(root, progress=False,
                                                       shard_size=8 << 10, **options)


def read_all(ds):
    return [int(e["i"]) for e in ds if (e["x"] == e["i"]).all()]


# -- the storage's conditional create --------------------------------------------------------
def test_a_create_whose_answer_is_lost_is_ours(s3_root, fault_proxy, client):
    storage = Storage(s3_root)
    fault_proxy.fail("PUT", "/a", "forward_reset")
    assert storage.create_exclusive("a", b"one") is True
    assert fault_proxy.seen("PUT", "/a")[0] == "forward_reset"
    assert storage.create_exclusive("a", b"two") is False
    assert storage.read_bytes("a") == b"one"


def test_a_create_that_never_arrived_is_sent_again(s3_root, fault_proxy, client):
    storage = Storage(s3_root)
    fault_proxy.fail("PUT", "/a", "reset")
    assert storage.create_exclusive("a", b"one") is True
    assert fault_proxy.seen("PUT", "/a") == ["reset", ""]
    assert storage.read_bytes("a") == b"one"


def test_another_writers_object_is_never_taken_for_ours(s3_root, fault_proxy, client):
    storage = Storage(s3_root)
    assert storage.create_exclusive("a", b"theirs") is True
    fault_proxy.fail("PUT", "/a", "forward_reset")  # the server says 412; nobody hears it
    assert storage.create_exclusive("a", b"ours") is False
    assert storage.read_bytes("a") == b"theirs"


def test_a_create_every_attempt_of_which_is_lost_is_an_error(s3_root, fault_proxy, client):
    storage = Storage(s3_root)
    fault_proxy.fail("PUT", "/a", "reset", times=-1)
    with pytest.raises(ConnectionError, match=f"for the PUT of {s3_root}/a"):
        storage.create_exclusive("a", b"one")
    assert not storage.exists("a")


# -- the protocol's creates: manifest, stream marker, lease -----------------------------------
@pytest.mark.parametrize("name", [layout.MANIFEST, "stream-", "lease-"])
def test_a_protocol_file_whose_answer_is_lost_commits_once_and_tidies(s3_root, fault_proxy,
                                                                       client, name):
    """The manifest: the job succeeds and the committed folder keeps no progress record or
    stream marker. A stream marker or a lease: the job goes on as their holder (with
    ``on_busy="compute"`` a lease taken for another writer's would commit nothing)."""
    fault_proxy.fail("PUT", name, "forward_reset")
    ds = pipeline(s3_root, on_busy="compute", lease_ttl=600)
    assert read_all(ds) == list(range(300))
    assert fault_proxy.seen("PUT", name)[0] == "forward_reset"
    folder = folder_of(s3_root)
    assert load_manifest(folder) is not None
    assert [n for n in folder.listdir() if n.startswith(("progress-", "stream-", "lease-"))] \
        == []
    assert read_all(pipeline(s3_root)) == list(range(300))


def test_a_commit_whose_outcome_is_unknown_says_so_and_the_next_run_commits(
        s3_root, fault_proxy, client):
    fault_proxy.fail("PUT", layout.MANIFEST, "reset", times=-1)
    with pytest.raises(StoreError, match="could not tell whether its commit reached the "
                                         "storage.*the next run reads the snapshot"):
        read_all(pipeline(s3_root))
    fault_proxy.clear()
    folder = folder_of(s3_root)
    assert load_manifest(folder) is None
    shards = sorted(n for n in folder.listdir() if n.endswith(".arrow"))
    assert read_all(pipeline(s3_root)) == list(range(300))
    assert sorted(s.path for s in load_manifest(folder).shards) == shards  # none computed again


# -- errors, the same through both clients ----------------------------------------------------
def test_shard_uploads_that_fail_fail_the_build_with_a_store_error(s3_root, fault_proxy, client):
    fault_proxy.fail("PUT", ".arrow", "reset", times=-1)
    with pytest.raises(StoreError, match=f"writing snapshot .* to {s3_root}/.* failed: could "
                                         f"not reach {fault_proxy.endpoint} for the PUT of "
                                         f"{s3_root}/.*arrow.*Nothing was committed"):
        read_all(pipeline(s3_root))


def test_a_refusal_names_the_object_and_the_credentials(s3_root, fault_proxy, client):
    read_all(pipeline(s3_root))
    fault_proxy.fail("GET", "", "status", times=-1, status=403)
    fault_proxy.fail("HEAD", "", "status", times=-1, status=403)
    with pytest.raises(PermissionError, match=f"{fault_proxy.endpoint} refused the (HEAD|GET) "
                                              f"of {s3_root}/.*/manifest.json .*check the "
                                              "credentials"):
        read_all(pipeline(s3_root))


# -- reads -----------------------------------------------------------------------------------
def test_a_shard_download_that_breaks_off_half_way_is_fetched_again(
        s3_root, fault_proxy, client):
    """A GET of a shard whose body breaks off (a connection reset) is retried by the client
    (obstore continues it, botocore sends it again); the epoch reads on."""
    assert read_all(pipeline(s3_root)) == list(range(300))
    s3server.clear_filesystem_caches()
    fault_proxy.fail("GET", ".arrow", "cut", times=2)
    assert read_all(pipeline(s3_root)) == list(range(300))  # a fresh pipeline: cold read
    assert fault_proxy.seen("GET", ".arrow")[:2] == ["cut", "cut"]
    assert len(fault_proxy.seen("GET", ".arrow")) > 2  # the continuations
