"""hash_function: functions are identified by what they compute, not where they were written.

Decision on names: a function's own name is NOT part of its digest (renaming ``f`` to ``g``
computes the same thing). The pipeline may still put the name in an op's label.
"""

from __future__ import annotations

import functools
import math
import os
import sys
import textwrap
import types

import numpy as np
import pytest

from snapcache.errors import FingerprintError
from snapcache.fingerprint import hash_function
from snapcache.fingerprint.tree import combine, pipeline_root

from fp_user_code import make


def fp(fn) -> str:
    return hash_function(fn, "function `f`", where="map #1 `f`").digest


BASE = """
def f(x):
    return x + 1
"""

EQUAL = {
    "comments": ("""
        def f(x):
            # add one
            return x + 1  # trailing comment
        """),
    "docstring added": ('''
        def f(x):
            """Add one to x."""
            return x + 1
        '''),
    "blank lines and another file and line": ("""

        def f(x):

            return x + 1

        """),
    "renamed function": ("""
        def g(x):
            return x + 1
        f = g
        """),
    "multi-line expression": ("""
        def f(x):
            return (x
                    + 1)
        """),
}


@pytest.mark.parametrize("case", sorted(EQUAL))
def test_pairs_that_hash_equal(case):
    base = make(BASE, filename="a.py")
    other = make(EQUAL[case], filename="other/b.py", shift=40)
    assert fp(base) == fp(other), case


EQUAL_PAIRS = {
    "docstring changed": ('def f(x):\n    "A."\n    return [x]\n',
                          'def f(x):\n    "B, longer."\n    return [x]\n'),
    "local variable renamed": ("def f(x):\n    y = x * 2\n    return y\n",
                               "def f(x):\n    z = x * 2\n    return z\n"),
    "same lambda in two places": ("f = lambda x: x * 2\n",
                                  "def outer():\n    return lambda x: x * 2\nf = outer()\n"),
    "nested def with and without docstring": (
        "def f(x):\n    def g(y):\n        'inner'\n        return y\n    return g(x)\n",
        "def f(x):\n    def g(y):\n        return y\n    return g(x)\n"),
    "helper moved": ("def h(x):\n    return x * 3\ndef f(x):\n    return h(x)\n",
                     "def f(x):\n    return h(x)\n\n\n\ndef h(x):\n    # moved\n"
                     "    return x * 3\n"),
}


@pytest.mark.parametrize("case", sorted(EQUAL_PAIRS))
def test_more_pairs_that_hash_equal(case):
    a, b = EQUAL_PAIRS[case]
    assert fp(make(a, filename="a.py")) == fp(make(b, filename="b.py", shift=7)), case


class Scaler:
    def __init__(self, factor):
        self.factor = factor

    def apply(self, x):
        return x * self.factor

    def __call__(self, x):
        return x * self.factor


def _closure(k):
    return lambda x: x * k


DIFFERENT = {
    "constant changed": ("def f(x):\n    return x + 1\n", "def f(x):\n    return x + 2\n"),
    "operator changed": ("def f(x):\n    return x + 1\n", "def f(x):\n    return x - 1\n"),
    "default changed": ("def f(x, k=1):\n    return x + k\n", "def f(x, k=2):\n    return x + k\n"),
    "kwdefault changed": ("def f(x, *, k=1):\n    return x + k\n",
                          "def f(x, *, k=2):\n    return x + k\n"),
    "nested lambda constant": ("def f(xs):\n    return list(map(lambda v: v + 1, xs))\n",
                               "def f(xs):\n    return list(map(lambda v: v + 2, xs))\n"),
    "comprehension changed": ("def f(xs):\n    return [v * 2 for v in xs]\n",
                              "def f(xs):\n    return [v * 3 for v in xs]\n"),
    "comprehension filter": ("def f(xs):\n    return [v for v in xs]\n",
                             "def f(xs):\n    return [v for v in xs if v]\n"),
    "np used vs math used": ("def f(x):\n    return np.sqrt(x)\n",
                             "def f(x):\n    return math.sqrt(x)\n"),
    "inner def changed": ("def f(x):\n    def g(y):\n        return y + 1\n    return g(x)\n",
                          "def f(x):\n    def g(y):\n        return y * 1\n    return g(x)\n"),
    "positional-only": ("def f(x, /):\n    return x\n", "def f(x):\n    return x\n"),
    "docstring equals a used constant": ('def f():\n    "abc"\n    return "abc"\n',
                                         'def f():\n    "abd"\n    return "abd"\n'),
    "attribute read": ("def f(x):\n    return x.mean()\n", "def f(x):\n    return x.sum()\n"),
}


