"""Snapshots on S3 against LitData and MosaicML streaming: requests, time and CPU per phase.

On a loopback moto server; the peers when installed in the bench venv.

    python -m benchmarks.bench_s3 [--scale 1.0] [--systems snapcache,litdata,mosaic]
                                  [--workers 0,2] [--workloads image,token]
                                  [--repeat image=2,token=1] [--write-doc]

Phases, each system's in fresh processes; the timed part of each (after the library's import and
the data's set-up) is measured for wall time, the process's CPU (with its DataLoader workers)
and the requests in the server's access log. A fresh process is forked from a fork server per
system that made the imports a run makes before its clock starts, once (benchmarks/
forkserver.py; ``--fresh-interpreters`` starts a new interpreter per run instead): the
libraries' import (2-7 s each for torch, LitData, Mosaic) is outside every timed span either
way, and each S3 client still starts inside it. The start-up rows are new interpreters.

- build: the first epoch, writing the snapshot to S3 (identity map over the workload's example
  maker; 64 MB shards); timed from the writer's (snapcache: the pipeline's) construction to its
  last write;
- cold read: timed from the dataset's construction (snapcache: the pipeline's, with the
  DataLoader when workers are asked) to its last batch, with an empty local cache: batches of
  256 copied into a staging buffer, checksums verified. Whatever a system's S3 client costs to
  start after its ``import`` (snapcache imports obstore lazily, s3fs only where obstore cannot
  serve; Mosaic boto3; LitData boto3 at ``import litdata``, obstore lazily) is inside this span, as a user would feel it;
- warm read: the next epoch of the same dataset object (a loader held across epochs), in the
  same process, the local cache filled by the cold read. With workers, DataLoaders keep them
  (``persistent_workers``). Worker counts run from the highest down; a warm epoch slower than
  the same system's best warm epoch with another worker count so far is stopped there (it
  cannot be the system's best setting; its row then shows a lower bound). Cold epochs always
  run whole (the warm epoch after one needs the cache it fills).

A phase of a workload in ``--repeat`` is measured that many times (each a fresh process, a
fresh destination or cache) for every system alike, and the fastest run counts: the image-like
phases last 1-3 s, within the noise of a shared machine, the token-like ones 1-40 s.

The server runs in its own process on the same 2 cores (its CPU time is reported apart).
Requests are counted from the server's access log, so every system is counted the same way.
"""

from __future__ import annotations

import collections
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from benchmarks.report import command_line, load_average, markers, publish, target_rows

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
START, END = markers("s3-benchmark")
SHARD = 64 << 20
BATCH = 256
_LINE = re.compile(r'"(GET|PUT|HEAD|POST|DELETE) (\S+) HTTP/[\d.]+" (\d+)')


# -- the server and its request log ------------------------------------------------------------
class Server:
    def __init__(self, workdir: str):
        sys.path.insert(0, os.path.join(ROOT, "tests"))
        import s3server  # the tests' moto server launcher

        self._mod = s3server
        self.log_path = os.path.join(workdir, "moto.log")
        self._log = open(self.log_path, "w+b")
        self.server = s3server.start(self._log)
        self.env = dict(self.server.env)
        self.endpoint = self.server.endpoint

    def make_bucket(self, name: str) -> None:
        self.server.filesystem().mkdir(name)

    def remove_bucket(self, name: str) -> None:
        self.server.filesystem().rm(name, recursive=True)

    def stop(self) -> None:
        self._mod.stop(self.server.process)
        self._log.close()


def classify(requests) -> dict:
    out = collections.Counter()
    for method, path, status in requests:
        if method == "GET" and ("list-type=" in path or "prefix=" in path):
            out["LIST"] += 1
        else:
            out[method] += 1
    out["total"] = len(requests)
    return dict(out)


# -- the child: one system, one phase ----------------------------------------------------------
class Meter:
    """Wall time, this process's CPU (and its reaped children's: DataLoader workers), the
    server's CPU and the server's requests over the timed part of a phase."""

    def __init__(self, log_path: str):
        self.log_path = log_path
        self.server_pid = int(os.environ.get("BENCH_S3_SERVER_PID", "0"))

    def start(self) -> None:
        self.since = os.path.getsize(self.log_path)
        self.cpu = _cpu()
        self.server_cpu = _proc_cpu(self.server_pid) if self.server_pid else float("nan")
        self.t = time.perf_counter()

    def stop(self) -> dict:
        seconds = time.perf_counter() - self.t
        cpu = _cpu() - self.cpu
        time.sleep(0.3)  # let the server write its last lines
        server_cpu = (_proc_cpu(self.server_pid) if self.server_pid else float("nan")) \
            - self.server_cpu
        with open(self.log_path, "rb") as f:
            f.seek(self.since)
            text = f.read().decode(errors="replace")
        reqs = [(m.group(1), m.group(2), int(m.group(3))) for m in _LINE.finditer(text)]
        return {"seconds": seconds, "cpu_s": cpu, "server_cpu_s": server_cpu,
                "requests": classify(reqs)}


