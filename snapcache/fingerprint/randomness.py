"""Randomness upstream of a snapshot: what user code draws at random, found by reading it.

Random draws upstream of a snapshot are computed once and frozen into it, then replayed every
epoch. :func:`detect_randomness` reads a function's bytecode (and that of the user helpers it
calls, its closure, the callables an object holds) for reads of global random state, unseeded
generators, operating-system randomness, the clock and the builtin ``hash()``; it also reports
random generator objects captured and random augmentations of torchvision, albumentations and
kornia, recognised by class name without importing them. :func:`detect_dataset_randomness` does
the same for what a map-style dataset runs when an item is read.

The bytecode is analysed once, by :mod:`snapcache.fingerprint.bytecode` (globals read,
attribute chains with their call arguments, what user modules hold), for fingerprints and for
this module alike; this module judges what that analysis finds. See ``docs/fingerprints.md``
("Randomness is frozen").
"""

from __future__ import annotations

import builtins
import dis
import functools
import inspect
import random
import types
from typing import Any, Callable

from snapcache.fingerprint import canonical
from snapcache.fingerprint.bytecode import (
    ATTR_LOADS, LOCAL_LOADS, NOT_IMPORTABLE, code_info, module_reads)
from snapcache.fingerprint.functions import (
    global_rng, held_user_code, is_function_like, is_wrapper)
from snapcache.fingerprint.origin import user_class, user_function

__all__ = ["detect_randomness", "detect_dataset_randomness"]

_RANDOM_DRAWS = frozenset({
    "random", "randint", "randrange", "shuffle", "choice", "choices", "sample", "uniform",
    "gauss", "normalvariate", "lognormvariate", "triangular", "betavariate", "expovariate",
    "gammavariate", "paretovariate", "weibullvariate", "vonmisesvariate", "getrandbits",
    "randbytes", "binomialvariate"})
_NUMPY_NOT_DRAWS = frozenset({"default_rng", "Generator", "SeedSequence", "RandomState",
                              "BitGenerator", "PCG64", "PCG64DXSM", "Philox", "SFC64", "MT19937",
                              "seed", "get_state", "set_state", "get_bit_generator",
                              "set_bit_generator"})
_TORCH_DRAWS = frozenset({"rand", "randn", "randint", "randperm", "normal", "rand_like",
                          "randn_like", "randint_like", "bernoulli", "multinomial", "poisson"})
_TF_SEEDED = frozenset({"Generator", "set_seed", "create_rng_state", "Algorithm"})
# Constructors seeded from operating-system entropy when given no seed (or None), under
# numpy.random or where they are defined (``numpy.random._generator.default_rng``).
_NUMPY_SEEDABLE = frozenset({"default_rng", "RandomState", "SeedSequence", "PCG64", "PCG64DXSM",
                             "Philox", "SFC64", "MT19937"})
_UNSEEDED = "creates an unseeded generator"  # seeded from operating-system entropy
_SALTED_HASH = ("calls the builtin `hash()`, whose value for str and bytes changes from process "
                "to process (PYTHONHASHSEED; `zlib.crc32` or `hashlib` give stable values)")


def _classify(full: str, args: int | None = None) -> str | None:
    """What reading ``full`` (called with ``args`` arguments, None if not called) does to
    the results, or None if they stay the same from run to run."""
    parts = full.split(".")
    last = parts[-1]
    if args == 0 and (full == "random.Random" or (
            full.startswith("numpy.random.") and last in _NUMPY_SEEDABLE)):
        return _UNSEEDED
    if len(parts) == 2 and parts[0] == "random" and last in _RANDOM_DRAWS:
        return "reads global random state"
    if full.startswith("numpy.random.") and len(parts) == 3 and last not in _NUMPY_NOT_DRAWS:
        return "reads global random state"
    if len(parts) == 2 and parts[0] == "torch" and last in _TORCH_DRAWS:
        return "reads global random state"
    if full.startswith("tensorflow.random.") and not (
            last.startswith("stateless") or last in _TF_SEEDED):
        return "reads global random state"
    if full in ("os.urandom", "uuid.uuid1", "uuid.uuid4", "random.SystemRandom") or \
            parts[0] == "secrets":
        return "draws operating-system randomness"
    if full in ("time.time", "time.time_ns"):
        return "reads the clock"
    return None


