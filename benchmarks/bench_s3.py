"""Snapshots on S3 (a loopback moto server): requests, time and CPU per phase, for snapcache and
(when installed in the bench venv) LitData and MosaicML streaming.

    python -m benchmarks.bench_s3 [--scale 1.0] [--systems snapcache,litdata,mosaic]
                                  [--workers 0,2] [--workloads image,token] [--write-doc]

Phases, each in a fresh process; the timed part of each (after imports and set-up) is measured
for wall time, the process's CPU (with its DataLoader workers) and the requests in the server's
access log:

- build: the first epoch, writing the snapshot to S3 (identity map over the workload's example
  maker; 64 MB shards);
- cold read: a new pipeline object and an empty local cache, batches of 256 copied into a
  staging buffer, checksums verified;
- warm read: the second epoch of a pipeline object (a loader) held across epochs, the local
  cache filled by the cold read. With workers, DataLoaders keep them (``persistent_workers``).

The server runs in its own process on the same 2 cores (its CPU time is reported apart).
Requests are counted from the server's access log, so every system is counted the same way.
"""

from __future__ import annotations

import argparse
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

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
START, END = "<!-- s3-benchmark:start -->", "<!-- s3-benchmark:end -->"
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

    def cpu_seconds(self) -> float:
        try:
            with open(f"/proc/{self.server.process.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except OSError:
            return float("nan")

    def make_bucket(self, name: str) -> None:
        self.server.filesystem().mkdir(name)

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
    """Wall time, this process's CPU (and its reaped children's: DataLoader workers) and the
    server's requests over the timed part of a phase."""

    def __init__(self, log_path: str):
        self.log_path = log_path

    def start(self) -> None:
        self.since = os.path.getsize(self.log_path)
        self.cpu = _cpu()
        self.t = time.perf_counter()

    def stop(self) -> dict:
        seconds = time.perf_counter() - self.t
        cpu = _cpu() - self.cpu
        time.sleep(0.3)  # let the server write its last lines
        with open(self.log_path, "rb") as f:
            f.seek(self.since)
            text = f.read().decode(errors="replace")
        reqs = [(m.group(1), m.group(2), int(m.group(3))) for m in _LINE.finditer(text)]
        return {"seconds": seconds, "cpu_s": cpu, "requests": classify(reqs)}


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
    from benchmarks.workloads import MAKERS, consume, staging
    stage = staging(workload, BATCH)
    make = MAKERS[workload]
    meter = Meter(log_path)
    if system != "snapcache":
        return PEERS[system](phase, workload, n, url, cache, workers, stage, make, meter)
    import snapcache as sc
    if phase == "start-up":  # the S3 client: import s3fs/aiobotocore, a session, one LIST
        meter.start()
        from snapcache.store.fs import Storage
        Storage(url).listdir()
        return {**meter.stop(), "rows": 0}
    ds = sc.Dataset.range(n).map(make).snapshot(url, progress=False, shard_size=SHARD,
                                                local_cache=cache)
    rows = 0
    if phase == "build":
        meter.start()
        for _ in ds:
            rows += 1
        return {**meter.stop(), "rows": rows}
    batched = ds.batch(BATCH)
    if workers:
        import torch
        loader = torch.utils.data.DataLoader(batched.to_torch(), batch_size=None,
                                             num_workers=workers, persistent_workers=True)
    else:
        loader = batched
    if phase == "warm":  # the pipeline object held across epochs, the cache filled
        for b in loader:
            consume(stage, b)
    meter.start()
    for b in loader:
        rows += consume(stage, b)
    return {**meter.stop(), "rows": rows}


def run_child(server: Server, system: str, phase: str, workload: str, n: int, url: str,
              cache: str, workers: int) -> dict:
    env = {**os.environ, **server.env, "PYTHONPATH": ROOT}
    cpu0 = server.cpu_seconds()
    out = subprocess.run([sys.executable, "-m", "benchmarks.bench_s3", "--child", system,
                          phase, workload, str(n), url, cache, str(workers), server.log_path],
                         capture_output=True, text=True, cwd=ROOT, env=env)
    result = {"server_cpu_s": server.cpu_seconds() - cpu0}
    if out.returncode:
        lines = (out.stderr or "failed").strip().splitlines()
        result["error"] = lines[-1] if lines else "failed"
        return result
    for line in out.stderr.splitlines():
        if line.startswith("NOTE: "):
            result.setdefault("notes", []).append(line[6:])
    result.update(json.loads(out.stdout.strip().splitlines()[-1]))
    return result


# -- peers -------------------------------------------------------------------------------------
def note(text: str) -> None:
    print("NOTE: " + text, file=sys.stderr, flush=True)


def _loader(dataset, workers: int):
    import torch
    return torch.utils.data.DataLoader(dataset, batch_size=BATCH, num_workers=workers,
                                       persistent_workers=workers > 0)


def _read_epoch(phase, loader, stage, meter) -> dict:
    """cold: the meter runs from before the dataset was opened; warm: the loader (held across
    epochs, as snapcache's pipeline object is) reads one epoch first, then one is measured."""
    from benchmarks.workloads import consume

    def epoch() -> int:
        rows = 0
        for b in loader:
            rows += consume(stage, {k: v.numpy() if hasattr(v, "numpy") else v
                                    for k, v in b.items()})
        return rows

    if phase == "warm":
        epoch()
        meter.start()
    rows = epoch()
    return {**meter.stop(), "rows": rows}


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
    return _read_epoch(phase, loader, stage, meter)


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


def _mds_columns(workload):
    if workload == "image":
        return {"image": "ndarray:uint8:128,128,3", "label": "int64"}
    return {"tokens": "ndarray:int32:128", "length": "int"}


def _mosaic(phase, workload, n, url, cache, workers, stage, make, meter):
    os.environ["S3_ENDPOINT_URL"] = os.environ["AWS_ENDPOINT_URL_S3"]
    note("Mosaic streaming: endpoint given by S3_ENDPOINT_URL (its only setting for it)")
    try:
        import torchvision  # noqa: F401
    except Exception:
        _stand_in_torchvision()
        note("Mosaic streaming: `import streaming` imports torchvision, which cannot load "
             "here (a CUDA build beside the CPU torch): stand-in modules for the two names "
             "it imports (streaming.vision, unused here) are used")
    try:
        import transformers.tokenization_utils_base  # noqa: F401
    except Exception:
        _stand_in_transformers()
        note("Mosaic streaming: `import streaming` imports transformers (for isinstance checks "
             "in its own DataLoader, a tokenizer for its C4/Pile datasets: unused here), which cannot load beside the huggingface-hub "
             "that HF datasets needs: stand-in classes are used")
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
    return _read_epoch(phase, _loader(ds, workers), stage, meter)


PEERS = {"litdata": _litdata, "mosaic": _mosaic}


NOTES = """
- **A warm epoch's requests.** The held pipeline's epoch makes one request, a HEAD of the
  manifest (has it changed?). Its read lease is taken once per process and snapshot, renewed
  in the background (every `lease_ttl / 4`), and released when the pipeline object is
  collected or at exit; the last-use record is written with it. With DataLoader workers the
  epoch's workers on a node share that one check (`snapcache/store/checks.py`: a node-local
  record named by the epoch's token, under `flock`), and the loader's process holds the read
  lease for its workers (`to_torch`, or before it forks the next epoch's workers), so the
  warm epoch is one request with workers too, persistent or not.
- **A build's requests.** Per shard: one PUT of the whole shard (written in memory, uploaded
  from a background pool while the next shard is encoded; parallel parts above 128 MB) and at
  most one PUT of the stream's progress record; no listing per shard. The other ~25 are the
  write protocol's fixed cost (lease, fence, stream marker, manifest, clean-up), the same for
  1 shard or 100.
- **What bounds the image build and cold read.** Both run in a fresh process, and the first
  S3 request of a process pays the client's start-up: importing s3fs and aiobotocore (with
  aiohttp) and creating a session (the "S3 client start-up" row, measured alone in a fresh
  process). That fixed cost is a large share of a 1-3 s phase; the rest is the loopback
  server's transfer (its CPU in the server column) and the client's per-MB work (download,
  local cache copy, checksum), in the CPU column.
- **Checksums.** snapcache verifies each shard (xxh3) before use, Mosaic its shards (xxh64,
  `validate_hash`); LitData has no verification.
- **Noise.** Other jobs share the 2 cores: wall times swing by up to 2x between runs of the
  same system (a peer's warm epoch took 0.4 s in one run and 8 s in another); CPU s/GB is
  steadier. A missed target here may be noise or real; the CPU column says which."""


# -- the run -----------------------------------------------------------------------------------
def measure(args) -> tuple[list[dict], float]:
    from benchmarks.workloads import example_bytes
    sizes = {"image": max(200, int(2000 * args.scale)),
             "token": max(10_000, int(100_000 * args.scale))}
    sizes = {w: n for w, n in sizes.items() if w in args.workloads}
    rows = []
    workdir = tempfile.mkdtemp(prefix="snapcache-s3-")
    server = Server(workdir)
    try:
        if "snapcache" in args.systems:
            server.make_bucket("bench-start-up")
            r = run_child(server, "snapcache", "start-up", "image", 0, "s3://bench-start-up/x",
                          os.path.join(workdir, "unused"), 0)
            rows.append({"workload": "-", "system": "snapcache", "phase": "start-up",
                         "workers": 0, "payload": 0, "n": 0, **r})
            print(f"  snapcache start-up {json.dumps(r)}", file=sys.stderr, flush=True)
        for workload, n in sizes.items():
            payload = n * example_bytes(workload)
            for system in args.systems:
                bucket = f"bench-{system}-{workload}"
                server.make_bucket(bucket)
                url = f"s3://{bucket}/snaps"
                cache = os.path.join(workdir, f"cache-{system}-{workload}")
                build = run_child(server, system, "build", workload, n, url, cache, 0)
                rows.append({"workload": workload, "system": system, "phase": "build",
                             "workers": 0, "payload": payload, "n": n, **build})
                print(f"  {workload} {system} build {json.dumps(build)}", file=sys.stderr,
                      flush=True)
                for workers in args.workers:
                    shutil.rmtree(cache, ignore_errors=True)
                    for phase in ("cold", "warm"):
                        r = run_child(server, system, phase, workload, n, url, cache, workers)
                        rows.append({"workload": workload, "system": system, "phase": phase,
                                     "workers": workers, "payload": payload, "n": n, **r})
                        print(f"  {workload} {system} {phase} w{workers} {json.dumps(r)}",
                              file=sys.stderr, flush=True)
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return rows, 0.0


def render(args, rows, elapsed) -> str:
    L = [START, "## Snapshots on S3: requests, time and CPU per phase\n"]
    L.append(f"`.bench-venv/bin/python -m benchmarks.bench_s3 --scale {args.scale} --write-doc` "
             "(the peers from `benchmarks/requirements.txt` in the bench venv, see "
             f"`benchmarks/run_all.py`; took "
             f"{elapsed / 60:.1f} min). A moto S3 server in server mode on loopback HTTP, on the "
             "same 2 cores as the client and shared with other jobs: only ratios within this "
             "run mean anything. Requests are counted from the server's access log. CPU s/GB: "
             "the client process's user+system CPU per GB of example payload (the server's "
             "own CPU in the next column). warm read = a later epoch served from the local "
             "cache. "
             + "; ".join(f"{w}-like: {n:,} examples ({p / 1e6:,.0f} MB)" for w, n, p in
                         sorted({(r["workload"], r["n"], r["payload"]) for r in rows}))
             + "; 64 MB shards; best setting of each system = the faster of workers 0 and 2. "
             + (f"Load average (1 min) {args.load[0]:.1f} at the start, {args.load[1]:.1f} at "
                "the end." if getattr(args, "load", None) else "") + "\n")
    L.append("| workload | system | phase | workers | s | MB/s | CPU s/GB | server CPU s | "
             "requests | by kind |")
    L.append("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            L.append(f"| {r['workload']} | {r['system']} | {r['phase']} | {r['workers']} | "
                     f"failed: {r['error']} |||||")
            continue
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(r["requests"].items()) if k != "total")
        if r["phase"] == "start-up":
            L.append(f"| - | snapcache | S3 client start-up | 0 | {r['seconds']:.2f} | - | "
                     f"{r['cpu_s']:.2f} CPU s | {r['server_cpu_s']:.1f} | "
                     f"{r['requests'].get('total', 0)} | {kinds} |")
            continue
        gb = r["payload"] / 1e9
        L.append(f"| {r['workload']} | {r['system']} | {r['phase']} | {r['workers']} | "
                 f"{r['seconds']:.2f} | {r['payload'] / r['seconds'] / 1e6:,.0f} | "
                 f"{r['cpu_s'] / gb:.1f} | {r['server_cpu_s']:.1f} | "
                 f"{r['requests'].get('total', 0)} | {kinds} |")
    L += targets(rows)
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
          and r["phase"] == phase and "error" not in r]
    return min(ok, key=lambda r: r["seconds"]) if ok else None