def _cpu() -> float:
    """CPU seconds of this process, its reaped children and its live descendants (persistent
    DataLoader workers are not reaped before the meter stops)."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        r = resource.getrusage(who)
        total += r.ru_utime + r.ru_stime
    return total + sum(_proc_cpu(pid) for pid in _descendants(os.getpid()))


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{parent}/task/{tid}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def _proc_cpu(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def child(system: str, phase: str, workload: str, n: int, url: str, cache: str,
          workers: int, log_path: str) -> dict:
    """One system's phase; ``phase`` "read" is the cold epoch and then the warm one, measured
    apart: ``{"cold": {...}, "warm": {...}}``."""
    meter = Meter(log_path)
    if phase == "start-up":
        return START_UPS[system](url, meter)
    from benchmarks.workloads import MAKERS, staging
    stage = staging(workload, BATCH)
    make = MAKERS[workload]
    if system != "snapcache":
        return PEERS[system](phase, workload, n, url, cache, workers, stage, make, meter)
    import snapcache as sc
    if workers:
        import torch  # imported before the clock, as the peers import it with themselves
    meter.start()
    ds = sc.Dataset.range(n).map(make).snapshot(url, progress=False, shard_size=SHARD,
                                                local_cache=cache)
    if phase == "build":
        rows = 0
        for _ in ds:
            rows += 1
        return {**meter.stop(), "rows": rows}
    batched = ds.batch(BATCH)
    if workers:
        loader = torch.utils.data.DataLoader(batched.to_torch(), batch_size=None,
                                             num_workers=workers, persistent_workers=True)
    else:
        loader = batched
    return _cold_then_warm(loader, stage, meter, numpy=False)


def _start_up_snapcache(url: str, meter: "Meter") -> dict:
    """snapcache's S3 client as a fresh process gets it (obstore where the options allow, as
    here; else s3fs/aiobotocore, a session and a client), and one LIST."""
    import snapcache  # noqa: F401 (the library's own import is not the client's start-up)
    meter.start()
    from snapcache.store.fs import Storage
    Storage(url).listdir()
    result = meter.stop()
    from snapcache.store import fs_obstore
    return {**result, "rows": 0, "client": "obstore" if fs_obstore.used_here() and
            "s3fs" not in sys.modules else "s3fs + aiobotocore"}


def _start_up_boto3(url: str, meter: "Meter") -> dict:
    """Mosaic's S3 client, as it makes it (a boto3 Session's client, endpoint from
    S3_ENDPOINT_URL), and one LIST: all of it inside Mosaic's timed phases."""
    meter.start()
    from boto3.session import Session
    from botocore.config import Config
    client = Session().client("s3", config=Config(retries={"mode": "adaptive"}),
                              endpoint_url=os.environ["AWS_ENDPOINT_URL_S3"])
    bucket, _, prefix = url[len("s3://"):].partition("/")
    client.list_objects_v2(Bucket=bucket, Prefix=prefix)
    return {**meter.stop(), "rows": 0}


def _start_up_obstore(url: str, meter: "Meter") -> dict:
    """LitData's chunk transfers: an obstore S3Store and one LIST. (LitData also makes a boto3
    client, whose import is paid at ``import litdata``, outside its timed phases.)"""
    meter.start()
    import obstore
    from obstore.store import S3Store
    bucket, _, prefix = url[len("s3://"):].partition("/")
    store = S3Store(bucket, endpoint=os.environ["AWS_ENDPOINT_URL_S3"],
                    virtual_hosted_style_request=False, client_options={"allow_http": True})
    list(obstore.list(store, prefix=prefix))
    return {**meter.stop(), "rows": 0}


START_UPS = {"snapcache": _start_up_snapcache, "mosaic": _start_up_boto3,
             "litdata": _start_up_obstore}
START_UP_NAMES = {"snapcache": "obstore", "mosaic": "boto3",
                  "litdata": "obstore"}


