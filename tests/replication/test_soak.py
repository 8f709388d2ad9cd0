"""The soak test (benchmarks/soak.py), shortened: 4 workers (one on Redis), 2 writers and 2
endpoints on the throwaway PostgreSQL and Redis, while a worker, a writer, an endpoint and
Redis are each killed and restarted at least once, and a fuzzer sends random bytes to the
endpoints. Every worker must end with every fact exactly once."""
from __future__ import annotations

import sys

import pytest

from testing.processes import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import soak  # noqa: E402

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.faults]


def test_short_soak_under_faults(pg_url, redis_server, tmp_path):
    # One round of the four faults (however long a loaded machine makes it take): a duration
    # shorter than a round, so the round is the whole run. The pause between faults is pacing
    # only (each recovery is waited for); 15 facts/s per writer (3 transactions of 5) keep
    # facts flowing through every fault, and each fact costs every process CPU.
    cfg = soak.SoakConfig(duration=1, workers=4, redis_workers=1, rate=15, fault_pause=0.2, min_rounds=1,
                          startup_timeout=120, recover_timeout=90, drain_timeout=120, progress=False)
    result = soak.run(cfg, pg_url, redis_server, tmp_path)
    report = result.report()
    assert result.written > 0, report
    assert set(result.written_per_writer) == {"w1", "w2"}, report
    assert result.total_duplicates == 0, report
    assert result.total_missing == 0, report
    assert all(n == result.written for n in result.delivered.values()), report
    # Every fault happened and was recovered from.
    assert all(result.faults_by_kind()[kind] >= 1 for kind in soak.FAULT_KINDS), report
    assert all(f.recovered_after is not None for f in result.faults), report
    assert not result.crashes, report
    assert result.writer_exits == {"w1": 0, "w2": 0}, report
    # The fuzzer got through, and every connection it made was answered ERROR and closed;
    # the endpoints name it a bad line.
    assert result.fuzz.get("ERROR then closed", 0) > 0, report
    assert result.fuzz.get("not closed with ERROR", 0) == 0, report
    assert result.disconnects.get("bad line", 0) > 0, report
    assert result.latency_ms["n"] > 0, report
    assert result.ok, report
