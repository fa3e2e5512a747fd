"""hash_function: functions are identified by what they compute, not where they were written.

Decision on names: a function's own name is NOT part of its digest (renaming ``f`` to ``g``
computes the same thing). The pipeline may still put the name in an op's label.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import sys
import textwrap
import time
import types

import numpy as np
import pytest

from snapcache.errors import FingerprintError
from snapcache.fingerprint import hash_function
from snapcache.fingerprint.tree import combine, pipeline_root


def make(src: str, name: str = "f", *, filename: str = "<a>", shift: int = 0, **namespace):
    """Compile ``src`` as if it were a user module at another place in another file."""
    ns = {"__name__": "fp_fixture_module", "np": np, "math": math, "functools": functools}
    ns.update(namespace)
    exec(compile("\n" * shift + textwrap.dedent(src), filename, "exec"), ns)
    return ns[name]


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


# -- randomness --------------------------------------------------------------------------------

RANDOM_CASES = {
    "import random": ("import random\ndef f(x):\n    return x + random.random()\n",
                      "reads global random state (`random.random`)"),
    "np.random.rand": ("def f(x):\n    return x + np.random.rand(3)\n",
                       "reads global random state (`np.random.rand`)"),
    "from random import shuffle": ("from random import shuffle\ndef f(x):\n    shuffle(x)\n",
                                   "reads global random state (`random.shuffle`)"),
    "from numpy.random import rand": ("from numpy.random import rand\n"
                                      "def f(x):\n    return rand()\n",
                                      "reads global random state (`numpy.random.rand`)"),
    "import inside the function": ("def f(x):\n    import numpy as npx\n"
                                   "    return npx.random.randn()\n",
                                   "reads global random state (`numpy.random.randn`)"),
    "from-import inside the function": (
        "def f(x):\n    from random import choice\n    return choice(x)\n",
        "reads global random state (`random.choice`)"),
    "through a helper": ("import random\ndef jitter(x):\n    return x + random.gauss(0, 1)\n"
                         "def f(x):\n    return jitter(x) * 2\n",
                         "reads global random state (`random.gauss`) via helper `jitter`"),
    "the clock": ("import time\ndef f(x):\n    return (x, time.time())\n",
                  "reads the clock (`time.time`)"),
    "os randomness": ("import os\ndef f(x):\n    return os.urandom(4)\n",
                      "draws operating-system randomness (`os.urandom`)"),
    "unseeded default_rng": ("def f(x):\n    return np.random.default_rng().random(2)\n",
                             "creates an unseeded generator (`np.random.default_rng()`)"),
    "default_rng(None)": ("def f(x):\n    return np.random.default_rng(None).random(2)\n",
                          "creates an unseeded generator (`np.random.default_rng()`)"),
    "default_rng(seed=None)": ("def f(x):\n    return np.random.default_rng(seed=None).random()\n",
                               "creates an unseeded generator (`np.random.default_rng()`)"),
    "from numpy.random import default_rng": (
        "from numpy.random import default_rng\ndef f(x):\n    return default_rng().random()\n",
        "creates an unseeded generator (`numpy.random.default_rng()`)"),
    "unseeded RandomState": ("def f(x):\n    return np.random.RandomState().rand()\n",
                             "creates an unseeded generator (`np.random.RandomState()`)"),
    "unseeded bit generator": ("def f(x):\n    return np.random.Generator(np.random.PCG64())\n",
                               "creates an unseeded generator (`np.random.PCG64()`)"),
    "unseeded random.Random": ("import random\ndef f(x):\n    return random.Random().random()\n",
                               "creates an unseeded generator (`random.Random()`)"),
    "random.SystemRandom": ("import random\ndef f(x):\n    return random.SystemRandom().random()\n",
                            "draws operating-system randomness (`random.SystemRandom`)"),
    "builtin hash": ("def f(x):\n    return hash(f'tok{x}') % 1000\n",
                     "calls the builtin `hash()`, whose value for str and bytes changes from "
                     "process to process (PYTHONHASHSEED; `zlib.crc32` or `hashlib` give stable "
                     "values)"),
}


@pytest.mark.parametrize("case", sorted(RANDOM_CASES))
def test_detect_randomness(case):
    from snapcache.fingerprint import detect_randomness
    src, expected = RANDOM_CASES[case]
    assert detect_randomness(make(src)) == [expected]


@pytest.mark.parametrize("src", [
    "def f(x, seed=0):\n    rng = np.random.default_rng(seed)\n    return rng.random() + x\n",
    "def f(x):\n    return np.random.Generator(np.random.PCG64(x)).integers(3)\n",
    "def f(x):\n    return math.sqrt(x) + np.mean(x)\n",
    "import random\ndef f(x):\n    return random.Random(x).random()\n",
    "def f(x):\n    random = 4\n    return x.random + random\n",
    "def f(x):\n    return np.random.default_rng(seed=x + 1).random()\n",
    "def f(x):\n    return np.random.default_rng(int(x)).random()\n",
    "def f(x):\n    return np.random.RandomState(0).rand() + np.random.RandomState(x).rand()\n",
    "def f(x):\n    from numpy.random import default_rng\n    return default_rng(x).random()\n",
    "def f(x):\n    return np.random.default_rng(*x).random()\n",  # the bytecode does not say
    "def f(x):\n    make = np.random.default_rng\n    return make(x)\n",
    "import zlib\ndef f(x):\n    return zlib.crc32(x.encode()) % 1000\n",
    "def hash(x):\n    return len(x)\ndef f(x):\n    return hash(x)\n",  # not the builtin
])
def test_detect_randomness_is_quiet_for_seeded_or_pure_code(src):
    from snapcache.fingerprint import detect_randomness
    assert detect_randomness(make(src)) == []


def test_detect_randomness_through_partials_methods_and_closures():
    from snapcache.fingerprint import detect_randomness
    noisy = make("def g(x, k):\n    return np.random.normal(x, k)\n", "g")
    assert detect_randomness(functools.partial(noisy, k=1)) == [
        "reads global random state (`np.random.normal`)"]
    closure = (lambda h: (lambda x: h(x, 1)))(noisy)
    assert detect_randomness(closure) == [
        "reads global random state (`np.random.normal`) via helper `h`"]
    cls = make("class Noisy:\n    def __call__(self, x):\n        return x + np.random.rand()\n",
               "Noisy")
    assert detect_randomness(cls()) == ["reads global random state (`np.random.rand`)"]
    assert detect_randomness(cls().__call__) == ["reads global random state (`np.random.rand`)"]
    recursive = make("def f(x):\n    return f(x - 1) if x else np.random.rand()\n")
    assert detect_randomness(recursive) == ["reads global random state (`np.random.rand`)"]


def test_lru_cache_wrapped_helpers_are_followed():
    a = functools.lru_cache(maxsize=None)(make("def h(x):\n    return x * 2\n", "h"))
    b = functools.lru_cache(maxsize=8)(make("def h(x):\n    return x * 2\n", "h"))
    c = functools.lru_cache(maxsize=None)(make("def h(x):\n    return x * 3\n", "h"))
    assert fp(a) == fp(b) != fp(c)
    user = "def f(x):\n    return h(x)\n"
    assert fp(make(user, h=a)) != fp(make(user, h=c))


def test_detect_randomness_in_methods_of_callable_objects_and_classes():
    from snapcache.fingerprint import detect_randomness
    cls = make("import random\nclass T:\n    def __call__(self, x):\n        return self.noise(x)\n"
               "    def noise(self, x):\n        return x + random.random()\n", "T")
    expected = ["reads global random state (`random.random`)"]
    assert detect_randomness(cls()) == expected
    assert detect_randomness(cls) == expected
    cached = functools.lru_cache(make("def g(x):\n    return np.random.rand()\n", "g"))
    assert detect_randomness(cached) == ["reads global random state (`np.random.rand`)"]


@dataclasses.dataclass(frozen=True)
class _Scale:
    k: int = 2

    def __call__(self, x):
        return x * self.k


def test_hash_inside_hash_methods_is_quiet():
    """``__hash__`` is where ``hash()`` belongs (a frozen dataclass writes one): a callable object
    is scanned with all its methods, and must not warn for it."""
    from snapcache.fingerprint import detect_randomness
    assert "__hash__" in vars(_Scale)
    assert detect_randomness(_Scale()) == []
    keyed = make("class Key:\n    def __hash__(self):\n        return hash(self.name)\n"
                 "    def __call__(self, x):\n        return x\n", "Key")
    assert detect_randomness(keyed()) == []


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

@pytest.fixture
def user_package(tmp_path, monkeypatch):
    """A user package ``fp_pkg`` on sys.path: ``write(name, src)`` (re)writes a module of it and
    drops it from sys.modules, as a fresh process would see the file."""
    (tmp_path / "fp_pkg").mkdir()
    (tmp_path / "fp_pkg" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(name: str, src: str) -> None:  # name: "helpers", "sub/helpers"
        path = tmp_path / "fp_pkg" / f"{name}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        if not (path.parent / "__init__.py").exists():
            (path.parent / "__init__.py").write_text("")
        path.write_text(textwrap.dedent(src))
        for m in [m for m in sys.modules if m == "fp_pkg" or m.startswith("fp_pkg.")]:
            del sys.modules[m]
    yield write
    for m in [m for m in sys.modules if m == "fp_pkg" or m.startswith("fp_pkg.")]:
        del sys.modules[m]


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


def test_randomness_in_helpers_imported_inside_is_reported(user_package):
    from snapcache.fingerprint import detect_randomness
    user_package("noise", "import random\ndef jitter(x):\n    return x + random.random()\n")
    user_package("user", "def f(x):\n    from fp_pkg.noise import jitter\n    return jitter(x)\n")
    import fp_pkg.user
    assert detect_randomness(fp_pkg.user.f) == [
        "reads global random state (`random.random`) via helper `fp_pkg.noise.jitter`"]


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


def test_function_attributes_count():
    def attributed(k):
        f = make("def f(x):\n    return x * f.factor\n")
        f.factor = k
        return f
    assert fp(attributed(2)) != fp(attributed(3))
    assert fp(attributed(2)) == fp(attributed(2))


# -- randomness held by objects: transforms, augmentation libraries, datasets ------------------

def library_class(src: str, name: str, module: str):
    """A class as if defined in an installed library's ``module`` (never imported here)."""
    cls = make(src, name)
    cls.__module__ = module
    return cls


