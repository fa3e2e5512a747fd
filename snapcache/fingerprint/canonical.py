"""Canonical hashing of captured values, by content.

:func:`hash_value` turns a value into a :class:`FingerprintNode` whose digest depends only on
what the value holds, never on ``id()``, ``hash()``, memory addresses or ``PYTHONHASHSEED``.
Scalars and containers are streamed into one xxh3-128 hasher with a one-letter type tag before
each value, so ``1``, ``1.0``, ``True``, ``"1"`` and ``b"1"`` all differ, and so do ``[1, 2]``
and ``(1, 2)``. Dicts are hashed in their order (code that iterates a dict sees that order, so
a reordered dict may compute something else); sets in an order-independent way. Objects of plain Python
classes are hashed by their class's code and their attributes; library types whose state lives
in C by a registered form of their content (snapcache's own: :mod:`snapcache.fingerprint.forms`);
anything else must be taught with :func:`register`, or the call fails with a
:class:`~snapcache.errors.FingerprintError` that names the value and where it was captured.

Small str-keyed dicts and objects get one child node per entry, so an explanation can say
``global `cfg`: key `size` changed (224 -> 256)``.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import io
import math
import pathlib
import re
import struct
import sys
import threading
import types
import weakref
from typing import Any, Callable

import numpy as np
import xxhash

from snapcache.fingerprint.explain import describe
from snapcache.fingerprint.origin import (
    is_user_module, module_version, user_class, user_module_sources)
from snapcache.fingerprint.tree import (FingerprintNode, Unhashable, Walk, leaf, node, shorten,
                                       type_name)

__all__ = ["hash_value", "register"]

_REGISTRY: dict[type, Callable[[Any], Any]] = {}
_DEFAULTS: dict[type, bool] = {}
"""The types of :data:`_REGISTRY` whose form is snapcache's own (not the user's), each with
whether a user subclass's instance attributes count too (see :func:`_registered`)."""
_REGISTRY_LOOKUP: dict[type, tuple[Callable[[Any], Any], int] | None] = {}
""":func:`_registered`'s answers for built-in types (they live as long as the process)."""
_CLASS_LOOKUP: "weakref.WeakKeyDictionary[type, tuple[Callable[[Any], Any], int] | None]" = \
    weakref.WeakKeyDictionary()
"""The same for classes made by class statements, held weakly: a notebook that defines its
transform class anew in every cell run of a sweep must not keep every old class (and what
it holds) alive."""
_LAZY: dict[str, Callable[[], None]] = {}
"""Top-level module -> what registers the forms of its types, not run yet (see
:func:`register_lazily`)."""
_LAZY_LOCK = threading.Lock()
_FORM_ONLY, _WITH_CLASS, _WITH_STATE = 0, 1, 2  # what a type's value counts by besides its form
_MAX_CHILDREN = 64  # dicts/objects with more entries become one leaf
_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: the class was made by a class statement (or type())
_NAN = struct.pack("<d", math.nan)


def register(type_: type, fn: Callable[[Any], Any]) -> None:
    """Teach snapcache to fingerprint ``type_`` (and its subclasses).

    ``fn(value)`` must return something :func:`hash_value` already handles, e.g. a tuple of
    numbers and strings that identifies the value's content::

        register(Image.Image, lambda im: (im.mode, im.size, im.tobytes()))

    Your function is the whole fingerprint of the type's values and of its subclasses' values;
    it replaces snapcache's own form of a type.
    """
    if not isinstance(type_, type):
        raise TypeError(f"register() needs a class, got {type_!r}")
    if not callable(fn):
        raise TypeError(f"register() needs a callable returning a hashable form, got {fn!r}")
    _REGISTRY[type_] = fn
    _DEFAULTS.pop(type_, None)
    _clear_lookups()


def register_default(type_: type, fn: Callable[[Any], Any], *, subclass_state: bool = True
                     ) -> None:
    """snapcache's own form of a library type: like :func:`register`, but a form the user
    registered wins, and a value of a user subclass counts by the form plus the subclass's
    code and, with ``subclass_state``, its instance attributes (``False`` where the library's
    own instance ``__dict__`` holds internals: loggers, pandas objects)."""
    if type_ in _REGISTRY and type_ not in _DEFAULTS:
        return
    _REGISTRY[type_] = fn
    _DEFAULTS[type_] = subclass_state
    _clear_lookups()


