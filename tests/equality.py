"""Exact equality of examples for tests: type, dtype (native byte order), shape and bits
(so NaN payloads and -0.0 count), for dicts, tuples and single values."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np


def assert_same_value(expected: Any, got: Any) -> None:
    """Exact equality: type, dtype (native order), shape and bits."""
    if isinstance(expected, np.ndarray):
        assert type(got) is np.ndarray
        native = expected.dtype.newbyteorder("=")
        assert got.dtype == native and got.dtype.byteorder in "=|"
        assert got.shape == expected.shape
        assert got.tobytes() == np.ascontiguousarray(expected, dtype=native).tobytes()
    elif isinstance(expected, np.generic):
        assert type(got) is type(expected) and got.dtype == expected.dtype
        assert got.tobytes() == expected.tobytes()
    elif type(expected) is float:
        assert type(got) is float and struct.pack("<d", got) == struct.pack("<d", expected)
    else:
        assert type(got) is type(expected) and got == expected


def assert_same_example(expected: Any, got: Any) -> None:
    assert type(got) is type(expected)
    if isinstance(expected, dict):
        assert list(got) == list(expected)
        for key in expected:
            assert_same_value(expected[key], got[key])
    elif isinstance(expected, tuple):
        assert len(got) == len(expected)
        for e, g in zip(expected, got):
            assert_same_value(e, g)
    else:
        assert_same_value(expected, got)
