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


def test_the_readme_steps_the_benchmarks_follow_are_there():
    """bench_newcomer and bench_observer --live run the README's SQL and ACL line: both are
    found, the role gets SELECT on tables and sequences only, the user SUBSCRIBE and PING only."""
    from benchmarks._synapse_cluster import ROOT, readme_acl_line, readme_role_sql

    statements = readme_role_sql(ROOT / "README.md")
    assert statements[0].startswith("CREATE ROLE synapse_observer LOGIN PASSWORD 'choose-a-password'")
    grants = [s for s in statements if "GRANT" in s]
    assert grants and all("SELECT" in s or "CONNECT" in s or "USAGE" in s for s in grants)
    assert not any(word in s for s in statements for word in ("INSERT", "UPDATE", "DELETE", "ALL PRIVILEGES"))
    line = readme_acl_line(ROOT / "README.md")
    assert line.split()[:3] == ["ACL", "SETUSER", "synapse_observer"]
    assert line.endswith("-@all +subscribe +ping") and "&example.com" in line
