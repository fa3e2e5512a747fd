"""Running a snapshot op: negotiate with other processes, then read, write or compute."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import itertools
import logging
import os
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator

from snapcache.errors import (
    CorruptSnapshotError, LeaseLostError, OptionConflictWarning, RandomnessWarning, StoreError,
    warn)
from snapcache.pipeline import interrupt, ops, streams
from snapcache.pipeline.shares import first_shard, piece_rows, read_share
from snapcache.store import layout
from snapcache.store.decoder import read_only
from snapcache.store.fs import Storage, normalized_url
from snapcache.store.manifest import Manifest, load_manifest
from snapcache.store.reader import SnapshotReader, open_reader as _open
from snapcache.store.order import EpochOrder, Share
from snapcache.store.ordered_read import layout_of, ordered_pieces
from snapcache.runtime.progress import EpochProgress
from snapcache.store.protocol import (
    StreamRecord, best_progress, commit_fields, discard, held_by_parent, hold_read, holds_read,
    negotiate, record_last_use, try_commit)
from snapcache.store.options import WriteOptions
from snapcache.store.protocol.versions import manifest_file
from snapcache.store.writer import SnapshotWriter

log = logging.getLogger("snapcache")

Iterate = Callable[..., Iterator[Any]]

LAST_USED_INTERVAL = 60.0
_last_used: dict[str, float] = {}
_warned: "weakref.WeakSet[ops.Op]" = weakref.WeakSet()


def run_snapshot(op: ops.SnapshotOp, epoch: int, iterate: Iterate, *, tree, labelled,
                 describe: str) -> Iterator[Any]:
    options = op.options
    if not options.key:
        _warn_randomness(op, labelled)
    spec = streams.current()
    storage = snapshot_storage(op, tree.digest)
    run_id = layout.new_run_id()
    # Streams may each write their share only if that gives the same examples as one writer:
    # an element-wise upstream. Otherwise one stream writes everything, the others wait.
    alone = spec.count > 1 and not ops.splittable(op.parent)
    writing = streams.StreamSpec() if alone else spec
    make_folder(op, storage)
    with root_errors(op, storage):
        decision = negotiate(storage, run_id=run_id, stream=writing.index,
                             streams=writing.count,
                             on_busy="wait" if alone else options.coordination.on_busy,
                             lease_ttl=options.coordination.lease_ttl,
                             wait_timeout=options.coordination.wait_timeout)

    def fields() -> dict:
        return commit_fields(options.write, key=options.key, name=options.name,
                             fingerprint=tree.digest, fingerprint_tree=tree.to_json(),
                             pipeline=describe, run_id=run_id)

    if decision.action == "read":
        assert decision.manifest is not None
        return stream_rows(open_reader(storage, decision.manifest, options), op, spec)
    if decision.action == "replay":
        assert decision.resume is not None
        if alone:
            # One writer wrote everything and recorded its stream but crashed (or is just
            # about to commit): commit it, then read this stream's share like every stream.
            try_commit(storage, writing.count, **fields())
            return _write_then_read(iter(()), storage, op, spec)
        return _replay(storage, decision.resume, options, writing.count, fields)
    if decision.action == "compute":
        log.info("snapshot %s is being written by another process: computing without writing",
                 storage.url)
        return read_only_examples(iterate(op.parent, epoch,
                                          streams.StreamSpec(spec.index, spec.count)))
    resume = decision.resume
    if resume is not None and not ops.resumable(op.parent):
        log.info("snapshot %s stream %d restarts: its upstream cannot skip examples",
                 storage.url, writing.index)
        discard(storage, resume)
        resume = None
    skip = resume.rows if resume is not None else 0
    if skip:
        log.info("resuming snapshot %s stream %d: %d examples already written", storage.url,
                 writing.index, skip)
    writer = SnapshotWriter(storage, fingerprint=tree.digest, options=options.write,
                            key=options.key, name=options.name,
                            fingerprint_tree=tree.to_json(), pipeline=describe,
                            stream=writing.index, streams=writing.count, run_id=run_id,
                            resume=resume, lease=decision.lease)
    source = iterate(op.parent, epoch, streams.StreamSpec(writing.index, writing.count, skip))
    progress = epoch_progress(op, storage, writing, skip)
    if progress is not None:
        source = progress.wrap(source)

    def committed_by_another(done: int, finished: bool) -> Iterator[Any] | None:
        """After this writer lost its lease: the rest of its share from the snapshot another
        writer committed, when skipping ``done`` examples is exact (else None); nothing when
        this writer had yielded its whole share (``finished``: it was committing)."""
        manifest = load_manifest(storage)
        if manifest is None:
            return None
        if finished:
            return iter(())
        if done and not ops.resumable(op.parent):
            return None
        share = stream_rows(open_reader(storage, manifest, options), op, writing)
        return itertools.islice(share, done, None)

    written = _write(source, writer, decision.lease,
                     SnapshotReader(storage, _partial_manifest(resume, tree.digest))
                     if resume is not None else None, committed_by_another, progress)
    if alone:
        return _write_then_read(written, storage, op, spec)
    return written


def epoch_progress(op: ops.SnapshotOp, storage: Storage, writing: streams.StreamSpec,
                   skip: int) -> EpochProgress | None:
    """The progress report of this stream of the writing epoch (None with progress=False):
    the whole epoch's length, a tick folder shared by the epoch's streams on this machine,
    and the snapshot folder's progress records for the streams elsewhere."""
    setting = op.options.progress
    if setting is False:
        return None

    def remote() -> dict[int, int]:
        found = {}
        for i in range(writing.count):
            record = best_progress(storage, i, writing.count)
            if record is not None:
                found[i] = record.rows
        return found

    key = hashlib.sha1(f"{storage.url}|{writing.count}".encode()).hexdigest()[:16]
    return EpochProgress(op.options.name or storage.url, ops.known_length(op.parent),
                         stream=writing.index, streams=writing.count, key=key, resumed=skip,
                         callback=setting if callable(setting) else None,
                         remote=remote if writing.count > 1 else None)


