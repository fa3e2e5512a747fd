"""errors.warn: a warning names the user's line, past snapcache's frames and past the frames of
the libraries that called into snapcache (a DataLoader's fetch, the standard library's threads).
"""

from __future__ import annotations

import os
import site
import sys
import sysconfig
import warnings

import pytest

from snapcache import errors


def compiled(source: str, filename: str, name: str):
    """Function ``name`` of ``source``, its frames reporting ``filename``."""
    namespace: dict = {}
    exec(compile(source, filename, "exec"), namespace)
    return namespace[name]


# snapcache's own code warns; a library calls it; the user calls the library
SNAPCACHE_CODE = compiled("def warns(errors):\n    errors.warn('frozen', UserWarning)\n",
                          os.path.join(os.path.dirname(errors.__file__), "pipeline", "x.py"),
                          "warns")


@pytest.mark.parametrize("folder", [
    sysconfig.get_paths()["stdlib"],
    sysconfig.get_paths()["purelib"],
    site.getusersitepackages(),  # ``pip install --user``: an installed package too
])
def test_warnings_step_past_the_libraries_that_called_snapcache(folder):
    library = compiled("def call(f, *args):\n    return f(*args)\n",
                       os.path.join(folder, "somelib", "fetch.py"), "call")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        library(SNAPCACHE_CODE, errors)
    assert [(w.filename, w.lineno) for w in caught] == [(__file__, line)]

