"""TensorFlow adapter: element_spec from the snapshot schema, Keras fit. (TF imports slowly:
keep these tests few and in this module.)"""

from __future__ import annotations

import os

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import snapcache as sc  # noqa: E402


def make(i):
    return {"x": np.full(4, i, np.float32), "y": np.float32(i % 2), "name": f"n{i}",
            "ragged": np.arange(i % 3 + 1, dtype=np.int32), "label": i}


def test_element_spec_comes_from_the_snapshot_schema_which_to_tf_builds(root):
    ds = sc.Dataset.range(12).map(make).snapshot(root, progress=False)
    assert not os.path.exists(root)
    tf_ds = ds.shuffle(4, seed=0).to_tf()
    assert len(os.listdir(root)) == 1          # built once, to read the schema
    spec = tf_ds.element_spec
    assert spec == {"x": tf.TensorSpec((4,), tf.float32), "y": tf.TensorSpec((), tf.float32),
                    "name": tf.TensorSpec((), tf.string),
                    "ragged": tf.TensorSpec((None,), tf.int32),      # varied: None
                    "label": tf.TensorSpec((), tf.int64)}
    epochs = [[int(e["label"]) for e in tf_ds] for _ in range(2)]
    assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(12))
    assert epochs[0] != epochs[1]               # each tf iteration is the next epoch
    first = next(iter(ds.to_tf()))
    assert first["name"].numpy() == b"n0" and first["ragged"].shape == (1,)


def test_batched_pipeline_has_a_leading_none_and_fits_a_keras_model(root):
    base = sc.Dataset.range(64).map(make).snapshot(root, progress=False)
    batched = sc.Dataset.range(64).map(lambda i: {"x": np.full(4, i, np.float32)}) \
        .snapshot(root, progress=False).batch(8)
    assert batched.to_tf().element_spec == {"x": tf.TensorSpec((None, 4), tf.float32)}

    xy = base.map(lambda e: (e["x"] / 64.0, e["y"])).batch(16)      # a map after: peeked
    tf_ds = xy.to_tf()
    assert tf_ds.element_spec == (tf.TensorSpec((None, 4), tf.float32),
                                  tf.TensorSpec((None,), tf.float32))
    assert tf_ds.cardinality().numpy() == 4
    model = tf.keras.Sequential([tf.keras.Input((4,)),
                                 tf.keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer="sgd", loss="binary_crossentropy")
    history = model.fit(tf_ds, epochs=1, verbose=0, shuffle=False)
    assert np.isfinite(history.history["loss"][0])


def test_explicit_element_spec_and_empty_dataset(root):
    spec = tf.TensorSpec((), tf.int64)
    assert [int(x) for x in sc.Dataset.range(3).to_tf(element_spec=spec)] == [0, 1, 2]
    with pytest.raises(ValueError, match="element_spec"):
        sc.Dataset.range(0).to_tf()


def test_a_batch_of_batches_after_a_committed_snapshot(root):
    """Found: the whole-column read ran only the first batch: 13 items of (4,) while the
    element_spec and cardinality said 5 of (None, None)."""
    ds = sc.Dataset.range(50).map(lambda i: {"x": np.full(2, i, np.float32)}) \
        .snapshot(root, progress=False)
    list(ds)  # committed
    tf_ds = ds.batch(4).batch(3).to_tf()
    assert tf_ds.element_spec == {"x": tf.TensorSpec((None, None, 2), tf.float32)}
    shapes = [tuple(e["x"].shape) for e in tf_ds]
    assert shapes == [(3, 4, 2)] * 4 + [(1, 2, 2)]
    assert tf_ds.cardinality().numpy() == 5


@pytest.mark.parametrize("upstream", ["map after the snapshot", "no snapshot"])
def test_a_batch_of_batches_read_off_the_first_element_leaves_every_batch_dimension_open(
        root, upstream):
    """Found: with a map after the snapshot (the spec read off the first element) only the
    outer batch dimension was None: (None, 4) for batch(4).batch(3), and the inner batch's
    remainder (1, 1) failed every TF epoch at its last element. The schema path gave
    (None, None); both give it now."""
    if upstream == "no snapshot":
        ds = sc.Dataset.range(13).map(lambda i: {"x": np.float32(i), "v": np.full(2, i)})
    else:
        ds = sc.Dataset.range(13).map(lambda i: {"x": np.float32(i), "v": np.full(2, i)}) \
            .snapshot(root, progress=False).map(lambda e: {"x": e["x"] * 2, "v": e["v"]})
    tf_ds = ds.batch(4).batch(3).to_tf()
    assert tf_ds.element_spec == {"x": tf.TensorSpec((None, None), tf.float32),
                                  "v": tf.TensorSpec((None, None, 2), tf.int64)}
    for _ in range(2):
        assert [tuple(e["x"].shape) for e in tf_ds] == [(3, 4), (1, 1)]


def test_cardinality_counts_the_keyed_snapshot_each_epoch_reads(root):
    """Found: with ``snapshot(key=...)`` over a source that had grown (100 examples written,
    120 now), to_tf() asserted the source's 120 and every TF epoch failed at its end with
    "expected to contain 120 elements but contained only 100"."""
    list(sc.Dataset.range(100).map(lambda i: {"id": i}).snapshot(root, key="v1",
                                                                   progress=False))
    ds = sc.Dataset.range(120).map(lambda i: {"id": i}).snapshot(root, key="v1",
                                                                  progress=False)
    for pipeline, expected in ((ds, 100), (ds.map(lambda e: e["id"] * 2).batch(8), 13)):
        tf_ds = pipeline.to_tf()
        assert tf_ds.cardinality().numpy() == expected
        for _ in range(2):
            assert sum(1 for _ in tf_ds) == expected
