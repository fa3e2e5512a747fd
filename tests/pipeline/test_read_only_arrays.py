"""What follows a snapshot gets read-only arrays in every epoch, the writing one included, and
a user function that writes into one is told why and what to do."""

from __future__ import annotations

import numpy as np
import pytest

import snapcache as sc

N = 32


def make(i):
    return {"id": i, "image": np.full((4, 4), i + 1, np.uint8)}


def erase_row(e):  # a typical in-place augmentation (random erasing)
    e["image"][int(e["id"]) % 4] = 0
    return e


def erase_row_on_a_copy(e):
    image = np.array(e["image"])
    image[int(e["id"]) % 4] = 0
    return {**e, "image": image}


TAILS = {
    "map": lambda ds, fn: ds.map(fn),
    "threads": lambda ds, fn: ds.map(fn, num_parallel_calls=2),
    "map, batch": lambda ds, fn: ds.map(fn).batch(8),
    "seeded shuffle, map": lambda ds, fn: ds.shuffle(8, seed=0).map(fn),
}


@pytest.mark.parametrize("tail", list(TAILS))
def test_an_in_place_map_after_a_snapshot_fails_from_the_first_epoch_saying_why(root, tail):
    """Found: the writing epoch handed the map the upstream's writable arrays, so an in-place
    augmentation passed the first, expensive epoch and failed from the second on (read-only
    views of the snapshot) with numpy's bare "assignment destination is read-only". It fails
    in every epoch alike now, the note saying why and how to copy; the snapshot is intact."""
    base = sc.Dataset.from_iterable(list(range(N))).map(make).snapshot(root, progress=False)
    ds = TAILS[tail](base, erase_row)
    for epoch in range(2):
        with pytest.raises(ValueError, match="read-only") as raised:
            list(ds.iterate(epoch))
        note = " ".join(raised.value.__notes__)
        assert "raised by map `erase_row`" in note, note
        assert "read-only" in note and ".snapshot()" in note and "np.array(" in note, note
    fixed = TAILS[tail](base, erase_row_on_a_copy)
    for epoch in range(2):  # the fix the note gives works in every epoch
        assert sum(1 for _ in fixed.iterate(epoch)) == (N // 8 if "batch" in tail else N)
    snap = base.open_snapshot()
    assert snap.state == "committed"
    assert all((snap[i]["image"] == i + 1).all() for i in range(N))  # never written into


def test_the_writing_epoch_hands_on_read_only_views_and_leaves_the_upstreams_arrays(root):
    made = []

    def keep(i):
        e = make(i)
        made.append(e["image"])
        return e

    ds = sc.Dataset.range(6).map(keep).snapshot(root, progress=False)
    for epoch in range(2):  # writing, then reading
        got = list(ds.iterate(epoch))
        assert [int(e["id"]) for e in got] == list(range(6))
        assert not any(e["image"].flags.writeable for e in got), epoch
    assert len(made) == 6 and all(a.flags.writeable for a in made)  # upstream's: untouched


@pytest.mark.parametrize("raise_it, expected", [
    (lambda a: a.__setitem__(0, 1), True),       # assignment destination is read-only
    (lambda a: a.__iadd__(1), True),             # output array is read-only
    (lambda a: np.random.default_rng(0).shuffle(a), True),  # array is read-only
    (lambda a: a.setflags(write=True), True),    # cannot set WRITEABLE flag to True
    (lambda a: a.reshape(7), False),             # another ValueError
])
def test_numpys_read_only_errors_are_recognised(raise_it, expected):
    from snapcache.runtime.errors import wrote_read_only

    read_only = np.frombuffer(bytes(48), np.int64)  # cannot even be made writable
    with pytest.raises(ValueError) as raised:
        raise_it(read_only if expected else np.arange(6))
    assert wrote_read_only(raised.value) is expected


def test_opencvs_read_only_error_is_recognised():
    from snapcache.runtime.errors import wrote_read_only

    cv2 = pytest.importorskip("cv2")
    image = np.zeros((8, 8, 3), np.uint8)
    image.flags.writeable = False
    with pytest.raises(cv2.error) as raised:  # "... NumPy array marked as readonly"
        cv2.rectangle(image, (1, 1), (3, 3), (255, 0, 0), 1)
    assert wrote_read_only(raised.value)
