"""Requests snapcache makes to S3, counted in the access log of a moto server of this module's
own: a held pipeline's warm epoch makes one request, a HEAD of its manifest; a build lists the snapshot
folder as often for many shards as for few; processes sharing a node-local shard cache download
each shard once between them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np
import pytest

import s3server
import snapcache as sc
from snapcache.options import ReadOptions
from snapcache.store.cache import SUFFIX as cache_suffix

pytestmark = pytest.mark.skipif(s3server.missing_requirements() is not None,
                                reason=str(s3server.missing_requirements()))
_LINE = re.compile(r'"(GET|PUT|HEAD|POST|DELETE) (\S+) HTTP/[\d.]+" (\d+)')
PARTIAL = "206"  # the status of a ranged GET
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class LoggedServer:
    def __init__(self, log):
        self.log = log
        self.server = s3server.start(log)
        self.bucket: str | None = None  # the running test's: set by the bucket_url fixture

    def mark(self) -> int:
        self.log.flush()
        return os.fstat(self.log.fileno()).st_size

    def requests(self, since: int, status: bool = False) -> list[tuple[str, ...]]:
        """(method, path) of the requests to the running test's bucket logged since
        ``since``; listings as method LIST; with ``status``, (method, path, HTTP status).
        Other buckets' are left out: the read lease of a pipeline an earlier test still holds
        is renewed in the background, on its own clock."""
        deadline = time.monotonic() + 5
        text = ""
        while time.monotonic() < deadline:  # the server logs a request after answering it
            self.log.flush()
            with open(self.log.name, "rb") as f:
                f.seek(since)
                new = f.read().decode(errors="replace")
            if new == text and new:
                break
            text = new
            time.sleep(0.3)
        out = []
        for m in _LINE.finditer(text):
            method, path = m.group(1), m.group(2)
            if self.bucket is not None and \
                    path.lstrip("/").split("?")[0].split("/")[0] != self.bucket:
                continue
            if method == "GET" and "list-type=" in path:
                method = "LIST"
            out.append((method, path, m.group(3)) if status else (method, path))
        return out


@pytest.fixture(scope="module")
def logged():
    with tempfile.NamedTemporaryFile(prefix="snapcache-moto-log-") as log:
        server = LoggedServer(log)
        try:
            yield server
        finally:
            s3server.stop(server.server.process)


@pytest.fixture
def bucket_url(logged, monkeypatch):
    for name in s3server._FOREIGN_AWS_VARS:
        monkeypatch.delenv(name, raising=False)
    for name, value in logged.server.env.items():
        monkeypatch.setenv(name, value)
    bucket = s3server.new_bucket_name()
    logged.server.filesystem().mkdir(bucket)
    s3server.clear_filesystem_caches()
    logged.bucket = bucket
    yield f"s3://{bucket}/snaps"
    logged.bucket = None
    s3server.clear_filesystem_caches()


def example(i):
    """4 KB of noise: shards are stored raw, so their count follows the example count."""
    return {"x": np.random.default_rng(i).integers(0, 256, 4096, dtype=np.uint8), "i": i}


def shard_gets(requests, ranged=False):
    """The paths of the whole-shard GETs among ``requests`` (method, path, status); with
    ``ranged``, of the ranged ones (206: a record batch read alone) instead."""
    return [path for method, path, status in requests
            if method == "GET" and path.endswith(".arrow") and (status == PARTIAL) == ranged]


@pytest.mark.parametrize("batched", [False, True], ids=["examples", "batches"])
def test_a_held_pipelines_warm_epoch_makes_one_request_a_manifest_head(logged, bucket_url,
                                                                        tmp_path, batched):
    ds = sc.Dataset.range(300).map(example).snapshot(
        bucket_url, progress=False, shard_size=256 << 10, local_cache=str(tmp_path / "cache"),
        lease_ttl=600)
    if batched:
        ds = ds.batch(64)
    assert sum(1 for _ in ds) > 0  # build
    assert sum(1 for _ in ds) > 0  # cold: fills the local cache, takes the read lease
    since = logged.mark()
    assert sum(1 for _ in ds) > 0  # warm
    reqs = logged.requests(since)
    # The read lease is held by the pipeline object and renewed in the background, every
    # ttl / 4 (150 s here: never within this epoch, however slow); no last-use record either.
    assert len(reqs) == 1, reqs
    method, path = reqs[0]
    assert method == "HEAD" and path.split("?")[0].endswith("/manifest.json"), reqs


def test_a_build_does_not_list_per_shard(logged, bucket_url):
    lists = {}
    for n in (40, 400):  # 1 shard and 10 shards of ~160 KB
        since = logged.mark()
        ds = sc.Dataset.range(n).map(example).snapshot(f"{bucket_url}-{n}", progress=False,
                                                       shard_size=160 << 10)
        assert sum(1 for _ in ds) == n
        reqs = logged.requests(since)
        shards = len([p for m, p in reqs if m == "PUT" and p.endswith(".arrow")])
        lists[shards] = len([r for r in reqs if r[0] == "LIST"])
    assert len(lists) == 2 and min(lists) < max(lists)
    few, many = (lists[k] for k in sorted(lists))
    assert many == few, lists


READER = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    import snapcache as sc
    url, cache, go = sys.argv[1:4]
    def example(i):
        return {"x": np.random.default_rng(i).integers(0, 256, 4096, dtype=np.uint8), "i": i}
    ds = sc.Dataset.range(400).map(example).snapshot(url, progress=False,
                                                     shard_size=160 << 10, local_cache=cache)
    while not os.path.exists(go):  # start together
        time.sleep(0.01)
    n = sum(int(e["i"]) for e in ds)
    print(n)
""")