def register_lazily(module: str, registrar: Callable[[], None]) -> None:
    """Call ``registrar()`` (which registers forms with :func:`register_default`) the first
    time a value is fingerprinted whose class, or a base of it, comes from ``module`` or a
    module below it (``"torch"``, ``"numpy.ma"``). Such a value exists only once ``module`` is
    imported, so snapcache never imports it (torch, pandas, and numpy.ma, which costs ~30 ms);
    and it costs nothing to a user who never imports it."""
    _LAZY[module] = registrar
    _clear_lookups()


def load_lazy_forms(module: str) -> None:
    """Run the pending :func:`register_lazily` registration of ``module`` now, if the module
    is imported. Another thread meeting one of its values meanwhile waits for it to finish
    (or it might remember its types as having no form)."""
    if module in _LAZY and module in sys.modules:
        with _LAZY_LOCK:
            registrar = _LAZY.get(module)
            if registrar is not None:
                registrar()
                del _LAZY[module]


def _clear_lookups() -> None:
    _REGISTRY_LOOKUP.clear()
    _CLASS_LOOKUP.clear()


def _registered(t: type) -> tuple[Callable[[Any], Any], int] | None:
    """The form registered for ``t`` or its nearest base, and what else counts: a user class
    that extends a type snapcache registered is more than its base (a ``Vocab`` extending
    ``OrderedDict`` with an ``unk`` attribute and a ``__call__``), so its class's code counts,
    and its attributes (:func:`_attributes`) unless the registration says otherwise."""
    lookup = _CLASS_LOOKUP if t.__flags__ & _HEAPTYPE else _REGISTRY_LOOKUP
    try:
        return lookup[t]
    except KeyError:
        pass
    if _LAZY:  # once per type met: are forms of its modules pending?
        for c in t.__mro__:
            name = str(getattr(c, "__module__", None))
            for module in [m for m in _LAZY if name == m or name.startswith(m + ".")]:
                load_lazy_forms(module)
    found = None
    for c in t.__mro__:
        if c in _REGISTRY:
            extra = _FORM_ONLY
            if c is not t and c in _DEFAULTS and t.__flags__ & _HEAPTYPE and user_class(t):
                extra = _WITH_STATE if _DEFAULTS[c] else _WITH_CLASS
            found = (_REGISTRY[c], extra)
            break
    lookup[t] = found
    return found


# -- the streaming encoder ---------------------------------------------------------------------

def _u64(n: int) -> bytes:
    return n.to_bytes(8, "little")


def _feed_bytes(h: Any, tag: bytes, data: bytes) -> None:
    h.update(tag + _u64(len(data)))
    h.update(data)


def _feed_int(h: Any, v: int, w: Walk) -> None:
    if -(1 << 63) <= v < (1 << 63):
        h.update(b"i" + struct.pack("<q", v))
    else:
        _feed_bytes(h, b"I", v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True))


def _feed_float(h: Any, v: float, w: Walk) -> None:
    h.update(b"f" + (_NAN if v != v else struct.pack("<d", v)))


def _feed_complex(h: Any, v: complex, w: Walk) -> None:
    h.update(b"c")
    _feed_float(h, v.real, w)
    _feed_float(h, v.imag, w)


def _feed_str(h: Any, v: str, w: Walk) -> None:
    _feed_bytes(h, b"s", v.encode("utf-8", "surrogatepass"))


def _feed_sequence(tag: bytes, mutable: bool) -> Callable[[Any, Any, Walk], None]:
    def feed(h: Any, v: Any, w: Walk) -> None:
        if mutable and (distance := w.enter(v)) is not None:
            h.update(b"^" + _u64(distance))
            return
        try:
            h.update(tag + _u64(len(v)))
            for i, item in enumerate(v):
                try:
                    feed_value(h, item, w)
                except Unhashable as e:
                    e.path.append(f"item #{i}")
                    raise
        finally:
            if mutable:
                w.leave(v)
    return feed