@pytest.mark.parametrize("case", sorted(DIFFERENT))
def test_pairs_that_differ(case):
    a, b = DIFFERENT[case]
    assert fp(make(a)) != fp(make(b)), case


def test_future_annotations_flag_of_the_file_does_not_matter():
    fns = []
    for header in ("from __future__ import annotations\n", ""):
        ns = {"__name__": "fp_fixture_module"}
        exec(compile(header + "def f(x: int) -> int:\n    return x\n", "m.py", "exec",
                     dont_inherit=True), ns)
        fns.append(ns["f"])
    assert fp(fns[0]) == fp(fns[1])


def test_captured_values_that_differ():
    src = "def f(x):\n    return x[:SIZE]\n"
    assert fp(make(src, SIZE=224)) != fp(make(src, SIZE=256))
    assert fp(make(src, SIZE=224)) == fp(make(src, SIZE=224))
    assert fp(_closure(2)) != fp(_closure(3))
    assert fp(_closure(2)) == fp(_closure(2))
    helper_a = make("def h(x):\n    return x * 2\n", "h")
    helper_b = make("def h(x):\n    return x * 3\n", "h")
    user = "def f(x):\n    return h(x)\n"
    assert fp(make(user, h=helper_a)) != fp(make(user, h=helper_b))
    assert fp(functools.partial(max, 1)) != fp(functools.partial(max, 2))
    assert fp(functools.partial(max, key=abs)) != fp(functools.partial(max, key=len))
    assert fp(Scaler(2).apply) != fp(Scaler(3).apply)
    assert fp(Scaler(2).apply) == fp(Scaler(2).apply)
    assert fp(Scaler(2)) != fp(Scaler(3))
    assert fp(Scaler(2)) == fp(Scaler(2))


def test_module_attribute_helpers_in_user_modules_are_followed(tmp_path):
    module = types.ModuleType("fp_user_utils")
    module.__file__ = str(tmp_path / "fp_user_utils.py")
    sys.modules["fp_user_utils"] = module
    try:
        exec("def resize(x):\n    return x * 2\nSIZE = 3\n", module.__dict__)
        src = "def f(x):\n    return utils.resize(x) + utils.SIZE\n"
        before = hash_function(make(src, utils=module), "function `f`")
        exec("def resize(x):\n    return x * 4\n", module.__dict__)
        after = hash_function(make(src, utils=module), "function `f`")
        assert before.digest != after.digest
        assert "helper `utils.resize`" in [c.label for c in after.children]
    finally:
        del sys.modules["fp_user_utils"]


def test_library_functions_by_name_and_version():
    nodes = {f: hash_function(f, "function") for f in (np.mean, np.sum, np.add, math.sqrt,
                                                        os.path.join, len, str.upper)}
    assert len({n.digest for n in nodes.values()}) == len(nodes)
    assert all(not n.children for n in nodes.values())
    assert hash_function(np.mean, "a").digest == hash_function(np.mean, "b").digest
    assert hash_function(" ".join, "f").digest != hash_function(",".join, "f").digest
    node = make("def f(x):\n    return np.mean(x)\n")
    assert [c.summary for c in hash_function(node, "f").children if c.label == "global `np`"] == \
        [f"<module numpy {np.__version__}>"]


def test_classes_used_as_functions():
    a = make("class T:\n    def __init__(self, x):\n        self.x = x + 1\n", "T")
    b = make("class T:\n    def __init__(self, x):\n        self.x = x + 2\n", "T")
    c = make("class T:\n    # moved\n    def __init__(self, x):\n        self.x = x + 1\n", "T",
             shift=9)
    assert fp(a) != fp(b)
    assert fp(a) == fp(c)


