"""``Storage.read_parsed``: an unchanged file (a manifest) is parsed once per process; a
replaced or deleted one is seen at once."""

from __future__ import annotations

import pytest

from snapcache.store.fs import Storage


def test_an_unchanged_file_is_parsed_once_and_a_replaced_one_again(tmp_path):
    storage = Storage(str(tmp_path))
    storage.write_atomic("m.json", b"one")
    calls = []

    def parse(data):
        calls.append(data)
        return ("parsed", data)

    first = storage.read_parsed("m.json", parse)
    assert storage.read_parsed("m.json", parse) is first
    assert calls == [b"one"]
    storage.write_atomic("m.json", b"two")
    assert storage.read_parsed("m.json", parse) == ("parsed", b"two")
    assert calls == [b"one", b"two"]
    storage.remove("m.json")
    with pytest.raises(FileNotFoundError):
        storage.read_parsed("m.json", parse)
    storage.write_atomic("m.json", b"one")
    assert storage.read_parsed("m.json", parse) == ("parsed", b"one")
    assert calls == [b"one", b"two", b"one"]


def test_a_missing_file_raises(tmp_path):
    with pytest.raises(FileNotFoundError):
        Storage(str(tmp_path)).read_parsed("nothing.json", bytes)


def test_a_local_file_changed_in_place_within_the_same_instant_is_seen(tmp_path):
    storage = Storage(str(tmp_path))
    storage.write_atomic("m.json", b"aaaa")
    assert storage.read_parsed("m.json", bytes) == b"aaaa"
    with open(tmp_path / "m.json", "r+b") as f:  # same inode, size (and maybe mtime)
        f.write(b"b")
    assert storage.read_parsed("m.json", bytes) == b"baaa"
