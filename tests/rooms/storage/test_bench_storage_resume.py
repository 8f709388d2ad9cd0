"""``bench_storage --data-dir``: a build stopped part way and continued by later runs stores
exactly what one straight build stores, and a directory that does not match is refused.

End to end: each run is the benchmark's own process with its own kept PostgreSQL (as an
operator runs it over several sessions); the two kept clusters are then opened and compared.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks._build_record import BuildRefused, skip_stored
from rooms.storage.generator import Batch
from testing.services import MissingBinary, PostgresServer

ROOT = Path(__file__).resolve().parents[3]
#: the smallest dataset that still has every kind of event the generator makes (backfill and
#: outliers, every membership and visibility, redactions) over 12 batches and a backfill one
DATASET = ["--events", "600", "--rooms", "12", "--users", "30", "--batch", "50", "--seed", "3", "--samples", "3"]

#: what must be equal (received_ts is the wall clock at persist time)
EVENTS = ("SELECT id, event_id, room_id, type, state_key, sender, membership, redacts, rejected, outlier, redacted, "
          "stream_ordering, topological_ordering, depth, json FROM events ORDER BY stream_ordering")
STATE = "SELECT room_id, type, state_key, event_id, membership FROM current_state_events ORDER BY 1, 2, 3"
MEMBERS = "SELECT * FROM room_memberships ORDER BY event_id"
GROUPS = "SELECT count(*), count(DISTINCT state_group) FROM event_to_state_groups"


def bench(data_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_storage.py"), *DATASET,
                           "--data-dir", str(data_dir), *extra], capture_output=True, text=True, cwd=ROOT,
                          timeout=600)


def rows(data_dir: Path) -> dict[str, list]:
    import psycopg

    try:
        pg = PostgresServer(directory=str(data_dir), keep=True).start()
    except MissingBinary as e:
        pytest.fail(str(e), pytrace=False)
    try:
        with psycopg.connect(pg.url("bench_storage")) as conn:
            return {sql: conn.execute(sql).fetchall() for sql in (EVENTS, STATE, MEMBERS, GROUPS)}
    finally:
        pg.stop()


@pytest.fixture
def kept_dirs():
    """Directories for kept clusters, outside pytest's tmp_path (its parents are private to
    root, and PostgreSQL runs as the ``postgres`` user); removed afterwards."""
    import tempfile

    top = Path(tempfile.mkdtemp(prefix="bench_storage_resume_"))
    top.chmod(0o755)
    yield top
    shutil.rmtree(top, ignore_errors=True)


def record(data_dir: Path) -> dict:
    return json.loads((data_dir / "build.json").read_text())


def test_a_build_stopped_and_continued_stores_what_a_straight_build_stores(kept_dirs):
    parts, straight = kept_dirs / "parts", kept_dirs / "straight"
    first = bench(parts, "--stop-after", "200")
    assert first.returncode == 0, first.stderr
    assert "stopped after" in first.stdout and "the reads run once the build is complete" in first.stdout
    assert "state at event" not in first.stdout  # no reads on a partial build without --read-partial
    at_200 = record(parts)
    assert at_200["phase"] == "persist" and 200 <= at_200["written"] < 250
    assert not (parts / "dataset.json").exists()

    # another dataset's figures: refused before anything starts, the partial build kept
    other = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_storage.py"), *DATASET,
                            "--events", "700", "--data-dir", str(parts)], capture_output=True, text=True, cwd=ROOT)
    assert other.returncode == 2
    assert "partial build of another dataset" in other.stderr and "600 events" in other.stderr

    second = bench(parts, "--stop-after", "400", "--read-partial")
    assert second.returncode == 0, second.stderr
    assert "regenerated and skipped the" in second.stdout
    assert "PARTIAL DATASET" in second.stdout and "state at event, cold" in second.stdout
    at_400 = record(parts)
    assert at_400["written"] >= 400 and len(at_400["sessions"]) == 2

    # a record claiming more than the database holds: refused, nothing written
    claimed = {**at_400, "written": at_400["written"] + 200}
    (parts / "build.json").write_text(json.dumps(claimed))
    refused = bench(parts)
    assert refused.returncode == 2
    assert "the build record says" in refused.stderr and "not this database's" in refused.stderr
    assert record(parts) == claimed

    # the record falls behind the database, as after a kill between a commit and the
    # record's rewrite: the whole batches past it are taken as stored (untimed)
    (parts / "build.json").write_text(json.dumps(at_200))
    third = bench(parts)
    assert third.returncode == 0, third.stderr
    assert "committed after the last record" in third.stdout
    assert "state at event, cold" in third.stdout  # complete: the reads ran
    done = record(parts)
    assert done["phase"] == "done" and done["untimed"] == at_400["written"] - at_200["written"]
    assert json.loads((parts / "dataset.json").read_text())["events"] == 600
    # the per-slice rates of every session are kept, each slice closed once
    assert [s["end"] for s in done["slices"]] == sorted({s["end"] for s in done["slices"]})

    # the straight build on a server with settings of its own: they reach the server (as it
    # reports them) and the record; each slice prints its database counters
    whole = bench(straight, "--pg-set", "shared_buffers=200MB", "--pg-set", "max_wal_size=2GB")
    assert whole.returncode == 0, whole.stderr
    assert "settings shared_buffers 200 MB, max_wal_size 2,048 MB" in whole.stdout
    assert record(straight)["sessions"][0]["pg_settings"] == {"shared_buffers": "200MB", "max_wal_size": "2GB"}
    assert "CPU per event" in whole.stdout and "KiB/event" in whole.stdout
    assert "settings shared_buffers 128 MB" in third.stdout  # the throwaway server's own default
    resumed, expected = rows(parts), rows(straight)
    assert len(expected[EVENTS]) > 600 and expected[STATE]
    for sql in (EVENTS, STATE, MEMBERS, GROUPS):
        assert resumed[sql] == expected[sql], sql


def batches(*sizes: int):
    return iter([Batch(list(range(n))) for n in sizes])


def test_skip_stored_accepts_only_whole_batches_past_the_record():
    it = batches(3, 3, 4, 2)
    assert skip_stored(it, recorded_batches=1, recorded_events=3, stored_events=10, what="x") == (2, 7)
    assert [len(b.items) for b in it] == [2]  # positioned after what is stored
    assert skip_stored(batches(3, 3), recorded_batches=0, recorded_events=0, stored_events=0, what="x") == (0, 0)
    for kwargs, message in (
        (dict(recorded_batches=2, recorded_events=6, stored_events=5), "the build record says"),
        (dict(recorded_batches=1, recorded_events=3, stored_events=5), "not a whole number of batches"),
        (dict(recorded_batches=2, recorded_events=7, stored_events=7), "the generator changed"),
        (dict(recorded_batches=1, recorded_events=3, stored_events=20), "more than it has"),
    ):
        with pytest.raises(BuildRefused, match=message):
            skip_stored(batches(3, 3, 4, 2), what="x", **kwargs)


def test_a_pg_setting_that_is_not_name_equals_value_is_refused_before_anything_starts(kept_dirs):
    for bad in ("shared_buffers", "=4GB", "shared_buffers="):
        run = bench(kept_dirs / "never", "--pg-set", bad)
        assert run.returncode == 2
        assert "--pg-set takes NAME=VALUE" in run.stderr and repr(bad) in run.stderr
    assert not (kept_dirs / "never").exists()
    # a setting the server does not know: the run stops with the server's own reason
    unknown = bench(kept_dirs / "misspelt", "--pg-set", "shared_bufers=4GB")
    assert unknown.returncode != 0
    assert 'unrecognized configuration parameter "shared_bufers"' in unknown.stderr
