"""Which codec a shard is written with: decided from a sample of its first record batch, per
shard, and recorded in its :class:`~snapcache.store.manifest.ShardInfo` (docs/format.md).

Compression is worth it only where it saves enough to pay for its decoding at read time, and
then the codec that reads fastest from where the shard is stored wins: lz4 on a local disk,
zstd on remote storage where every byte is downloaded.
"""

from __future__ import annotations

import pyarrow as pa

from snapcache.store.options import WriteOptions


MIN_SAVINGS = 0.3
"""A shard is compressed only if compressing a sample of its first record batch saves at least
this share of the bytes. Decoding zstd runs at ~1 GB/s a core while raw Arrow buffers are read
at memory or disk speed, so smaller savings cost reading time instead of saving it (pixels with
6 bits of noise shrink by ~25% and read ~3x slower compressed)."""
ZSTD_OVER_LZ4 = 0.5
"""With the default ``compression="auto"`` on local storage, zstd is taken over lz4 only where
its sample comes out at most this share of lz4's (of the raw size when lz4 saves too little):
lz4 decodes ~3x faster (token-like int32 rows: ~5 GB/s a core against ~1.9 GB/s), which is worth
more than the bytes zstd saves on a local disk or in the page cache. On remote storage, where
each byte is downloaded, zstd is taken wherever it saves :data:`MIN_SAVINGS`."""
SAMPLE_BYTES = 1 << 20
"""Bytes of the first record batch compressed to decide."""


def _ipc_size(batch: pa.RecordBatch, codec: pa.Codec | None) -> int:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema,
                           options=pa.ipc.IpcWriteOptions(compression=codec)) as w:
        w.write_batch(batch)
    return sink.getvalue().size


def choose_compression(batch: pa.RecordBatch, options: WriteOptions, local: bool = True
                       ) -> str:
    """The codec a shard starting with ``batch`` is written with, from a sample of the batch.

    An explicit codec is kept if it saves at least :data:`MIN_SAVINGS`, else ``"none"``. The
    default ``"auto"`` picks among the codecs that save that much the one that reads fastest
    from where the shard is stored (``local``: a local path rather than remote storage): lz4,
    or zstd where it leaves at most :data:`ZSTD_OVER_LZ4` of lz4's bytes; on remote storage
    zstd."""
    asked = options.compression
    if asked == "none" or batch.num_rows == 0:
        return "none"
    codecs = ("lz4", "zstd") if asked == "auto" else (asked,)
    raw, packed = _sample_sizes(batch, codecs, options)
    saving = [c for c in codecs if packed[c] <= (1 - MIN_SAVINGS) * raw]
    if asked != "auto" or not saving:
        return saving[0] if saving else "none"
    if not local:
        return "zstd" if "zstd" in saving else "lz4"
    if "zstd" in saving and packed["zstd"] <= ZSTD_OVER_LZ4 * min(packed["lz4"], raw):
        return "zstd"
    return "lz4" if "lz4" in saving else "none"


def _sample_sizes(batch: pa.RecordBatch, codecs: tuple[str, ...], options: WriteOptions
                  ) -> tuple[int, dict[str, int]]:
    """(raw bytes, {codec: compressed bytes}) of a sample of about :data:`SAMPLE_BYTES` of
    ``batch``."""
    rows = max(1, min(batch.num_rows,
                      SAMPLE_BYTES * batch.num_rows // max(1, batch.nbytes)))
    if rows == 1 and batch.nbytes > 2 * SAMPLE_BYTES:
        return _sample_bytes(batch, codecs, options)
    sample = batch.slice(0, rows)
    return _ipc_size(sample, None), {c: _ipc_size(sample, arrow_codec(c, options))
                                     for c in codecs}


def _sample_bytes(batch: pa.RecordBatch, codecs: tuple[str, ...], options: WriteOptions
                  ) -> tuple[int, dict[str, int]]:
    """The sample of a batch whose first row alone is far larger than it: the first bytes of
    its buffers, compressed as they are (serialising the row would copy all of a huge example,
    twice)."""
    pieces = []
    raw = 0
    for column in batch.columns:
        for buffer in column.buffers():
            if buffer is None or raw >= SAMPLE_BYTES:
                continue
            pieces.append(buffer.slice(0, min(buffer.size, SAMPLE_BYTES - raw)))
            raw += pieces[-1].size
    return raw, {c: sum(arrow_codec(c, options).compress(p).size for p in pieces)  # type: ignore
                 for c in codecs}


def arrow_codec(name: str, options: WriteOptions) -> pa.Codec | None:
    """The Arrow codec a shard recorded with ``name`` is written with (None: no compression)."""
    if name == "none":
        return None
    # The level asked applies to the codec asked; "auto" takes no level (see WriteOptions).
    level = options.compression_level if name == options.compression else None
    return pa.Codec(name, level)