def check_root(op: ops.SnapshotOp) -> Storage:
    """``op``'s snapshot root; StoreError at once if it is a local file or lies under one."""
    root = Storage(op.path, op.options.storage_options)
    if root.local:
        found = _nearest_existing(root.root)
        if not os.path.isdir(found):
            raise unusable_root(op.path, NotADirectoryError(errno.ENOTDIR, "Not a directory"),
                                file=found)
    return root


def _nearest_existing(path: str) -> str:
    """``path`` itself if it exists, else its closest ancestor that does."""
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def snapshot_storage(op: ops.SnapshotOp, digest: str) -> Storage:
    """The folder of ``op``'s snapshot; StoreError at once if its local root is a file."""
    return check_root(op).child(digest)


def make_folder(op: ops.SnapshotOp, storage: Storage) -> None:
    """Create the snapshot folder ``storage`` of ``op``'s root (nothing if it exists, as
    when a committed snapshot is read): on local disk, a root that cannot hold it is a
    StoreError naming the root and the way out rather than an OSError from the first file
    written into it. Object stores have no folders: nothing to do there."""
    if not storage.local:
        return
    try:
        storage.makedirs()
    except OSError as e:
        raise unusable_root(op.path, e) from e


@contextlib.contextmanager
def root_errors(op: ops.SnapshotOp, storage: Storage) -> Iterator[None]:
    """Around a writer's first files in its snapshot folder (its lease): an OSError there is
    about the root (a local one read-only or full, a folder where a file should go), so it
    becomes the StoreError of :func:`unusable_root`. Elsewhere only refused permissions."""
    try:
        yield
    except StoreError:  # snapcache's own (a LeaseTimeoutError is a TimeoutError, an OSError)
        raise
    except (NotADirectoryError, FileExistsError, PermissionError) as e:
        raise unusable_root(op.path, e) from e
    except OSError as e:
        if not storage.local or e.errno not in _ROOT_ERRNOS:  # a race, a timeout: not the root
            raise
        raise unusable_root(op.path, e) from e