WARM_CAP: float | None = None
"""Seconds after which the warm epoch is stopped: the same system's best warm epoch with
another worker count so far (this one can no longer be the best; see :func:`measure`)."""


def _cold_then_warm(loader, stage, meter, numpy: bool) -> dict:
    """The cold epoch (the meter runs from before the dataset was constructed), then the warm
    one of the same loader (stopped once it takes longer than :data:`WARM_CAP`)."""
    from benchmarks.workloads import consume

    def epoch(cap: float | None = None) -> int:
        rows = 0
        for b in loader:
            if numpy:
                b = {k: v.numpy() if hasattr(v, "numpy") else v for k, v in b.items()}
            rows += consume(stage, b)
            if cap is not None and time.perf_counter() - meter.t > cap:
                return -rows
        return rows

    rows = epoch()
    cold = {**meter.stop(), "rows": rows}
    meter.start()
    rows = epoch(WARM_CAP)
    warm = {**meter.stop(), "rows": abs(rows)}
    if rows < 0:
        warm["stopped"] = True
    return {"cold": cold, "warm": warm}


def child_env(server: Server) -> dict:
    env = {**os.environ, **server.env, "PYTHONPATH": ROOT,
           "BENCH_S3_SERVER_PID": str(server.server.process.pid)}
    if TRANSFORMERS_LOADS not in os.environ:
        os.environ[TRANSFORMERS_LOADS] = "1" if transformers_loads() else "0"
    env[TRANSFORMERS_LOADS] = os.environ[TRANSFORMERS_LOADS]
    return env


def preload(what: str) -> None:
    """The imports a run of ``what`` makes before its clock starts, done once by its fork
    server (benchmarks/forkserver.py) instead of in every run: nothing a timed span includes
    (an S3 client, boto3 where a system imports it lazily) is imported here."""
    import benchmarks.workloads  # noqa: F401
    system, _, extra = what.partition("+")
    if system == "snapcache":
        import snapcache  # noqa: F401
        if extra == "torch":
            import torch  # noqa: F401
    elif system == "litdata":
        import litdata  # noqa: F401
        from litdata.streaming import downloader  # noqa: F401
    elif system == "mosaic":
        _mosaic_imports()


def run_child(server: Server, system: str, phase: str, workload: str, n: int, url: str,
              cache: str, workers: int, forks: dict | None = None,
              warm_cap: float | None = None) -> dict:
    """One phase in a fresh process: a fork of the system's fork server (its libraries
    imported, nothing else), or a new interpreter for the start-up phase and without
    ``forks``."""
    argv = ["--child", system, phase, workload, str(n), url, cache, str(workers),
            server.log_path] + ([repr(warm_cap)] if warm_cap is not None else [])
    started = time.perf_counter()
    if forks is None or phase == "start-up":
        out = subprocess.run([sys.executable, "-m", "benchmarks.bench_s3", *argv],
                             capture_output=True, text=True, cwd=ROOT, env=child_env(server))
    else:
        what = system + ("+torch" if system == "snapcache" and workers else "")
        if what not in forks:
            from benchmarks.forkserver import ForkServer
            forks[what] = ForkServer("benchmarks.bench_s3", what, env=child_env(server),
                                     cwd=ROOT)
        out = forks[what].run(argv)
    if out.returncode:
        lines = (out.stderr or "failed").strip().splitlines()
        failed = {"error": lines[-1] if lines else "failed"}
        return {"cold": failed, "warm": dict(failed)} if phase == "read" else failed
    notes = [line[6:] for line in out.stderr.splitlines() if line.startswith("NOTE: ")]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"  ({system} {phase} {workload} workers {workers}: the process took "
          f"{time.perf_counter() - started:.1f} s)", file=sys.stderr, flush=True)
    for part in (result.values() if phase == "read" else [result]):
        if notes:
            part["notes"] = notes
    return result


# -- peers -------------------------------------------------------------------------------------
def note(text: str) -> None:
    print("NOTE: " + text, file=sys.stderr, flush=True)


def _loader(dataset, workers: int):
    import torch
    return torch.utils.data.DataLoader(dataset, batch_size=BATCH, num_workers=workers,
                                       persistent_workers=workers > 0)