def _digest(v: Any, w: Walk) -> bytes:
    h = xxhash.xxh3_128()
    feed_value(h, v, w)
    return h.digest()


def _feed_dict(h: Any, d: dict, w: Walk) -> None:
    if (distance := w.enter(d)) is not None:
        h.update(b"^" + _u64(distance))
        return
    try:  # in the dict's order: iterating code sees it (FINGERPRINT_VERSION 2)
        if all(type(k) is str for k in d):  # common case
            h.update(b"{s" + _u64(len(d)))
            for k, v in d.items():
                _feed_str(h, k, w)
                _feed_entry(h, v, k, w)
        else:
            h.update(b"{" + _u64(len(d)))
            for k, v in d.items():
                feed_value(h, k, w)
                _feed_entry(h, v, k, w)
    finally:
        w.leave(d)


def _feed_entry(h: Any, v: Any, key: Any, w: Walk) -> None:
    try:
        feed_value(h, v, w)
    except Unhashable as e:
        e.path.append(f"key `{shorten(repr(key) if not isinstance(key, str) else key, 40)}`")
        raise


def _feed_set(tag: bytes) -> Callable[[Any, Any, Walk], None]:
    def feed(h: Any, v: Any, w: Walk) -> None:
        h.update(tag + _u64(len(v)))
        for digest in sorted(_digest(item, w) for item in v):
            h.update(digest)
    return feed


def _feed_array(h: Any, a: np.ndarray, w: Walk) -> None:
    h.update(b"a" + _u64(a.ndim) + b"".join(_u64(n) for n in a.shape))
    if a.dtype.hasobject:
        h.update(b"O")
        for item in a.ravel(order="C"):
            feed_value(h, item, w)
        return
    dtype = a.dtype.newbyteorder("<") if a.dtype.byteorder in ">=" else a.dtype
    plain = dtype.fields is None and dtype.subdtype is None
    _feed_bytes(h, b"d", (dtype.str if plain else str(dtype.descr)).encode())
    data = np.ascontiguousarray(a, dtype=dtype)
    h.update(_u64(data.nbytes))
    h.update(data.view(np.uint8).reshape(-1).data if data.size else b"")


def _feed_numpy_scalar(h: Any, v: np.generic, w: Walk) -> None:
    h.update(b"g")
    _feed_array(h, np.asarray(v), w)


def _feed_dtype(h: Any, v: np.dtype, w: Walk) -> None:
    plain = v.fields is None and v.subdtype is None
    _feed_bytes(h, b"D", (v.str if plain else str(v.descr)).encode())


def _feed_slice(h: Any, v: slice, w: Walk) -> None:
    h.update(b"S")
    for part in (v.start, v.stop, v.step):
        feed_value(h, part, w)


_EXACT: dict[type, Callable[[Any, Any, Walk], None]] = {
    type(None): lambda h, v, w: h.update(b"N"),
    type(...): lambda h, v, w: h.update(b"."),
    bool: lambda h, v, w: h.update(b"T" if v else b"F"),
    int: _feed_int,
    float: _feed_float,
    complex: _feed_complex,
    str: _feed_str,
    bytes: lambda h, v, w: _feed_bytes(h, b"b", v),
    bytearray: lambda h, v, w: _feed_bytes(h, b"B", bytes(v)),
    memoryview: lambda h, v, w: _feed_bytes(h, b"m", v.tobytes()),
    tuple: _feed_sequence(b"(", mutable=False),
    list: _feed_sequence(b"[", mutable=True),
    dict: _feed_dict,
    set: _feed_set(b"<"),
    frozenset: _feed_set(b">"),
    range: lambda h, v, w: _feed_sequence(b"r", False)(h, (v.start, v.stop, v.step), w),
    slice: _feed_slice,
    np.ndarray: _feed_array,
}

# Builtin bases a user subclass may extend; the subclass is hashed as its class plus the base.
_BUILTIN_BASES = (int, float, complex, str, bytes, tuple, list, dict, set, frozenset)


