"""Fingerprints of functions: what they compute, not where they were written.

A user function is identified by its bytecode, its constants (nested code objects included), the
globals its code reads, its closure cells, and its defaults, each one a child node so an
explanation can say which of them changed. File names, line numbers, comments, docstrings and the
function's own name do not count: moving a function or editing a comment keeps its fingerprint.

Helpers written by the user (module-level functions in user code) are followed recursively.
Functions from the standard library and installed packages are identified by module, qualified
name and package version, not by their bytecode (which is which:
:mod:`snapcache.fingerprint.origin`). The analysis of a code object
(:mod:`snapcache.fingerprint.bytecode`) is cached by identity (code is immutable); the values
of globals are read afresh on every call.

Requires the bytecode of one Python minor version: fingerprints differ between 3.10 and 3.11.
"""

from __future__ import annotations

import builtins
import collections.abc
import functools
import random
import re
import sys
import types
from typing import Any, Callable

from snapcache.fingerprint import canonical
from snapcache.fingerprint.bytecode import NOT_IMPORTABLE, CodeInfo, code_info, module_reads
from snapcache.fingerprint.canonical import child_node
from snapcache.fingerprint.explain import describe
from snapcache.fingerprint.origin import (is_user_module, module_version, user_class,
                                          user_function)
from snapcache.fingerprint.tree import FingerprintNode, Unhashable, Walk, leaf, node

__all__ = ["callable_node", "class_node", "global_rng", "hash_function", "held_user_code",
           "is_function_like", "is_wrapper"]

_BUILTIN_CALLABLES = (types.BuiltinFunctionType, types.MethodWrapperType,
                      types.WrapperDescriptorType, types.MethodDescriptorType,
                      types.ClassMethodDescriptorType)
_CLASS_SKIP = frozenset({"__module__", "__qualname__", "__doc__", "__dict__", "__weakref__",
                         "__annotations__", "__dataclass_fields__", "__dataclass_params__",
                         "__firstlineno__", "__static_attributes__", "__orig_bases__",
                         "__parameters__", "_abc_impl", "__slotnames__"})


# -- nodes -------------------------------------------------------------------------------------

def is_function_like(v: Any) -> bool:
    """Functions, partials, methods, C-level wrappers like ``functools.lru_cache`` and library
    callables like ``len``, ``np.add``, ``np.mean``."""
    if isinstance(v, (types.FunctionType, functools.partial, types.MethodType,
                      *_BUILTIN_CALLABLES)):
        return True
    if not callable(v) or isinstance(v, type) or canonical.is_plain_object(v):
        return False
    return is_wrapper(v) or (isinstance(getattr(v, "__qualname__", None), str)
                              and not is_user_module(getattr(v, "__module__", None)))


def is_wrapper(v: Any) -> bool:
    """A C-level decorator object (``lru_cache``, ``cache``) around a user function."""
    wrapped = getattr(v, "__wrapped__", None)
    return (isinstance(wrapped, types.FunctionType) and user_function(wrapped)
            and not isinstance(v, (types.FunctionType, type)) and not canonical.is_plain_object(v))


def global_rng(owner: Any) -> str | None:
    """The module whose hidden global generator ``owner`` is (``random``, ``numpy.random``)."""
    if owner is getattr(random, "_inst", None):
        return "random"
    mtrand = getattr(sys.modules.get("numpy.random.mtrand"), "_rand", None)
    return "numpy.random" if mtrand is not None and owner is mtrand else None


def _named_node(fn: Any, label: str, w: Walk) -> FingerprintNode:
    """A library callable: module, qualified name and package version; a bound one's owner."""
    owner = getattr(fn, "__self__", None)
    module = getattr(fn, "__module__", None) or type(owner).__module__
    qualname = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", type(fn).__name__)
    payload = f"{module}\0{qualname}\0{module_version(module)}".encode()
    children = []
    if not (owner is None or isinstance(owner, (type, types.ModuleType)) or global_rng(owner)):
        children.append(child_node(owner, "instance `self`", w))
    return node(label, "library function", payload, children, f"<function {qualname}>")