def _resolve(value: Any) -> str | None:
    """The dotted name ``value`` is known by: ``numpy.random`` for ``np.random``."""
    if isinstance(value, types.ModuleType):
        return value.__name__
    owner = getattr(value, "__self__", None)
    if owner is not None and (rng := global_rng(owner)):
        return f"{rng}.{value.__name__}"
    module, name = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    return f"{module}.{name}" if isinstance(module, str) and isinstance(name, str) else None


def _random_reads(fn: types.FunctionType) -> list[str]:
    found = []
    for kind, root, attrs, args in code_info(fn.__code__).chains:
        written = ".".join((root,) + attrs) if kind == "global" else None
        if kind == "global":
            if root not in fn.__globals__ and not hasattr(builtins, root):
                continue
            base = _resolve(fn.__globals__.get(root, getattr(builtins, root, None)))
        else:
            base = root
        if base is None:
            continue
        if ".".join((base,) + attrs) == "builtins.hash":
            # Hashing is what ``__hash__`` is for (dataclasses write one that calls hash()).
            if fn.__code__.co_name != "__hash__":
                found.append(_SALTED_HASH)
            continue
        for n in range(len(attrs), -1, -1):  # the longest prefix that names something known
            full = ".".join((base,) + attrs[:n])
            if (what := _classify(full, args if n == len(attrs) else None)) is not None:
                shown = ".".join((root,) + attrs[:n]) if written and n else full
                if what is _UNSEEDED:  # the call, by its public name
                    public = f"numpy.random.{full.rpartition('.')[2]}"
                    shown = (public if shown.startswith("numpy.random.") else shown) + "()"
                found.append(f"{what} (`{shown}`)")
                break
    return found


def _generator_type(value: Any) -> str | None:
    """``numpy.random.Generator`` if ``value`` is a random generator object (stdlib, numpy,
    torch, TensorFlow), else None. Frameworks are recognised by type name, never imported."""
    cls = type(value)
    if isinstance(value, random.Random):
        return f"{cls.__module__}.{cls.__qualname__}"
    module = getattr(cls, "__module__", "") or ""
    top = module.partition(".")[0]
    if top == "numpy" and module.startswith("numpy.random") and \
            cls.__name__ in ("Generator", "RandomState"):
        return f"numpy.random.{cls.__name__}"
    if top in ("torch", "tensorflow") and cls.__name__ == "Generator":
        return f"{top}.{'random.' if top == 'tensorflow' else ''}Generator"
    return None


def _held_values(fn: Any) -> list[tuple[str, Any]]:
    """(name, value) of what ``fn`` holds besides its code: referenced globals, closure cells,
    defaults, a partial's arguments, a callable object's or bound method's state."""
    if isinstance(fn, functools.partial):
        return [(f"argument {i}", v) for i, v in enumerate(fn.args)] + \
            [(k, v) for k, v in (fn.keywords or {}).items()]
    if isinstance(fn, types.FunctionType):
        out = [(name, fn.__globals__[name]) for name in code_info(fn.__code__).global_names
               if name in fn.__globals__]
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
            try:
                out.append((name, cell.cell_contents))
            except ValueError:  # an empty cell
                pass
        names = fn.__code__.co_varnames[:fn.__code__.co_argcount]
        defaults = fn.__defaults__ or ()
        out += list(zip(names[len(names) - len(defaults):], defaults))
        out += list((fn.__kwdefaults__ or {}).items())
        return out
    owner = getattr(fn, "__self__", fn)
    if owner is not fn and _generator_type(owner) and not global_rng(owner):
        # a generator's own method (``rng.random``); the hidden global ones are reported as
        # "reads global random state" already
        return [("self", owner)]
    state = getattr(owner, "__dict__", None)
    return [(f"self.{k}", v) for k, v in state.items()] if isinstance(state, dict) else []


def _captured_generators(fn: Any) -> list[str]:
    return [f"draws from a captured random generator (`{name}`: {kind})"
            for name, value in _held_values(fn) if (kind := _generator_type(value)) is not None]