def targets(rows) -> list[str]:
    L = ["\n| target | measured | |", "|---|---|---|"]
    peers = sorted({r["system"] for r in rows} - {"snapcache"})
    for workload in sorted({r["workload"] for r in rows}):
        if workload == "-":
            continue
        for phase, factor in (("cold", 2.0), ("warm", 2.0), ("build", 1.0)):
            ours = _best(rows, workload, "snapcache", phase)
            theirs = [p for p in (_best(rows, workload, s, phase) for s in peers) if p]
            what = (f"{workload} {phase}: >= {factor:g}x the faster peer" if phase != "build"
                    else f"{workload} build: no slower than the faster peer")
            if ours is None or not theirs:
                L.append(f"| {what} | not measured (a run failed or no peer ran) | **MISSED** |")
                continue
            best = min(theirs, key=lambda r: r["seconds"])
            ratio = best["seconds"] / ours["seconds"]
            L.append(f"| {what} | {ours['seconds']:.2f} s (workers {ours['workers']}) vs "
                     f"{best['system']} {best['seconds']:.2f} s (workers {best['workers']}) = "
                     f"{ratio:.2f}x | {'**met**' if ratio >= factor else '**MISSED**'} |")
        warm = [r for r in rows if r["workload"] == workload and r["system"] == "snapcache"
                and r["phase"] == "warm" and "error" not in r]
        for r in warm:
            n = r["requests"].get("total", 0)
            L.append(f"| {workload} warm epoch, workers {r['workers']}: <= 1 request | {n} "
                     f"({', '.join(f'{k} {v}' for k, v in sorted(r['requests'].items()) if k != 'total')}) "
                     f"| {'**met**' if n <= 1 else '**MISSED**'} |")
    return L


