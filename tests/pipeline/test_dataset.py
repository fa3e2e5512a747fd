"""The Dataset API: sources, ops, epochs, errors (no snapshot involved)."""

from __future__ import annotations

import numpy as np
import pytest

import snapcache as sc


def test_sources():
    assert list(sc.Dataset.range(5)) == [0, 1, 2, 3, 4]
    assert list(sc.Dataset.range(2, 10, 3)) == [2, 5, 8]
    assert list(sc.Dataset.from_iterable(["a", "b"])) == ["a", "b"]

    def gen(n, offset=0):
        yield from range(offset, offset + n)

    ds = sc.Dataset.from_generator(gen, 3, offset=10)
    assert list(ds) == [10, 11, 12]
    assert list(ds) == [10, 11, 12]  # called again each epoch


def test_from_files(tmp_path):
    for name in ("b.txt", "a.txt", "c.bin"):
        (tmp_path / name).write_text(name)
    ds = sc.Dataset.from_files(str(tmp_path / "*.txt"))
    assert [p.rsplit("/", 1)[1] for p in ds] == ["a.txt", "b.txt"]
    listed = sc.Dataset.from_files([str(tmp_path / "c.bin"), str(tmp_path / "a.txt")])
    assert [p.rsplit("/", 1)[1] for p in listed] == ["c.bin", "a.txt"]
    with pytest.raises(FileNotFoundError, match="no file matches"):
        sc.Dataset.from_files(str(tmp_path / "*.jpg"))


def test_from_files_fsspec_url():
    import fsspec

    fs = fsspec.filesystem("memory")
    fs.pipe({"/ds/x1.txt": b"1", "/ds/x2.txt": b"22"})
    urls = list(sc.Dataset.from_files("memory://ds/*.txt"))
    assert urls == ["memory:///ds/x1.txt", "memory:///ds/x2.txt"]
    assert sc.Dataset.from_files("memory://ds/*.txt").fingerprint()


def test_from_iterable_rejects_one_shot_iterators():
    with pytest.raises(TypeError, match="from_generator"):
        sc.Dataset.from_iterable(x for x in range(3))


def test_map_filter_take():
    ds = sc.Dataset.range(10).map(lambda x: x * 2).filter(lambda x: x % 3 == 0).take(2)
    assert list(ds) == [0, 6]


@pytest.mark.parametrize("workers", [None, 1, 4, sc.AUTOTUNE])
def test_parallel_map_preserves_order(workers):
    import time

    def slow(x):
        time.sleep(0.001 * (x % 3))
        return x * x

    ds = sc.Dataset.range(50).map(slow, num_parallel_calls=workers)
    assert list(ds) == [x * x for x in range(50)]


def test_parallel_map_nondeterministic_yields_everything():
    ds = sc.Dataset.range(100).map(lambda x: x + 1, num_parallel_calls=4, deterministic=False)
    assert sorted(ds) == list(range(1, 101))


def test_map_error_keeps_type_and_says_where():
    def boom(x):
        if x == 3:
            raise ValueError("bad example")
        return x

    for workers in (None, 3):
        with pytest.raises(ValueError, match="bad example") as info:
            list(sc.Dataset.range(10).map(boom, num_parallel_calls=workers))
        notes = "".join(getattr(info.value, "__notes__", []))
        assert "map `test_map_error_keeps_type_and_says_where.<locals>.boom`" in notes
        assert "#3" in notes


def test_batch_stacks_per_key():
    ds = sc.Dataset.range(5).map(lambda i: {"x": np.full((2,), i, np.float32), "y": i,
                                            "s": str(i)}).batch(2)
    batches = list(ds)
    assert len(batches) == 3
    assert batches[0]["x"].shape == (2, 2) and batches[0]["x"].dtype == np.float32
    assert batches[0]["y"].tolist() == [0, 1]
    assert batches[0]["s"].tolist() == ["0", "1"]
    assert batches[2]["x"].shape == (1, 2)
    assert len(list(sc.Dataset.range(5).batch(2, drop_remainder=True))) == 2
    pairs = list(sc.Dataset.range(4).map(lambda i: (i, np.arange(i, i + 3))).batch(4))
    assert pairs[0][0].tolist() == [0, 1, 2, 3] and pairs[0][1].shape == (4, 3)


def test_batch_of_ragged_arrays_says_how_to_fix():
    ds = sc.Dataset.range(3).map(lambda i: np.zeros(i + 1)).batch(3)
    with pytest.raises(sc.SnapcacheError, match="different shapes.*pad"):
        list(ds)


def test_shuffle_is_a_permutation_reshuffled_each_epoch_and_seeded():
    ds = sc.Dataset.range(100).shuffle(30, seed=7)
    e1, e2 = list(ds), list(ds)
    assert sorted(e1) == sorted(e2) == list(range(100))
    assert e1 != e2 and e1 != list(range(100))
    again = sc.Dataset.range(100).shuffle(30, seed=7)
    assert list(again) == e1 and list(again) == e2
    assert list(ds.iterate(epoch=0)) == e1