def test_processes_sharing_a_local_cache_download_each_shard_once(logged, bucket_url,
                                                                   tmp_path):
    ds = sc.Dataset.range(400).map(example).snapshot(bucket_url, progress=False,
                                                     shard_size=160 << 10)
    assert sum(1 for _ in ds) == 400
    (folder,) = [p for p in logged.server.filesystem().ls(bucket_url[5:])]
    shards = [p for p in logged.server.filesystem().ls(folder) if p.endswith(".arrow")]
    assert len(shards) > 3
    cache, go = str(tmp_path / "cache"), str(tmp_path / "go")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    since = logged.mark()
    procs = [subprocess.Popen([sys.executable, "-c", READER, bucket_url, cache, go], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    time.sleep(0.5)
    open(go, "w").close()
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [e for _, e in outs]
    assert [int(o) for o, _ in outs] == [sum(range(400))] * 3
    gets = shard_gets(logged.requests(since, status=True))
    assert sorted(gets) == sorted(set(gets)), gets  # no shard fetched twice
    assert len(gets) == len(shards)


def not_leases(requests):
    """The requests that are not for a lease (renewed in the background, on its own clock)."""
    return [r for r in requests if not r[1].split("?")[0].rsplit("/", 1)[-1].startswith(
        ("reader-", "lease-"))]


def test_a_row_on_s3_is_one_ranged_get_of_its_record_batch(logged, bucket_url, tmp_path):
    """After open (which reads the manifest), the first row of a record batch is one ranged
    GET of that record batch, a later row of it none; with the shard in the node-local cache,
    no request at all. (The pipeline's read lease, renewed in the background, is not
    counted.)"""
    ds = sc.Dataset.range(300).map(example).snapshot(bucket_url, progress=False,
                                                     shard_size=256 << 10)
    assert sum(1 for _ in ds) == 300
    snap = sc.open_snapshot(bucket_url)
    shard = snap.shards[1]
    row = snap.shards[0].rows + shard.batch_rows[0]  # the first row of record batch 1
    since = logged.mark()
    assert snap[row]["i"] == row and snap[row + 1]["i"] == row + 1
    reqs = not_leases(logged.requests(since, status=True))
    assert [(m, p.split("?")[0].rsplit("/", 1)[-1], st) for m, p, st in reqs] == \
        [("GET", shard.path, PARTIAL)], reqs

    cache = str(tmp_path / "cache")
    cached = sc.open_snapshot(bucket_url, read=ReadOptions(local_cache=cache))
    assert sum(1 for _ in cached.reader()) == 300  # every shard downloaded into the cache
    fresh = sc.open_snapshot(bucket_url, read=ReadOptions(local_cache=cache))
    since = logged.mark()
    assert fresh[row]["i"] == row
    assert not_leases(logged.requests(since)) == []

    # An empty cache: the row is one ranged GET, its shard then comes whole into the cache
    # in the background (one GET), and rows of the shard's other record batches read it.
    empty = sc.open_snapshot(bucket_url, read=ReadOptions(local_cache=str(tmp_path / "c2")))
    since = logged.mark()
    assert empty[row]["i"] == row
    assert empty._row_access().reader.wait_for_cache(timeout=60)
    last = snap.shards[0].rows + shard.rows - 1  # the shard's last record batch
    assert empty[last]["i"] == last
    got = [(m, p.split("?")[0].rsplit("/", 1)[-1], st)
           for m, p, st in not_leases(logged.requests(since, status=True))]
    assert sorted(got) == sorted([("GET", shard.path, PARTIAL), ("GET", shard.path, "200")]), got

    # A damaged local copy is dropped and the record batch read from the store instead.
    [copy] = [os.path.join(d, f) for d, _, files in os.walk(tmp_path / "c2") for f in files
              if f.endswith(shard.path + cache_suffix)]
    with open(copy, "r+b") as f:
        f.seek(shard.batch_offsets[-2] + 40)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 1]))
    again = sc.open_snapshot(bucket_url, read=ReadOptions(local_cache=str(tmp_path / "c2")))
    since = logged.mark()
    assert again[last]["i"] == last
    reqs = [(m, st) for m, _, st in not_leases(logged.requests(since, status=True))]
    # then the dropped copy is fetched again in the background
    assert reqs[0] == ("GET", PARTIAL) and set(reqs[1:]) <= {("GET", "200")}, reqs


