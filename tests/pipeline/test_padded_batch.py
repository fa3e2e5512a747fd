"""``padded_batch``: sequences of different lengths batched by padding each to the longest of
its batch, on every path a batch takes (examples one by one, whole columns of a snapshot, the
positions of an exactly resumable epoch, streams), with the padding counted in the fingerprint
only where it is upstream of a snapshot."""

from __future__ import annotations

import json

import numpy as np
import pytest

import snapcache as sc
from snapcache.errors import SchemaMismatchError
from snapcache.pipeline import plan
from snapcache.runtime.batch import Padding, stack

LENGTHS = np.random.default_rng(0).integers(1, 20, 120).tolist()


def sequence(i):
    n = LENGTHS[i]
    return {"id": i, "ids": np.arange(1, n + 1, dtype=np.int32) + 100 * i, "n": n,
            "text": "w" * n}


def ragged(root, n=120):
    return sc.Dataset.range(n).map(sequence).snapshot(root, shard_size=2048, progress=False)


def check_padded(batch, value=0, multiple=1):
    """Each row is its example followed by ``value`` up to the batch's longest (rounded)."""
    width = batch["ids"].shape[1]
    assert width == -(-max(batch["n"]) // multiple) * multiple
    assert batch["ids"].dtype == np.int32
    for i, n, row, text in zip(batch["id"], batch["n"], batch["ids"], batch["text"]):
        assert row[:n].tolist() == (np.arange(1, n + 1) + 100 * i).tolist()
        assert (row[n:] == value).all() and text == "w" * n


def ids_of(batches):
    return [int(i) for b in batches for i in b["id"]]


# -- stacking ----------------------------------------------------------------------------------

def test_arrays_are_padded_at_the_end_of_every_dimension_to_the_largest_of_the_batch():
    examples = [{"m": np.ones((2, 3), np.float32), "k": 1},
                {"m": np.ones((4, 1), np.float32), "k": 2}]
    batch = stack(examples, Padding(-1.0))
    assert batch["m"].shape == (2, 4, 3) and batch["k"].tolist() == [1, 2]
    assert (batch["m"][0, :2, :] == 1).all() and (batch["m"][0, 2:, :] == -1).all()
    assert (batch["m"][1, :, :1] == 1).all() and (batch["m"][1, :, 1:] == -1).all()
    rounded = stack(examples, Padding(0, multiple_of=8))["m"]
    assert rounded.shape == (2, 8, 3)   # the first dimension rounded up, the others as padded


def test_a_dict_of_padding_values_pads_only_its_keys():
    examples = [{"ids": np.arange(n), "mask": np.ones(n, bool), "box": np.zeros(4)}
                for n in (2, 5)]
    batch = stack(examples, Padding({"ids": -100, "mask": False}))
    assert batch["ids"][0].tolist() == [0, 1, -100, -100, -100]
    assert batch["mask"][0].tolist() == [True, True, False, False, False]
    assert batch["box"].shape == (2, 4)
    examples[1]["box"] = np.zeros(5)
    with pytest.raises(SchemaMismatchError, match="key 'box' has examples of different shapes "
                                                  r".*padding_values does not name it"):
        stack(examples, Padding({"ids": -100, "mask": False}))


@pytest.mark.parametrize("examples, padding, match", [
    ([np.zeros(2), np.zeros((2, 2))], Padding(0), "of 1 and 2 dimensions"),
    ([{"x": np.zeros(2, np.uint8)}, {"x": np.zeros(3, np.uint8)}], Padding(-1),
     r"padding value -1 does not fit key 'x''s dtype uint8"),
    ([(np.zeros(2),), (np.zeros(3),)], Padding({"x": 0}), "the examples are tuples"),
    ([{"x": np.zeros(2)}, {"x": np.zeros(3)}], None, r"use padded_batch\(\)"),
    ([{"ids": np.zeros(2)}, {"ids": np.zeros(3)}], Padding({"input_ids": 0}),
     r"padding_values names keys the examples do not have: 'input_ids' \(they "
     r"have 'ids'\)"),
])
def test_what_cannot_be_padded_says_why(examples, padding, match):
    with pytest.raises(SchemaMismatchError, match=match):
        stack(examples, padding)


@pytest.mark.parametrize("kwargs, match", [
    (dict(padding_values="pad"), "padding_values must be a number"),
    (dict(padding_values={"ids": None}), "for key 'ids'"),
    (dict(padding_values=True), "padding_values must be a number"),
    (dict(pad_to_multiple_of=0), "pad_to_multiple_of"),
])
def test_padded_batch_checks_its_arguments_when_built(kwargs, match):
    with pytest.raises(ValueError, match=match):
        sc.Dataset.range(3).padded_batch(2, **kwargs)


# -- in pipelines ------------------------------------------------------------------------------

def test_the_writing_epoch_and_the_reading_epochs_pad_alike(root):
    ds = ragged(root).padded_batch(8, pad_to_multiple_of=4)
    written = list(ds)                      # writes the snapshot, batches the examples
    read = list(ds)                         # reads it back
    assert len(written) == len(read) == 15
    for a, b in zip(written, read):
        check_padded(b, multiple=4)
        assert all(np.array_equal(a[k], b[k]) for k in a)
    assert ids_of(read) == list(range(120))


def test_a_shuffled_padded_epoch_is_every_example_once_and_reproducible(root):
    ds = ragged(root).shuffle(50, seed=3).padded_batch(16, padding_values=-7)
    list(ds)
    first, again = list(ds.iterate(2)), list(ds.iterate(2))
    assert sorted(ids_of(first)) == list(range(120)) and ids_of(first) != list(range(120))
    assert ids_of(first) == ids_of(again)
    for batch in first:
        check_padded(batch, value=-7)


@pytest.mark.parametrize("streams", [1, 2])
@pytest.mark.parametrize("stop", [1, 3])
def test_a_padded_epoch_resumes_exactly(root, streams, stop):
    ds = ragged(root).shuffle(40, seed=1).padded_batch(8)
    list(ds)
    for k in range(streams):
        full = list(ds.iterate(2, stream=(k, streams)))
        it = ds.iterate(2, stream=(k, streams))
        head = [next(it) for _ in range(stop)]
        state = json.loads(json.dumps(it.state_dict()))
        it.close()
        rest = list(ds.iterate(state=state, stream=(k, streams)))
        assert len(head) + len(rest) == len(full)
        for a, b in zip(head + rest, full):
            check_padded(a)
            assert all(np.array_equal(a[key], b[key]) for key in a)
    everything = [ids_of(ds.iterate(2, stream=(k, streams))) for k in range(streams)]
    assert sorted(sum(everything, [])) == list(range(120))


def test_whole_column_batches_are_rounded_as_example_batches_are(root):
    """A snapshot whose arrays have one shape is batched from whole columns: padding changes
    nothing there but the rounding, which both paths apply alike."""
    fixed = sc.Dataset.range(50).map(lambda i: {"x": np.full(5, i, np.int16), "i": i}) \
        .snapshot(root, progress=False)
    list(fixed)
    columns = list(fixed.padded_batch(16, padding_values=9, pad_to_multiple_of=8))
    rows = list(fixed.map(lambda e: e).padded_batch(16, padding_values=9,
                                                    pad_to_multiple_of=8))
    assert [b["x"].shape for b in columns] == [(16, 8)] * 3 + [(2, 8)]
    # an op the ordered read does not take (take): the generic runner, from whole columns too
    taken = list(fixed.padded_batch(16, padding_values=9, pad_to_multiple_of=8).take(4))
    assert all(np.array_equal(a["x"], b["x"]) for a, b in zip(taken, columns))
    for a, b in zip(columns, rows):
        assert a["x"].dtype == b["x"].dtype == np.int16
        assert np.array_equal(a["x"], b["x"]) and np.array_equal(a["i"], b["i"])
    assert columns[0]["x"][3].tolist() == [3] * 5 + [9] * 3


def test_padding_counts_in_the_fingerprint_only_upstream_of_a_snapshot_and_only_if_asked(root):
    base = sc.Dataset.range(30).map(sequence)
    plain = base.batch(4)
    assert len(plain._op.fingerprint_children("x")) == 2  # as before padded_batch existed
    prints = {base.padded_batch(4).snapshot(root).fingerprint(),
              base.padded_batch(4, padding_values=-1).snapshot(root).fingerprint(),
              base.padded_batch(4, pad_to_multiple_of=8).snapshot(root).fingerprint()}
    assert len(prints) == 3
    snap = base.snapshot(root, progress=False)
    list(snap.padded_batch(4))          # downstream: the snapshot of the examples, unpadded
    assert snap.padded_batch(8, padding_values=3).explain().hit and snap.explain().hit
    assert plan.describe_pipeline(base.padded_batch(4, padding_values=-1)._op).endswith(
        "padded_batch(4, padding_values=-1)")


def test_to_torch_and_to_tf_take_padded_batches(root):
    torch = pytest.importorskip("torch")
    ds = ragged(root, n=40).padded_batch(8)
    batches = list(torch.utils.data.DataLoader(ds.to_torch(), batch_size=None))
    assert [tuple(b["ids"].shape)[0] for b in batches] == [8] * 5
    assert all(isinstance(b["ids"], torch.Tensor) for b in batches)
    pytest.importorskip("tensorflow")
    tf_ds = ds.to_tf()
    assert tf_ds.element_spec["ids"].shape.as_list() == [None, None]
    widths = {int(b["ids"].shape[1]) for b in tf_ds}
    assert widths == {max(LENGTHS[i:i + 8]) for i in range(0, 40, 8)}


# -- whole columns of arrays that differ in shape ---------------------------------------------

def mixed(i):
    """A sequence, a matrix of a varying number of rows, a fixed vector and a string."""
    n = LENGTHS[i]
    return {"id": i, "ids": np.arange(1, n + 1, dtype=np.int32) + 100 * i,
            "m": np.full((n % 4 + 1, 3), i, np.float32), "box": np.full(4, i, np.int16),
            "text": "w" * n}


READS = {
    "in order": lambda ds: ds,
    "shuffled": lambda ds: ds.shuffle(40, seed=1),
    # record batches of a few rows: shuffle windows decoded whole (store/gather.Window)
    "small record batches, shuffled": lambda ds: ds.shuffle(60, seed=2),
}


@pytest.mark.parametrize("read", sorted(READS))
def test_columns_whose_rows_differ_in_shape_are_padded_as_examples_are(root, read, monkeypatch):
    """A snapshot whose arrays vary in shape is cut into padded batches from whole columns
    (object arrays of the rows' arrays), not example by example: the same batches as the
    example path (a map after the snapshot), every row once."""
    from snapcache.store import ordered_read

    record_batch_size = 512 if read.startswith("small") else 16 << 20
    snap = sc.Dataset.range(120).map(mixed).snapshot(root, record_batch_size=record_batch_size,
                                                     progress=False)
    list(snap)
    padding = dict(padding_values={"ids": -1, "m": 0}, pad_to_multiple_of=4)
    decoded = []
    real = ordered_read.as_columns
    monkeypatch.setattr(ordered_read, "as_columns",
                        lambda *a: decoded.append(1) or real(*a))
    columns = list(READS[read](snap).padded_batch(16, **padding).iterate(3))
    assert decoded, "the read did not take whole columns"
    rows = list(READS[read](snap.map(lambda e: e)).padded_batch(16, **padding).iterate(3))
    assert len(columns) == len(rows) == 8
    for a, b in zip(columns, rows):
        assert a.keys() == b.keys()
        for key in a:
            assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key]), key
        assert a["ids"].shape[1] % 4 == 0 and a["m"].shape[2] == 3
        assert a["m"].shape[1] == -(-max(int(i) % 4 + 1 for i in lengths_of(a)) // 4) * 4
    assert sorted(ids_of(columns)) == list(range(120))


def lengths_of(batch):
    return [LENGTHS[int(i)] for i in batch["id"]]


def test_whole_columns_of_arrays_that_differ_still_refuse_to_stack_without_padding(root):
    snap = sc.Dataset.range(40).map(mixed).snapshot(root, progress=False)
    list(snap)
    with pytest.raises(SchemaMismatchError, match="key 'm' has examples of different shapes "
                                                  r".*padding_values does not name it"):
        list(snap.padded_batch(8, padding_values={"ids": 0}))
    with pytest.raises(SchemaMismatchError, match="key 'ids' has examples of different shapes"):
        list(snap.batch(8))
    assert [len(b["id"]) for b in snap.padded_batch(8)] == [8] * 5


@pytest.mark.parametrize("streams", [1, 3])
def test_whole_column_padded_epochs_resume_exactly_and_share_out_every_row(root, streams):
    snap = sc.Dataset.range(120).map(mixed).snapshot(root, shard_size=4096, progress=False)
    list(snap)
    ds = snap.shuffle(30, seed=4).padded_batch(8)
    for k in range(streams):
        full = list(ds.iterate(1, stream=(k, streams)))
        it = ds.iterate(1, stream=(k, streams))
        head = [next(it) for _ in range(2)]
        state = json.loads(json.dumps(it.state_dict()))
        it.close()
        rest = list(ds.iterate(state=state, stream=(k, streams)))
        assert len(head + rest) == len(full)
        for a, b in zip(head + rest, full):
            assert all(np.array_equal(a[key], b[key]) for key in a)
    shares = [ids_of(ds.iterate(1, stream=(k, streams))) for k in range(streams)]
    assert sorted(sum(shares, [])) == list(range(120))


def test_a_record_batch_whose_rows_happen_to_agree_joins_those_that_differ(root):
    """A tensor field that varies across the snapshot can have one shape throughout a record
    batch (here the shard's first, a block of its own); its column is made of rows like the
    others', so batches that straddle it and a varying one still stack."""
    def example(i):
        n = 7 if i < 64 else 3 + i % 11
        return {"id": i, "ids": np.arange(n, dtype=np.int32) + i}

    snap = sc.Dataset.range(200).map(example).snapshot(root, record_batch_size=1024,
                                                       progress=False)
    list(snap)
    [shard] = snap.open_snapshot().manifest.shards
    assert shard.batch_rows[0] == 16   # rows 0-15 alone, all of length 7
    batches = list(snap.padded_batch(24))
    assert [b["ids"].shape for b in batches[:3]] == [(24, 7), (24, 7), (24, 13)]
    for b in batches:
        for i, row in zip(b["id"], b["ids"]):
            n = 7 if i < 64 else 3 + i % 11
            assert row[:n].tolist() == list(range(i, i + n)) and not row[n:].any()
    assert ids_of(batches) == list(range(200))


def test_the_guides_padded_batch_snippet_runs_as_written(tmp_path):
    import pathlib

    guide = pathlib.Path(__file__).parents[2] / "docs" / "guide.md"
    blocks = [part.split("```")[0] for part in guide.read_text().split("```python\n")[1:]]
    [block] = [b for b in blocks if ".padded_batch(" in b]

    def tokenize(text):
        ids = np.array([len(w) for w in text.split()], np.int32)
        return {"input_ids": ids, "length": len(ids)}

    texts = [" ".join("w" * (1 + (i * j) % 5) for j in range(1 + i % 9)) for i in range(100)]
    namespace = {"sc": sc, "texts": texts, "tokenize": tokenize}
    exec(compile(block.replace("/data/snapshots", str(tmp_path)), "docs/guide.md", "exec"),
         namespace)
    batches = list(namespace["ds"])
    assert [len(b["length"]) for b in batches] == [32, 32, 32, 4]
    for b in batches:
        assert b["input_ids"].shape[1] % 8 == 0
        assert (b["input_ids"] > 0).sum(axis=1).tolist() == b["length"].tolist()
