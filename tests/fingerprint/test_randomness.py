"""detect_randomness and detect_dataset_randomness: what user code draws at random upstream of a
snapshot (frozen into it), found by reading the code, its helpers and what objects hold."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest

from fp_user_code import make


# -- what functions draw -----------------------------------------------------------------------

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


def test_detect_randomness_in_methods_of_callable_objects_and_classes():
    from snapcache.fingerprint import detect_randomness
    cls = make("import random\nclass T:\n    def __call__(self, x):\n        return self.noise(x)\n"
               "    def noise(self, x):\n        return x + random.random()\n", "T")
    expected = ["reads global random state (`random.random`)"]
    assert detect_randomness(cls()) == expected
    assert detect_randomness(cls) == expected
    cached = functools.lru_cache(make("def g(x):\n    return np.random.rand()\n", "g"))
    assert detect_randomness(cached) == ["reads global random state (`np.random.rand`)"]


def test_detect_randomness_in_a_class_made_by_exec_in_a_bare_namespace():
    """Its ``__module__`` is "builtins" (no ``__name__`` in the namespace): user code all the
    same, read like any other user class."""
    from snapcache.fingerprint import detect_randomness
    namespace: dict = {}
    exec("import random\nclass Prep:\n    def __call__(self, x):\n"
         "        return x * random.random()\n", namespace)
    assert detect_randomness(namespace["Prep"]()) == [
        "reads global random state (`random.random`)"]


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


def test_randomness_in_helpers_imported_inside_is_reported(user_package):
    from snapcache.fingerprint import detect_randomness
    user_package("noise", "import random\ndef jitter(x):\n    return x + random.random()\n")
    user_package("user", "def f(x):\n    from fp_pkg.noise import jitter\n    return jitter(x)\n")
    import fp_pkg.user
    assert detect_randomness(fp_pkg.user.f) == [
        "reads global random state (`random.random`) via helper `fp_pkg.noise.jitter`"]


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
