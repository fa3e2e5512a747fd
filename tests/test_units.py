"""Sizes and durations as people type them."""

from __future__ import annotations

from datetime import timedelta

import pytest

from snapcache.units import format_age, format_size, parse_duration, parse_size


@pytest.mark.parametrize("text, expected", [
    ("200GB", 200 * 10**9), ("1.5TiB", int(1.5 * 2**40)), ("500M", 500 * 10**6),
    ("1024", 1024), ("10 kb", 10_000), ("3KiB", 3072), ("0B", 0), (".5GB", 5 * 10**8), (7, 7),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["12XB", "", "GB", "-5GB", "1e3GB", "5 G B"])
def test_parse_size_rejects_with_the_units_to_use(text):
    with pytest.raises(ValueError, match=r"invalid size .*use a number with B, KB, MB, GB, TB "
                                         r"\(or KiB"):
        parse_size(text)


def test_parse_size_rejects_other_types():
    with pytest.raises(ValueError):
        parse_size(-1)
    with pytest.raises(TypeError):
        parse_size(1.5)  # type: ignore[arg-type]


@pytest.mark.parametrize("text, seconds", [
    ("7d", 7 * 86400), ("12h", 43200), ("30m", 1800), ("90s", 90), ("2w", 14 * 86400),
    ("1.5d", 1.5 * 86400), (60, 60.0), (timedelta(hours=1), 3600.0),
])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["7x", "d", "", "-1d", "7 days"])
def test_parse_duration_rejects(text):
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(text)


def test_formatting():
    assert format_size(999) == "999 B"
    assert format_size(1500) == "1.5 KB"
    assert format_size(2 * 10**12) == "2.0 TB"
    assert format_size(None) == "?"
    assert format_age(3) == "just now"
    assert format_age(300) == "5 min ago"
    assert format_age(86400 * 1.5) == "1 day ago"
    assert format_age(86400 * 9) == "9 days ago"
