"""What a new operator reads first: the commands' --help, the default seed, /favicon.ico."""
from __future__ import annotations

import pytest
from django.core.management import call_command, load_command_class


def help_of(app: str, name: str) -> str:
    return load_command_class(app, name).create_parser("manage.py", name).format_help()


def test_run_job_help_lists_every_job():
    from jobs.job_registry import JOBS, load_jobs

    load_jobs()
    text = " ".join(help_of("synapse_repl", "run_job").split())
    assert JOBS and ", ...)" not in text and "JOB is one of" in text
    for name in JOBS:
        assert name in text


def test_generate_rooms_flags_have_help():
    parser = load_command_class("synapse_repl", "generate_rooms").create_parser("manage.py", "generate_rooms")
    for action in parser._actions:
        if action.dest in ("rooms", "users", "events", "seed", "batch", "no_progress"):
            assert action.help, action.dest


def test_runservice_help_names_the_variables_it_reads():
    text = " ".join(help_of("synapse_repl", "runservice").split())
    for variable in ("WEB_LISTEN", "REPLICATION_LISTEN", "DATABASE_URL", "REDIS_URL", "STATE_DIR",
                     "ADMIN_PASSWORD", "DEMO", "JOBS_WORKER"):
        assert variable in text


@pytest.mark.django_db(transaction=True)
def test_generate_rooms_default_seed_does_not_collide_with_the_demos():
    import gc

    from dashboard.management.commands.demo import ROOMS

    assert gc.isenabled()
    call_command("generate_rooms", rooms=20, users=50, events=2000, seed=ROOMS["seed"], no_progress=True)
    # the bulk load turned the collector off while it froze its objects; it is back on after
    assert gc.isenabled()
    # Without --seed, next to the demo's rooms: no "seed already generated" refusal.
    call_command("generate_rooms", rooms=20, users=50, events=2000, no_progress=True)


def test_favicon_is_served(client):
    response = client.get("/favicon.ico")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("image/")
    assert b"".join(response.streaming_content if response.streaming else [response.content])


def test_server_rendered_times_have_one_format_with_the_zone():
    import re
    from datetime import datetime, timezone

    from django.template import Context, Template

    when = datetime(2026, 11, 24, 6, 5, 38, tzinfo=timezone.utc)
    text = Template("{{ t }}|{{ t|date:'DATETIME_FORMAT' }}|{{ t|time }}").render(Context({"t": when}))
    assert text == "2026-11-24 06:05:38 UTC|2026-11-24 06:05:38 UTC|06:05:38 UTC"
    assert not re.search(r"[ap]\.m\.|AM|PM", text)
