"""Turn examples into Arrow record batches and back, exactly: the column layout, and the
public names of the two halves (:class:`~snapcache.store.encoder.Encoder` in
:mod:`snapcache.store.encoder`, :class:`~snapcache.store.decoder.Decoder` in
:mod:`snapcache.store.decoder`) with the schema they share (:mod:`snapcache.store.schema`).

:class:`Encoder` collects examples and :meth:`Encoder.flush` returns them as one
``pa.RecordBatch``; :class:`Decoder` turns a batch back into examples (:meth:`Decoder.rows`) or
whole columns (:meth:`Decoder.columns`). The column layout is described in
:mod:`snapcache.store.schema`; in short, a tensor field is a ``large_list`` of its flattened
C-order elements (its length is the shape for ndim 1, a companion ``"<name>.shape"``
``fixed_size_list<int32>`` column holds the shape for ndim >= 2).

Decisions:

- ``large_list``/``large_string``/``large_binary`` (int64 offsets) everywhere: one batch of
  images easily passes 2**31 elements, decoding is as fast as with int32 offsets, and the 4
  extra bytes a row vanish under compression. One layout, no fallback logic.
- The encoder copies each array when it is added, so the pipeline may reuse it (see
  :mod:`snapcache.store.encoder`).
- Decoded tensors are **read-only views** of the batch's Arrow buffers (zero copy); copy an
  array before writing to it (see :mod:`snapcache.store.decoder`).
- Round trips are exact: dtypes, shapes (0-d arrays stay 0-d, numpy scalars stay numpy
  scalars, Python ``bool``/``int``/``float`` stay Python objects), NaN payloads and ``-0.0``.
"""

from __future__ import annotations

from snapcache.store.decoder import Decoder
from snapcache.store.encoder import Encoder
from snapcache.store.schema import FieldSpec, Schema, infer_schema

__all__ = ["Decoder", "Encoder", "FieldSpec", "Schema", "infer_schema"]
