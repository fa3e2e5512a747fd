"""User code for the fingerprint tests: functions and classes compiled from source, as if
written in a user module (``make``), shared by test_functions.py and test_randomness.py."""

from __future__ import annotations

import functools
import math
import textwrap

import numpy as np


def make(src: str, name: str = "f", *, filename: str = "<a>", shift: int = 0, **namespace):
    """Compile ``src`` as if it were a user module at another place in another file."""
    ns = {"__name__": "fp_fixture_module", "np": np, "math": math, "functools": functools}
    ns.update(namespace)
    exec(compile("\n" * shift + textwrap.dedent(src), filename, "exec"), ns)
    return ns[name]