def test_a_build_makes_at_most_two_requests_per_shard(logged, bucket_url):
    """Each shard goes up whole (one PUT) from the background upload pool; the stream's
    progress record is rewritten at most once per shard; nothing else grows with the count."""
    totals, shard_puts = {}, {}
    for n in (40, 400):  # 1 shard and 10 shards of ~160 KB
        since = logged.mark()
        ds = sc.Dataset.range(n).map(example).snapshot(f"{bucket_url}-{n}", progress=False,
                                                       shard_size=160 << 10)
        assert sum(1 for _ in ds) == n
        bucket = "/" + bucket_url[len("s3://"):].split("/")[0]
        reqs = [(m, p) for m, p in logged.requests(since)
                if p == bucket or p.startswith((bucket + "/", bucket + "?"))]
        puts = [p for m, p in reqs if m == "PUT" and p.split("?")[0].endswith(".arrow")]
        assert not [p for m, p in reqs if m == "POST" and p.endswith("?uploads")], \
            "no multipart upload for small shards"
        assert len(puts) == len(set(puts)), puts  # one PUT a shard, never retried
        shard_puts[n], totals[n] = len(puts), len(reqs)
    few, many = shard_puts[40], shard_puts[400]
    assert few == 1 and many >= 8, shard_puts
    assert totals[400] - totals[40] <= 2 * (many - few), totals


def test_a_cold_read_gets_the_manifest_with_its_version_in_one_request(logged, bucket_url,
                                                                       tmp_path):
    """The manifest's ETag comes with its GET (no HEAD after it); the one HEAD left is the
    check, after taking the read lease, that no purge removed the snapshot meanwhile."""
    from snapcache.store import fs

    ds = sc.Dataset.range(100).map(example).snapshot(bucket_url, progress=False)
    assert sum(1 for _ in ds) == 100
    fs._PARSED.clear()  # as in a new process
    again = sc.Dataset.range(100).map(example).snapshot(bucket_url, progress=False)
    since = logged.mark()
    assert sum(1 for _ in again) == 100
    manifest = [m for m, p in logged.requests(since) if p.endswith("/manifest.json")]
    assert sorted(manifest) == ["GET", "HEAD"], manifest