def _litdata(phase, workload, n, url, cache, workers, stage, make, meter):
    # obstore (LitData's chunk transfers) refuses http:// endpoints unless allowed; LitData
    # does not pass allow_http: add it to the client options LitData gives obstore.
    import litdata as ld
    from litdata.streaming import downloader
    downloader._OBSTORE_CLIENT_OPTIONS = {**downloader._OBSTORE_CLIENT_OPTIONS,
                                          "allow_http": True}
    note("LitData: allow_http added to the client options LitData passes to obstore "
         "(litdata.streaming.downloader._OBSTORE_CLIENT_OPTIONS); obstore refuses the "
         "loopback server's plain http:// endpoint otherwise")
    if phase == "build":
        meter.start()
        ld.optimize(fn=make, inputs=list(range(n)), output_dir=url, chunk_bytes="64MB",
                    num_workers=1, mode="overwrite")
        return {**meter.stop(), "rows": n}
    note("LitData: no checksum verification on read (it has none)")
    meter.start()  # opening the dataset reads its index: counted
    ds = ld.StreamingDataset(ld.streaming.resolver.Dir(path=cache, url=url))
    loader = ld.StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers,
                                    persistent_workers=workers > 0)
    return _cold_then_warm(loader, stage, meter, numpy=True)


def _stand_in_torchvision() -> None:
    import importlib.machinery
    import types
    for name in ("torchvision", "torchvision.datasets", "torchvision.transforms",
                 "torchvision.transforms.functional"):
        sys.modules.pop(name, None)
        mod = types.ModuleType(name)
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        mod.__path__ = []
        sys.modules[name] = mod
    sys.modules["torchvision.datasets"].VisionDataset = object

    def to_tensor(*_):
        raise RuntimeError("torchvision stand-in: to_tensor is not available")

    sys.modules["torchvision.transforms.functional"].to_tensor = to_tensor


def _stand_in_transformers() -> None:
    import importlib.machinery
    import types
    names = {"transformers": None, "transformers.feature_extraction_utils": "BatchFeature",
             "transformers.tokenization_utils_base": "BatchEncoding",
             "transformers.models": None, "transformers.models.auto": None,
             "transformers.models.auto.tokenization_auto": "AutoTokenizer"}
    for name, cls in names.items():
        mod = types.ModuleType(name)
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        mod.__path__ = []
        if cls:
            setattr(mod, cls, type(cls, (dict,), {}))
        sys.modules[name] = mod


TRANSFORMERS_LOADS = "BENCH_S3_TRANSFORMERS_LOADS"


def transformers_loads() -> bool:
    """Whether ``transformers`` can be imported in this venv: tried once, in a subprocess, so
    that each Mosaic child does not spend ~3 s finding out again."""
    out = subprocess.run([sys.executable, "-c", "import transformers.tokenization_utils_base"],
                         capture_output=True, cwd=ROOT)
    return out.returncode == 0


def _mds_columns(workload):
    if workload == "image":
        return {"image": "ndarray:uint8:128,128,3", "label": "int64"}
    return {"tokens": "ndarray:int32:128", "length": "int"}


_MOSAIC_NOTES: list[str] | None = None


def _mosaic_imports() -> list[str]:
    """Import Mosaic streaming (stand-ins where its imports cannot load here, once per
    process); the notes saying which."""
    global _MOSAIC_NOTES
    if _MOSAIC_NOTES is not None:
        return _MOSAIC_NOTES
    notes = []
    try:
        import torchvision  # noqa: F401
    except Exception:
        _stand_in_torchvision()
        notes.append("Mosaic streaming: `import streaming` imports torchvision, which cannot "
                     "load here (a CUDA build beside the CPU torch): stand-in modules for the "
                     "two names it imports (streaming.vision, unused here) are used")
    try:
        if os.environ.get(TRANSFORMERS_LOADS) == "0":  # tried once by the parent (~3 s)
            raise ImportError("transformers cannot be imported here (tried by the parent)")
        import transformers.tokenization_utils_base  # noqa: F401
    except Exception:
        _stand_in_transformers()
        notes.append("Mosaic streaming: `import streaming` imports transformers (for "
                     "isinstance checks in its own DataLoader, a tokenizer for its C4/Pile "
                     "datasets: unused here), which cannot load beside the huggingface-hub "
                     "that HF datasets needs: stand-in classes are used")
    import streaming  # noqa: F401
    from streaming.base.util import clean_stale_shared_memory  # noqa: F401
    _MOSAIC_NOTES = notes
    return notes


