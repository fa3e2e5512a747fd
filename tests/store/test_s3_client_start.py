"""The S3 client's start-up in a fresh process: s3fs is imported without the TLS backend
botocore only imports to take the standard library's SSLContext back out of it
(``urllib3.contrib.pyopenssl``, which imports pyOpenSSL and cryptography when installed), and
nothing of that is left behind for the rest of the process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BACKEND = "urllib3.contrib.pyopenssl"


def run(script: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": ROOT})


def test_s3fs_is_imported_without_the_unused_tls_backend_and_nothing_is_left_blocked():
    out = run(f"""
        import importlib.abc, ssl, sys

        looked_up = []

        class Recorder(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                looked_up.append(name)
                return None

        sys.meta_path.insert(0, Recorder())
        from snapcache.store.fs import Storage

        storage = Storage("s3://a-bucket/prefix", {{"key": "k", "secret": "s",
                          "client_kwargs": {{"endpoint_url": "http://127.0.0.1:9"}}}})
        assert type(storage.fs).__name__ == "S3FileSystem", type(storage.fs)
        assert "{BACKEND}" not in looked_up, "the backend was imported"
        assert "{BACKEND}" not in sys.modules, "an entry is left in sys.modules"
        import botocore.httpsession
        assert botocore.httpsession.SSLContext is ssl.SSLContext  # what it would take anyway
        try:  # a later import is looked up as usual (it may fail: pyOpenSSL is optional)
            import {BACKEND}
        except ImportError:
            pass
        assert "{BACKEND}" in looked_up
        print("ok")
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_a_process_that_imported_the_backend_first_keeps_it():
    out = run(f"""
        import sys, types
        fake = types.ModuleType("{BACKEND}")
        sys.modules["{BACKEND}"] = fake
        from snapcache.store.fs import Storage
        Storage("s3://a-bucket/prefix", {{"key": "k", "secret": "s"}})
        assert sys.modules["{BACKEND}"] is fake
        print("ok")
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_without_s3fs_the_error_names_the_package_to_install():
    out = run("""
        import sys
        sys.modules["s3fs"] = None  # as if it were not installed
        from snapcache.store.fs import Storage
        try:
            Storage("s3://a-bucket/prefix")
        except ImportError as e:
            print(e)
    """)
    assert out.returncode == 0, out.stderr
    assert "s3fs (pip install 'snapcache[s3]')" in out.stdout