def feed_value(h: Any, v: Any, w: Walk) -> None:
    """Stream the canonical encoding of ``v`` into the xxh3 hasher ``h``."""
    encode = _EXACT.get(type(v))
    if encode is not None:
        encode(h, v, w)
    else:
        _feed_other(h, v, w)


def _feed_other(h: Any, v: Any, w: Walk) -> None:
    t = type(v)
    if (registered := _registered(t)) is not None:
        _feed_registered(h, v, w, *registered)
    elif isinstance(v, np.ndarray):  # a subclass (np.ndarray itself is in _EXACT)
        _feed_array(h, v, w)
        try:
            _feed_subclass(h, v, w, state=True)
        except Unhashable as e:
            if not is_user_module(t.__module__):
                e.inside(t, internals=True)
            raise
    elif isinstance(v, np.generic):
        _feed_numpy_scalar(h, v, w)
    elif isinstance(v, np.dtype):
        _feed_dtype(h, v, w)
    elif isinstance(v, enum.Enum):
        h.update(b"E" + bytes.fromhex(_functions.class_node(t, "class", w).digest))
        feed_value(h, v.name if v.name is not None else v.value, w)
    elif isinstance(v, pathlib.PurePath):
        flavour = b"w" if isinstance(v, pathlib.PureWindowsPath) else b"p"
        _feed_bytes(h, b"P" + flavour, str(v).encode("utf-8", "surrogatepass"))
    elif isinstance(v, _BUILTIN_BASES) and is_plain_object(v):
        _feed_builtin_subclass(h, v, w)
    elif (build := _node_builder(v)) is not None:
        h.update(b"@" + bytes.fromhex(build(v, "value", w).digest))
    else:
        raise Unhashable(v, _reason(v))


def _feed_registered(h: Any, v: Any, w: Walk, canonical: Callable[[Any], Any], extra: int
                     ) -> None:
    """A value of a registered type: its form, and what :func:`_registered` says besides."""
    t = type(v)
    if (distance := w.enter(v)) is not None:  # the form holds the value itself
        h.update(b"^" + _u64(distance))
        return
    try:
        form = canonical(v)
        if isinstance(form, t):
            raise TypeError(f"the function registered for {type_name(t)} returned the same type")
        identity = t.__qualname__ if is_user_module(t.__module__) else type_name(t)
        _feed_bytes(h, b"R", identity.encode())
        feed_value(h, form, w)
        if extra != _FORM_ONLY:
            _feed_subclass(h, v, w, state=extra == _WITH_STATE)
    except Unhashable as e:
        if not is_user_module(t.__module__):
            e.inside(t, internals=False)
        raise
    finally:
        w.leave(v)


def _feed_subclass(h: Any, v: Any, w: Walk, state: bool) -> None:
    """What a subclass adds to the form of its base: its class (a user class by its code) and,
    with ``state``, its instance attributes."""
    try:  # what it reads that cannot be hashed (a thread-local a method reads) is left out,
        # as the whole subclass was before it counted
        h.update(b"+" + bytes.fromhex(_functions.class_node(type(v), "class", w).digest))
    except Unhashable:
        h.update(b"+?")
    if state:
        _feed_attributes(h, v, w, optional=True)


def _feed_attributes(h: Any, v: Any, w: Walk, *, optional: bool = False) -> None:
    """``_attributes(v)`` as a flat tuple ``(name, value, name, value, ...)``; an error below
    names the attribute. ``optional``: an attribute that cannot be hashed (a lock a subclass
    keeps) is left out, its name counted, as before such attributes counted at all."""
    state = _attributes(v)
    h.update(b"(" + _u64(2 * len(state)))
    for name, x in state:
        feed_value(h, name, w)
        if optional:
            sub = xxhash.xxh3_128()
            try:
                feed_value(sub, x, w)
            except Unhashable:
                h.update(b"?")  # left out: it cannot be hashed
                continue
            h.update(b"=" + sub.digest())
            continue
        try:
            feed_value(h, x, w)
        except Unhashable as e:
            e.path.append(f"attribute `{name}`")
            raise