def test_prefetch_and_error_propagation():
    assert list(sc.Dataset.range(100).prefetch(3)) == list(range(100))
    assert list(sc.Dataset.range(10).prefetch()) == list(range(10))

    def gen():
        yield 1
        raise RuntimeError("upstream broke")

    it = iter(sc.Dataset.from_generator(gen).prefetch(2))
    assert next(it) == 1
    with pytest.raises(RuntimeError, match="upstream broke"):
        next(it)


def test_cache_fills_on_first_complete_epoch(counter):
    def f(x):
        counter.hit()
        return x + 1

    ds = sc.Dataset.range(10).map(f).cache()
    assert list(ds.take(3)) == [1, 2, 3]  # a partial epoch does not fill the cache
    assert list(ds) == list(range(1, 11))
    calls = counter.count
    assert list(ds) == list(range(1, 11))
    assert counter.count == calls


@pytest.mark.parametrize("bad", [
    lambda: sc.Dataset.range(3).map(42),
    lambda: sc.Dataset.range(3).map(abs, num_parallel_calls=0),
    lambda: sc.Dataset.range(3).batch(0),
    lambda: sc.Dataset.range(3).shuffle(-1),
    lambda: sc.Dataset.range(3).shuffle(10, seed="x"),
    lambda: sc.Dataset.range(3).take(-1),
    lambda: sc.Dataset.range(3).snapshot("/tmp/x", compression="gzip"),
    lambda: sc.Dataset.range(3).snapshot("/tmp/x", shard_size=0),
])
def test_bad_arguments_fail_when_the_pipeline_is_built(bad):
    with pytest.raises((ValueError, TypeError)):
        bad()


def test_datasets_are_immutable():
    base = sc.Dataset.range(4)
    doubled = base.map(lambda x: 2 * x)
    assert list(base) == [0, 1, 2, 3]
    assert list(doubled) == [0, 2, 4, 6]
    assert "range(0, 4) -> map" in repr(doubled)


def test_a_dataset_is_iterated_not_indexed_and_says_what_to_use():
    ds = sc.Dataset.range(6).map(lambda i: 2 * i)
    for index in (0, slice(0, 2)):
        with pytest.raises(TypeError) as caught:
            ds[index]
        message = str(caught.value)
        assert message.startswith(f"a snapcache Dataset is iterated, not indexed (ds[{index!r}])")
        for way in ("pass ds.to_torch()", "ds.open_snapshot()[i]",
                    "ds.open_snapshot().to_torch_map_style()", "ds.take(n)"):
            assert way in message
    # Nothing that reads collections by index takes a Dataset for one: it is iterated.
    nested = sc.Dataset.from_iterable(ds)
    assert list(nested) == [0, 2, 4, 6, 8, 10]
    assert [list(nested.iterate(stream=(k, 2))) for k in range(2)] == [[0, 4, 8], [2, 6, 10]]
    with pytest.raises(TypeError, match="from_torch needs a map-style dataset"):
        sc.Dataset.from_torch(ds)


def test_public_names_are_pinned():
    assert sorted(sc.__all__) == sorted([
        "AUTOTUNE", "CorruptSnapshotError", "Dataset", "FingerprintError", "SnapcacheError",
        "Snapshot", "SnapshotNotFoundError", "SnapshotOptions", "SnapshotStateError",
        "UnknownFormatVersionError", "UnsupportedValueError", "__version__", "info", "ls",
        "open_snapshot", "purge", "verify"])


def refuse_31(i):
    if i == 31:
        raise ValueError("bad example 31")
    return i


def not_multiple_of_3(i):
    return i % 3 != 0


@pytest.mark.parametrize("executor", ["thread", "process"])
def test_an_error_note_in_a_stream_names_the_example_in_the_epoch_or_says_share(executor):
    """Found: with streams (DataLoader workers, ranks, Ray tasks) the note counted within the
    stream's share: example 31, stream 1 of 2, was "#15 of this epoch". Split by stride, the
    stream knows the position in the epoch; after a filter it does not, and says so."""
    def notes(ds, stream):
        with pytest.raises(ValueError, match="bad example 31") as raised:
            list(ds.iterate(0, stream=stream))
        return [n for n in raised.value.__notes__ if n.startswith("snapcache: raised")]

    strided = sc.Dataset.range(40).map(refuse_31, num_parallel_calls=2, executor=executor)
    for stream in ((0, 1), (1, 2), (1, 3)):
        assert notes(strided, stream) == [
            "snapcache: raised by map `refuse_31` on example #31 of this epoch"], stream
    filtered = sc.Dataset.range(40).filter(not_multiple_of_3).map(
        refuse_31, num_parallel_calls=2, executor=executor)
    assert notes(filtered, (1, 2)) == [  # 1, 5, 7, 11, ...: 31 is the 11th of stream 1's
        "snapcache: raised by map `refuse_31` on example #10 of this stream's share "
        "(stream 1 of 2)"]
