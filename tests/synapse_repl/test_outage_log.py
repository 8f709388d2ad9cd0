"""A Redis outage under a real full-mode ``runservice`` costs its log one line per change of
state for each connection (lost, still down, back) and no traceback (docs/replication.md,
"Redis outages in the log"): before, every retry said so, and tracebacks came with them."""
from __future__ import annotations

import re
import time
from collections import Counter

from tests.synapse_repl.test_web_hardening import Service, _wait_for

OUTAGE_SECONDS = 8.0


def said_by(text: str, what: str) -> Counter:
    """How many lines each connection said ``what`` (``lost: ``, ``back after ``...)."""
    return Counter(m.group(1) for m in re.finditer(rf"(?:WARNING|INFO) \S+: (.+?) {what}", text))


def all_back(text: str) -> bool:
    """Every connection lost is back (the USER_IP subscription is not resumed but made anew
    once its lease is back: the lease says so)."""
    lost = {name for name in said_by(text, "lost: ") if not name.endswith("/USER_IP")}
    return bool(lost) and lost <= set(said_by(text, "back after "))


def test_a_redis_outage_is_said_once_per_change_of_state(tmp_path, pg_url, private_redis):
    service = Service({"DATABASE_URL": pg_url, "REDIS_URL": private_redis.url, "DEMO": "0",
                       "REPLICATION_SECRET": "k3Jx9Qv2LmZ8rT5wN1yB7cF4hD6gS0pA"}, tmp_path / "var")
    service.start()
    try:
        _wait_for(lambda: "celery@" in service.output() and " ready" in service.output(), "the Celery worker")
        time.sleep(1.0)
        mark = len(service.output())
        private_redis.proc.kill()
        private_redis.proc.wait()
        time.sleep(OUTAGE_SECONDS)
        private_redis.start()  # on the same port
        out = lambda: service.output()[mark:]  # noqa: E731
        _wait_for(lambda: all_back(out()), "every connection that was lost back", timeout=60)
        during = out()
    finally:
        service.stop()
    assert "Traceback" not in during, during[-3000:]
    said = said_by(during, "(?:lost: |still down: |back after |: cannot connect)")
    assert said, during[-3000:]
    # per connection: lost, still down (once, however many retries), back
    assert all(n <= 3 for n in said.values()), said