def _function_node(fn: types.FunctionType, label: str, w: Walk) -> FingerprintNode:
    if user_function(fn):
        return w.guarded(fn, label, lambda: _build_function(fn, label, w))
    held = held_user_code(fn)
    if not held:
        return _named_node(fn, label, w)
    module = fn.__globals__.get("__name__") or ""
    code = getattr(fn.__code__, "co_qualname", fn.__code__.co_name)
    payload = f"{module}\0{code}\0{module_version(module)}".encode()
    return w.guarded(fn, label, lambda: node(
        label, "library wrapper", payload, [_library_state(v, what, w) for what, v in held],
        f"<function {fn.__qualname__}>"))


def held_user_code(fn: types.FunctionType, depth: int = 0) -> list[tuple[str, Any]]:
    """What a function made by a library (a decorator's wrapper) holds, labelled, when that
    includes user code: the function or callable object it wraps (``functools.wraps``:
    ``singledispatch``, ``torch.no_grad()``, ``torch.vmap``, ...), the implementations
    registered with a ``singledispatch`` function, its closure (the decorator's settings).
    Empty when it holds no user code: it then counts by name and version alone."""
    held: list[tuple[str, Any]] = []
    wrapped = getattr(fn, "__wrapped__", None)
    if callable(wrapped):
        held.append(("wrapped function", wrapped))
    registry = getattr(fn, "registry", None)
    if isinstance(registry, collections.abc.Mapping) and callable(getattr(fn, "dispatch", None)):
        for cls, impl in list(registry.items()):
            name = getattr(cls, "__qualname__", None) or type(cls).__name__
            held += [(f"dispatch type `{name}`", cls), (f"registered for `{name}`", impl)]
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if value is not wrapped:
            held.append((f"closure `{name}`", value))

    def user_code(v: Any) -> bool:
        if _user_value(v):
            return True
        v = getattr(v, "func", getattr(v, "__func__", v))  # a partial's, a method's, a cm's
        if isinstance(v, types.FunctionType):
            return user_function(v) or (depth < 8 and bool(held_user_code(v, depth + 1)))
        return isinstance(v, type) and user_class(v)
    return held if any(user_code(v) for _, v in held) else []


def _user_value(v: Any) -> bool:
    """Is ``v`` the user's code itself: a user function (or a partial or method of one), a user
    class, or an object of a user class (a callable object, a config)?"""
    if isinstance(v, (functools.partial, functools.partialmethod)):
        v = v.func
    elif isinstance(v, (types.MethodType, staticmethod, classmethod)):
        v = v.__func__
    if isinstance(v, types.FunctionType):
        return user_function(v)
    return user_class(v if isinstance(v, type) else type(v))


def _library_state(value: Any, label: str, w: Walk) -> FingerprintNode:
    """What a library's wrapper holds: user code in full; the library's own state (a lock, a
    cache) by its type when it cannot be hashed."""
    try:
        return _captured(value, label, w)
    except Unhashable:
        if _user_value(value):
            raise
        return leaf(label, "library state", canonical.type_name(type(value)).encode(),
                    describe(value))


def _build_function(fn: types.FunctionType, label: str, w: Walk) -> FingerprintNode:
    code = fn.__code__
    info = code_info(code)
    children = [leaf("bytecode", "bytecode", info.bytecode),
                leaf("constants", "constants", info.constants)]
    children += _global_nodes(fn, info, w)
    for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
        try:
            value = cell.cell_contents
        except ValueError:  # a cell not yet filled
            children.append(leaf(f"closure `{name}`", "empty cell", b"", "<empty>"))
            continue
        children.append(_captured(value, f"closure `{name}`", w))
    positional = code.co_varnames[:code.co_argcount]
    defaults = fn.__defaults__ or ()
    for name, value in zip(positional[len(positional) - len(defaults):], defaults):
        children.append(_captured(value, f"default `{name}`", w))
    for name, value in sorted((fn.__kwdefaults__ or {}).items()):
        children.append(_captured(value, f"kwdefault `{name}`", w))
    for name, value in sorted(vars(fn).items()):  # ``fn.factor = 3``, read as ``fn.factor``
        if not (name.startswith("__") and name.endswith("__")):
            children.append(_captured(value, f"attribute `{name}`", w))
    return node(label, "function", b"", children, f"<function {fn.__qualname__}>")


