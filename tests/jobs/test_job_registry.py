"""Every job is named in one place: the built-in ones in ``jobs.job_registry``, an
operator's in the ``JOBS`` dict of a ``JOB_MODULES`` module; importing a module registers nothing."""
from __future__ import annotations

import sys
import types

import pytest

from jobs import job_registry as registry


def test_built_in_jobs_are_listed_by_name():
    jobs = registry.built_in_jobs()
    assert sorted(jobs) == ["check_chain_cover", "check_topological_ordering", "check_visibility",
                            "rebuild_chain_cover", "synapse_check_chain_cover", "synapse_check_orderings",
                            "synapse_check_state", "synapse_forward_extremities", "synapse_state_group_health",
                            "topological_ordering", "visibility"]
    assert all(callable(job) for job in jobs.values())


def test_job_modules_name_their_jobs_in_a_jobs_dict():
    from tests.dashboard import browser_jobs

    assert registry.operator_jobs(["tests.dashboard.browser_jobs"]) == {"test_endless": browser_jobs.endless}


def test_a_job_module_without_jobs_is_refused_with_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "no_jobs_here", types.ModuleType("no_jobs_here"))
    with pytest.raises(ImportError, match=r"JOB_MODULES: no_jobs_here names no jobs .*JOBS = "):
        registry.operator_jobs(["no_jobs_here"])


def test_load_jobs_takes_both(settings):
    settings.JOB_MODULES = ["tests.dashboard.browser_jobs"]
    jobs = registry.load_jobs()
    try:
        assert {"visibility", "test_endless"} <= set(jobs)
    finally:
        jobs.pop("test_endless")
