"""Every job the runner knows, by name, listed here (as ``streams/registry.py`` lists the
streams): the built-in ones, then those of the operator's ``JOB_MODULES``, each of which names
its jobs in a module-level ``JOBS`` dict. Nothing registers itself by being imported.

The job functions need pyspark and pandas, so they are imported by :func:`load_jobs`, not at
Django start-up nor by the URL check every ``migrate`` and web process runs."""
from __future__ import annotations

import importlib

from jobs.outcome import Job

#: name -> job; filled by :func:`load_jobs` (tests may add jobs of their own)
JOBS: dict[str, Job] = {}


def built_in_jobs() -> dict[str, Job]:
    # deferred: the job functions import pyspark and pandas (1.5 CPU-s), which only a process
    # that runs or lists jobs needs, not every web process or the URL check of `migrate`
    from jobs import definitions as d
    from jobs.synapse_audit_jobs import AUDIT_JOBS

    return {
        "topological_ordering": d.recompute_topological_ordering,
        "check_topological_ordering": d.check_topological_ordering,
        "visibility": d.recompute_visibility,
        "check_visibility": d.check_visibility,
        "rebuild_chain_cover": d.rebuild_chain_cover,
        "check_chain_cover": d.check_chain_cover,
        # read-only audits of a real Synapse's database (SYNAPSE_DATABASE_URL)
        **AUDIT_JOBS,
    }


def operator_jobs(modules: list[str]) -> dict[str, Job]:
    """The ``JOBS`` dicts of ``modules`` (``JOB_MODULES``), merged in order."""
    jobs: dict[str, Job] = {}
    for name in modules:
        module = importlib.import_module(name)
        named = getattr(module, "JOBS", None)
        if not isinstance(named, dict):
            raise ImportError(f"JOB_MODULES: {name} names no jobs (it needs a module-level "
                              f"JOBS = {{'name': function}})")
        jobs.update(named)
    return jobs


def load_jobs() -> dict[str, Job]:
    """Fill :data:`JOBS` with the built-in jobs and those of ``JOB_MODULES``; return it."""
    from django.conf import settings

    JOBS.update(built_in_jobs())
    JOBS.update(operator_jobs(list(getattr(settings, "JOB_MODULES", ()))))
    return JOBS
