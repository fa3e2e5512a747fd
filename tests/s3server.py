"""An S3 server for tests: moto's server mode in a subprocess, spoken to over real HTTP.

The client side is configured the way production is, through the standard AWS environment
variables (credentials, region and ``AWS_ENDPOINT_URL_S3``), which s3fs/aiobotocore honour, so
code under test needs no ``storage_options`` and subprocesses started by a test reach the same
server by inheriting ``os.environ``.

Fixtures (registered in ``tests/conftest.py``):

``s3_server`` (session)
    A running server: ``.endpoint`` ("http://127.0.0.1:PORT"), ``.env`` (the variables to set),
    ``.storage_options`` (the explicit alternative to the endpoint variables). Stopped at the end
    of the session; it also dies with the pytest process if that is killed.
``s3_root`` (function)
    ``"s3://<fresh bucket>/snaps"`` with ``.env`` set in ``os.environ`` for the test and fsspec's
    filesystem instance cache cleared before and after, so no test sees another's listings.

Tests that use them are skipped with a reason when moto's server or s3fs is not installed
(both are in the ``dev`` extra).
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from typing import IO, Iterator

import pytest

START_TIMEOUT = 20.0   # seconds for the server to answer before the session fails
STOP_TIMEOUT = 5.0     # seconds between SIGTERM and SIGKILL

# Variables that would point the client elsewhere or at other credentials: removed for tests.
_FOREIGN_AWS_VARS = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN",
                     "AWS_SECURITY_TOKEN", "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS",
                     "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE")


def missing_requirements() -> str | None:
    """Why the S3 tests cannot run here, or None if they can."""
    for module, package in (("s3fs", "s3fs"), ("moto", "moto[server]"),
                            ("flask", "moto[server]"), ("werkzeug", "moto[server]")):
        if importlib.util.find_spec(module) is None:
            return (f"S3 tests need {package}, which is not installed "
                    "(pip install -e '.[dev]')")
    return None


@dataclass
class S3Server:
    """A running moto S3 server and how to reach it."""

    endpoint: str
    env: dict[str, str]
    process: subprocess.Popen
    _admin: object = field(default=None, repr=False)

    @property
    def storage_options(self) -> dict:
        """fsspec options that reach the server without the environment variables."""
        return {"key": self.env["AWS_ACCESS_KEY_ID"], "secret": self.env["AWS_SECRET_ACCESS_KEY"],
                "client_kwargs": {"endpoint_url": self.endpoint}}

    def filesystem(self):
        """An S3FileSystem of the fixtures' own on this server, for test set-up: not in
        fsspec's instance cache, listings never cached, independent of the environment."""
        if self._admin is None:
            import s3fs

            self._admin = s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False,
                                            **self.storage_options)
        return self._admin


def client_env(endpoint: str) -> dict[str, str]:
    """The environment a production client would have, pointed at ``endpoint``."""
    missing_config = os.path.join(tempfile.gettempdir(), "snapcache-tests-no-aws-config")
    return {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL_S3": endpoint,
        "AWS_ENDPOINT_URL": endpoint,
        # keep a developer's ~/.aws out of the tests
        "AWS_CONFIG_FILE": missing_config,
        "AWS_SHARED_CREDENTIALS_FILE": missing_config,
        "AWS_EC2_METADATA_DISABLED": "true",
    }


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(endpoint: str) -> bool:
    try:
        with urllib.request.urlopen(endpoint + "/moto-api/", timeout=0.5) as response:
            return response.status < 500
    except urllib.error.HTTPError as e:  # any HTTP answer means the server is up
        return e.code < 500
    except (OSError, ValueError):
        return False


def _tail(log: IO[bytes], limit: int = 4000) -> str:
    log.flush()
    log.seek(0)
    text = log.read().decode(errors="replace")
    return text[-limit:] if text.strip() else "(nothing)"


def stop(process: subprocess.Popen) -> None:
    """Terminate ``process`` and reap it; kill it if it does not stop in time."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def start(log: IO[bytes], attempts: int = 3) -> S3Server:
    """Start a server on a free loopback port and wait until it answers.

    The port is found by binding port 0 and released before the server binds it, so another
    process may take it in between: the server then exits at once and a new port is tried.
    Server output goes to ``log`` (a file, not a pipe, which would fill up and block the server).
    """
    failures = []
    for _ in range(attempts):
        port = free_port()
        endpoint = f"http://127.0.0.1:{port}"
        env = {**os.environ, "MOTO_PORT": str(port)}
        process = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), str(os.getpid()), "-H", "127.0.0.1",
             "-p", str(port)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline and process.poll() is None:
            if _answers(endpoint):
                return S3Server(endpoint=endpoint, env=client_env(endpoint), process=process)
            time.sleep(0.05)
        code = process.poll()
        stop(process)
        if code is None:
            pytest.fail(f"the moto S3 server on {endpoint} did not answer within "
                        f"{START_TIMEOUT:.0f} s; its output:\n{_tail(log)}", pytrace=False)
        failures.append(f"port {port}: exited with code {code}")
    pytest.fail(f"the moto S3 server did not start ({'; '.join(failures)}); its output:\n"
                f"{_tail(log)}", pytrace=False)


def clear_filesystem_caches() -> None:
    """Forget every cached fsspec filesystem instance (and with them their cached listings)."""
    import fsspec

    fsspec.AbstractFileSystem.clear_instance_cache()
    try:
        import s3fs
    except ImportError:
        return
    s3fs.S3FileSystem.clear_instance_cache()


_bucket_numbers = itertools.count()


def new_bucket_name() -> str:
    # lower case, digits and dashes, 3-63 characters: valid on AWS too
    return f"snapcache-test-{os.getpid()}-{next(_bucket_numbers)}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """A moto S3 server subprocess on 127.0.0.1, shared by the whole session."""
    reason = missing_requirements()
    if reason:
        pytest.skip(reason)
    with tempfile.TemporaryFile(prefix="snapcache-moto-") as log:
        server = start(log)
        try:
            yield server
        finally:
            stop(server.process)


@pytest.fixture
def s3_root(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """``s3://<fresh bucket>/snaps`` on the test server, with the client environment set."""
    for name in _FOREIGN_AWS_VARS:
        monkeypatch.delenv(name, raising=False)
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    bucket = new_bucket_name()
    s3_server.filesystem().mkdir(bucket)
    clear_filesystem_caches()
    try:
        yield f"s3://{bucket}/snaps"
    finally:
        clear_filesystem_caches()


def _serve(argv: list[str]) -> None:
    """Run moto's server (``argv``: pytest's pid, then moto's arguments), first asking Linux to
    SIGTERM it when pytest dies, so even a pytest killed without running finalizers leaks no
    server."""
    parent, moto_args = int(argv[0]), argv[1:]
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        pr_set_pdeathsig = 1
        try:
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:
        sys.exit("pytest exited before the S3 test server started")
    from moto.server import main

    main(moto_args)


if __name__ == "__main__":
    _serve(sys.argv[1:])