def _feed_builtin_subclass(h: Any, v: Any, w: Walk) -> None:
    base = next(b for b in _BUILTIN_BASES if isinstance(v, b))
    h.update(b"@" + bytes.fromhex(_functions.class_node(type(v), "class", w).digest))
    _EXACT[base](h, v, w)
    _feed_attributes(h, v, w)


def _reason(v: Any) -> str:
    if isinstance(v, (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType)):
        return ("A generator's position cannot be read; capture the function that makes it, "
                "or the data, instead.")
    if isinstance(v, io.IOBase):
        return "An open file is not a value; capture its path instead."
    if any(word in type(v).__name__.lower() for word in ("lock", "thread", "socket", "queue")):
        return "Locks, threads, queues and sockets have no content to hash."
    return ""


# -- nodes: dicts and objects ------------------------------------------------------------------

def is_plain_object(v: Any) -> bool:
    """Is every class of ``v`` (but ``object`` and builtin bases) a Python class whose state is
    visible in ``__dict__`` or ``__slots__``?"""
    for cls in type(v).__mro__:
        if cls is object or cls in _BUILTIN_BASES:
            continue
        if not cls.__flags__ & _HEAPTYPE:
            return False  # a static C type
        slots = cls.__dict__.get("__slots__", ())
        room = 8 * ((1 if isinstance(slots, str) else len(slots)) + 2)  # + dict and weakref
        if cls.__basicsize__ - cls.__base__.__basicsize__ > room:
            return False  # an extension heap type with C fields: its state is hidden
    return True


def _node_builder(v: Any) -> Callable[[Any, str, Walk], FingerprintNode] | None:
    if isinstance(v, types.ModuleType):
        return _module_node
    if isinstance(v, type):
        return _functions.class_node
    if _functions.is_function_like(v):
        return _functions.callable_node
    if is_plain_object(v) and not isinstance(v, _BUILTIN_BASES):
        return object_node
    return None


def _module_node(m: types.ModuleType, label: str, w: Walk) -> FingerprintNode:
    """A library module by name and version. A user module held as a value (a closure cell, a
    default, an attribute: code may call anything in it) also by the source files of all the
    user code it can read: its own and, recursively, those of the user modules it imports or
    re-exports from (:func:`~snapcache.fingerprint.origin.user_module_sources`)."""
    version = module_version(m.__name__)
    summary = f"<module {m.__name__}{' ' + version if version else ''}>"
    payload = f"{m.__name__}\0{version}".encode()
    if not version:
        sources = user_module_sources(m)
        for path, digest in sources:  # its own file alone: the payload it always had
            payload += (b"" if len(sources) == 1 else b"\0" + path.encode()) + b"\0" + digest
        if len(sources) > 1:
            summary = f"<module {m.__name__}, {len(sources)} files of yours>"
    return leaf(label, "module", payload, summary)


def module_name_node(m: types.ModuleType, label: str) -> FingerprintNode:
    """A module by name and version only: for a global module whose reads the code names
    (``utils.resize``), each followed on its own."""
    version = module_version(m.__name__)
    summary = f"<module {m.__name__}{' ' + version if version else ''}>"
    return leaf(label, "module", f"{m.__name__}\0{version}".encode(), summary)


MEMO_NAME = re.compile(r"^_*(cache|caches|memo|memos|memory)$|_(cache|memo)$", re.IGNORECASE)
"""Names of attributes that hold a memo cache: ``cache``, ``_cache``, ``bpe_cache``, ``memo``,
``_memo`` ... Such an attribute whose value is a dict, a list or a set is not state: it fills
as the object is called and what the object computes does not depend on it (the default rule;
``register`` the class to fingerprint it your own way)."""

_MEMO_TYPES = (dict, list, set)


def is_memo_cache(name: str, value: Any) -> bool:
    """Is attribute ``name`` holding ``value`` a memo cache (see :data:`MEMO_NAME`)?"""
    return isinstance(value, _MEMO_TYPES) and MEMO_NAME.search(name) is not None