TV = "torchvision.transforms.transforms"
RandomHorizontalFlip = library_class(
    "class RandomHorizontalFlip:\n    def __init__(self, p=0.5):\n        self.p = p\n"
    "    def __call__(self, x):\n        return x\n", "RandomHorizontalFlip", TV)
Normalize = library_class("class Normalize:\n    def __call__(self, x):\n        return x\n",
                          "Normalize", TV)
Compose = library_class("class Compose:\n    def __init__(self, transforms):\n"
                        "        self.transforms = transforms\n    def __call__(self, x):\n"
                        "        return x\n", "Compose", TV)
HorizontalFlip = library_class(
    "class HorizontalFlip:\n    def __init__(self, p=0.5):\n        self.p = p\n"
    "    def __call__(self, x):\n        return x\n", "HorizontalFlip",
    "albumentations.augmentations.geometric.transforms")

NOISY = make("class Noisy:\n    def __call__(self, x):\n        return x + np.random.rand()\n",
             "Noisy")
USER_COMPOSE = make("class Steps:\n    def __init__(self, *steps):\n        self.steps = steps\n"
                    "    def __call__(self, x):\n        for s in self.steps:\n"
                    "            x = s(x)\n        return x\n", "Steps")
AUGMENTATION = "applies a random augmentation (torchvision `RandomHorizontalFlip`)"

