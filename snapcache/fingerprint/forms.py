"""snapcache's own canonical forms of library types whose state is not in Python attributes.

Each form (:func:`~snapcache.fingerprint.canonical.register_default`) turns a value into
something :func:`~snapcache.fingerprint.canonical.hash_value` handles, by content:
``re.compile(r"\\s+")`` into its pattern and flags, ``torch.float32`` into its name, a pandas
DataFrame into its columns' names, dtypes and values and its index. A form the user registers
for the same type wins.

The standard library and numpy forms are registered when
:mod:`snapcache.fingerprint.canonical` is imported (:func:`register_forms`). Those of
``numpy.ma``, ``torch``, ``pandas`` and ``zoneinfo`` are registered the first time a value
whose class comes from one of them is fingerprinted
(:func:`~snapcache.fingerprint.canonical.register_lazily`): such a value exists only once its
module is imported, so fingerprinting never imports them.
"""

from __future__ import annotations

import array
import collections
import datetime
import decimal
import logging
import operator
import random
import re
import struct
import sys
import types
from typing import Any

import numpy as np

from snapcache.fingerprint.canonical import load_lazy_forms, register_default, register_lazily
from snapcache.fingerprint.tree import Unhashable

__all__ = ["load_forms", "register_forms"]


def _register_stdlib_and_numpy() -> None:
    """Common stdlib and numpy types whose state lives in C, and loggers, which user functions
    read all the time and which never change what they compute."""
    register_default(logging.Logger, lambda lg: lg.name, subclass_state=False)
    register_default(logging.LoggerAdapter, lambda a: a.logger, subclass_state=False)
    for cls in (datetime.date, datetime.datetime, datetime.time):
        register_default(cls, lambda d: d.isoformat())
    register_default(datetime.timedelta, lambda d: (d.days, d.seconds, d.microseconds))
    register_default(datetime.timezone, lambda tz: (tz.utcoffset(None), tz.tzname(None)))
    register_default(decimal.Decimal, str)
    register_default(collections.OrderedDict, lambda d: list(d.items()))
    register_default(collections.defaultdict, lambda d: (d.default_factory, dict(d)))
    register_default(collections.deque, lambda d: (list(d), d.maxlen))
    register_default(types.SimpleNamespace, lambda ns: dict(vars(ns)), subclass_state=False)
    register_default(types.MappingProxyType, dict)
    for getter in (operator.itemgetter, operator.attrgetter, operator.methodcaller):
        register_default(getter, lambda g: g.__reduce__()[1:])
    register_default(re.Pattern, lambda p: (p.pattern, p.flags))
    register_default(struct.Struct, lambda s: s.format)
    register_default(array.array, _array_form)
    register_default(random.Random, lambda r: r.getstate())
    register_default(np.random.Generator, lambda g: g.bit_generator.state)
    register_default(np.random.RandomState, lambda r: r.get_state(legacy=False))
    register_default(np.random.BitGenerator, lambda g: g.state)
    register_default(np.random.SeedSequence, lambda s: s.state)
    # ndarray subclasses whose state is not in __dict__ (the rest: the array, the class and
    # the instance attributes, in canonical._feed_other); MaskedArray's in _register_masked
    register_default(np.memmap, np.asarray, subclass_state=False)  # by content, not its file


def _register_masked() -> None:
    """``numpy.ma``'s form, registered once it is imported (importing it costs ~30 ms)."""
    import numpy as np

    register_default(np.ma.MaskedArray, _masked_form)


def _masked_form(a: Any) -> tuple:
    import numpy as np

    try:
        fill = a.fill_value
    except AttributeError:  # np.ma.masked: its getter would set the default, and it is frozen
        fill = np.ma.default_fill_value(a)
    return np.ma.getdata(a), np.ma.getmaskarray(a), fill, a.hardmask


def _array_form(a: array.array) -> tuple:
    """An ``array.array`` by type code and its items' bytes, little-endian on every machine."""
    if sys.byteorder == "big":
        a = array.array(a.typecode, a)
        a.byteswap()
    return (a.typecode, a.tobytes())


# -- zoneinfo ----------------------------------------------------------------------------------

def _register_zoneinfo() -> None:
    zoneinfo = sys.modules["zoneinfo"]
    register_default(zoneinfo.ZoneInfo, _zone_key)


def _zone_key(zone: Any) -> str:
    if zone.key is None:
        raise Unhashable(zone, "A ZoneInfo read from a file has no key naming its rules; "
                               "make it with ZoneInfo(key).")
    return zone.key


