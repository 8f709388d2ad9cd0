"""The embedded default: ``run_job`` on SQLite (no DATABASE_URL), as ``make run`` would."""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

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

    # both jobs in one process (one Spark start), through the runner as run_job calls it
    script = ("from jobs.runner import run_job\n"
              "check = run_job('check_topological_ordering')\n"
              "print('check', check.status, check.differences, [d['event_id'] for d in check.difference_sample])\n"
              "fix = run_job('topological_ordering')\n"
              "print('fix', fix.status, fix.rows_out)\n")
    out = manage(tmp_path, "shell", "-c", script)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "check succeeded 1 ['$c']" in out.stdout
    assert "fix succeeded 1" in out.stdout
    assert dict(db.execute("SELECT event_id, topological_ordering FROM events").fetchall()) == {
        "$a": 1, "$b": 2, "$c": 2, "$d": 3}
    runs = db.execute("SELECT job, status FROM job_runs ORDER BY id").fetchall()
    assert runs == [("check_topological_ordering", "succeeded"), ("topological_ordering", "succeeded")]