HELD_CASES = {
    "torchvision Random* class": (RandomHorizontalFlip(), [AUGMENTATION]),
    "inside a library Compose": (Compose([Normalize(), RandomHorizontalFlip()]),
                                 [AUGMENTATION + " via `self.transforms[1]`"]),
    "inside a user Compose": (USER_COMPOSE(Normalize(), NOISY()), [
        "reads global random state (`np.random.rand`) via `self.steps[1]`"]),
    "a user Compose of a library one": (USER_COMPOSE(Compose([RandomHorizontalFlip()])),
                                        [AUGMENTATION + " via `self.steps[0]`"]),
    "albumentations, applied with p=0.5": (HorizontalFlip(), [
        "applies a random augmentation (albumentations `HorizontalFlip`)"]),
    "a flip that always flips": (RandomHorizontalFlip(p=1.0), []),
    "never applied": (HorizontalFlip(p=0), []),
    "albumentations, always applied": (HorizontalFlip(p=1.0), []),
    "deterministic transforms": (Compose([Normalize(), USER_COMPOSE(Normalize())]), []),
}


@pytest.mark.parametrize("case", sorted(HELD_CASES))
def test_detect_randomness_in_transforms_objects_hold(case):
    """Augmentation libraries are recognised by class name and module, never imported: a class
    named ``Random*`` (or a listed one like ``ColorJitter``) of torchvision, albumentations or
    kornia; in albumentations, a transform applied with a probability between 0 and 1."""
    from snapcache.fingerprint import detect_randomness
    transform, expected = HELD_CASES[case]
    assert detect_randomness(transform) == expected


