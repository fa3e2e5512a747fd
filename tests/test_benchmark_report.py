"""The helper every benchmark shares (benchmarks/report.py): its command line and how it puts a
section into docs/benchmarks.md without touching the others."""

from __future__ import annotations

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
