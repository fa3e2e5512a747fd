"""TensorFlow: a ``Dataset`` as a ``tf.data.Dataset`` whose ``element_spec`` comes from the
snapshot's schema.

Where the spec comes from, in order:

1. ``to_tf(element_spec=...)`` if given;
2. the committed snapshot's schema, when the pipeline has a ``.snapshot()`` and only ops that
   keep the example structure follow it (ops whose traits say ``structure_preserving``:
   shuffle, batch, filter, take, shard, repeat, prefetch, cache). A snapshot not committed yet is built first (the first epoch's work, done once).
   Dimensions that varied between examples are ``None``; each ``batch`` after the snapshot adds
   a leading ``None``; after a ``padded_batch`` every dimension of an array is ``None``;
3. otherwise the first example (or batch) of epoch 0: its shapes, with a leading ``None`` for
   each ``batch`` of the pipeline (a batch of batches: the last one, or a remainder of the
   inner batch, is smaller in both). Pass ``element_spec`` when later examples may have other
   shapes.

Each iteration of the ``tf.data.Dataset`` (each Keras epoch) is the next snapcache epoch, so
seeded shuffles reshuffle.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from snapcache.adapters._imports import require
from snapcache.pipeline import queries
from snapcache.store.schema import Schema

def to_tf(dataset: Any, *, element_spec: Any = None) -> Any:
    tf = require("tensorflow", "ds.to_tf()")
    spec = element_spec if element_spec is not None else infer_element_spec(dataset)

    def generate() -> Iterator[Any]:
        yield from dataset.iterate()

    tf_dataset = tf.data.Dataset.from_generator(generate, output_signature=spec)
    length = queries.known_length(dataset)
    if length is not None:  # lets Keras show progress and know where an epoch ends
        tf_dataset = tf_dataset.apply(tf.data.experimental.assert_cardinality(length))
    return tf_dataset


def infer_element_spec(dataset: Any) -> Any:
    """The ``tf.TypeSpec`` structure of the pipeline's elements (see the module docstring)."""
    tf = require("tensorflow", "ds.to_tf()")
    structure = queries.snapshot_structure(dataset)
    if structure is not None:
        schema, batch_dims = structure
        spec = spec_from_schema(tf, schema, batch_dims)
    else:
        first = next(iter(dataset.iterate(epoch=0)), _EMPTY)
        if first is _EMPTY:
            raise ValueError("ds.to_tf(): the dataset is empty, so its element_spec cannot "
                             "be inferred; pass to_tf(element_spec=...)")
        spec = spec_from_value(tf, first, queries.batch_dims(dataset))
    if queries.pads(dataset):  # padded to each batch's longest: no size is known ahead
        spec = tf.nest.map_structure(
            lambda s: tf.TensorSpec((None,) * len(s.shape), s.dtype), spec)
    return spec


_EMPTY = object()


def spec_from_schema(tf: Any, schema: Schema, batch_dims: int = 0) -> Any:
    """TensorSpecs of a snapshot schema's examples, with ``batch_dims`` leading ``None``s."""
    lead = (None,) * batch_dims
    specs = []
    for field in schema.fields:
        if field.kind in ("str", "bytes"):
            specs.append(tf.TensorSpec(lead, tf.string))
            continue
        shape = () if field.kind == "scalar" else \
            (field.shape if field.shape is not None else (None,) * field.ndim)
        specs.append(tf.TensorSpec(lead + tuple(shape), _tf_dtype(tf, np.dtype(field.dtype))))
    if schema.structure == "dict":
        return {field.name: spec for field, spec in zip(schema.fields, specs)}
    if schema.structure == "tuple":
        return tuple(specs)
    return specs[0]


def spec_from_value(tf: Any, value: Any, batch_dims: int = 0) -> Any:
    """TensorSpecs matching one element, its ``batch_dims`` leading dimensions ``None`` (as
    :func:`spec_from_schema` makes them): each batch's size varies at an epoch's end."""
    if isinstance(value, dict):
        return {k: spec_from_value(tf, v, batch_dims) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(spec_from_value(tf, v, batch_dims) for v in value)
    if isinstance(value, (str, bytes)):
        return tf.TensorSpec((), tf.string)
    array = np.asarray(value)
    shape = tuple(array.shape)
    lead = min(batch_dims, len(shape))
    shape = (None,) * lead + shape[lead:]
    if array.dtype == object or array.dtype.kind in "US":
        return tf.TensorSpec(shape, tf.string)
    return tf.TensorSpec(shape, _tf_dtype(tf, array.dtype))


def _tf_dtype(tf: Any, dtype: np.dtype) -> Any:
    try:
        return tf.as_dtype(dtype)
    except TypeError as e:
        raise TypeError(f"ds.to_tf(): TensorFlow has no dtype for numpy {dtype}; convert the "
                        "field in a map() after the snapshot") from e