def bounds(rows) -> list[str]:
    """For each missed time target: how much of the phase the client's start-up takes, what
    the server spent, and the time the target asks for."""
    up = next((r for r in rows if r["phase"] == "start-up" and "error" not in r), None)
    peers = sorted({r["system"] for r in rows} - {"snapcache"})
    L = []
    for workload in sorted({r["workload"] for r in rows} - {"-"}):
        for phase, factor in (("cold", 2.0), ("warm", 2.0), ("build", 1.0)):
            ours = _best(rows, workload, "snapcache", phase)
            theirs = [p for p in (_best(rows, workload, s, phase) for s in peers) if p]
            if ours is None or not theirs or up is None:
                continue
            best = min(theirs, key=lambda r: r["seconds"])
            if best["seconds"] / ours["seconds"] >= factor:
                continue
            L.append(f"- {workload} {phase} missed: snapcache {ours['seconds']:.2f} s, of which "
                     f"the S3 client's start-up is {up['seconds']:.2f} s "
                     f"({up['seconds'] / ours['seconds']:.0%}); the server spent "
                     f"{ours['server_cpu_s']:.2f} CPU s on its requests (the peer "
                     f"{best['server_cpu_s']:.2f}); the target asks for "
                     f"{best['seconds'] / factor:.2f} s ({best['system']} "
                     f"{best['seconds']:.2f} s / {factor:g}).")
    return ["", *L] if L else []


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        system, phase, workload, n, url, cache, workers, log_path = argv[1:9]
        print(json.dumps(child(system, phase, workload, int(n), url, cache, int(workers),
                               log_path)))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--systems", default="snapcache,litdata,mosaic")
    parser.add_argument("--workers", default="0,2")
    parser.add_argument("--workloads", default="image,token")
    parser.add_argument("--write-doc", action="store_true")
    parser.add_argument("--rows-json", help="also write the measured rows to this file")
    args = parser.parse_args(argv)
    args.systems = args.systems.split(",")
    args.workloads = args.workloads.split(",")
    args.workers = [int(w) for w in args.workers.split(",")]
    started = time.perf_counter()
    args.load = [os.getloadavg()[0]]
    rows, _ = measure(args)
    args.load.append(os.getloadavg()[0])
    if args.rows_json:
        with open(args.rows_json, "w") as f:
            json.dump(rows, f)
    section = render(args, rows, time.perf_counter() - started)
    print(section)
    if args.write_doc:
        from benchmarks.run_all import write_doc
        write_doc(section, START, END)


if __name__ == "__main__":
    main()
