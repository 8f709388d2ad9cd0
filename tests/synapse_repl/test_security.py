"""Security settings (synapse_repl/security.py, login_throttle.py, the production profile)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from synapse_repl.services import free_port
from tests.synapse_repl.test_settings import settings_in_subprocess

ROOT = Path(__file__).resolve().parents[2]


# --- REPLICATION_SECRET --------------------------------------------------------------------------


def test_replication_secret_generated_on_the_embedded_default_and_shared(tmp_path):
    first = settings_in_subprocess({"STATE_DIR": str(tmp_path)}, "settings.REPLICATION_SECRET")
    secret_file = tmp_path / "replication_secret"
    assert first == repr(secret_file.read_text()) and len(secret_file.read_text()) >= 50
    assert oct(secret_file.stat().st_mode & 0o777) == "0o600"
    # Every later process from this checkout (same STATE_DIR) reads the same one.
    assert settings_in_subprocess({"STATE_DIR": str(tmp_path)}, "settings.REPLICATION_SECRET") == first


def test_replication_secret_from_the_environment_or_none_in_full_mode(tmp_path):
    assert settings_in_subprocess({"STATE_DIR": str(tmp_path), "REPLICATION_SECRET": "abc"},
                                  "settings.REPLICATION_SECRET") == "'abc'"
    assert settings_in_subprocess({"STATE_DIR": str(tmp_path), "DATABASE_URL": "postgres://u@h/db"},
                                  "settings.REPLICATION_SECRET") == "''"
    assert not (tmp_path / "replication_secret").exists()


def test_secret_with_a_comma_is_refused(tmp_path):
    with pytest.raises(subprocess.CalledProcessError) as e:
        settings_in_subprocess({"STATE_DIR": str(tmp_path), "REPLICATION_SECRET": "a,b"}, "1")
    assert "REPLICATION_SECRET must not contain commas" in e.value.stderr


def _wait_for(predicate, what: str, timeout: float = 90):
    deadline = time.monotonic() + timeout
    while not (result := predicate()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.2)
    return result


def test_make_run_processes_share_the_generated_secret(tmp_path):
    """The embedded default as `make run` starts it: runservice (web + its runreplication
    child) and a replication_worker from the same checkout, all with no REPLICATION_SECRET
    in the environment. The catch-up endpoint refuses an anonymous GET; the worker, reading
    the generated secret, catches up facts written before it started."""
    web, repl = free_port(), free_port()
    env = {"PATH": os.environ["PATH"], "STATE_DIR": str(tmp_path), "PYTHONUNBUFFERED": "1",
           "WEB_LISTEN": f"127.0.0.1:{web}", "REPLICATION_LISTEN": f"127.0.0.1:{repl}",
           "POSITION_POLL_SECONDS": "0.1"}
    run = lambda *args: subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env,  # noqa: E731
                                       check=True, capture_output=True, timeout=300)
    run("migrate", "--noinput")
    run("write_facts", "receipts", "--count", "5", "--no-progress")
    service_log, worker_log = open(tmp_path / "service.log", "w"), open(tmp_path / "worker.log", "w")
    service = subprocess.Popen([sys.executable, "manage.py", "runservice"], cwd=ROOT, env=env,
                               stdout=service_log, stderr=subprocess.STDOUT, start_new_session=True)
    worker = None
    try:
        def web_up():
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{web}/status.json", timeout=2)
                return True
            except OSError:
                return False

        _wait_for(web_up, "runservice's web listener")
        url = (f"http://127.0.0.1:{web}/_synapse/replication/get_repl_stream_updates/receipts/"
               "?from_token=0&upto_token=5")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url, timeout=10)
        assert refused.value.code == 401
        jsonl = tmp_path / "worker.jsonl"
        worker = subprocess.Popen([sys.executable, "manage.py", "replication_worker", "--name", "w1",
                                   "--jsonl", str(jsonl), "--streams", "receipts"], cwd=ROOT, env=env,
                                  stdout=worker_log, stderr=subprocess.STDOUT)

        def facts():
            if not jsonl.exists():
                return None
            lines = [json.loads(line) for line in jsonl.read_text().splitlines() if line]
            return lines if len(lines) >= 5 else None

        got = _wait_for(facts, "the worker to catch up")
        tokens = [f["token"] for f in got]
        assert len(tokens) == 5 and tokens == sorted(set(tokens))
        assert "HTTP 40" not in (tmp_path / "worker.log").read_text()
    finally:
        if worker is not None:
            worker.terminate()
            worker.wait(timeout=20)
        os.killpg(service.pid, signal.SIGTERM)
        service.wait(timeout=20)
        service_log.close()
        worker_log.close()
