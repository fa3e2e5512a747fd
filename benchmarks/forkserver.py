"""A process that imports a benchmark's libraries once and forks a fresh child for each run.

A benchmark that measures each phase in a fresh process (so every S3 client starts inside the
timed span, as a user's first epoch would) pays the libraries' import in every one of them:
``import torch`` or ``import litdata`` takes 2-7 s here, outside the timed span but inside the
benchmark's run time. A :class:`ForkServer` imports them once (``preload``: exactly the imports
the run makes before its clock starts, nothing a timed span would include) and forks a child
per run; the child starts with what a fresh process would have after those imports, runs the
module's ``main(argv)`` and exits the normal way (its atexit handlers run, as in a fresh
process).

    server = ForkServer("benchmarks.bench_s3", "litdata", env=env, cwd=ROOT)
    done = server.run(["--child", ...])      # returncode, stdout, stderr
    server.close()

The served module provides ``preload(what)`` and ``main(argv)``.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tempfile
import traceback


class ForkServer:
    """A serving process for ``module`` with ``preload(what)`` done."""

    def __init__(self, module: str, what: str, *, env: dict, cwd: str):
        self._dir = tempfile.mkdtemp(prefix="snapcache-forkserver-")
        self._jobs = 0
        self.proc = subprocess.Popen([sys.executable, "-m", "benchmarks.forkserver", module, what],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                     cwd=cwd, text=True)
        ready = self.proc.stdout.readline()
        if ready.strip() != "ready":
            self.close()
            raise RuntimeError(f"the fork server for {what} did not start ({ready!r})")

    def run(self, argv: list[str]) -> subprocess.CompletedProcess:
        """Run ``main(argv)`` in a forked child; its exit code and output."""
        self._jobs += 1
        out = os.path.join(self._dir, f"{self._jobs}.out")
        err = os.path.join(self._dir, f"{self._jobs}.err")
        self.proc.stdin.write(json.dumps({"argv": argv, "out": out, "err": err}) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer:
            raise RuntimeError("the fork server exited")
        code = json.loads(answer)["returncode"]
        with open(out) as f, open(err) as g:
            done = subprocess.CompletedProcess(argv, code, f.read(), g.read())
        os.remove(out)
        os.remove(err)
        return done

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        try:
            os.rmdir(self._dir)
        except OSError:
            pass


def serve(module: str, what: str) -> None:
    served = importlib.import_module(module)
    served.preload(what)
    print("ready", flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(served, job)  # never returns
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)


def _child(served, job: dict) -> None:
    for fd, path in ((1, job["out"]), (2, job["err"])):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdin = open(0, closefd=False)
    code = 0
    try:
        served.main(job["argv"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported as a failed run
        traceback.print_exc()
        code = 1
    sys.exit(code)  # the normal exit: stdio flushed, atexit handlers run


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2])