def _mosaic(phase, workload, n, url, cache, workers, stage, make, meter):
    os.environ["S3_ENDPOINT_URL"] = os.environ["AWS_ENDPOINT_URL_S3"]
    note("Mosaic streaming: endpoint given by S3_ENDPOINT_URL (its only setting for it)")
    for text in _mosaic_imports():
        note(text)
    from streaming import MDSWriter, StreamingDataset
    if phase == "build":
        meter.start()
        with MDSWriter(out=url, columns=_mds_columns(workload), size_limit=SHARD,
                       hashes=["xxh64"], progress_bar=False, exist_ok=True) as w:
            for i in range(n):
                w.write(make(i))
        return {**meter.stop(), "rows": n}
    from streaming.base.util import clean_stale_shared_memory
    clean_stale_shared_memory()
    meter.start()  # opening the dataset reads its index: counted
    ds = StreamingDataset(remote=url, local=cache, batch_size=BATCH, shuffle=False,
                          validate_hash="xxh64")
    return _cold_then_warm(_loader(ds, workers), stage, meter, numpy=True)


PEERS = {"litdata": _litdata, "mosaic": _mosaic}


NOTES = """
- **A warm epoch's requests.** The held pipeline's epoch makes one request, a HEAD of the
  manifest (has it changed?). Its read lease is taken once per process and snapshot, renewed
  in the background (every `lease_ttl / 4`), and released when the pipeline object is
  collected or at exit; the last-use record is written with it (beside the manifest's HEAD
  that follows a new lease, while the first shard's GET is already under way:
  `benchmarks/bench_first_batch.py`). With DataLoader workers the
  epoch's workers on a node share that one check (`snapcache/store/checks.py`: a node-local
  record named by the epoch's token, under `flock`), and the loader's process holds the read
  lease for its workers (`to_torch`, or before it forks the next epoch's workers), so the
  warm epoch is one request with workers too, persistent or not. Workers started afresh each
  epoch (torch's default) find that check made by the loader's process just before it forked
  them, under the token they compute: they make no request and start no S3 client (a forked
  worker cannot use its parent's obstore runtime and would start s3fs, ~0.5 CPU s, for the
  one HEAD): `benchmarks/bench_workers.py` measures it.
- **A build's requests.** Per shard: one PUT of the whole shard (written in memory, uploaded
  from a background pool while the next shard is encoded; parallel parts above 128 MB) and at
  most one PUT of the stream's progress record; no listing per shard. The rest is the write
  protocol's fixed cost, the same for 1 shard or 100: 21 requests for one shard (lease,
  fence, stream marker, manifest, clean-up; 4 of them listings, each serving every look-up
  of the step that made it: `tests/store/test_s3_requests.py` pins them, through both S3
  clients).
- **The S3 client.** snapcache sends its S3 requests through obstore (the Rust object_store
  crate's bindings, as LitData's transfers do) whenever the storage options can be said in
  its terms (keys or the `AWS_*` variables, endpoint, region: as here), and through s3fs
  otherwise (profiles, botocore config, credentials only botocore finds) and in processes
  forked after obstore started (its runtime does not survive a fork); so, with a node-local
  cache, a DataLoader's process fetches the shards its workers will read into it just before
  it forks them (the workers-2 rows: the workers make no request), and without one the
  workers fetch through s3fs, imported once by the loader's process before the fork;
  `SNAPCACHE_S3_CLIENT=s3fs` forces s3fs.
  s3fs's start-up in a fresh process is ~0.5 CPU s (aiobotocore, aiohttp, a botocore session
  parsing the S3 service model), obstore's a few milliseconds (the start-up rows). Mosaic
  pays boto3's start-up inside its phases, on its upload or download thread; LitData imports
  boto3 with `import litdata` (outside the timed span) and transfers through obstore.
- **What bounds the image build and cold read.** A cold image read gets each 64 MB shard in
  one GET (over loopback, bound by the server: its CPU column), verifies it (xxh3, ~10 ms)
  and starts the next while the consumer is on the first; the local copy is written in the
  background. Its first shard's GET is taken as it streams in, each record batch decoded as
  soon as it has arrived (see "First batch on S3" below). A build computes the examples (the same for every system), uploads each
  shard while the next is encoded, and pays the protocol's fixed requests before and after.
- **Checksums.** snapcache verifies each shard (xxh3) before use, Mosaic its shards (xxh64,
  `validate_hash`); LitData has no verification.
- **Noise.** Other jobs share the 2 cores: wall times swing by up to 2x between runs of the
  same system (a peer's warm epoch took 0.4 s in one run and 8 s in another); CPU s/GB is
  steadier. The image-like phases (1-3 s) are therefore run several times, every system
  alike, and the fastest counts (the runs column shows the spread); a missed target here may
  still be noise or real; the CPU columns say which."""