BUILD_REQUESTS = {"GET": 3 + 3, "HEAD": 2, "LIST": 4, "POST": 3, "PUT": 5}
"""A one-shard build's requests, by kind (31 before the listings were shared and obstore's
client came: LIST 13, now 4). GET: the manifest three times (the pipeline's look,
negotiate's, and its look again once the lease is taken: each 404), the own lease (at the
fence and at clean-up) and the stream marker (the commit); HEAD: the manifest before the marker, the own
lease's age at clean-up; LIST: the folder in negotiate (serving the lease and the progress
records' look-ups too), one recursive listing at the fence (lease and shards), one at the
commit (markers and shards), one at clean-up (leases and files); POST: the bulk deletes of
the progress record, the marker and the lease; PUT: the lease, the shard, the progress
record, the marker, the manifest."""


@pytest.mark.parametrize("client", ["auto", "s3fs"])
def test_a_builds_protocol_makes_the_same_few_requests_through_both_clients(
        logged, bucket_url, monkeypatch, client):
    monkeypatch.setenv("SNAPCACHE_S3_CLIENT", client)
    since = logged.mark()
    ds = sc.Dataset.range(40).map(example).snapshot(bucket_url, progress=False,
                                                    shard_size=1 << 20, lease_ttl=600)
    assert sum(1 for _ in ds) == 40
    kinds: dict[str, int] = {}
    for method, _ in logged.requests(since):
        kinds[method] = kinds.get(method, 0) + 1
    assert kinds == BUILD_REQUESTS, logged.requests(since)


def _fresh_process_state():
    """As in a new process: no manifest known, no read lease held."""
    from snapcache.store import fs, protocol

    protocol.release_all()
    fs._PARSED.clear()


@pytest.mark.parametrize("ordered", [True, False], ids=["ordered", "two-shuffles"])
@pytest.mark.parametrize("cached", [False, True], ids=["no-cache", "local-cache"])
def test_a_cold_reads_first_shard_is_fetched_while_the_read_lease_is_taken(
        logged, bucket_url, tmp_path, monkeypatch, cached, ordered):
    """The first shard's GET goes out beside the read lease's requests, not after them; it is
    the only GET of that shard, and the epoch reads back whole. The lease's PUT waits here
    (at most 60 s) until a GET of a shard has started on another thread: without the early
    fetch nothing starts one, and the test fails. Both read paths: the global order's
    (``ordered``) and the one for pipelines it does not run (two shuffles)."""
    import threading

    from snapcache.store.fs import Storage

    options = {"local_cache": str(tmp_path / "cache")} if cached else {}
    ds = sc.Dataset.range(200).map(example).snapshot(bucket_url, progress=False,
                                                     shard_size=256 << 10, **options)
    assert sum(1 for _ in ds) == 200
    _fresh_process_state()
    shard_fetch_started = threading.Event()
    read_bytes, write_atomic = Storage.read_bytes, Storage.write_atomic

    def reading(self, rel, *args, **kwargs):
        if str(rel).endswith(".arrow"):
            shard_fetch_started.set()
        return read_bytes(self, rel, *args, **kwargs)

    waited = []

    def writing(self, rel, *args, **kwargs):
        if str(rel).startswith("reader-") and threading.current_thread() is main:
            waited.append(shard_fetch_started.wait(60))
        return write_atomic(self, rel, *args, **kwargs)

    main = threading.current_thread()
    monkeypatch.setattr(Storage, "read_bytes", reading)
    monkeypatch.setattr(Storage, "write_atomic", writing)
    again = sc.Dataset.range(200).map(example).snapshot(bucket_url, progress=False,
                                                        shard_size=256 << 10, **options)
    since = logged.mark()
    if ordered:
        rows = [int(i) for b in again.batch(32) for i in b["i"]]
        assert rows == list(range(200))
    else:
        rows = [int(e["i"]) for e in again.shuffle(50, seed=1).shuffle(50, seed=2)]
        assert sorted(rows) == list(range(200))
    assert waited == [True]
    reqs = logged.requests(since, status=True)
    gets = shard_gets(reqs)
    assert len(gets) > 1 and sorted(gets) == sorted(set(gets)), gets  # none fetched twice
    assert shard_gets(reqs, ranged=True) == []  # one GET a shard


