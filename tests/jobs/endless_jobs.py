"""Jobs for the launch-cap test, loaded with ``JOB_MODULES=tests.jobs.endless_jobs``:
twenty jobs of distinct names that each run until cancelled (tests/dashboard/browser_jobs.py's
``test_endless``), so a flood of starts meets the host's cap rather than one job's lock."""
from __future__ import annotations

from tests.dashboard.browser_jobs import endless

NAMES = [f"test_endless_{i:02d}" for i in range(20)]

JOBS = {name: endless for name in NAMES}