def _callees(fn: Any) -> list[tuple[str, Any]]:
    """User functions reached from ``fn``: helpers, closure cells, partial and method targets."""
    if isinstance(fn, functools.partial):
        return [("", fn.func)]
    if is_wrapper(fn):
        return [("", fn.__wrapped__)]
    if not isinstance(fn, types.FunctionType):  # a class, a callable object, a bound method
        owner = getattr(fn, "__self__", fn)
        cls = owner if isinstance(owner, type) else type(owner)
        members = [m for c in cls.__mro__ if user_class(c)
                   for m in vars(c).values()]
        members = [getattr(m, "__func__", m) for m in members]  # static and class methods
        return [("", m) for m in members if isinstance(m, types.FunctionType)]
    info = code_info(fn.__code__)
    out = [(name, fn.__globals__.get(name)) for name in info.global_names]
    out += [(path, v) for path, v in module_reads(fn, info) if v is not NOT_IMPORTABLE]
    cells = zip(fn.__code__.co_freevars, fn.__closure__ or ())
    for name, cell in cells:
        try:
            out.append((name, cell.cell_contents))
        except ValueError:  # an empty cell
            pass
    return out


# Augmentation libraries whose transforms are recognised by class name, never imported: a class
# named ``Random*`` or listed here draws at every call (unless its probability ``p`` is 0, or it
# is a flip with ``p`` 1); in albumentations, so does any transform with ``p`` between 0 and 1.
_AUGMENTATION_LIBRARIES = frozenset({"torchvision", "albumentations", "kornia"})
_RANDOM_AUGMENTATIONS = frozenset({"ColorJitter", "RandAugment", "AutoAugment",
                                   "TrivialAugmentWide", "AugMix", "ElasticTransform"})
# Library classes whose attributes are searched for callables, besides the libraries above.
_CONTAINER_MODULES = frozenset({"torch.nn.modules.container"})
_HELD_ITEMS = 64  # a longer list, tuple or dict holds data, not transforms


def _random_augmentation(value: Any) -> str | None:
    """Why ``value``, an object of an augmentation library, is random; None if it is not one
    (or not known to be one)."""
    cls = type(value)
    top = (getattr(cls, "__module__", None) or "").partition(".")[0]
    if top not in _AUGMENTATION_LIBRARIES:
        return None
    name = cls.__name__
    p = getattr(value, "__dict__", {}).get("p")
    p = p if isinstance(p, (int, float)) and not isinstance(p, bool) else None
    if p is not None and (p <= 0 or (p >= 1 and "Flip" in name)):
        return None  # never applied, or a flip that always is
    if name.startswith("Random") or name in _RANDOM_AUGMENTATIONS or (
            top == "albumentations" and p is not None and p < 1):
        return f"applies a random augmentation ({top} `{name}`)"
    return None


def _attribute_values(owner: Any, prefix: str) -> list[tuple[str, Any]]:
    """(path, value) of ``owner``'s attributes, the items of short lists, tuples and dicts in
    their place (``self.transforms[0]``)."""
    state = getattr(owner, "__dict__", None)
    if not isinstance(state, dict):
        return []
    out: list[tuple[str, Any]] = []
    for name, value in list(state.items()):
        path = f"{prefix}.{name}"
        if isinstance(value, (list, tuple)) and len(value) <= _HELD_ITEMS:
            out += [(f"{path}[{i}]", v) for i, v in enumerate(value)]
        elif isinstance(value, dict) and len(value) <= _HELD_ITEMS:
            out += [(f"{path}[{k!r}]", v) for k, v in list(value.items())]
        else:
            out.append((path, value))
    return out


def _held_callables(fn: Any) -> list[tuple[str, Any]]:
    """Callables a callable object (or a bound method's object) holds in its attributes, where
    it is user code, an augmentation library's or a torch container (``nn.Sequential``): the
    transforms of a Compose-like object, ``self.transforms[0]``."""
    if isinstance(fn, (types.FunctionType, functools.partial, type)):
        return []
    owner = getattr(fn, "__self__", fn) if isinstance(fn, types.MethodType) else fn
    module = getattr(type(owner), "__module__", None) or ""
    if not (user_class(type(owner)) or module.partition(".")[0] in _AUGMENTATION_LIBRARIES
            or module in _CONTAINER_MODULES):
        return []
    return [(path, v) for path, v in _attribute_values(owner, "self")
            if callable(v) and not isinstance(v, type)]


