"""An opened shard whose record batches are validated before they are handed out
(:class:`ShardFile`), and how a damaged shard is reported: what damaged bytes make Arrow raise
(:data:`DAMAGE`), the way out every error names (:func:`way_out`) and the shard it names
(:func:`about_shard`, for ``on_corrupt="rebuild"``).

What a record batch is checked for, and what that costs, is in :mod:`snapcache.store.validate`;
how a shard's bytes are loaded and checked against the manifest first is in
:mod:`snapcache.store.reader`.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable

import pyarrow as pa

from snapcache.errors import CorruptSnapshotError

if TYPE_CHECKING:
    from snapcache.store.fs import Storage
    from snapcache.store.manifest import ShardInfo
    from snapcache.store.validate import BatchValidator

# What damaged bytes make Arrow (or Python decoding them) raise: never let one escape as such.
DAMAGE = (pa.ArrowException, OSError, ValueError, SystemError, UnicodeDecodeError, MemoryError,
           IndexError, OverflowError)


def way_out(storage: Storage) -> str:
    """What to do about a damaged snapshot folder ``storage``."""
    root, _, fingerprint = storage.url.rpartition("/")
    return (f"Check the root with `snapcache verify --root {root}`, delete this snapshot with "
            f"`snapcache purge --root {root} {fingerprint[:12]}` (or delete {storage.url}), "
            "and rerun the pipeline to rebuild it")


def about_shard(method: Callable[..., Any]) -> Callable[..., Any]:
    """A reader method taking a shard first: a CorruptSnapshotError it raises names that shard
    (``error.shard``), for ``on_corrupt="rebuild"`` to know which commits list it."""
    @functools.wraps(method)
    def wrapper(self: Any, shard: ShardInfo, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, shard, *args, **kwargs)
        except CorruptSnapshotError as e:
            e.shard = e.shard or shard.path
            raise
    return wrapper


class ShardFile:
    """An opened shard whose record batches are validated before they are handed out.

    See :mod:`snapcache.store.validate` for what is checked and what it costs.
    """

    def __init__(self, file_reader: pa.RecordBatchFileReader,
                 validator: BatchValidator | None, where: str, way_out: str,
                 path: str | None = None):
        self._file, self._validator = file_reader, validator
        self._where, self._way_out, self._path = where, way_out, path
        self.num_record_batches = file_reader.num_record_batches
        self.schema = file_reader.schema

    def get_batch(self, index: int, whole: bool = True) -> pa.RecordBatch:
        """Record batch ``index``, validated (``whole=False``: all but the tensors' shapes)."""
        try:
            try:
                batch = self._file.get_batch(index)
            except DAMAGE as e:
                raise CorruptSnapshotError(
                    f"{self._where} is corrupt: record batch {index} is damaged "
                    f"({type(e).__name__}: {e}). {self._way_out}") from None
            return self.checked(batch, index, self._validator, self._where, self._way_out,
                                structure_only=not whole)
        except CorruptSnapshotError as e:
            e.shard = e.shard or self._path
            raise

    @staticmethod
    def checked(batch: pa.RecordBatch, index: int, validator: BatchValidator | None,
                where: str, way_out: str, *, structure_only: bool = False) -> pa.RecordBatch:
        """Record batch ``index`` of the shard ``where`` once validated against the snapshot's
        schema (see :mod:`snapcache.store.validate`; ``structure_only``: all but the tensors'
        shapes, for rows decoded one by one); CorruptSnapshotError if not."""
        try:
            if validator is not None:
                if structure_only:
                    validator.check_structure(batch)
                else:
                    validator(batch)
            else:  # no schema to check against (an empty snapshot): Arrow's own full check
                batch.validate(full=True)
        except CorruptSnapshotError as e:
            raise CorruptSnapshotError(f"{where} is corrupt: record batch {index}: {e}. "
                                       f"{way_out}") from None
        except DAMAGE as e:
            raise CorruptSnapshotError(
                f"{where} is corrupt: record batch {index} is damaged "
                f"({type(e).__name__}: {e}). {way_out}") from None
        return batch