# -- the run -----------------------------------------------------------------------------------
def measure(args) -> list[dict]:
    """One row per workload, system, phase and worker count: ``runs`` (each a fresh process)
    and the fastest of them merged in. Repetitions go round the systems in turn, so a burst of
    load from another job falls on each alike."""
    from benchmarks.workloads import example_bytes
    sizes = {"image": max(200, int(2000 * args.scale)),
             "token": max(10_000, int(100_000 * args.scale))}
    sizes = {w: n for w, n in sizes.items() if w in args.workloads}
    rows = []
    workdir = tempfile.mkdtemp(prefix="snapcache-s3-")
    server = Server(workdir)
    unused = os.path.join(workdir, "unused")
    forks: dict | None = None if args.fresh_interpreters else {}
    try:
        server.make_bucket("bench-start-up")
        for system in args.systems:
            r = run_child(server, system, "start-up", "-", 0, "s3://bench-start-up/x", unused, 0)
            rows.append(_row("-", system, "start-up", 0, 0, 0, [r]))
            print(f"  {system} start-up {json.dumps(r)}", file=sys.stderr, flush=True)
        for workload, n in sizes.items():
            payload = n * example_bytes(workload)
            runs: dict[tuple, list] = collections.defaultdict(list)
            for rep in range(args.repeat.get(workload, 1)):
                for system in args.systems:
                    bucket = f"bench-{system}-{workload}-{rep}"
                    server.make_bucket(bucket)
                    url = f"s3://{bucket}/snaps"
                    r = run_child(server, system, "build", workload, n, url, unused, 0, forks)
                    runs[(system, "build", 0)].append(r)
                    print(f"  {workload} {system} build {json.dumps(r)}", file=sys.stderr,
                          flush=True)
                    for workers in sorted(args.workers, reverse=True):
                        # A warm epoch slower than this system's best warm epoch with another
                        # worker count is stopped there: it cannot be the best (the slow
                        # setting, usually workers 0 here, goes last). Cold epochs run whole:
                        # the warm epoch after one needs the whole cache it fills.
                        others = [x["seconds"] for (sy, ph, w), found in runs.items()
                                  if (sy, ph) == (system, "warm") and w != workers
                                  for x in found if "error" not in x and not x.get("stopped")]
                        cache = os.path.join(workdir, f"cache-{system}-{workload}-{workers}")
                        r = run_child(server, system, "read", workload, n, url, cache, workers,
                                      forks, min(others) if others else None)
                        shutil.rmtree(cache, ignore_errors=True)
                        for phase in ("cold", "warm"):
                            runs[(system, phase, workers)].append(r[phase])
                            print(f"  {workload} {system} {phase} w{workers} "
                                  f"{json.dumps(r[phase])}", file=sys.stderr, flush=True)
                    server.remove_bucket(bucket)  # the server holds its objects in memory
            for (system, phase, workers), found in runs.items():
                rows.append(_row(workload, system, phase, workers, payload, n, found))
    finally:
        for fork_server in (forks or {}).values():
            fork_server.close()
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    order = {"start-up": 0, "build": 1, "cold": 2, "warm": 3}
    rows.sort(key=lambda r: (r["workload"] != "-", r["workload"], r["system"],
                             order[r["phase"]], r["workers"]))
    return rows


def _row(workload, system, phase, workers, payload, n, runs) -> dict:
    ok = [r for r in runs if "error" not in r]
    whole = [r for r in ok if not r.get("stopped")]
    best = min(whole or ok, key=lambda r: r["seconds"]) if ok else runs[-1]
    return {"workload": workload, "system": system, "phase": phase, "workers": workers,
            "payload": payload, "n": n, **best,
            "runs": [None if "error" in r else -r["seconds"] if r.get("stopped")
                     else r["seconds"] for r in runs]}


def _runs(r) -> str:
    if len(r["runs"]) < 2:
        return ""
    return ", ".join("failed" if s is None else f"> {-s:.2f} (stopped)" if s < 0
                     else f"{s:.2f}" for s in r["runs"])