_ROOT_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT,
                          errno.ENOTDIR, errno.EISDIR, errno.ENAMETOOLONG})
_NOT_WRITABLE = {errno.EACCES: "permission denied", errno.EPERM: "permission denied",
                 errno.EROFS: "read-only file system"}


def unusable_root(root: str, error: OSError, file: str | None = None) -> StoreError:
    """One line naming the root, what is wrong with it and the way out (``file``: the file
    found where the root or one of its parents should be a folder)."""
    path = normalized_url(root)
    elsewhere = "pass snapshot() a folder you can write to, or set $SNAPCACHE_ROOT"
    if isinstance(error, PermissionError) or error.errno in _NOT_WRITABLE:
        cause = _NOT_WRITABLE.get(error.errno, "permission denied")
        why = f"is not writable ({cause})"
        way = elsewhere + (" (or fix its permissions)" if cause == "permission denied" else "") \
            + "; reading a snapshot that already exists from a read-only root works"
    elif file is not None and file != path:
        why = f"is inside {file}, which is a file, not a folder"
        way = "pass snapshot() a folder path (or set $SNAPCACHE_ROOT), or move the file away"
    elif file is not None or os.path.isfile(path):
        why = "is a file, not a folder"
        way = "pass snapshot() a folder path (or set $SNAPCACHE_ROOT), or move the file away"
    else:
        what = "hold snapshot folders" if os.path.isdir(path) else "be created"
        why, way = f"cannot {what} ({error.strerror or error})", elsewhere
    return StoreError(f"snapshot root {path} {why}: {way}")


def open_reader(storage: Storage, manifest, options) -> SnapshotReader:
    """A reader of a committed snapshot configured by the snapshot's read options."""
    warn_option_conflicts(storage, manifest, options)
    return _open(storage, manifest, options.read)


_conflicts_warned: set[tuple] = set()


def warn_option_conflicts(storage: Storage, manifest: Manifest, options) -> None:
    """Warn once (per snapshot and options, in this process) when ``name=`` or a non-default
    ``compression=`` differ from what the committed snapshot has: they do not change the
    examples, so they are not in its fingerprint and the snapshot is read as it is."""
    conflicts = []
    if options.name is not None and options.name != manifest.name:
        conflicts.append(f"name={options.name!r} (the snapshot's name is {manifest.name!r})")
    asked = options.write.compression
    if asked != WriteOptions().compression and asked != manifest.compression:
        conflicts.append(f"compression={asked!r} (the snapshot was written with "
                         f"{manifest.compression!r})")
    key = (storage.url, tuple(conflicts))
    if not conflicts or key in _conflicts_warned:
        return
    _conflicts_warned.add(key)
    root, _, folder = storage.url.rpartition("/")
    warn(
        f"snapshot {folder[:12]} in {root} already exists; {' and '.join(conflicts)} has no "
        "effect: options that do not change the examples are not part of the fingerprint, "
        f"so it is read as it is. Purge it (`snapcache purge {root} {folder[:12]}`) to "
        "rewrite it with these options, or drop them", OptionConflictWarning)


def _write_then_read(written: Iterator[Any], storage: Storage, op: ops.SnapshotOp,
                     spec: streams.StreamSpec) -> Iterator[Any]:
    """One stream writes the whole snapshot for all (its examples are not yielded as they
    are written), then reads back its own share like every other stream."""
    for _ in written:
        pass
    manifest = load_manifest(storage)
    if manifest is None:  # committed by nobody: cannot happen after a complete write
        raise CorruptSnapshotError(f"snapshot {storage.url} was not committed after writing")
    yield from stream_rows(open_reader(storage, manifest, op.options), op, spec)