# -- torch -------------------------------------------------------------------------------------

def _register_torch() -> None:
    torch = sys.modules["torch"]

    def tensor(t: Any) -> tuple:  # dtype, shape and bytes
        t = t.detach().cpu().contiguous()
        return ("torch.Tensor", str(t.dtype), tuple(t.shape),
                t.reshape(-1).view(torch.uint8).numpy().tobytes())

    register_default(torch.Tensor, tensor)
    for cls in (torch.dtype, torch.device, torch.layout, torch.memory_format):
        register_default(cls, str)  # "torch.float32", "cuda:0", "torch.strided"
    register_default(torch.Size, tuple)
    register_default(torch.Generator, lambda g: (str(g.device), g.get_state()))


# -- pandas ------------------------------------------------------------------------------------

def _register_pandas() -> None:
    """DataFrame, Series, Index and extension arrays by content: names, dtypes, values, index.
    Their instance ``__dict__`` holds pandas' internals, so a subclass of yours counts by its
    class's code and the attributes it declares in ``_metadata`` (pandas' way to add some)."""
    pd = sys.modules["pandas"]
    register_default(pd.DataFrame, _frame, subclass_state=False)
    register_default(pd.Series, _series, subclass_state=False)
    register_default(pd.Index, _index, subclass_state=False)
    register_default(pd.api.extensions.ExtensionArray, _values, subclass_state=False)
    register_default(pd.Timedelta,  # timedelta's form drops the nanoseconds
                     lambda td: (td.days, td.seconds, td.microseconds, td.nanoseconds))
    register_default(pd.Period, lambda p: (p.ordinal, p.freqstr))
    register_default(pd.Interval, lambda iv: (iv.left, iv.right, iv.closed))


def _frame(df: Any) -> tuple:
    return (df.columns, [_values(column) for _, column in df.items()], df.index, _metadata(df))


def _series(s: Any) -> tuple:
    return (s.name, _values(s), s.index, _metadata(s))


def _index(index: Any) -> tuple:
    pd = sys.modules["pandas"]
    if isinstance(index, pd.RangeIndex):
        return (index.name, index.start, index.stop, index.step)
    if isinstance(index, pd.MultiIndex):
        return (tuple(index.names), list(index.levels), [np.asarray(c) for c in index.codes])
    return (tuple(index.names), _values(index), getattr(index, "freqstr", None))


def _values(values: Any) -> Any:
    """The values of a Series, an Index or an extension array, by content. A numpy dtype's
    values are the array (its bytes; an object array item by item, each by content). Those of
    an extension dtype (``str``, ``category``, ``Int64``, tz-aware datetimes, Arrow types) are
    the dtype's name (plus a categorical's categories and order) and pandas' 64-bit hash of
    each value, which hashes strings with a fixed key: the same in every process."""
    pd = sys.modules["pandas"]
    extension = values if isinstance(values, pd.api.extensions.ExtensionArray) else values.array
    if isinstance(values.dtype, np.dtype) or isinstance(extension,
                                                         pd.arrays.NumpyExtensionArray):
        return np.asarray(values)
    from pandas.util import hash_array

    dtype = values.dtype
    form: list[Any] = [str(dtype)]
    if isinstance(dtype, pd.CategoricalDtype):
        form += [dtype.categories, dtype.ordered]
    try:
        form.append(hash_array(extension))
    except TypeError:  # values pandas cannot hash (an Arrow list column): item by item
        form.append(("items", extension.tolist()))
    return tuple(form)


def _metadata(obj: Any) -> tuple:
    """The attributes a pandas subclass declares in ``_metadata``."""
    return tuple((name, getattr(obj, name, None)) for name in getattr(type(obj), "_metadata", ()))


def load_forms(module: str) -> None:
    """Register the forms of ``module`` (``"torch"``, ``"pandas"``) now if it is imported,
    rather than when a value of its is first fingerprinted."""
    load_lazy_forms(module)


def register_forms() -> None:
    """Register the standard library and numpy forms, and those of numpy.ma, zoneinfo, torch
    and pandas lazily (called once, by :mod:`snapcache.fingerprint.canonical`)."""
    _register_stdlib_and_numpy()
    register_lazily("numpy.ma", _register_masked)
    register_lazily("zoneinfo", _register_zoneinfo)
    register_lazily("torch", _register_torch)
    register_lazily("pandas", _register_pandas)