def render(args, rows, elapsed) -> str:
    L = [START, "## Snapshots on S3: requests, time and CPU per phase\n"]
    repeats = ", ".join(f"{w}-like {k}" for w, k in args.repeat.items() if w in args.workloads)
    L.append(f"`.bench-venv/bin/python -m benchmarks.bench_s3 --scale {args.scale} --write-doc` "
             "(the peers from `benchmarks/requirements.txt` in the bench venv, see "
             f"`benchmarks/run_all.py`; took "
             f"{elapsed / 60:.1f} min). A moto S3 server in server mode on loopback HTTP, on the "
             "same 2 cores as the client and shared with other jobs: only ratios within this "
             "run mean anything. Requests are counted from the server's access log. CPU s/GB: "
             "the client process's user+system CPU (with its DataLoader workers) per GB of "
             "example payload; server CPU: the server's over the same span. Build: from the "
             "writer's construction to its last write; cold read: from the dataset's "
             "construction to its last batch, empty local cache (the S3 client's start-up "
             "after the library's import is inside it, for every system); warm read: the next "
             "epoch of the same dataset object, from the local cache. "
             + "; ".join(f"{w}-like: {n:,} examples ({p / 1e6:,.0f} MB)" for w, n, p in
                         sorted({(r["workload"], r["n"], r["payload"]) for r in rows
                                 if r["workload"] != "-"}))
             + "; 64 MB shards; best setting of each system = the faster of workers "
             + " and ".join(map(str, args.workers))
             + f"; each phase run {repeats} times (fresh processes, every system alike; the "
             "fastest counts, all runs in the last column)"
             + ("" if args.fresh_interpreters else
                ", each forked from a per-system process that made the imports a run makes "
                "before its clock starts (`benchmarks/forkserver.py`)") + ". "
             + f"Load average (1 min) {args.load[0]} at the start, {args.load[1]} at the end.\n")
    L.append("| workload | system | phase | workers | s | MB/s | CPU s/GB | server CPU s | "
             "requests | by kind | runs (s) |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            L.append(f"| {r['workload']} | {r['system']} | {r['phase']} | {r['workers']} | "
                     f"failed: {r['error']} ||||||")
            continue
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(r["requests"].items()) if k != "total")
        if r["phase"] == "start-up":
            L.append(f"| - | {r['system']} | S3 client start-up "
                     f"({r.get('client') or START_UP_NAMES[r['system']]}) | 0 | "
                     f"{r['seconds']:.2f} | - | "
                     f"{r['cpu_s']:.2f} CPU s | {r['server_cpu_s']:.2f} | "
                     f"{r['requests'].get('total', 0)} | {kinds} | |")
            continue
        gb = r["payload"] / 1e9
        if r.get("stopped"):  # every run of it stopped: a lower bound, no rates
            L.append(f"| {r['workload']} | {r['system']} | {r['phase']} | {r['workers']} | "
                     f"> {r['seconds']:.2f} (stopped: slower than its other setting) | - | - "
                     f"| {r['server_cpu_s']:.2f} | {r['requests'].get('total', 0)} | {kinds} "
                     f"| {_runs(r)} |")
            continue
        L.append(f"| {r['workload']} | {r['system']} | {r['phase']} | {r['workers']} | "
                 f"{r['seconds']:.2f} | {r['payload'] / r['seconds'] / 1e6:,.0f} | "
                 f"{r['cpu_s'] / gb:.1f} | {r['server_cpu_s']:.2f} | "
                 f"{r['requests'].get('total', 0)} | {kinds} | {_runs(r)} |")
    L += ["", *target_rows(targets(rows))]
    L += bounds(rows)
    L.append(NOTES)
    notes = sorted({n for r in rows for n in r.get("notes", [])})
    if notes:
        L.append("\nWorkarounds applied by the benchmark:\n")
        L += [f"- {n}" for n in notes]
    L.append(END)
    return "\n".join(L)


def _best(rows, workload, system, phase):
    """The fastest run of a phase (over the worker counts: each system in its best setting)."""
    ok = [r for r in rows if r["workload"] == workload and r["system"] == system
          and r["phase"] == phase and "error" not in r and not r.get("stopped")]
    return min(ok, key=lambda r: r["seconds"]) if ok else None


TIME_TARGETS = (("cold", 2.0), ("warm", 2.0), ("build", 1.0))


