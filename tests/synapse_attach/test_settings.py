"""SYNAPSE_ATTACH's URLs carry passwords: nothing prints them (docs/attach.md)."""
from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.test import override_settings

from synapse_attach.reader import AttachError, AttachSettings


def test_diffsettings_masks_the_synapse_urls():
    attach = {"DATABASE_URL": "postgres://observer:main-secret@db/synapse",
              "STATE_DATABASE_URL": "postgres://observer:state-secret@db/state",
              "REDIS_URL": "redis://:redis-secret@redis:6379/0", "SERVER_NAME": "example.org",
              "STATEMENT_TIMEOUT_SECONDS": 10.0, "CONNECT_TIMEOUT_SECONDS": 5}
    out = StringIO()
    with override_settings(SYNAPSE_ATTACH=attach):
        call_command("diffsettings", stdout=out)
    text = out.getvalue()
    assert "postgres://observer:***@db/synapse" in text and "redis://:***@redis:6379/0" in text
    assert not any(secret in text for secret in ("main-secret", "state-secret", "redis-secret"))


def test_a_state_url_of_another_kind_is_refused_masked():
    with pytest.raises(AttachError) as raised:
        AttachSettings.from_settings({"DATABASE_URL": "postgres://u:p@h/db",
                                      "STATE_DATABASE_URL": "sqlite://u:hidden@h/x"})
    assert str(raised.value).startswith("SYNAPSE_STATE_DATABASE_URL=sqlite://u:***@h/x: expected postgres://")


@pytest.mark.parametrize("extra, line", [
    ({"SYNAPSE_REDIS_URL": "redis://observer:hunter2@127.0.0.1:6379"},
     "CommandError: SYNAPSE_REDIS_URL is set but SYNAPSE_SERVER_NAME is not"),
    ({"SYNAPSE_REDIS_URL": "http://observer:hunter2@127.0.0.1:6379", "SYNAPSE_SERVER_NAME": "example.org"},
     "CommandError: SYNAPSE_REDIS_URL=http://observer:***@127.0.0.1:6379: expected redis://"),
    ({"SYNAPSE_DATABASE_URL": "mysql://observer:hunter2@127.0.0.1/synapse"},
     "CommandError: SYNAPSE_DATABASE_URL=mysql://observer:***@127.0.0.1/synapse: expected postgres://"),
])
def test_runservice_refuses_an_observer_it_cannot_run_in_one_line(tmp_path, extra, line):
    from tests.synapse_repl.test_runservice_children import refusal, service_env

    env = service_env(tmp_path / "state", REPLICATION_SECRET="k3Jx9Qv2LmZ8rT5wN1yB7cF4hD6gS0pA", DEMO="0", **extra)
    said = refusal(env)
    assert said.startswith(line) and "hunter2" not in said