class _Images:
    """A map-style dataset, torchvision style."""

    def __init__(self, n, transform=None, target_transform=None):
        self.data = np.arange(n * 4.0).reshape(n, 4)
        self.targets = list(range(n))
        self.transform, self.target_transform = transform, target_transform

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        x, y = self.data[i], self.targets[i]
        if self.transform is not None:
            x = self.transform(x)
        return x, (self.target_transform(y) if self.target_transform else y)


class _Jittered(_Images):
    def __init__(self, n):
        super().__init__(n)
        self.data = self.data + np.random.rand(n, 4)  # drawn once, when made: its state

    def __getitem__(self, i):
        return [self.jitter(x) for x in self.data[i:i + 1]][0]

    def jitter(self, x):
        return x + np.random.normal(size=4)


class _Hashed(_Images):
    def __getitem__(self, i):
        return self.data[i], hash(f"class{self.targets[i]}") % 10


class _Generator(_Images):
    def __init__(self, n):
        super().__init__(n)
        self.rng = np.random.default_rng(0)

    def __getitem__(self, i):
        return self.data[i] + self.rng.random()


class _Wrapper:
    """Like ``torch.utils.data.Subset``."""

    def __init__(self, dataset, indices):
        self.dataset, self.indices = dataset, indices

    def __len__(self):
        return len(self.indices)

    def __getitem__(self, i):
        return self.dataset[self.indices[i]]


DATASET_CASES = {
    "transform": (_Images(3, NOISY()), [
        "`_Images.transform` reads global random state (`np.random.rand`)"]),
    "target_transform lambda": (_Images(3, None, lambda y: y + np.random.randint(2)), [
        "`_Images.target_transform` reads global random state (`np.random.randint`)"]),
    "a transform inside a Compose": (_Images(3, Compose([Normalize(), RandomHorizontalFlip()])), [
        "`_Images.transform` " + AUGMENTATION + " via `self.transforms[1]`"]),
    "a method __getitem__ calls": (_Jittered(3), [
        "`_Jittered.jitter` reads global random state (`np.random.normal`)"]),
    "hash in __getitem__": (_Hashed(3), [
        f"`_Hashed.__getitem__` {RANDOM_CASES['builtin hash'][1]}"]),
    "a generator it holds": (_Generator(3), [
        "`_Generator.rng` is a random generator (numpy.random.Generator)"]),
    "a dataset it wraps": (_Wrapper(_Images(5, NOISY()), [0, 2]), [
        "`_Wrapper.dataset.transform` reads global random state (`np.random.rand`)"]),
    "deterministic": (_Images(3, Compose([Normalize()]), lambda y: y + 1), []),
    "seeded per item": (_Images(3, lambda x: x + np.random.default_rng(int(x[0])).random()), []),
    "no transform": (_Images(3), []),
}


@pytest.mark.parametrize("case", sorted(DATASET_CASES))
def test_detect_dataset_randomness(case):
    from snapcache.fingerprint import detect_dataset_randomness
    dataset, expected = DATASET_CASES[case]
    assert detect_dataset_randomness(dataset) == expected