def _global_nodes(fn: types.FunctionType, info: CodeInfo, w: Walk) -> list[FingerprintNode]:
    """One node per global the code reads, plus reads of user modules' contents: ``module.attr``
    through a global module, and what the code imports itself (``import helpers``,
    ``from helpers import scale``)."""
    namespace, nodes = fn.__globals__, []
    for name in info.global_names:
        if name in namespace:
            value = namespace[name]
            if isinstance(value, types.ModuleType):  # its contents the code reads: below
                nodes.append(canonical.module_name_node(value, f"global `{name}`"))
                continue
            user_fn = isinstance(value, types.FunctionType) and user_function(value)
            nodes.append(_captured(value, f"{'helper' if user_fn else 'global'} `{name}`", w))
        elif not hasattr(builtins, name):  # builtins count by name, which the bytecode holds
            nodes.append(leaf(f"global `{name}`", "undefined", name.encode(), "<undefined>"))
    for path, value in module_reads(fn, info):
        if value is NOT_IMPORTABLE:
            nodes.append(leaf(f"import `{path}`", "not importable", path.encode(),
                              "<not importable>"))
            continue
        user_fn = isinstance(value, types.FunctionType) and user_function(value)
        nodes.append(_captured(value, f"{'helper' if user_fn else 'global'} `{path}`", w))
    return nodes


def _captured(value: Any, label: str, w: Walk) -> FingerprintNode:
    try:
        if is_function_like(value) or isinstance(value, type):
            return callable_node(value, label, w)
        return canonical.value_node(value, label, w)
    except Unhashable as e:
        e.path.append(label)
        raise


def _partial_node(p: functools.partial, label: str, w: Walk) -> FingerprintNode:
    children = [_captured(p.func, "function", w)]
    children += [_captured(a, f"partial argument #{i}", w) for i, a in enumerate(p.args)]
    children += [_captured(v, f"partial keyword `{k}`", w) for k, v in sorted(p.keywords.items())]
    return node(label, "partial", b"", children, describe(p))


def _method_node(m: types.MethodType, label: str, w: Walk) -> FingerprintNode:
    children = [_captured(m.__func__, "function", w), _captured(m.__self__, "instance `self`", w)]
    return node(label, "method", b"", children, f"<function {m.__qualname__}>")


def class_node(cls: type, label: str, w: Walk) -> FingerprintNode:
    """A class: for user classes, its bases, methods' code and class attributes."""
    summary = f"<class {cls.__qualname__}>"
    if not user_class(cls):
        payload = f"{cls.__module__}\0{cls.__qualname__}\0{module_version(cls.__module__)}"
        return leaf(label, "library class", payload.encode(), summary)

    def build() -> FingerprintNode:
        children = [class_node(b, f"base `{b.__qualname__}`", w)
                    for b in cls.__bases__ if b is not object]
        for name, member in sorted(cls.__dict__.items()):
            if name not in _CLASS_SKIP:
                children.append(_member_node(name, member, w))
        return node(label, "class", cls.__qualname__.encode(), children, summary)
    return w.guarded(cls, label, build)