def _replay(storage: Storage, record: StreamRecord, options, count: int,
            commit_fields: Callable[[], dict]) -> Iterator[Any]:
    """This stream is complete while others are not: yield its own shards again, then commit
    if the others have finished meanwhile."""
    fields = commit_fields()
    partial = _partial_manifest(record, fields["fingerprint"])
    yield from SnapshotReader(storage, partial, verify=options.read.verify).examples()
    try_commit(storage, count, **fields)


def stream_rows(reader: SnapshotReader, op: ops.SnapshotOp, spec: streams.StreamSpec
                ) -> Iterator[Any]:
    """This stream's share of a committed snapshot: the rows it wrote, if the snapshot was
    written by as many streams, else chunks of its rows round-robin across the streams."""
    order = EpochOrder(layout_of(reader.manifest), None, 0)
    share = read_share(reader.manifest, spec, shuffled=False)
    with read_session(reader, op, order, share):
        for _, _, rows in ordered_pieces(reader, order, share.pieces(), mode="rows",
                                         piece=piece_rows(share.unit)):
            yield from rows


@contextlib.contextmanager
def read_session(reader: SnapshotReader, op: ops.SnapshotOp, order: EpochOrder | None = None,
                 share: Share | None = None, skip: int = 0) -> Iterator[None]:
    """Read under a lease, so ``purge`` keeps the snapshot. The process keeps its lease
    (renewed in the background) for as long as the snapshot op ``op`` can read again, and
    releases it at exit: later epochs make no lease request. A process forked from one that
    holds the lease (a DataLoader worker of a loader made after the snapshot was committed,
    see :func:`hold_for_workers`) takes none: its parent's covers its reads.

    With the epoch's ``order`` and the ``share`` it reads (after ``skip``): on an object
    store, a read that takes a new lease starts the GET of its first shard before the lease's
    requests, beside them (:func:`fetch_first_early`); what no read took is dropped at the
    end of the session."""
    storage = reader.storage
    if order is not None and share is not None:
        fetch_first_early(reader, order, share, skip)
    try:
        if not held_by_parent(storage):
            _hold(storage, reader.manifest, op)
        yield
    finally:
        reader.early.clear()


def fetch_first_early(reader: SnapshotReader, order: EpochOrder, share: Share,
                      skip: int = 0) -> None:
    """On an object store, when this read will take a new read lease: start the GET of the
    first shard ``share`` reads (after ``skip``) now, so that it overlaps the lease's requests
    (:meth:`EarlyFetches.start <snapcache.store.early_fetch.EarlyFetches.start>`)."""
    if reader.storage.local or holds_read(reader.storage):
        return
    shard = first_shard(order, share, skip)
    if shard is not None:
        reader.early.start(reader.manifest.shards[shard])


def hold_for_workers(op: ops.SnapshotOp) -> tuple[Storage, Manifest] | None:
    """Hold a read lease on ``op``'s snapshot in this process while ``op`` lives, if it is
    committed: the worker processes forked from here to read it then take none of their own
    (one lease for a DataLoader, not one per worker and epoch). Its folder and manifest if
    held; None if not committed, or if the storage cannot be reached now (the workers then
    take their own)."""
    from snapcache.pipeline.plan import committed_snapshot

    try:
        storage, manifest = committed_snapshot(op)
        if manifest is not None:
            _hold(storage, manifest, op)
    except OSError as e:
        log.info("snapshot %s: not held for the loader's workers (%s); each worker holds its "
                 "own read lease", op.path, e)
        return None
    return (storage, manifest) if manifest is not None else None