def test_classes_made_by_exec_in_a_bare_namespace_are_user_code():
    """``exec(source, {})`` (a config file a tool runs) gives a class ``__module__`` "builtins",
    from a namespace without ``__name__``: it is user code all the same, counted by its
    methods' code, not by the name ``builtins.Prep``."""
    def prep(k):
        namespace: dict = {}
        exec(f"class Prep:\n    def __call__(self, x):\n        return x * {k}\n", namespace)
        return namespace["Prep"]()
    assert type(prep(2)).__module__ == "builtins"
    assert fp(prep(2)) != fp(prep(3))
    assert fp(prep(2)) == fp(prep(2))
    assert fp(type(prep(2))) != fp(type(prep(3)))
    assert not hash_function(dict, "f").children  # the builtins' own classes: by name


def test_recursion_terminates():
    fact = make("def f(n):\n    return 1 if n < 2 else n * f(n - 1)\n")
    assert fp(fact) == fp(fact)
    ns = {}
    src = ("def f(n):\n    return g(n - 1) if n else 0\n"
           "def g(n):\n    return f(n - 1) if n else 1\n")
    f1 = make(src, **ns)
    f2 = make(src, filename="other.py", shift=3)
    assert fp(f1) == fp(f2)
    node = hash_function(f1, "f")
    assert [c.label for c in node.children] == ["bytecode", "constants", "helper `g`"]


def test_stable_after_the_function_has_run_many_times():
    f = make("def f(x):\n    return x.real + 1 if x > 0 else -x\n")
    before = fp(f)
    for i in range(5000):
        f(i)
    assert fp(f) == before


def test_decorated_functions_follow_the_wrapped_function():
    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*a):
            return fn(*a)
        return wrapper
    assert fp(deco(make(DIFFERENT["constant changed"][0]))) != fp(
        deco(make(DIFFERENT["constant changed"][1])))


def test_children_say_what_was_captured():
    scale = 2.0
    n = hash_function(make("def f(x, k=3, *, m=4):\n    return helper(x) * SIZE + k + m\n",
                           helper=_closure(scale), SIZE=224), "function `f`")
    labels = [c.label for c in n.children]
    assert labels == ["bytecode", "constants", "helper `helper`", "global `SIZE`", "default `k`",
                      "kwdefault `m`"]
    assert n.children[3].summary == "224"
    assert [c.label for c in hash_function(_closure(2), "f").children][-1] == "closure `k`"


def test_unhashable_capture_names_where():
    import threading
    lock = threading.Lock()
    with pytest.raises(FingerprintError) as info:
        hash_function(make("def f(x):\n    return LOCK\n", LOCK=lock), "function `f`",
                      where="map #2 `f`")
    assert "global `LOCK` of function `f` of map #2 `f`" in str(info.value)


def test_loggers_are_identified_by_name():
    import logging
    src = "def f(x):\n    log.info('x=%s', x)\n    return x\n"
    assert fp(make(src, log=logging.getLogger("a"))) == fp(make(src, log=logging.getLogger("a")))
    assert fp(make(src, log=logging.getLogger("a"))) != fp(make(src, log=logging.getLogger("b")))


def test_non_callables_are_rejected():
    with pytest.raises(TypeError, match="needs a callable"):
        hash_function(3, "function `f`")


def test_undefined_globals_do_not_crash():
    f = make("def f(x):\n    return not_defined_anywhere(x)\n")
    assert "global `not_defined_anywhere`" in [c.label for c in hash_function(f, "f").children]


# -- performance -------------------------------------------------------------------------------