def test_a_purge_between_the_manifest_and_the_read_lease_is_said_and_drops_the_early_fetch(
        logged, bucket_url, monkeypatch):
    """A purge that removes the snapshot after the reader read its manifest and before its
    read lease is visible: the read says so (the bytes fetched early are never used), and
    nothing of them stays held."""
    from snapcache.errors import CorruptSnapshotError
    from snapcache.store import reader as reader_module
    from snapcache.store.fs import Storage

    ds = sc.Dataset.range(100).map(example).snapshot(bucket_url, progress=False,
                                                     shard_size=256 << 10)
    assert sum(1 for _ in ds) == 100
    _fresh_process_state()
    readers = []
    init = reader_module.SnapshotReader.__init__

    def keep(self, *args, **kwargs):
        init(self, *args, **kwargs)
        readers.append(self)

    write_atomic = Storage.write_atomic

    def purged_first(self, rel, *args, **kwargs):
        if str(rel).startswith("reader-"):  # what a purge does, just before the lease lands
            for name in self.fs.ls(self.root, detail=False):
                if not name.rsplit("/", 1)[-1].startswith("reader-"):
                    self.fs.rm(name)
        return write_atomic(self, rel, *args, **kwargs)

    monkeypatch.setattr(reader_module.SnapshotReader, "__init__", keep)
    monkeypatch.setattr(Storage, "write_atomic", purged_first)
    again = sc.Dataset.range(100).map(example).snapshot(bucket_url, progress=False,
                                                        shard_size=256 << 10)
    with pytest.raises(CorruptSnapshotError, match="purged while it was being opened"):
        next(iter(again.batch(10)))
    assert readers and all(not r.early.pending() for r in readers)


ROWS = 30_000


def small(i):
    """72 bytes of noise and the index: 2,048 rows in a stream's first record batch of 1 MiB
    shards (256 KB), more than a read's first piece of 1,024 positions."""
    return {"x": np.frombuffer(np.random.default_rng(i).bytes(64), np.uint8), "i": i}


def _again(bucket_url, **options):
    return sc.Dataset.range(ROWS).map(small).snapshot(bucket_url, progress=False,
                                                      shard_size=1 << 20, **options)


@pytest.fixture
def early_batches(monkeypatch):
    """A fresh read's first shard streams in whatever its size (by default only from
    STREAMED_SHARD_BYTES on: these tests' shards are 256 KB to 1 MiB)."""
    from snapcache.store import early_fetch

    monkeypatch.setattr(early_fetch, "STREAMED_SHARD_BYTES", 0)


def _several(bucket_url, **options):
    """8,192 rows of 4 KB in two 16 MiB shards of four 4 MiB record batches each."""
    return sc.Dataset.range(8192).map(example).snapshot(
        bucket_url, progress=False, shard_size=16 << 20, record_batch_size=4 << 20, **options)