def targets(rows) -> list[tuple[str, str, bool | None]]:
    out = []
    peers = sorted({r["system"] for r in rows} - {"snapcache"})
    for workload in sorted({r["workload"] for r in rows} - {"-"}):
        for phase, factor in TIME_TARGETS:
            ours = _best(rows, workload, "snapcache", phase)
            theirs = [p for p in (_best(rows, workload, s, phase) for s in peers) if p]
            what = (f"{workload} {phase}: >= {factor:g}x the faster peer" if phase != "build"
                    else f"{workload} build: no slower than the faster peer")
            if ours is None or not theirs:
                out.append((what, "not measured (a run failed or no peer ran)", None))
                continue
            best = min(theirs, key=lambda r: r["seconds"])
            ratio = best["seconds"] / ours["seconds"]
            out.append((what, f"{ours['seconds']:.2f} s (workers {ours['workers']}) vs "
                              f"{best['system']} {best['seconds']:.2f} s (workers "
                              f"{best['workers']}) = {ratio:.2f}x", ratio >= factor))
        for r in rows:
            if (r["workload"], r["system"], r["phase"]) != (workload, "snapcache", "warm") \
                    or "error" in r:
                continue
            if r.get("stopped"):
                out.append((f"{workload} warm epoch, workers {r['workers']}: <= 1 request",
                            "not measured (the epoch was stopped)", None))
                continue
            n = r["requests"].get("total", 0)
            kinds = ", ".join(f"{k} {v}" for k, v in sorted(r["requests"].items())
                              if k != "total")
            out.append((f"{workload} warm epoch, workers {r['workers']}: <= 1 request",
                        f"{n} ({kinds})", n <= 1))
    return out


def bounds(rows) -> list[str]:
    """For each missed time target: the share of the phase the S3 clients' start-up takes
    (ours and the peer's), the CPU each side and the server spent, and the time the target
    asks for."""
    ups = {r["system"]: r for r in rows if r["phase"] == "start-up" and "error" not in r}
    peers = sorted({r["system"] for r in rows} - {"snapcache"})
    L = []
    for workload in sorted({r["workload"] for r in rows} - {"-"}):
        for phase, factor in TIME_TARGETS:
            ours = _best(rows, workload, "snapcache", phase)
            theirs = [p for p in (_best(rows, workload, s, phase) for s in peers) if p]
            if ours is None or not theirs:
                continue
            best = min(theirs, key=lambda r: r["seconds"])
            if best["seconds"] / ours["seconds"] >= factor:
                continue
            up, peer_up = ups.get("snapcache"), ups.get(best["system"])
            gb = ours["payload"] / 1e9
            # the start-ups' CPU: one run each, whose wall time swings with the load
            L.append(
                f"- {workload} {phase} missed: snapcache {ours['seconds']:.2f} s"
                + (f", of which its S3 client's start-up is about {up['cpu_s']:.2f} CPU s"
                   if up else "")
                + f"; {best['system']} {best['seconds']:.2f} s"
                + (f" (its S3 client's start-up {peer_up['cpu_s']:.2f} CPU s)"
                   if peer_up else "")
                + f". Client CPU {ours['cpu_s'] / gb:.1f} vs {best['cpu_s'] / gb:.1f} s/GB, "
                f"server CPU {ours['server_cpu_s']:.2f} vs {best['server_cpu_s']:.2f} s. "
                f"The target asks for {best['seconds'] / factor:.2f} s.")
    return ["", *L] if L else []


def _repeat(text: str) -> dict[str, int]:
    out = {}
    for part in filter(None, text.split(",")):
        workload, _, times = part.partition("=")
        out[workload] = max(1, int(times))
    return out


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        system, phase, workload, n, url, cache, workers, log_path = argv[1:9]
        global WARM_CAP
        WARM_CAP = float(argv[9]) if len(argv) > 9 else None
        print(json.dumps(child(system, phase, workload, int(n), url, cache, int(workers),
                               log_path)))
        return
    parser = command_line(__doc__, scale=1.0)
    parser.add_argument("--systems", default="snapcache,litdata,mosaic")
    parser.add_argument("--workers", default="0,2")
    parser.add_argument("--workloads", default="image,token")
    parser.add_argument("--repeat", default="image=2,token=1",
                        help="runs of each phase per workload (the fastest counts)")
    parser.add_argument("--rows-json", help="also write the measured rows to this file")
    parser.add_argument("--fresh-interpreters", action="store_true",
                        help="start every run as a new interpreter instead of forking it from "
                             "a process that imported its system's libraries once (slower)")
    args = parser.parse_args(argv)
    args.systems = args.systems.split(",")
    args.workloads = args.workloads.split(",")
    args.workers = [int(w) for w in args.workers.split(",")]
    args.repeat = _repeat(args.repeat)
    started = time.perf_counter()
    args.load = [load_average()]
    rows = measure(args)
    args.load.append(load_average())
    if args.rows_json:
        with open(args.rows_json, "w") as f:
            json.dump(rows, f)
    publish(render(args, rows, time.perf_counter() - started), START, END, write=args.write)


if __name__ == "__main__":
    main()
