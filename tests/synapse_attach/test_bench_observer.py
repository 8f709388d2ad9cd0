"""``benchmarks/bench_observer.py`` runs and its lines all parse: every command it feeds is
one Synapse sends, so the memory it reports is the observer's on real traffic's shape."""
from __future__ import annotations

from benchmarks.bench_observer import lines_of_read, main
from replication.protocol.commands import parse_line


def test_every_line_the_benchmark_feeds_parses():
    tokens = {"events": 1, "receipts": 1, "presence": 1, "caches": 1}
    for i in range(25):
        for line in lines_of_read(i, tokens):
            parse_line(line)


def test_a_short_run_reports_its_memory(capsys):
    assert main(["--lines", "200000", "--every", "100000"]) == 0
    out = capsys.readouterr().out
    assert "baseline after" in out and "end: RSS" in out and "29 processes" in out and " 0 bad" in out