@pytest.mark.parametrize("case", ["in-one", "in-one-local-cache", "in-two"])
def test_a_cold_reads_first_batch_comes_before_its_whole_shard(logged, bucket_url, tmp_path,
                                                               monkeypatch, case,
                                                               early_batches):
    """The first shard's GET is taken as it streams in, and each record batch is usable as
    soon as its bytes have arrived: here the rest of the shard is held back (at most 60 s)
    once three quarters of it are in, until the first batch is out, so if the first batch
    needed the whole shard, the wait would time out and the test fail. The first batch is in
    the first record batch (64 rows of 2,048), or in the first two (2,048 rows of 4 KB from
    record batches of 1,024). The epoch then reads back whole, in order, with one GET a
    shard."""
    import threading

    from snapcache.store import streamed

    options = {"local_cache": str(tmp_path / "cache")} if case.endswith("cache") else {}
    make, batch, rows = (_several, 2048, 8192) if case == "in-two" else (_again, 64, ROWS)
    assert sum(1 for _ in make(bucket_url, **options)) == rows
    shards = sc.open_snapshot(bucket_url).shards
    _fresh_process_state()
    first_out, waited = threading.Event(), []
    add = streamed.Streamed.add

    def gated(self, chunk):
        if not waited and self._at + len(chunk) > 0.75 * len(self._buffer):
            waited.append(first_out.wait(60))
        add(self, chunk)

    monkeypatch.setattr(streamed.Streamed, "add", gated)
    monkeypatch.setattr(streamed, "STREAM_CHUNK", 64 << 10)  # finer than these shards
    since = logged.mark()
    it = iter(make(bucket_url, **options).batch(batch))
    first = next(it)
    first_out.set()
    got = [int(i) for i in first["i"]] + [int(i) for b in it for i in b["i"]]
    assert got == list(range(rows))
    assert waited == [True], waited
    reqs = logged.requests(since, status=True)
    assert shard_gets(reqs, ranged=True) == []  # one GET a shard, no byte fetched twice
    gets = shard_gets(reqs)
    assert len(gets) == len(shards) and len(set(gets)) == len(gets), gets


def test_a_flipped_byte_in_a_record_batch_streaming_in_is_refused_naming_it(
        logged, bucket_url, early_batches):
    """A record batch of a shard streaming in is checked against its own checksum before any
    of its rows is used: a flipped byte in it is an error naming the shard and the record
    batch, and no row comes out before it."""
    assert sum(1 for _ in _again(bucket_url)) == ROWS
    snap = sc.open_snapshot(bucket_url)
    shard = snap.shards[0]
    fs = logged.server.filesystem()
    key = f"{snap.url.removeprefix('s3://')}/{shard.path}"
    data = bytearray(fs.cat(key))
    data[shard.batch_offsets[0] + 100] ^= 0x10
    fs.pipe(key, bytes(data))
    _fresh_process_state()
    seen = []
    with pytest.raises(sc.CorruptSnapshotError, match="record batch 0 is corrupt: checksum") \
            as info:
        for batch in _again(bucket_url).batch(64):
            seen.append(batch)
    assert seen == [] and shard.path in str(info.value)


def test_a_shard_that_does_not_stream_in_is_read_whole(logged, bucket_url, monkeypatch,
                                                       early_batches):
    """Streaming is only a head start: when the shard comes otherwise (here: a download that
    does not stream), the read takes its record batches from the whole shard, as without
    it."""
    from snapcache.store.early_fetch import EarlyFetches
    from snapcache.store.fs import Storage

    assert sum(1 for _ in _again(bucket_url)) == ROWS
    _fresh_process_state()
    read_bytes, take_stream = Storage.read_bytes, EarlyFetches.take_stream
    streams = []

    def whole(self, rel, size=None, into=None):
        return read_bytes(self, rel, size)

    def taken(self, shard):
        streams.append(take_stream(self, shard))
        return streams[-1]

    monkeypatch.setattr(Storage, "read_bytes", whole)
    monkeypatch.setattr(EarlyFetches, "take_stream", taken)
    got = [int(i) for b in _again(bucket_url).batch(64) for i in b["i"]]
    assert got == list(range(ROWS))
    [stream] = [s for s in streams if s is not None]
    assert not stream.complete and stream.wait_for(1) is None


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs Linux's /proc")
def test_a_streamed_buffer_takes_memory_as_its_bytes_arrive_not_when_it_is_made():
    """A Streamed is made on the read's own thread before its GET starts: its buffer must not
    be written (zeroed) then, which for a large shard took longer than the GET's first bytes.
    Its pages are taken as the body is written into it."""
    from snapcache.store.streamed import Streamed

    size = 256 << 20
    before = _resident_bytes()
    into = Streamed(size)
    assert _resident_bytes() - before < 16 << 20
    into.add(b"\1" * (1 << 20))
    into.add(memoryview(b"\2" * (size - (1 << 20))))
    into.finish()
    assert _resident_bytes() - before >= size - (16 << 20)
    got = into.result()
    assert into.complete and len(got) == size and got[0] == 1 and got[size - 1] == 2
    assert Streamed(0).wait_for(0) is not None and len(Streamed(0).result()) == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_does_not_see_its_parents_stream_go_on():
    """A process forked while a shard streams in (a DataLoader's workers) keeps what it had:
    the buffer is private memory, copy-on-write across fork, not shared with the parent."""
    from snapcache.store.streamed import Streamed

    into = Streamed(4 << 20)
    into.add(b"\1" * (1 << 20))
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: wait until the parent wrote more, then look
        try:
            os.close(ready_r)
            os.write(ready_w, b"x")
            os.read(go_r, 1)
            view = into._view
            os._exit(0 if view[0] == 1 and view[(1 << 20) + 5] == 0 else 1)
        finally:
            os._exit(2)
    os.read(ready_r, 1)
    into.add(b"\2" * (1 << 20))
    os.write(go_w, b"x")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert into.wait_for(2 << 20)[(1 << 20) + 5] == 2


