"""Writing a snapshot: examples in, checksummed Arrow shards and a manifest out.

Examples are validated and copied into the next record batch; each full record batch is
encoded, compressed, checksummed and written on the caller's thread, by Arrow, which compresses
a batch's buffers in parallel on its own threads without the GIL. On remote storage a finished
shard then uploads in the background (:mod:`snapcache.store.upload`) while the next is written.
Nothing is visible as a snapshot until the manifest is committed (see
:mod:`snapcache.store.protocol` for how several streams commit exactly once).

Why not a writer thread of snapcache's own: a Python thread that needs the GIL back (after each
native call: every write Arrow makes through a Python file, every hash update) waits until the
thread holding it lets go of it for long enough. A map that releases the GIL often and briefly
(numpy's random generators, most numpy calls on larger arrays, image decoders) never does: each
release hands the GIL straight back to itself, and wakes the waiting thread for nothing. The
writer thread then waited most of an epoch, and the futile wake-ups slowed the map itself by
35-80% (token-like rows: 4.3-4.9 s for 100,000 examples against 2.9-3.0 s written on the
caller's thread, which compression costs ~0.1 s of). Even a thread that only writes each
record batch's bytes to the file (``os.writev``, the GIL needed twice a record batch) cost that
epoch 0.4-0.5 s. Rows of :data:`BACKGROUND_ROW_BYTES` or more come from a map that works long
between two releases of the GIL, and there that thread pays: the kernel's copy into the page
cache (~1.5 ms a MB into fresh memory on a virtual machine) leaves the caller's thread (an
image-like first epoch with a 1 ms map: 1.06x the epoch without a snapshot, against 1.11-1.12x
with the copy on the caller's thread). So local shards of such rows are written out by a
:class:`~snapcache.store.background_write.BackgroundFile`, the others on the caller's thread.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import xxhash

from snapcache.errors import LeaseLostError, StoreError
from snapcache.store.options import FIRST_RECORD_BATCH, WriteOptions
from snapcache.store.order import PIECE_ROWS
from snapcache.store import layout
from snapcache.store.compression import arrow_codec, choose_compression
from snapcache.store.encoder import Encoder
from snapcache.store.fs import Storage, is_storage_error
from snapcache.store.indexed_file import (HashingSink, IndexedFileWriter, page_size_for,
                                          store_page_table)
from snapcache.store.protocol import WriteLease
from snapcache.store.manifest import (
    CHECKSUM_ALGORITHM, MAX_BATCH_ROWS, Manifest, ShardInfo, now_iso)
from snapcache.store.schema import Schema, infer_schema, merge_schemas
from snapcache.store.recorder import FLUSH_BYTES, Recorder
from snapcache.store.upload import Spool, Uploads
from snapcache.store.protocol import (
    StreamRecord, commit_fields, try_commit, write_marker)

log = logging.getLogger(__name__)


def batch_rows(example_bytes: int, target_bytes: int, most: int = MAX_BATCH_ROWS) -> int:
    """Rows per record batch: the largest power of two whose batch stays within the target.

    Powers of two make the record batches line up with the batch sizes users pick (32, 256,
    1024): a ``snapshot -> batch(256)`` pipeline then cuts its batches out of one record batch
    each, without copying them together.
    """
    rows = max(1, target_bytes // max(1, example_bytes))
    return min(most, 1 << (rows.bit_length() - 1))


def first_batch_rows(example_bytes: int, target_bytes: int) -> int:
    """Rows of a stream's first record batch: those of :data:`FIRST_RECORD_BATCH` bytes, but
    at least :data:`PIECE_ROWS` (all a read's first batch waits for, so that it can come from
    that record batch alone) and at most the other record batches' (``target_bytes``). A
    power of two like them: batches of up to 1,024 rows still line up with every record
    batch. Token rows (520 B): 1,024 rows, against 16,384 in the others; images of 49 KB:
    256, as the others."""
    rows = batch_rows(example_bytes, target_bytes)
    return min(rows, max(PIECE_ROWS, batch_rows(example_bytes, FIRST_RECORD_BATCH)))


def _payload_bytes(example: Any) -> int:
    """Bytes of the arrays, str and bytes directly in an example (cheap, approximate)."""
    values = example.values() if isinstance(example, dict) else \
        example if isinstance(example, tuple) else (example,)
    total = 0
    for value in values:
        if isinstance(value, np.ndarray):
            total += value.nbytes
        elif isinstance(value, (str, bytes)):
            total += len(value)
    return total


BACKGROUND_ROW_BYTES = 16 << 10
"""A local shard whose first record batch holds rows of this many bytes or more on average is
written out to its file by a thread (:mod:`snapcache.store.background_write`); smaller rows
are written on the caller's thread (see the module's docstring)."""


class _ShardFile:
    """One shard being written: a temporary file that becomes final on :meth:`finish` (on a
    remote filesystem a :class:`Spool` the writer then uploads whole, see
    :mod:`snapcache.store.upload`).

    Its codec is chosen from its first record batch (:func:`choose_compression`) and recorded
    in its :class:`ShardInfo`; a compressed shard that ends up larger than its raw payload is
    rewritten uncompressed, so compression never costs disk space."""

    def __init__(self, storage: Storage, name: str, first: pa.RecordBatch,
                 options: WriteOptions):
        self.storage, self.name, self.options = storage, name, options
        self.tmp = layout.tmp_name(name) if storage.local else name
        self.spool: Spool | None = None
        self.compression = choose_compression(first, options, local=storage.local)
        # rows this large come from a map that works long between two releases of the GIL:
        # a thread writing the file out gets the GIL back soon (see background_write)
        self._background = first.num_rows > 0 and \
            first.nbytes >= BACKGROUND_ROW_BYTES * first.num_rows
        self._open(first.schema, self.compression)
        self._flushed = 0  # bytes flushed to the disk early (flush_due)
        self.rows = 0
        self.raw_bytes = 0
        self.batch_rows: list[int] = []

    def _output(self) -> Any:
        if self.storage.local:
            return self.storage.open_output(self.tmp, background=self._background)
        self.spool = Spool()
        return self.spool

    def _open(self, schema: pa.Schema, compression: str) -> None:
        self.sink = HashingSink(self._output(), self._page_size(compression))
        self.writer = IndexedFileWriter(self.sink, schema, arrow_codec(compression, self.options))

    def _page_size(self, compression: str) -> int | None:
        """Pages checksummed one by one (ShardInfo.pages_checksum) serve rows read alone from
        raw shards on local disk only: a compressed buffer is decompressed whole, and a row on
        remote storage is one ranged GET of its record batch either way."""
        if compression != "none" or not self.storage.local:
            return None
        return page_size_for(self.options.batch_target)

    def write(self, batch: pa.RecordBatch, raw_bytes: int) -> None:
        self.writer.write_batch(batch)
        self.sink.flush()  # a background file's thread writes the record batch out
        self.rows += batch.num_rows
        self.raw_bytes += raw_bytes
        self.batch_rows.append(batch.num_rows)

    def flush_due(self) -> int | None:
        """A descriptor of the local file, of its own, once :data:`FLUSH_BYTES` more were
        written since the last one: for the recorder to flush them to the disk early."""
        if not self.storage.local or self.sink.size - self._flushed < FLUSH_BYTES:
            return None
        self._flushed = self.sink.size
        return os.dup(self.sink.fileno())

    def finish(self) -> ShardInfo:
        self.writer.close()
        self.sink.close()
        if self.compression != "none" and self.sink.size > self.raw_bytes:
            self._rewrite_raw()
        pages = self.sink.pages()
        if pages is not None:  # before the shard is in place: a listed shard has its table
            store_page_table(self.storage, self.name, pages)
        if self.tmp != self.name:
            self.storage.rename(self.tmp, self.name)
        return ShardInfo(path=self.name, rows=self.rows, bytes=self.sink.size,
                         checksum=f"{CHECKSUM_ALGORITHM}:{self.sink.hash.hexdigest()}",
                         raw_bytes=self.raw_bytes, batch_rows=tuple(self.batch_rows),
                         compression=self.compression,
                         batch_offsets=tuple(self.writer.offsets),
                         batch_checksums=tuple(self.writer.checksums),
                         page_size=self.sink.page_size,
                         pages_checksum=xxhash.xxh3_64(pages).hexdigest()
                         if pages is not None else None)


    def _rewrite_raw(self) -> None:
        """The shard's later batches did not compress like its first: store it raw if that
        is smaller."""
        written = self.spool.read() if self.spool is not None else \
            self.storage.read_bytes(self.tmp)
        table = pa.ipc.open_file(pa.py_buffer(written)).read_all()
        buffer = io.BytesIO()
        raw = HashingSink(buffer, self._page_size("none"))
        writer = IndexedFileWriter(raw, table.schema, None)
        for batch in table.to_batches():
            writer.write_batch(batch)
        writer.close()
        if raw.size >= self.sink.size:
            return
        self.compression = "none"
        if self.spool is not None:
            self.spool.discard()
        out = self._output()
        out.write(buffer.getbuffer())
        out.close()
        self.sink, self.writer = raw, writer

    def discard(self) -> None:
        try:
            self.writer.close()
        except Exception:  # already broken; the file is removed anyway
            pass
        self.sink.abandon()
        if self.spool is not None:
            self.spool.discard()
        elif self.storage.local:  # (a remote shard handed to its upload is the writer's)
            self.storage.remove(self.tmp)


class SnapshotWriter:
    """Writes one snapshot folder.

    Example::

        writer = SnapshotWriter(Storage("/tmp/snaps").child(fp), fingerprint=fp)
        for example in examples:
            writer.write(example)
        manifest = writer.commit()      # or writer.abort() to stop without committing
    """

    def __init__(self, storage: Storage, *, fingerprint: str,
                 options: WriteOptions | None = None, fingerprint_tree: dict | None = None,
                 pipeline: str = "", stream: int = 0, streams: int = 1,
                 run_id: str | None = None, resume: StreamRecord | None = None,
                 lease: WriteLease | None = None,
                 key: str | None = None, name: str | None = None, task: str | None = None):
        if not 0 <= stream < streams:
            raise ValueError(f"stream must be in [0, {streams}); got {stream}")
        self.storage = storage
        self.fingerprint = fingerprint
        self.options = options or WriteOptions()
        self._key, self._name = key, name  # recorded in the manifest
        self._task = task  # a delta build's task, recorded in the progress records
        self._tree, self._pipeline = fingerprint_tree, pipeline
        self._stream, self._streams, self._lease = stream, streams, lease
        self._run_id = run_id or layout.new_run_id()
        self._created_at = now_iso()
        self._encoder: Encoder | None = None
        self._count = 0
        self._shard: _ShardFile | None = None  # the shard being written
        self._seq = 0  # shards this run has started
        self._error: BaseException | None = None
        self._resume_schema = resume.schema if resume else None
        self._shards: list[ShardInfo] = list(resume.shards) if resume else []
        self._recorded = 0  # shards in this run's progress files written so far
        self._latest_schema: dict | None = self._resume_schema
        self._tmp: list[str] = []           # in-flight files this writer created, for abort()
        self._uploads: Uploads | None = None  # remote: finished shards uploading
        self._recorder = Recorder(self.storage)  # flushes shards, writes progress records
        self._state = "open"
        self._batch_target = self.options.batch_target
        self._batch_rows: int | None = None
        self._first_rows = 0  # the stream's first record batch's (first_batch_rows), until sent

    @property
    def run_id(self) -> str:
        """This writer run's id (recorded in the manifest it commits)."""
        return self._run_id

    @property
    def num_examples(self) -> int:
        """Examples written by this writer (not counting resumed shards)."""
        return self._count

    # -- consumer side -------------------------------------------------------------------------
    def write(self, example: Any) -> None:
        """Add one example. Raises if the example cannot be stored or the writer failed, and
        LeaseLostError once its lease's heartbeat found the stream taken over."""
        self._check_open()
        if self._lease is not None:
            if self._lease.lost is not None:
                self.abort()
                raise LeaseLostError(self._lease.lost)
            self._lease.touch()
        if self._encoder is None:
            self._encoder = Encoder(infer_schema(example))
            self.storage.makedirs()
            # the first record batch's rows from the first on into one buffer (estimated from
            # the first example's arrays; the rows are decided once it is added, below)
            self._encoder.plan_rows(first_batch_rows(max(1, _payload_bytes(example)),
                                                     self._batch_target))
        if self._encoder.num_rows and _payload_bytes(example) >= self._batch_target:
            # A large example goes into a record batch of its own, so that flushing it does
            # not copy it together with the rows before it (writing N bytes needs ~2N).
            self._write_rows()
        self._encoder.add(example, index=self._count)
        self._count += 1
        if self._batch_rows is None:
            self._batch_rows = batch_rows(self._encoder.nbytes, self._batch_target)
            self._first_rows = first_batch_rows(self._encoder.nbytes, self._batch_target)
        if self._encoder.num_rows >= (self._first_rows or self._batch_rows) or \
                self._encoder.nbytes >= 2 * self._batch_target:
            self._write_rows()

    def _write_rows(self) -> None:
        """:meth:`_send_batch`; a failure aborts the writer and comes out as :meth:`_wrap`
        says (an interruption comes out as it is: the caller decides what to keep)."""
        try:
            self._send_batch()
        except Exception:
            self._check_open()  # aborts, and raises the failure
            raise

    def commit(self) -> Manifest | None:
        """Finish this stream and commit the snapshot if every stream is now complete.

        Returns the committed manifest, or None when other streams are still being written
        (the last of them commits).
        """
        self._check_open()
        if self._lease is not None:
            self._lease.touch()  # committing is progress (see protocol.lease.stalled)
        with self._aborting():
            record = self._flush()
            write_marker(self.storage, record, self._lease)  # fenced: see streams.fence
            manifest = try_commit(self.storage, self._streams, **commit_fields(
                self.options, key=self._key, name=self._name, fingerprint=self.fingerprint,
                fingerprint_tree=self._tree,
                pipeline=self._pipeline, run_id=self._run_id, created_at=self._created_at))
        self._state = "committed"
        return manifest

    def finish(self) -> StreamRecord:
        """Finish writing without committing anything: the shards written, in order, and their
        schema (what a delta snapshot's segment holds; see :mod:`snapcache.store.protocol.versions`)."""
        self._check_open()
        with self._aborting():
            record = self._flush()
        self._state = "finished"
        return record

    @contextlib.contextmanager
    def _aborting(self) -> Iterator[None]:
        """Abort the writer if the block fails; an OSError comes out saying what to do."""
        try:
            yield
        except BaseException as e:
            self.abort()
            if is_storage_error(e):
                raise self._wrap(e) from e
            raise

    def _flush(self) -> StreamRecord:
        if self._encoder is not None:
            if self._encoder.num_rows:
                self._send_batch()
            self._end_shards()
        self.storage.makedirs()
        return self._record(self._schema_json())

    def abort(self, keep: bool = False) -> None:
        """Stop writing; delete the shard in progress. Finished shards stay, recorded in this
        run's progress file, so a later run can reuse them. Safe to call twice.

        ``keep=True`` (an interruption: Ctrl-C, SIGTERM, a consumer that stops early) keeps
        every example written so far: the buffered rows and the shard in progress are finished
        and recorded, so the next run resumes after them. Not when the writer failed or its
        lease was taken over: then the shard in progress is deleted as without ``keep``."""
        if self._state != "open":
            return
        if keep and self._error is None and self._encoder is not None:
            try:
                self._keep()
                return
            except BaseException as e:  # a failure, a lost lease or a second Ctrl-C: discard
                log.info("snapshot %s: the shard in progress is discarded (%s)",
                         self.storage.url, e)
        self._state = "aborted"
        self._drop_shard()
        if self._uploads is not None:  # wait for those under way: their files are removed next
            self._uploads.close()
            self._uploads = None
        try:  # recorded shards stay (they are no longer in self._tmp)
            self._recorder.stop()
        except Exception as e:
            log.info("snapshot %s: the last progress record was not written (%s)",
                     self.storage.url, e)
        for name in self._tmp:
            self.storage.remove(name)
            self.storage.remove(layout.tmp_name(name))

    def _keep(self) -> None:
        """Finish the shard in progress with the buffered rows and record it in the progress
        record, then stop."""
        assert self._encoder is not None
        if self._lease is not None:
            self._lease.check()  # fenced: a writer that lost its stream records nothing
        if self._encoder.num_rows:
            self._send_batch()
        self._end_shards()
        self._state = "aborted"
        log.info("snapshot %s stream %d interrupted: %d examples of this run kept for the next "
                 "run to resume from", self.storage.url, self._stream, self._count)

    def _record(self, schema: dict | None) -> StreamRecord:
        return StreamRecord(self._stream, self._streams, self._run_id, tuple(self._shards),
                            schema, self._task)

    def _schema_json(self) -> dict | None:
        if self._encoder is None:
            return self._resume_schema
        schema = self._encoder.observed_schema()
        if self._resume_schema is not None:
            schema = merge_schemas(Schema.from_json(self._resume_schema), schema,
                                   where=f"snapshot {self.fingerprint[:12]}")
        return schema.to_json()

    def __enter__(self) -> "SnapshotWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None and self._state == "open":
            self.commit()
        else:
            self.abort()

    def _check_open(self) -> None:
        if self._state != "open":
            raise RuntimeError(f"this SnapshotWriter is already {self._state}")
        if self._error is not None:
            error = self._error
            self.abort()
            raise self._wrap(error) from (error if is_storage_error(error) else None)

    def _wrap(self, error: BaseException) -> BaseException:
        """Storage failures (a full disk, a failed upload) become one clear StoreError."""
        if not is_storage_error(error):
            return error
        if self._lease is not None:  # files vanishing under a writer that lost its stream
            try:
                self._lease.check()
            except LeaseLostError as lost:
                return lost
            except OSError:
                pass
        return StoreError(
            f"writing snapshot {self.fingerprint[:12]} to {self.storage.url} failed: {error}. "
            "Nothing was committed; finished shards are kept for the next run "
            "(`snapcache purge --incomplete` removes them)")

    def _send_batch(self) -> None:
        """Write the buffered rows as the next record batch of the shard in progress (a new
        shard if none is), finishing the shard once it is full. A failure here (a full disk,
        a failed upload, an interruption) leaves the shard in progress torn: it is deleted,
        and the writer accepts nothing more (finished shards stay recorded)."""
        assert self._encoder is not None
        raw = self._encoder.nbytes
        batch = self._encoder.flush()
        self._first_rows = 0  # the next ones at the target's rows
        if self._batch_rows is not None:
            self._encoder.plan_rows(self._batch_rows)
        self._latest_schema = self._schema_json()
        try:
            if self._shard is None:
                name = layout.shard_name(self._run_id, self._stream, self._seq)
                self._tmp.append(name)
                self._seq += 1
                self._shard = _ShardFile(self.storage, name, batch, self.options)
            self._shard.write(batch, raw)
            del batch  # written: the encoder may reuse its memory
            fd = self._shard.flush_due()
            if fd is not None:
                self._recorder.flush_early(fd)
            if self._shard.sink.size >= self.options.shard_size:
                shard, self._shard = self._shard, None
                self._finish(shard)
        except BaseException as e:
            self._error = e
            self._drop_shard()
            raise

    def _end_shards(self) -> None:
        """Finish the shard in progress, wait for every upload and record what they stored."""
        try:
            if self._shard is not None:
                shard, self._shard = self._shard, None
                self._finish(shard)
            if self._uploads is not None:
                uploads, self._uploads = self._uploads, None
                self._stored(uploads.finish())
            self._recorder.stop()
        except BaseException as e:
            self._error = e
            raise

    def _drop_shard(self) -> None:
        if self._shard is not None:
            shard, self._shard = self._shard, None
            shard.discard()

    def _finish(self, shard: _ShardFile) -> None:
        try:
            info = shard.finish()
        except BaseException:
            shard.discard()
            raise
        if shard.spool is None:  # local: the file is in place
            self._stored([info])
            return
        if self._uploads is None:
            self._uploads = Uploads(self.storage, self.options.uploads_in_flight)
        stored = self._uploads.submit(info, shard.spool)
        shard.spool = None  # the upload has it now, and discards it once stored
        self._stored(stored)

    def _stored(self, shards: list[ShardInfo]) -> None:
        """Record shards that are in place (in order): one progress record for them all,
        written by the recorder thread (:mod:`snapcache.store.recorder`: on local disk the
        shards flushed to the disk first), which the caller's thread does not wait for. A
        failure of the recorder's is raised here, at the next shard's."""
        if not shards:
            return
        self._recorder.check()
        recorded = self._recorded
        for info in shards:
            self._shards.append(info)
            self._tmp.remove(info.path)
        self._recorded = len(self._shards)
        self._recorder.record([info.path for info in shards],
                              self._record(self._latest_schema), recorded)