def _attributes(v: Any) -> list[tuple[str, Any]]:
    """An object's state: ``__dict__`` and ``__slots__``, sorted by name; for a dataclass (or
    a subclass of one) its fields first, in their order, then the rest of that state (what a
    subclass's ``__init__`` or a ``__post_init__`` sets). Memo caches (:func:`is_memo_cache`)
    and ``cached_property`` values left out."""
    cls = type(v)
    state = {k: x for k, x in getattr(v, "__dict__", {}).items()
             if not isinstance(getattr(cls, k, None), functools.cached_property)
             and not is_memo_cache(k, x)}
    for c in cls.__mro__:
        slots = c.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name in ("__dict__", "__weakref__"):
                continue
            attr = f"_{c.__name__.lstrip('_')}{name}" if name.startswith("__") else name
            if hasattr(v, attr) and not is_memo_cache(name, getattr(v, attr)):
                state[name] = getattr(v, attr)
    if not dataclasses.is_dataclass(cls):
        return sorted(state.items())
    fields = [(f.name, getattr(v, f.name)) for f in dataclasses.fields(v)
              if not is_memo_cache(f.name, getattr(v, f.name))]
    for f in dataclasses.fields(v):
        state.pop(f.name, None)
    return fields + sorted(state.items())


def child_node(value: Any, label: str, w: Walk) -> FingerprintNode:
    """``value_node`` that names ``label`` in the path of an error from below."""
    try:
        return value_node(value, label, w)
    except Unhashable as e:
        e.path.append(label)
        raise


def object_node(v: Any, label: str, w: Walk) -> FingerprintNode:
    """A plain object (dataclass, callable object, ...): its class's code and its attributes."""
    def build() -> FingerprintNode:
        cls = type(v)
        dataclass = dataclasses.is_dataclass(cls)
        fields = {f.name for f in dataclasses.fields(cls)} if dataclass else ()
        children = [_functions.class_node(cls, f"class `{cls.__qualname__}`", w)]
        for k, x in _attributes(v):
            if k in fields or not dataclass:
                children.append(child_node(x, f"{'field' if k in fields else 'attribute'} "
                                              f"`{k}`", w))
                continue
            try:  # a dataclass's other state counts where it can be hashed: a handle that
                # __post_init__ keeps (a lock, a connection) is left out, as its fields name it
                children.append(value_node(x, f"attribute `{k}`", w))
            except Unhashable:
                children.append(leaf(f"attribute `{k}`", "left-out", b"",
                                     "cannot be hashed: left out"))
        return node(label, "object", b"", children, describe(v))
    try:
        return w.guarded(v, label, build)
    except Unhashable as e:
        if not is_user_module(type(v).__module__):  # a library's object: its internals
            e.inside(type(v), internals=True)
        raise


def _dict_node(d: dict, label: str, w: Walk) -> FingerprintNode:
    def build() -> FingerprintNode:
        children = [child_node(x, f"key `{k}`", w) for k, x in d.items()]
        return node(label, "dict", b"", children, describe(d))
    return w.guarded(d, label, build)


def value_node(v: Any, label: str, w: Walk) -> FingerprintNode:
    """The node of any supported value, inside an ongoing walk."""
    t = type(v)
    if t is dict and len(v) <= _MAX_CHILDREN and all(type(k) is str for k in v):
        return _dict_node(v, label, w)
    if t not in _EXACT and _registered(t) is None and not isinstance(v, (np.generic, enum.Enum)):
        build = _node_builder(v)
        if build is not None:
            return build(v, label, w)
    h = xxhash.xxh3_128()
    feed_value(h, v, w)
    return leaf(label, "value", h.digest(), describe(v))


def hash_value(value: Any, label: str, *, where: str = "") -> FingerprintNode:
    """Fingerprint ``value`` by content.

    ``label`` names the value in explanations (``"global `SIZE`"``); ``where`` says where it
    was captured (``"map #2 `prep`"``) for error messages.

    >>> hash_value({"b": 2, "a": 1}, "v").digest == hash_value({"a": 1, "b": 2}, "v").digest
    True
    """
    try:
        return value_node(value, label, Walk())
    except Unhashable as e:
        raise e.to_error(label, where) from None


from snapcache.fingerprint import functions as _functions  # noqa: E402  (mutual recursion)
from snapcache.fingerprint.forms import register_forms  # noqa: E402  (it registers here)

register_forms()
