"""The helper every benchmark shares (benchmarks/report.py): its command line and how it puts a
section into docs/benchmarks.md without touching the others."""

from __future__ import annotations

import os

import pytest

from benchmarks import report


def test_write_doc_replaces_only_its_own_section(tmp_path, monkeypatch):
    doc = tmp_path / "benchmarks.md"
    monkeypatch.setattr(report, "DOC", str(doc))
    a, b = report.markers("a-benchmark"), report.markers("b-benchmark")
    doc.write_text(f"# Benchmarks\n\n{a[0]}\nold a\n{a[1]}\n\n{b[0]}\nb\n{b[1]}\n")
    report.write_doc(f"{a[0]}\nnew a\n{a[1]}", *a)
    assert doc.read_text() == f"# Benchmarks\n\n{a[0]}\nnew a\n{a[1]}\n\n{b[0]}\nb\n{b[1]}\n"
    c = report.markers("c-benchmark")
    report.write_doc(f"{c[0]}\nc\n{c[1]}", *c)  # a new section goes at the end
    assert doc.read_text().endswith(f"{b[1]}\n\n{c[0]}\nc\n{c[1]}\n")


def test_command_line_and_targets():
    """Benchmarks print by default and write with --write-doc; those that write by default
    take --no-write; both set ``args.write``."""
    parser = report.command_line("Title line.\n\nmore", scale=1.0)
    assert parser.description == "Title line."
    assert parser.parse_args([]).write is False and parser.parse_args([]).scale == 1.0
    assert parser.parse_args(["--write-doc", "--scale", "0.5"]).write is True
    writes = report.command_line(None, writes_by_default=True)
    assert writes.parse_args([]).write is True and writes.parse_args(["--no-write"]).write is False
    rows = report.target_rows([("x >= 2x y", "3 vs 1 = 3.00x", True), ("z", "not measured", None)])
    assert rows == ["| target | measured | |", "|---|---|---|",
                    "| x >= 2x y | 3 vs 1 = 3.00x | **met** |", "| z | not measured | **MISSED** |"]


def test_the_s3_benchmark_counts_the_fastest_of_each_systems_runs():
    """bench_s3: repeated phases keep every run and count the fastest, for every system alike;
    a target compares snapcache's best setting with the faster peer's."""
    from benchmarks import bench_s3

    assert bench_s3._repeat("image=2,token=1") == {"image": 2, "token": 1}

    def run(seconds, total=1):
        return {"seconds": seconds, "cpu_s": 0.1, "server_cpu_s": 0.0,
                "requests": {"total": total, "GET": total}}

    rows = [bench_s3._row("image", "snapcache", "cold", 0, 10**8, 10, [run(1.5), run(1.0)]),
            bench_s3._row("image", "snapcache", "cold", 2, 10**8, 10, [{"error": "boom"},
                                                                      run(3.0)]),
            bench_s3._row("image", "litdata", "cold", 0, 10**8, 10, [run(2.4), run(2.2)]),
            bench_s3._row("image", "mosaic", "cold", 2, 10**8, 10, [run(1.9), run(2.5)]),
            bench_s3._row("image", "snapcache", "warm", 0, 10**8, 10, [run(0.1, total=2)])]
    assert rows[0]["seconds"] == 1.0 and rows[0]["runs"] == [1.5, 1.0]
    assert rows[1]["seconds"] == 3.0 and rows[1]["runs"] == [None, 3.0]
    found = {what: (measured, ok) for what, measured, ok in bench_s3.targets(rows)}
    measured, ok = found["image cold: >= 2x the faster peer"]
    assert "vs mosaic 1.90 s (workers 2) = 1.90x" in measured and ok is False
    assert found["image warm epoch, workers 0: <= 1 request"][1] is False
    assert found["image build: no slower than the faster peer"][1] is None  # not measured


def test_the_runtime_benchmark_reads_every_system_in_rounds_and_counts_the_fastest():
    """run_all: each system and codec is read by several fresh processes in an order that
    changes every round; a row counts the fastest epoch and first batch of its rounds and
    keeps every round's value (the spread); a failed round is shown, not dropped."""
    from benchmarks import run_all

    configs = [("snapcache", "none"), ("snapcache", "auto"), ("hf", "none")]
    orders = [run_all.round_order(configs, r) for r in range(4)]
    assert orders[0] == configs and orders[1] == configs[::-1]
    assert len({tuple(o) for o in orders}) == 4 and all(sorted(o) == sorted(configs)
                                                        for o in orders)
    assert len({o[0] for o in orders}) == 3                  # each one first in some round

    def read(batched, first, **extra):
        return {"first_batch_s": first, "batched_s": batched, "batched_mb_s": 100 / batched,
                "batched_ex_s": 10 / batched, "peak_rss_mb": 50 + first, "epochs_s": [batched],
                **extra}

    row = run_all.combine_reads([read(2.0, 0.04, single_ex_s=7.0), {"error": "boom"},
                                 read(1.0, 0.05), read(1.5, 0.03, single_ex_s=9.0)])
    assert row["batched_s"] == 1.0 and row["batched_mb_s"] == 100.0
    assert row["first_batch_s"] == 0.03 and row["single_ex_s"] == 9.0
    assert row["batched_runs"] == [50.0, None, 100.0, 100 / 1.5]
    assert row["first_batch_runs"] == [0.04, None, 0.05, 0.03]
    assert "epochs_s" not in row and row["peak_rss_mb"] == 50.05
    assert run_all.combine_reads([{"error": "boom"}]) == {"error": "boom"}
    row = run_all.combine_reads([{"error": "boom"}, read(1.0, 0.05)])
    assert "error" not in row and row["batched_runs"] == [None, 100.0]
    assert "single_ex_s" not in row


def test_default_against_none_is_read_alternately_within_each_process(monkeypatch):
    """run_all.default_vs_none: each process reads both image-like snapshots, an epoch of one
    then of the other (throughput "alternate"), which goes first alternating from process to
    process, and each gives the default's speed over none's; a failed read is said, not
    averaged in."""
    from benchmarks import run_all

    calls = []
    speed = {"none": 100.0, "auto": 95.0}  # MB/s

    def sub(phase, system, workload, codecs, n, root_a, root_b):
        a, b = codecs.split(":")
        calls.append((phase, codecs, os.path.basename(root_a), os.path.basename(root_b)))
        return {"b_over_a": speed[b] / speed[a]}

    monkeypatch.setattr(run_all, "sub", sub)
    got = run_all.default_vs_none("/nowhere", 512, processes=3)
    assert [c[1] for c in calls] == ["none:auto", "auto:none", "none:auto"]
    assert all(c[0] == "alternate" and c[2].endswith(c[1].split(":")[0]) and
               c[3].endswith(c[1].split(":")[1]) for c in calls)
    assert got["ratios"] == pytest.approx([0.95] * 3)
    monkeypatch.setattr(run_all, "sub", lambda *a: {"error": "boom"})
    assert run_all.default_vs_none("/nowhere", 512, processes=3) == {"error": "boom"}