def _realistic_pipeline():
    src = """
    SIZE = 224
    MEAN = np.array([0.485, 0.456, 0.406], np.float32)
    CFG = {"size": SIZE, "flip": True, "names": ["a", "b"]}

    def normalize(x):
        return (x - MEAN) / np.std(x)

    def decode(x):
        return np.frombuffer(x, np.uint8).reshape(-1, 3)

    def resize(x):
        return x[:CFG["size"], :SIZE]

    def prep(x):
        return normalize(resize(decode(x))).astype(np.float32)

    def keep(x):
        return len(x) > 0 and math.isfinite(float(x[0][0]))

    def label(x, table={"cat": 0, "dog": 1}):
        return table.get(x, -1)

    def tokens(x):
        return [w.lower() for w in x.split() if w]
    """
    ns = {"__name__": "fp_perf", "np": np, "math": math}
    exec(textwrap.dedent(src), ns)
    scale = 2.0
    return [ns["prep"], ns["keep"], ns["label"], ns["tokens"], ns["normalize"], ns["decode"],
            lambda x: x * scale, functools.partial(ns["label"], table={"x": 1}),
            Scaler(3).apply, np.sqrt]


def test_ten_realistic_functions_fingerprint_the_same_every_time():
    """Stable across repeated analysis (its speed is benchmarks/bench_fingerprint.py's)."""
    fns = _realistic_pipeline()

    def run():
        ops = [combine(f"map #{i} `f`", [hash_function(f, "function `f`")], kind="op:map")
               for i, f in enumerate(fns)]
        return pipeline_root(ops).digest
    first = run()  # code objects are analysed once, then memoised
    for _ in range(10):
        assert run() == first


def test_lru_cache_wrapped_helpers_are_followed():
    a = functools.lru_cache(maxsize=None)(make("def h(x):\n    return x * 2\n", "h"))
    b = functools.lru_cache(maxsize=8)(make("def h(x):\n    return x * 2\n", "h"))
    c = functools.lru_cache(maxsize=None)(make("def h(x):\n    return x * 3\n", "h"))
    assert fp(a) == fp(b) != fp(c)
    user = "def f(x):\n    return h(x)\n"
    assert fp(make(user, h=a)) != fp(make(user, h=c))


STATE = 0


def _counts_calls(x):
    global STATE
    STATE += 1
    return x + 1


def test_globals_the_function_assigns_are_state_not_configuration():
    global STATE
    before = hash_function(_counts_calls, "f").digest
    STATE = 1234
    assert hash_function(_counts_calls, "f").digest == before


# -- code the function reaches without a global name ---------------------------------------

IMPORTS_INSIDE = {
    "from-import": "def f(x):\n    from fp_pkg.helpers import scale\n    return scale(x)\n",
    "import-as": "def f(x):\n    import fp_pkg.helpers as h\n    return h.scale(x)\n",
    "deep import-as": "def f(x):\n    import fp_pkg.sub.helpers as h\n    return h.scale(x)\n",
    "import dotted": "def f(x):\n    import fp_pkg.helpers\n    return fp_pkg.helpers.scale(x)\n",
    "relative module": "def f(x):\n    from . import helpers\n    return helpers.scale(x)\n",
    "relative from-import": "def f(x):\n    from .helpers import FACTOR\n    return x * FACTOR\n",
    "nested function": "def f(x):\n    def g(y):\n        from fp_pkg import helpers\n"
                       "        return helpers.scale(y)\n    return g(x)\n",
    "used in a comprehension": "def f(x):\n    import fp_pkg.helpers as h\n"
                                "    return [h.scale(v) for v in x]\n",
    "used in a lambda": "def f(x):\n    from fp_pkg.helpers import scale\n"
                         "    return list(map(lambda v: scale(v), x))\n",
}


@pytest.mark.parametrize("case", sorted(IMPORTS_INSIDE))
def test_helpers_imported_inside_the_function_are_followed(user_package, case):
    """A snapshot that exists is read without running the function: what it imports when it runs
    is imported (user modules only) and followed when it is fingerprinted."""
    module = "sub/helpers" if "fp_pkg.sub." in IMPORTS_INSIDE[case] else "helpers"

    def digest(factor: int, other: int = 0) -> str:
        user_package(module, f"""
            FACTOR = {factor}
            def scale(x):
                return x * FACTOR
            def unrelated(x):
                return x - {other}
            """)
        user_package("user", IMPORTS_INSIDE[case])
        import fp_pkg.user
        assert "fp_pkg." + module.replace("/", ".") not in sys.modules  # until fingerprinted
        return fp(fp_pkg.user.f)
    first = digest(2)
    assert digest(3) != first
    assert digest(2) == first
    assert digest(2, other=5) == first  # a helper the function does not read: no miss