def _member_node(name: str, member: Any, w: Walk) -> FingerprintNode:
    if isinstance(member, (staticmethod, classmethod)):
        member = member.__func__
    if isinstance(member, functools.cached_property):
        member = member.func
    if isinstance(member, types.FunctionType):
        return _captured(member, f"method `{name}`", w)
    if isinstance(member, property):
        parts = [(role, f) for role, f in (("getter", member.fget), ("setter", member.fset),
                                           ("deleter", member.fdel)) if f is not None]
        children = [_captured(f, role, w) for role, f in parts]
        return node(f"property `{name}`", "property", b"", children, "<property>")
    try:
        return _captured(member, f"attribute `{name}`", w)
    except Unhashable:
        if not hasattr(type(member), "__get__"):
            raise
        # A C-level descriptor (slot member, namedtuple field, ...): behaviour fixed by its type.
        payload = f"{canonical.type_name(type(member))}\0{name}".encode()
        return leaf(f"attribute `{name}`", "descriptor", payload, describe(member))


def is_torchscript_function(v: Any) -> bool:
    """A function compiled by ``torch.jit.script``: library type, user code. (A method of a
    scripted module is not one: it reads its module's parameters, and stays refused.)"""
    t = type(v)
    return t.__name__ == "ScriptFunction" and t.__module__.partition(".")[0] == "torch"


_TORCH_MANGLE = re.compile(r"___torch_mangle_\d+\.")  # a name compiled again in one process


def _torchscript_node(fn: Any, label: str, w: Walk) -> FingerprintNode:
    """A TorchScript function by what the compiler made of it: its graph with the functions it
    calls inlined (operators, constants, types; no source places), its own module's prefix
    taken out of the names in it (``__torch__.prep.Acc`` imported, ``__torch__.Acc`` as
    ``__main__``); and by the Python function it was compiled from, where torch keeps it, for
    the helpers that still run in Python (``@torch.jit.ignore``); and by torch's version."""
    try:
        graph = fn.inlined_graph.str(False)  # False: without source file and line
        qualified = _TORCH_MANGLE.sub("", fn.qualified_name)
    except Exception as e:
        raise Unhashable(fn, f"Its TorchScript graph cannot be read ({e}).") from None
    own = qualified.rpartition(".")[0] + "."
    graph = _TORCH_MANGLE.sub("", graph).replace(own, "__torch__.")
    children = [leaf("TorchScript graph", "torchscript", graph.encode(), "<graph>")]
    source = getattr(fn, "_torchdynamo_inline", None)  # set by torch.jit.script
    if isinstance(source, types.FunctionType) and user_function(source):
        children.append(_captured(source, "compiled from", w))
    module = type(fn).__module__
    payload = f"{canonical.type_name(type(fn))}\0{module_version(module)}".encode()
    return node(label, "torchscript function", payload, children,
                f"<scripted function {getattr(fn, 'name', '?')}>")


def callable_node(fn: Any, label: str, w: Walk) -> FingerprintNode:
    """The node of any callable, inside an ongoing walk."""
    if isinstance(fn, types.FunctionType):
        return _function_node(fn, label, w)
    if isinstance(fn, functools.partial):
        return w.guarded(fn, label, lambda: _partial_node(fn, label, w))
    if isinstance(fn, types.MethodType):
        return w.guarded(fn, label, lambda: _method_node(fn, label, w))
    if isinstance(fn, type):
        return class_node(fn, label, w)
    if is_torchscript_function(fn):
        return w.guarded(fn, label, lambda: _torchscript_node(fn, label, w))
    if is_wrapper(fn):  # the cache settings do not change what is computed
        return node(label, "wrapper", canonical.type_name(type(fn)).encode(),
                    [_captured(fn.__wrapped__, "wrapped function", w)], describe(fn))
    if is_function_like(fn):
        return _named_node(fn, label, w)
    return canonical.value_node(fn, label, w)  # a callable object: its class and its state


def hash_function(fn: Callable[..., Any], label: str, *, where: str = "") -> FingerprintNode:
    """Fingerprint what ``fn`` computes.

    >>> hash_function(lambda x: x + 1, "function").digest == hash_function(
    ...     lambda y: y + 1, "function").digest
    True
    """
    if not callable(fn):
        raise TypeError(f"hash_function() needs a callable, got {canonical.type_name(type(fn))}")
    try:
        return callable_node(fn, label, Walk())
    except Unhashable as e:
        raise e.to_error(label, where) from None