def detect_randomness(fn: Callable[..., Any]) -> list[str]:
    """Warnings for reads of global random state in ``fn`` or the user helpers it calls, for
    unseeded generators they create, for random generator objects they capture
    (``np.random.Generator``, ``random.Random``, ...), for random augmentations of torchvision,
    albumentations or kornia a callable object holds, and for the builtin ``hash()``: either way
    the results are computed once and frozen into a snapshot.

    Returns sentences to put after the op's name, e.g.
    ``"reads global random state (`np.random.rand`)"``.
    """
    warnings: list[str] = []
    seen: set[int] = set()
    todo: list[tuple[Any, str]] = [(fn, "")]
    while todo:
        f, via = todo.pop(0)
        if id(f) in seen:
            continue
        seen.add(id(f))
        if (augmentation := _random_augmentation(f)) is not None:
            warnings += [augmentation + via] if augmentation + via not in warnings else []
            continue
        if isinstance(f, types.FunctionType):
            if not user_function(f):  # library code is trusted, and not walked,
                todo += [(v, via) for _, v in held_user_code(f)]  # but what it wraps is
                continue
            warnings += [m + via for m in _random_reads(f) if m + via not in warnings]
        warnings += [m + via for m in _captured_generators(f) if m + via not in warnings]
        for name, callee in _callees(f):
            if is_function_like(callee) or isinstance(callee, type) or (
                    callable(callee) and canonical.is_plain_object(callee)):
                todo.append((callee, via or (f" via helper `{name}`" if name else "")))
        todo += [(held, via or f" via `{path}`") for path, held in _held_callables(f)]
    return warnings


def detect_dataset_randomness(dataset: Any) -> list[str]:
    """Warnings for what a map-style dataset (``torch.utils.data.Dataset``) draws at random when
    an item is read: in ``__getitem__`` (``__getitems__``) and the methods they call on
    ``self``, as :func:`detect_randomness` finds it; in the callables the dataset holds
    (``transform``, ``target_transform``, lists and dicts of them); in random generators it
    holds; and so on in the datasets it wraps (``Subset``, ``ConcatDataset``).

    Returns sentences that start with where, e.g.
    ``"`Images.transform` reads global random state (`torch.rand`)"``.
    """
    found: list[str] = []
    seen: set[int] = set()
    todo = [(type(dataset).__name__, dataset)]
    while todo:
        path, ds = todo.pop(0)
        if id(ds) in seen:
            continue
        seen.add(id(ds))
        for name, method in _item_methods(type(ds)):
            found += [f"`{path}.{name}` {m}" for m in detect_randomness(method)]
        for where, value in _attribute_values(ds, path):
            if (kind := _generator_type(value)) is not None:
                found.append(f"`{where}` is a random generator ({kind})")
            elif _is_map_dataset(value):
                todo.append((where, value))
            elif callable(value) and not isinstance(value, type) and id(value) not in seen:
                seen.add(id(value))  # one object held twice (torchvision's ``transforms``)
                if isinstance(value, types.MethodType) and value.__self__ is ds:
                    value = value.__func__  # its own method: not all of its class (``__init__``)
                found += [f"`{where}` {m}" for m in detect_randomness(value)]
    return list(dict.fromkeys(found))


def _is_map_dataset(value: Any) -> bool:
    """A dataset another one wraps: user code, or torch's (``Subset``, ``ConcatDataset``)."""
    cls = type(value)
    module = getattr(cls, "__module__", None) or ""
    return (not callable(value) and hasattr(cls, "__getitem__") and hasattr(cls, "__len__")
            and (module.startswith("torch.utils.data") or (
                user_class(cls) and isinstance(getattr(value, "__dict__", None), dict))))


def _item_methods(cls: type) -> list[tuple[str, types.FunctionType]]:
    """The user methods reading an item runs: ``__getitem__``, ``__getitems__``, and those
    they call on ``self`` (``self.load(i)``), however deep."""
    out: dict[str, types.FunctionType] = {}
    todo = ["__getitem__", "__getitems__"]
    while todo:
        name = todo.pop(0)
        member = inspect.getattr_static(cls, name, None)
        member = getattr(member, "__func__", member)  # static and class methods
        if name in out or not (isinstance(member, types.FunctionType)
                               and user_function(member)):
            continue
        out[name] = member
        todo += _self_attributes(member.__code__)
    return list(out.items())


def _self_attributes(code: types.CodeType, me: str | None = None) -> list[str]:
    """Attributes ``code`` reads on its first argument (``self.x``), in nested code too."""
    if me is None:
        if not code.co_argcount:
            return []
        me = code.co_varnames[0]
    instructions = list(dis.get_instructions(code))
    names = [b.argval for a, b in zip(instructions, instructions[1:])
             if a.opname in LOCAL_LOADS and a.argval == me and b.opname in ATTR_LOADS]
    for c in code.co_consts:
        if isinstance(c, types.CodeType) and me in c.co_freevars:
            names += _self_attributes(c, me)
    return names