@pytest.mark.parametrize("client", ["obstore", "s3fs"])
@pytest.mark.parametrize("said", ["right", "short", "long"])
def test_a_streamed_get_hands_over_its_bytes_as_they_arrive_and_returns_the_whole_file(
        logged, bucket_url, monkeypatch, client, said):
    """``read_streaming``: one GET whose body is taken in chunks into one buffer, whose first
    bytes can be read (``wait_for``) as soon as they are in, before the rest. A file of
    another size than said comes back as it is (the reader's size check names it)."""
    from snapcache.store import fs_obstore, streamed
    from snapcache.store.fs import Storage

    storage = Storage(bucket_url)
    data = np.random.default_rng(0).bytes(1 << 20)
    storage.upload("f.bin", data)
    monkeypatch.setattr(streamed, "STREAM_CHUNK", 64 << 10)
    clients = storage._s3
    streaming = clients.s3fs() if client == "s3fs" else clients.client()
    if client == "obstore" and not isinstance(streaming, fs_obstore.S3Client):
        pytest.skip("obstore is not usable here")
    size = {"right": len(data), "short": len(data) - 1000, "long": len(data) + 1000}[said]
    added, seen = [], []
    add = streamed.Streamed.add

    def counted(self, chunk):
        add(self, chunk)
        added.append(len(chunk))
        if not seen and sum(added) >= 300_000:
            seen.append((bytes(self.wait_for(300_000)), sum(added)))

    monkeypatch.setattr(streamed.Streamed, "add", counted)
    into = streamed.Streamed(size)
    since = logged.mark()
    got = streaming.read_streaming(storage.full("f.bin"), into)
    into.finish()
    assert bytes(got) == data and seen[0][0] == data[:300_000]
    assert seen[0][1] < len(data)  # there while the body was still coming
    assert into.complete == (said == "right")
    assert into.wait_for(size + 1) is None
    assert [m for m, _ in logged.requests(since)] == ["GET"]


def test_a_shuffled_cold_read_streams_its_first_shard_too(logged, bucket_url, monkeypatch,
                                                         early_batches):
    """A shuffled epoch's first shard streams in like an ordered one's (its first batch waits
    for the record batches it draws from, as they arrive); every shard in one GET."""
    from snapcache.store.early_fetch import EarlyFetches

    assert sum(1 for _ in _several(bucket_url)) == 8192
    _fresh_process_state()
    streams = []
    take_stream = EarlyFetches.take_stream

    def taken(self, shard):
        streams.append(take_stream(self, shard))
        return streams[-1]

    monkeypatch.setattr(EarlyFetches, "take_stream", taken)
    since = logged.mark()
    got = sorted(int(i) for b in _several(bucket_url).shuffle(2000, seed=1).batch(64)
                 for i in b["i"])
    assert got == list(range(8192))
    assert [s.complete for s in streams if s is not None] == [True]
    reqs = logged.requests(since, status=True)
    gets = shard_gets(reqs)
    assert shard_gets(reqs, ranged=True) == [] and len(gets) == 2 == len(set(gets)), gets