def test_a_module_the_function_cannot_import_is_named_not_fatal(user_package):
    user_package("user", "def f(x):\n    import fp_no_such_module_here\n"
                         "    return fp_no_such_module_here.g(x)\n")
    import fp_pkg.user
    node = hash_function(fp_pkg.user.f, "f")
    assert "import `fp_no_such_module_here`" in [c.label for c in node.children]


def test_library_modules_imported_inside_are_not_imported_to_fingerprint():
    if "moto" in sys.modules:
        pytest.skip("moto is imported already in this process")
    f = make("def f(x):\n    import moto\n    return moto.mock_aws(x)\n")
    fp(f)
    assert "moto" not in sys.modules


def test_singledispatch_functions_count_by_their_implementations():
    src = """
        @functools.singledispatch
        def f(x):
            return x * {a}
        @f.register
        def _(x: str):
            return x + "{b}"
        """
    def digest(a, b):
        return fp(make(src.format(a=a, b=b)))
    assert digest(2, "s") != digest(3, "s")
    assert digest(2, "s") != digest(2, "t")
    assert digest(2, "s") == digest(2, "s")


def test_library_wrappers_count_by_what_they_wrap():
    """A library decorator's wrapper (``functools.wraps`` gives it the user's ``__module__``)
    counts by the library's name and version and by the user code it holds."""
    import contextlib

    @contextlib.contextmanager
    def quiet():
        yield

    def wrapped(k):
        return quiet()(make(f"def f(x):\n    return x * {k}\n"))
    assert fp(wrapped(2)) != fp(wrapped(3))
    assert fp(wrapped(2)) == fp(wrapped(2))


SCALER = """
class Scaler:
    def __init__(self, k):
        self.k = k
    def __call__(self, x):
        return x * self.k
"""


def test_library_wrappers_around_callable_objects_count_by_the_object():
    """A library's wrapper (``functools.wraps``, like ``torch.no_grad()``) around a user
    callable object counts by the object: its attributes and its class's code."""
    no_grad = make("""
        def no_grad(fn):
            @functools.wraps(fn)
            def wrapper(*args):
                return fn(*args)
            return wrapper
        """, "no_grad", __name__="numpy.fp_fixture_decorators")  # as if installed
    scaler = make(SCALER, "Scaler")
    assert fp(no_grad(scaler(2))) != fp(no_grad(scaler(3)))
    assert fp(no_grad(scaler(2))) == fp(no_grad(scaler(2)))
    other = make(SCALER.replace("x * self.k", "x + self.k"), "Scaler")
    assert fp(no_grad(scaler(2))) != fp(no_grad(other(2)))
    assert fp(no_grad(np.add)) == fp(no_grad(np.add))  # library code inside: by name


def test_torch_wrappers_around_callable_objects_count_by_the_object():
    torch = pytest.importorskip("torch")
    scaler = make(SCALER, "Scaler")
    for wrap in (torch.no_grad(), torch.vmap):
        assert fp(wrap(scaler(2))) != fp(wrap(scaler(3)))
        assert fp(wrap(scaler(2))) == fp(wrap(scaler(2)))


def test_user_modules_held_as_values_count_by_their_source(user_package):
    import importlib

    def digest(factor: int) -> str:
        user_package("helpers", f"def scale(x):\n    return x * {factor}\n")
        mod = importlib.import_module("fp_pkg.helpers")
        return fp((lambda m: (lambda x: m.scale(x)))(mod))
    assert digest(2) != digest(3)
    assert digest(2) == digest(2)
    # a library module held as a value counts by name and version, as before
    assert fp((lambda m: (lambda x: m.sqrt(x)))(math)) == fp((lambda m: (lambda x: m.sqrt(x)))(
        math))


