"""Reading a committed snapshot back.

Readers trust nothing but the manifest, and the manifest only as far as the files agree with it:
each shard's size and xxh3 checksum are checked (checksum unless ``verify=False``) before any
of its examples is yielded, and its row count and Arrow schema must match.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Iterator, Sequence

import pyarrow as pa
import xxhash

from snapcache.errors import CorruptSnapshotError
from snapcache.store import layout
from snapcache.store.codec import Decoder, Schema
from snapcache.store.fs import Storage
from snapcache.store.manifest import Manifest, ShardInfo


def load_manifest(storage: Storage) -> Manifest | None:
    """The committed manifest of the snapshot folder ``storage``, or None if not committed."""
    try:
        data = storage.read_bytes(layout.MANIFEST)
    except FileNotFoundError:
        return None
    return Manifest.loads(data, where=storage.url)


def checksum(buffer: Any) -> str:
    return "xxh3_64:" + xxhash.xxh3_64(memoryview(buffer)).hexdigest()


class SnapshotReader:
    """Iterates the examples of a committed snapshot, shard by shard.

    Example::

        reader = SnapshotReader.open(Storage("/tmp/snaps").child(fingerprint))
        for example in reader:
            ...
    """

    def __init__(self, storage: Storage, manifest: Manifest, *, verify: bool = True,
                 read_ahead: int = 2):
        self.storage = storage
        self.manifest = manifest
        self.verify = verify
        self.read_ahead = max(0, read_ahead)
        self.schema = Schema.from_json(manifest.schema) if manifest.schema is not None else None
        self._decoder = Decoder(self.schema) if self.schema is not None else None
        self._arrow_schema = self.schema.arrow_schema() if self.schema is not None else None

    @classmethod
    def open(cls, storage: Storage, **kwargs: Any) -> "SnapshotReader":
        manifest = load_manifest(storage)
        if manifest is None:
            raise FileNotFoundError(f"no committed snapshot at {storage.url}")
        return cls(storage, manifest, **kwargs)

    def __len__(self) -> int:
        return self.manifest.num_examples

    def __iter__(self) -> Iterator[Any]:
        return self.examples()

    def examples(self, shards: Sequence[ShardInfo] | None = None) -> Iterator[Any]:
        decoder = self._decoder
        for batch in self.record_batches(shards):
            yield from decoder.rows(batch)  # type: ignore[union-attr]

    def record_batches(self, shards: Sequence[ShardInfo] | None = None
                       ) -> Iterator[pa.RecordBatch]:
        """Record batches of ``shards`` (default: all, in manifest order), each shard verified
        before its first batch is yielded; the next shards load and verify in the background."""
        shards = list(self.manifest.shards if shards is None else shards)
        if not shards:
            return
        pool = ThreadPoolExecutor(max_workers=max(1, self.read_ahead),
                                  thread_name_prefix="snapcache-read")
        pending: list[Future] = []
        try:
            position = 0
            while position < len(shards) or pending:
                while position < len(shards) and len(pending) <= self.read_ahead:
                    pending.append(pool.submit(self.open_shard, shards[position]))
                    position += 1
                file_reader = pending.pop(0).result()
                for i in range(file_reader.num_record_batches):
                    yield file_reader.get_batch(i)
        finally:
            for f in pending:
                f.cancel()
            pool.shutdown(wait=False, cancel_futures=True)

    def open_shard(self, shard: ShardInfo, *, verify: bool | None = None
                   ) -> pa.RecordBatchFileReader:
        """Load one shard and check it against the manifest; raise CorruptSnapshotError if not."""
        where = f"snapshot {self.manifest.fingerprint[:12]} shard {shard.path!r}"
        try:
            buffer = self.storage.read_buffer(shard.path)
        except FileNotFoundError:
            raise CorruptSnapshotError(f"{where} is missing ({self.storage.url_of(shard.path)})"
                                       ) from None
        if buffer.size != shard.bytes:
            raise CorruptSnapshotError(
                f"{where} has {buffer.size} bytes, the manifest says {shard.bytes}")
        if self.verify if verify is None else verify:
            actual = checksum(buffer)
            if actual != shard.checksum:
                raise CorruptSnapshotError(
                    f"{where} is corrupt: checksum {actual} != {shard.checksum} in the manifest. "
                    f"Delete the snapshot folder ({self.storage.url}) to rebuild it")
        try:
            reader = pa.ipc.open_file(buffer)
            rows = reader.count_rows()
        except (pa.ArrowInvalid, OSError) as e:
            raise CorruptSnapshotError(f"{where} is not a readable Arrow file: {e}") from None
        if rows != shard.rows:
            raise CorruptSnapshotError(f"{where} has {rows} rows, the manifest says {shard.rows}")
        if self._arrow_schema is not None and not reader.schema.equals(self._arrow_schema):
            raise CorruptSnapshotError(f"{where} does not have the manifest's schema")
        return reader

    def verify_all(self) -> list[str]:
        """Check every shard; return one line per problem (empty if the snapshot is sound)."""
        problems = []
        for shard in self.manifest.shards:
            try:
                self.open_shard(shard, verify=True)
            except CorruptSnapshotError as e:
                problems.append(str(e))
        return problems

