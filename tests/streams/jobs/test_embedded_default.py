"""The embedded default: ``run_job`` on SQLite (no DATABASE_URL), as ``make run`` would."""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.slow


def manage(state: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(STATE_DIR=str(state), SPARK_MASTER="local[1]", DJANGO_SETTINGS_MODULE="synapse_repl.settings")
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


def test_run_job_reads_and_swaps_on_sqlite(tmp_path):
    assert manage(tmp_path, "migrate", "--noinput", "-v", "0").returncode == 0
    # a small room written straight into the SQLite file: a fork and a merge, one ordering wrong
    chain = [("$a", [], 1), ("$b", ["$a"], 2), ("$c", ["$a"], 2), ("$d", ["$b", "$c"], 3)]
    db = sqlite3.connect(tmp_path / "db.sqlite3")
    for n, (eid, prevs, depth) in enumerate(chain, 1):
        stored = 99 if eid == "$c" else depth
        db.execute("INSERT INTO events (instance_name, stream_ordering, topological_ordering, depth, event_id, "
                   "room_id, type, sender, rejected, outlier, received_ts, json, redacted) "
                   "VALUES ('master', ?, ?, ?, ?, '!r:hs', 'm.room.message', '@u:hs', 0, 0, 0, ?, 0)",
                   (n, stored, stored, eid, json.dumps({"event_id": eid, "depth": depth}).encode()))
        for p in prevs:
            db.execute("INSERT INTO event_edges (event_id, prev_event_id, room_id) VALUES (?, ?, '!r:hs')", (eid, p))
    db.commit()

    check = manage(tmp_path, "run_job", "check_topological_ordering")
    assert check.returncode == 0, check.stderr[-3000:]
    assert "differences 1" in check.stdout and "'$c'" in check.stdout

    fix = manage(tmp_path, "run_job", "topological_ordering")
    assert fix.returncode == 0, fix.stderr[-3000:]
    assert "succeeded" in fix.stdout and "rows out 1" in fix.stdout
    assert dict(db.execute("SELECT event_id, topological_ordering FROM events").fetchall()) == {
        "$a": 1, "$b": 2, "$c": 2, "$d": 3}
    runs = db.execute("SELECT job, status FROM job_runs ORDER BY id").fetchall()
    assert runs == [("check_topological_ordering", "succeeded"), ("topological_ordering", "succeeded")]