SCRIPTED = """
import torch

@torch.jit.script
class Offset:
    def __init__(self, k: int):
        self.k = k

    def add(self, x: int) -> int:
        return x + self.k

def helper(x: int) -> int:
    return x - {h}

@torch.jit.ignore
def in_python(x: int) -> int:
    return x * {p}

@torch.jit.script
def f(x: int) -> int:
    return Offset({o}).add(helper(x)) * {k} + in_python(x)
"""


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")
def test_torchscript_functions_count_by_their_code(user_package):
    """A ``torch.jit.script`` function is a library type holding user code: it counts by its
    compiled graph (what it calls inlined) and the Python function it was made from, not as
    the library function ``torch.jit.ScriptFunction``."""
    pytest.importorskip("torch")
    import importlib
    import linecache

    def digest(k=2, h=1, o=3, p=1, module="scripted") -> str:
        user_package(module, SCRIPTED.format(k=k, h=h, o=o, p=p))
        linecache.clearcache()  # torch reads the source through linecache
        return fp(importlib.import_module(f"fp_pkg.{module}").f)
    first = digest()
    assert digest(k=3) != first  # its body
    assert digest(h=2) != first  # a helper compiled into it
    assert digest(o=4) != first  # a scripted class it uses
    assert digest(p=2) != first  # a helper it leaves to Python
    assert digest() == first  # compiled again in this process: torch mangles the names
    assert digest(module="elsewhere") == first  # the same code in another module


def _held(module: str) -> str:
    """The digest of a function holding user module ``module`` as a value (a closure cell), as
    the docs recommend for ``importlib.import_module(name)``."""
    import importlib
    held = importlib.import_module(module)
    return fp((lambda m: (lambda x: m.scale(x)))(held))


def test_a_held_package_counts_by_the_modules_it_re_exports_from(user_package):
    def digest(factor: int, other: int = 0) -> str:
        user_package("feat/__init__", "from .impl import scale\n")
        user_package("feat/impl", f"def scale(x):\n    return x * {factor}\n")
        user_package("unrelated", f"X = {other}\n")
        return _held("fp_pkg.feat")
    first = digest(2)
    assert digest(3) != first
    assert digest(2) == first
    assert digest(2, other=5) == first  # a module of the project it does not read


def test_a_held_module_counts_by_the_user_modules_it_imports(user_package):
    """Followed recursively, through an import cycle (consts imports the package back)."""
    def digest(a: int, b: int) -> str:
        user_package("helpers", "from fp_pkg import consts_a, consts_b\n"
                                "def scale(x):\n    return x * consts_a.K + consts_b.K\n")
        user_package("consts_a", f"import fp_pkg.helpers\nK = {a}\n")
        user_package("consts_b", f"K = {b}\n")
        return _held("fp_pkg.helpers")
    first = digest(2, 7)
    assert digest(3, 7) != first
    assert digest(7, 2) != first  # the two files' contents swapped
    assert digest(2, 7) == first


def test_a_held_package_fingerprints_alike_at_another_place(tmp_path, monkeypatch):
    def forget() -> None:
        for name in [m for m in sys.modules if m.partition(".")[0] == "fp_moved"]:
            del sys.modules[name]
    digests = []
    try:
        for place in ("a", "b"):
            package = tmp_path / place / "fp_moved"
            package.mkdir(parents=True)
            (package / "__init__.py").write_text("from .impl import scale\n")
            (package / "impl.py").write_text("def scale(x):\n    return x * 2\n")
            monkeypatch.syspath_prepend(str(tmp_path / place))
            forget()
            digests.append(_held("fp_moved"))
            assert sys.modules["fp_moved"].__file__.startswith(str(tmp_path / place))
    finally:
        forget()
    assert digests[0] == digests[1]


def test_function_attributes_count():
    def attributed(k):
        f = make("def f(x):\n    return x * f.factor\n")
        f.factor = k
        return f
    assert fp(attributed(2)) != fp(attributed(3))
    assert fp(attributed(2)) == fp(attributed(2))
