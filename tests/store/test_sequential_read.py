"""Sequential reads of local shards record batch by record batch (docs/format.md, "Record
batch index"): each record batch verified against its checksum in the manifest before any of
its bytes is used, hashed front to back by one verifier thread a shard (shards one after the
other) while the batches of one shard are decoded in parallel; a damaged batch raises naming
the shard and the batch, after the batches before it and with nothing of its own; shards
written before the index existed are read whole as before; an abandoned read leaves no thread
running; resident memory stays within the prefetch budget however large the shard."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import threading

import numpy as np
import pytest

import snapcache as sc
from snapcache.store import batched_read, ordered_read
from snapcache.store.batched_read import BatchedShard
from snapcache.store.fs import Storage
from snapcache.store.reader import SnapshotReader

REPO = pathlib.Path(__file__).parent.parent.parent


def example(i):
    rng = np.random.default_rng(i)
    tokens = np.zeros(64, np.int32)
    tokens[:8 + i % 24] = rng.integers(1, 50, 8 + i % 24)
    return {"tokens": tokens, "i": i}


def pipeline(root, n=4000, compression="lz4", record_batch_size=16 << 10, **kw):
    return sc.Dataset.range(n).map(example).snapshot(
        root, compression=compression, record_batch_size=record_batch_size, progress=False,
        **kw)


def reader_of(root) -> SnapshotReader:
    (fp,) = [d for d in os.listdir(root) if len(d) == 32]
    return SnapshotReader.open(Storage(root).child(fp))


class Spy:
    """Counts which kind of shard file the sequential readers open."""

    def __init__(self, monkeypatch):
        self.batched, self.whole = [], []
        real = batched_read.open_sequential

        def spying(reader, shard, **kw):
            opened = real(reader, shard, **kw)
            (self.batched if isinstance(opened, BatchedShard) else self.whole).append(shard.path)
            return opened

        monkeypatch.setattr(batched_read, "open_sequential", spying)
        monkeypatch.setattr(ordered_read, "open_sequential", spying)


@pytest.mark.parametrize("compression", ["none", "lz4", "zstd"])
@pytest.mark.parametrize("record_batch_size", [4 << 10, 64 << 10, 1 << 20])
def test_round_trips_record_batch_by_record_batch(root, monkeypatch, compression,
                                                  record_batch_size):
    ds = pipeline(root, 3000, compression, record_batch_size, shard_size=256 << 10)
    assert [e["i"] for e in ds] == list(range(3000))  # the first epoch writes
    reader = reader_of(root)
    assert all(s.batch_index and s.compression == compression for s in reader.manifest.shards)
    spy = Spy(monkeypatch)
    batches = list(ds.batch(100))  # the pipeline's ordered read
    ids = np.concatenate([b["i"] for b in batches])
    assert ids.tolist() == list(range(3000))
    for b in batches[::7]:
        for i, tokens in zip(b["i"].tolist(), b["tokens"]):
            assert np.array_equal(tokens, example(i)["tokens"])
    examples = list(reader.examples())  # the reader's own sequential read
    assert [e["i"] for e in examples] == list(range(3000))
    assert all(np.array_equal(e["tokens"], example(e["i"])["tokens"]) for e in examples[::13])
    paths = sorted(s.path for s in reader.manifest.shards)
    assert spy.whole == [] and sorted(set(spy.batched)) == paths


def flip_byte_in_batch(reader, shard_index: int, k: int) -> None:
    shard = reader.manifest.shards[shard_index]
    path = os.path.join(reader.storage.url, shard.path)
    where = (shard.batch_offsets[k] + shard.batch_offsets[k + 1]) // 2
    with open(path, "r+b") as f:
        f.seek(where)
        byte = f.read(1)
        f.seek(where)
        f.write(bytes([byte[0] ^ 0x40]))


@pytest.mark.parametrize("compression", ["none", "lz4", "zstd"])
def test_a_damaged_record_batch_raises_naming_it_after_the_batches_before_it(
        root, monkeypatch, compression):
    ds = pipeline(root, 4000, compression, shard_size=1 << 30)  # one shard, many batches
    list(ds)
    reader = reader_of(root)
    (shard,) = reader.manifest.shards
    assert len(shard.batch_rows) >= 8
    k = 5
    flip_byte_in_batch(reader, 0, k)
    before = sum(shard.batch_rows[:k])
    spy = Spy(monkeypatch)
    pattern = f"shard '{shard.path}' record batch {k} is corrupt: checksum"

    seen = []
    with pytest.raises(sc.CorruptSnapshotError, match=pattern):
        for batch in ds.batch(50):
            seen.extend(batch["i"].tolist())
    assert seen == list(range(before // 50 * 50))  # nothing of batch k

    seen = []
    with pytest.raises(sc.CorruptSnapshotError, match=pattern):
        for e in reader_of(root).examples():
            seen.append(e["i"])
    assert seen == list(range(before))
    assert spy.whole == []
    assert SnapshotReader.open(reader.storage).verify_all()  # verify: the whole file


@pytest.mark.parametrize("compression", ["none", "lz4"])
def test_without_verify_batches_are_decoded_and_validated_but_not_hashed(root, monkeypatch,
                                                                        compression):
    ds = pipeline(root, 2000, compression, shard_size=1 << 30, verify=False)
    list(ds)
    hashed = []
    real = SnapshotReader.batch_from_bytes

    def spying(self, shard, index, data, **kw):
        hashed.append((self.verify, kw.get("digest")))
        return real(self, shard, index, data, **kw)

    monkeypatch.setattr(SnapshotReader, "batch_from_bytes", spying)
    assert np.concatenate([b["i"] for b in ds.batch(64)]).tolist() == list(range(2000))
    assert hashed and set(hashed) == {(False, None)}


def without_batch_index(reader) -> None:
    """Rewrite the manifest as a writer older than the record batch index did."""
    path = os.path.join(reader.storage.url, "manifest.json")
    doc = json.loads(open(path).read())
    for shard in doc["shards"]:
        shard.pop("batch_offsets"), shard.pop("batch_checksums")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


def test_shards_without_the_index_are_read_and_verified_whole(root, monkeypatch):
    ds = pipeline(root, 3000, "zstd", shard_size=32 << 10)
    list(ds)
    reader = reader_of(root)
    without_batch_index(reader)
    old = reader_of(root)
    assert len(old.manifest.shards) > 1 and not any(s.batch_offsets for s in old.manifest.shards)
    spy = Spy(monkeypatch)
    assert np.concatenate([b["i"] for b in ds.batch(64)]).tolist() == list(range(3000))
    assert [e["i"] for e in old.examples()] == list(range(3000))
    assert spy.batched == [] and len(set(spy.whole)) == len(old.manifest.shards)
    flip_byte_in_batch(reader, 1, 0)  # the offsets of the original manifest
    with pytest.raises(sc.CorruptSnapshotError,
                       match=f"shard '{old.manifest.shards[1].path}' is corrupt: checksum"):
        list(ds.batch(64))


def test_a_shard_of_another_size_or_missing_fails_when_opened(root):
    ds = pipeline(root, 2000, "lz4", shard_size=16 << 10)
    list(ds)
    reader = reader_of(root)
    first, second = reader.manifest.shards[:2]
    with open(os.path.join(reader.storage.url, first.path), "ab") as f:
        f.write(b"\0")
    with pytest.raises(sc.CorruptSnapshotError,
                       match=f"shard '{first.path}' has {first.bytes + 1} bytes, the manifest "
                             f"says {first.bytes}"):
        list(reader.examples())
    os.unlink(os.path.join(reader.storage.url, second.path))
    with pytest.raises(sc.CorruptSnapshotError, match=f"shard '{second.path}' is missing"):
        list(reader.examples(reader.manifest.shards[1:]))


def read_threads() -> list[threading.Thread]:
    """The workers of the read pools (not the read lease's renewal thread)."""
    return [t for t in threading.enumerate() if t.name.startswith("snapcache-read_")]


@pytest.mark.parametrize("compression", ["none", "lz4"])
@pytest.mark.parametrize("how", ["close", "damage"])
@pytest.mark.parametrize("shard_size", [1 << 30, 32 << 10])
def test_stopping_early_leaves_no_read_thread(root, how, compression, shard_size):
    """Also with several shards, the next one opened ahead and hashed ahead from its start
    while the consumer is on the first."""
    ds = pipeline(root, 4000, compression, shard_size=shard_size)
    list(ds)
    assert (len(reader_of(root).manifest.shards) > 2) == (shard_size < 1 << 20)
    for t in read_threads():  # threads of earlier reads in this process
        t.join(60)
    assert read_threads() == []
    shard, k = (0, 3) if shard_size > 1 << 20 else (2, 1)
    if how == "damage":
        flip_byte_in_batch(reader_of(root), shard, k)
    it = iter(ds.batch(50))
    next(it)
    assert read_threads()  # the next record batches are being read ahead
    if how == "close":
        it.close()
    else:
        with pytest.raises(sc.CorruptSnapshotError, match=f"record batch {k} is corrupt"):
            for _ in it:
                pass
    del it
    for t in read_threads():  # tasks already running finish; queued ones are cancelled
        t.join(60)
    assert read_threads() == []


class Blocking:
    """xxh3_64 for batched_read and the reader that notes which thread hashed what (the hex
    digest, as in ``ShardInfo.batch_checksums``) and, while ``gate`` is clear, blocks the
    verifier thread before hashing (``waiting`` set). Verifier threads of earlier reads are
    let finish first, so that only this test's are seen."""

    def __init__(self, monkeypatch):
        import gc

        import xxhash

        from snapcache.store import reader

        gc.collect()  # abandoned reads' verifiers stop
        for thread in threading.enumerate():
            if thread.name == "snapcache-read_verify":
                thread.join(60)
        self.hashed, self.gate, self.waiting = [], threading.Event(), threading.Event()
        self.gate.set()
        real = xxhash.xxh3_64

        def hashing(data=b""):
            if threading.current_thread().name == "snapcache-read_verify" and \
                    not self.gate.is_set():
                self.waiting.set()
                self.gate.wait()
            digest = real(data)
            self.hashed.append((threading.current_thread().name, digest.hexdigest()))
            return digest

        spy = type("X", (), {"xxh3_64": staticmethod(hashing)})
        monkeypatch.setattr(batched_read, "xxhash", spy)
        monkeypatch.setattr(reader, "xxhash", spy)


@pytest.mark.parametrize("compression", ["none", "lz4"])
def test_a_sequential_read_is_hashed_ahead_front_to_back_and_a_jumping_one_only_as_asked(
        root, monkeypatch, compression):
    """Asked for in order, a shard's record batches are hashed ahead of decoding, front to
    back, by its verifier thread (each once); asked for out of order (a shuffled epoch, one
    stream's share), only the batches asked for are hashed: the verifier hashes the first two
    and ends, the asker hashes the rest."""
    ds = pipeline(root, 4000, compression, shard_size=1 << 30)
    list(ds)
    reader = reader_of(root)
    (shard,) = reader.manifest.shards
    count = len(shard.batch_rows)
    assert count > batched_read.SLACK + 4
    expected = shard.batch_checksums

    spy = Blocking(monkeypatch)
    opened = batched_read.open_sequential(reader, shard)
    assert opened.get_batch(0).num_rows == shard.batch_rows[0]
    rows = [opened.get_batch(k).column("i").to_numpy() for k in range(count)]
    opened.close()
    assert np.concatenate(rows).tolist() == list(range(shard.rows))
    assert spy.hashed == [("snapcache-read_verify", data) for data in expected]

    spy.hashed.clear()
    spy.gate.clear()  # hold the verifier at its first batch while the jumps are asked for
    opened = batched_read.open_sequential(reader, shard)
    wanted = [count - 1, 0] + list(range(2, count - 1, batched_read.SLACK + 2))
    asking = threading.Thread(target=lambda: [opened.get_batch(k) for k in wanted],
                              name="asker")
    asking.start()
    assert spy.waiting.wait(60)
    spy.gate.set()
    asking.join(60)
    assert not asking.is_alive()
    opened.close()
    assert spy.hashed == [("snapcache-read_verify", expected[k]) for k in wanted[:2]] + \
        [("asker", expected[k]) for k in wanted[2:]]


@pytest.mark.parametrize("compression", ["none", "lz4"])
def test_a_shard_opened_to_be_read_front_to_back_is_hashed_ahead_from_the_start(
        root, monkeypatch, compression):
    """``ahead=True`` (an unshuffled epoch read in one stream): the verifier hashes the record
    batches front to back as soon as the shard is opened, before any is asked for; the batches
    are then handed out against those digests (a flipped byte still raises, naming the batch).
    Only an unshuffled read of one stream's contiguous positions asks for it."""
    ds = pipeline(root, 4000, compression, shard_size=1 << 30)
    list(ds)
    reader = reader_of(root)
    (shard,) = reader.manifest.shards
    count = len(shard.batch_rows)
    assert count > 4
    spy = Blocking(monkeypatch)
    opened = batched_read.open_sequential(reader, shard, ahead=True)
    opened._verifier._thread.join(60)  # ends once every batch is hashed: none was asked for
    assert spy.hashed == [("snapcache-read_verify", d) for d in shard.batch_checksums]
    rows = [opened.get_batch(k).column("i").to_numpy() for k in range(count)]
    assert np.concatenate(rows).tolist() == list(range(shard.rows))
    assert len(spy.hashed) == count  # nothing hashed twice
    opened.close()

    path = os.path.join(reader.storage.url, shard.path)
    original = open(path, "rb").read()
    data = bytearray(original)
    k = count // 2
    data[(shard.batch_offsets[k] + shard.batch_offsets[k + 1]) // 2] ^= 0x01
    open(path, "wb").write(bytes(data))
    opened = batched_read.open_sequential(reader, shard, ahead=True)
    for j in range(k):
        opened.get_batch(j)
    with pytest.raises(sc.CorruptSnapshotError, match=f"record batch {k} is corrupt"):
        opened.get_batch(k)
    opened.close()
    open(path, "wb").write(original)

    kinds = []
    real = ordered_read.open_sequential
    monkeypatch.setattr(ordered_read, "open_sequential", lambda r, s, **kw: (
        kinds.append(kw.get("ahead")), real(r, s, **kw))[1])
    from snapcache.store.order import EpochOrder, Share
    layout = ordered_read.layout_of(reader.manifest)
    for seed, streams, expected in [(None, 1, True), (None, 2, False), (3, 1, False)]:
        order = EpochOrder(layout, seed, 0, 1)
        kinds.clear()
        share = Share.of([(0, len(order))], streams, 0, window=1)
        pieces = ordered_read.ordered_pieces(reader, order, share.pieces(), mode="columns",
                                             threads=2, budget=1 << 30)
        next(pieces)
        pieces.close()
        assert kinds == [expected], (seed, streams)
    kinds.clear()  # a whole read of the snapshot's record batches, in order (handle.columns)
    monkeypatch.setattr(batched_read, "open_sequential", lambda r, s, **kw: (
        kinds.append(kw.get("ahead")), real(r, s, **kw))[1])
    assert sum(b.num_rows for b in reader.record_batches()) == shard.rows
    assert kinds == [True]

def test_a_closed_shard_still_verifies_the_batches_it_is_asked_for(root, monkeypatch):
    """Closing stops hashing ahead; a record batch asked for afterwards is hashed by the one
    asking, so damage is still found, naming the shard and the batch."""
    ds = pipeline(root, 3000, "none", shard_size=1 << 30)
    list(ds)
    reader = reader_of(root)
    (shard,) = reader.manifest.shards
    flip_byte_in_batch(reader, 0, 4)
    spy = Blocking(monkeypatch)
    spy.gate.clear()  # the verifier waits before hashing the first batch asked for
    opened = batched_read.open_sequential(reader, shard)
    first = []
    asking = threading.Thread(target=lambda: first.append(opened.get_batch(0)))
    asking.start()
    assert spy.waiting.wait(60)
    closer = threading.Thread(target=opened.close)
    closer.start()
    spy.gate.set()
    closer.join(60), asking.join(60)
    assert not closer.is_alive() and not asking.is_alive()
    assert first[0].num_rows == shard.batch_rows[0]
    assert opened.get_batch(3).num_rows == shard.batch_rows[3]
    with pytest.raises(sc.CorruptSnapshotError,
                       match=f"shard '{shard.path}' record batch 4 is corrupt: checksum"):
        opened.get_batch(4)
    # the verifier hashed only the batch it was on when stopped (the asker, woken by the
    # stop, may have hashed it too); 3 and 4 were hashed here
    by = lambda name: [data for who, data in spy.hashed if who == name]  # noqa: E731
    assert by("snapcache-read_verify") == [shard.batch_checksums[0]]
    here = by(threading.current_thread().name)
    assert len(here) == 2 and here[0] == shard.batch_checksums[3]
    assert here[1] != shard.batch_checksums[4]  # batch 4's damaged bytes


FORK_CHILD = """
import os, sys, threading
import numpy as np
from snapcache.store import batched_read
from snapcache.store.fs import Storage
from snapcache.store.reader import SnapshotReader

root, fp = sys.argv[1], sys.argv[2]
reader = SnapshotReader.open(Storage(root).child(fp))
first, second = reader.manifest.shards[:2]
gate, waiting = threading.Event(), threading.Event()
real = batched_read.xxhash.xxh3_64

def hashing(data=b""):
    if os.getpid() == parent and not gate.is_set():
        waiting.set()
        gate.wait()
    return real(data)

parent = os.getpid()
batched_read.xxhash = type("X", (), {"xxh3_64": hashing})
held = batched_read.open_sequential(reader, first)
asking = threading.Thread(target=held.get_batch, args=(0,))
asking.start()
assert waiting.wait(60)  # its verifier is hashing (held), a reader waits for it
pid = os.fork()
if pid == 0:  # the child: no verifier thread of the parent's exists here
    import signal
    signal.alarm(120)  # a child that hangs (waits for a thread it does not have) dies
    rows = []
    for opened in (held, batched_read.open_sequential(reader, second)):
        rows += [opened.get_batch(k).column("i").to_numpy()
                 for k in range(opened.num_record_batches)]
    ok = np.concatenate(rows).tolist() == list(range(first.rows + second.rows))
    os._exit(0 if ok else 3)
_, status = os.waitpid(pid, 0)
gate.set()
asking.join()
held.close()
print("child", os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_reads_shards_whose_verifier_ran_in_its_parent(root):
    """A process forked while a verifier thread was hashing and a reader waited for it (a
    DataLoader worker started by fork): the child reads that shard, hashing its batches
    itself (the thread does not exist there), and opens others."""
    ds = pipeline(root, 2000, "lz4", shard_size=24 << 10)
    list(ds)
    (fp,) = [d for d in os.listdir(root) if len(d) == 32]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", FORK_CHILD, root, fp], capture_output=True,
                         text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-2:] == ["child", "0"]


MEMORY_CHILD = """
import json, resource, sys, tempfile
import numpy as np
import snapcache as sc

mode, root, codec = sys.argv[1], sys.argv[2], sys.argv[3]
BUDGET = 32 << 20

def example(i):
    x = np.random.default_rng(i).integers(0, 256, 2 << 20, dtype=np.uint8)
    x.reshape(-1, 4096)[::2] = 0   # half zero pages: lz4 saves about half
    return {"x": x, "i": i}

def pipeline(n, where):
    return sc.Dataset.range(n).map(example).snapshot(
        where, compression=codec, shard_size=1 << 30, record_batch_size=2 << 20,
        prefetch_bytes=BUDGET, progress=False)

def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

if mode == "build":
    for _ in pipeline(80, root):
        pass
    sys.exit()
with tempfile.TemporaryDirectory() as warm:   # libraries loaded, allocator warm
    for _ in pipeline(3, warm).batch(2):
        pass
before = peak()
rows = 0
for batch in pipeline(80, root).batch(4):
    rows += len(batch["i"])
    assert int(batch["x"][:, 1::8192].sum()) == 0
print(json.dumps({"extra": peak() - before, "rows": rows}))
"""


@pytest.mark.parametrize("codec", ["none", "lz4"])
def test_reading_one_large_shard_stays_within_the_prefetch_budget(tmp_path, codec):
    """A 160 MB shard (one file, 80 record batches) read with a 32 MB prefetch budget: the
    pages of its memory map are dropped as its record batches are hashed and decoded, record
    batch by record batch (none: batches are views of the map), so the peak resident memory grows
    by about the budget, not by the shard (measured in a child process; without dropping
    them: +170 MB raw, +110 MB with lz4)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    root = str(tmp_path / "snaps")

    def child(mode):
        out = subprocess.run([sys.executable, "-c", MEMORY_CHILD, mode, root, codec],
                             capture_output=True, text=True, timeout=600, env=env)
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout

    child("build")
    (fp,) = [d for d in os.listdir(root) if len(d) == 32]
    (shard,) = SnapshotReader.open(Storage(root).child(fp)).manifest.shards
    assert shard.bytes > (80 << 20) and len(shard.batch_rows) == 80
    result = json.loads(child("read").splitlines()[-1])
    assert result["rows"] == 80
    assert result["extra"] <= 64 << 20, f"peak grew by {result['extra'] >> 20} MB"


@pytest.mark.parametrize("verify", [True, False])
def test_a_sound_local_copy_of_a_remote_batch_is_kept(tmp_path, monkeypatch, verify):
    """A record batch read alone from the node-local copy of a remote shard: the copy is
    dropped only when its bytes do not match the batch's checksum (never without verify)."""
    from snapcache.store.cache import ShardCache

    url = f"memory://snapcache-batches-{os.getpid()}-{verify}"
    ds = pipeline(url, 2000, "lz4", shard_size=1 << 30)
    list(ds)
    storage = Storage(url).child(ds.open_snapshot().id)
    cache = ShardCache(str(tmp_path / "cache"), 1 << 30)
    reader = SnapshotReader.open(storage, verify=verify, cache=cache)
    discarded = []
    monkeypatch.setattr(cache, "discard", lambda key: discarded.append(key))
    (shard,) = reader.manifest.shards
    first = reader.read_batch(shard, 3)  # from the store; the shard is copied in the background
    assert reader.wait_for_cache(60)
    again = reader.read_batch(shard, 3)  # from the local copy
    assert again.equals(first) and discarded == []
    import fsspec
    fsspec.filesystem("memory").rm(url.removeprefix("memory://"), recursive=True)