def _hold(storage: Storage, manifest: Manifest, op: ops.SnapshotOp) -> None:
    try:
        fresh = hold_read(storage, ttl=op.options.coordination.lease_ttl, holder=op)
    except OSError as e:  # read-only storage: reading still works, purge just cannot see us
        log.debug("cannot record the read of %s: %s", storage.url, e)
        return
    if not fresh:
        return
    # The record of use and the check that the snapshot is still there do not depend on each
    # other: on an object store they go out together (one round trip of the first batch's
    # wait instead of two).
    if storage.local:
        _touch_last_used(storage)
        present = storage.exists(manifest_file(manifest))
    else:
        with ThreadPoolExecutor(1, thread_name_prefix="snapcache-last-used") as pool:
            touched = pool.submit(_touch_last_used, storage)
            present = storage.exists(manifest_file(manifest))
        touched.result()
    if not present:
        # A purge removed the snapshot between our reading its manifest and taking the lease.
        raise CorruptSnapshotError(
            f"snapshot {storage.url} was purged while it was being opened; iterate "
            "again to rebuild it")


def _write(source: Iterator[Any], writer: SnapshotWriter, lease, resumed: SnapshotReader | None,
           committed_by_another: Callable[[int, bool], Iterator[Any] | None],
           progress: EpochProgress | None = None) -> Iterator[Any]:
    done = 0
    finished = False  # the source is exhausted: committing
    try:
        with interrupt.keeps_written(writer, source):
            if resumed is not None:  # the examples of finished shards: read back, not recomputed
                for item in resumed.examples():
                    done += 1
                    yield item
            try:
                for item in source:
                    writer.write(item)
                    done += 1
                    yield read_only(item)  # as every later epoch reads it
                finished = True
                manifest = writer.commit()
                if progress is not None and manifest is not None and \
                        manifest.writer.get("run_id") == writer.run_id:  # we committed it
                    progress.finish()
            except LeaseLostError as lost:
                # Fenced out: this writer commits nothing. If the one that took over has
                # committed meanwhile, the epoch goes on with its snapshot instead of failing.
                rest = committed_by_another(done, finished)
                if rest is None:
                    raise
                log.warning("%s; the snapshot was committed by the other writer: this epoch "
                            "goes on reading it", lost)
                yield from rest
    finally:
        if lease is not None:
            lease.release()
        if writer.storage.local:  # (object stores have no empty folders: no LIST for it)
            writer.storage.remove_if_empty()  # a failed epoch that wrote nothing leaves nothing


def read_only_examples(examples: Iterator[Any]) -> Iterator[Any]:
    """``examples`` computed in place of a snapshot's read (``on_busy="compute"``), handed on
    as a read hands them out: numpy arrays read-only (:func:`~snapcache.store.decoder.read_only`).
    A map after the snapshot that writes into its input then fails in whichever epoch it
    first runs, with the same error, rather than only once epochs read the snapshot."""
    return ops.closing(examples, (read_only(example) for example in examples))


def _partial_manifest(resume: StreamRecord, fingerprint: str) -> Manifest:
    """A manifest listing only ``resume``'s shards, to read them back before the commit."""
    return Manifest(fingerprint=fingerprint, schema=resume.schema, shards=resume.shards,
                    compression="", created_at="", committed_at="", writer={})


def _touch_last_used(storage: Storage) -> None:
    """Record the use (``snapcache ls`` shows it), at most every :data:`LAST_USED_INTERVAL`
    seconds a process; a failure is only logged (reads go on)."""
    url = storage.url
    now = time.monotonic()
    if now - _last_used.get(url, -1e9) < LAST_USED_INTERVAL:
        return
    _last_used[url] = now
    try:
        record_last_use(storage)
    except OSError as e:
        log.debug("cannot record the use of %s: %s", storage.url, e)


def _warn_randomness(op: ops.SnapshotOp, labelled) -> None:
    if op in _warned:
        return
    _warned.add(op)
    for label, node in labelled:
        for problem in node.randomness_problems():
            warn(
                f"{label} {problem}: its random draws are frozen into the snapshot at "
                f"{op.path} and replayed every epoch. Move it after .snapshot(), or seed it.",
                RandomnessWarning)
