"""``manage.py synapse_status`` against a real Synapse 1.163.2 (testing/synapse_homeserver.py),
read through a PostgreSQL role that has SELECT only, as an operator would set it up
(docs/attach.md). One Synapse for the module, on the suite's PostgreSQL; Synapse's own tables,
read as superuser, are the oracle."""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from synapse_attach.catalogue import STREAMS, generators
from synapse_attach.reader import connect_read_only
from testing.services import free_port
from testing.synapse_homeserver import SynapseHomeserver, client_traffic, running

ROOT = Path(__file__).resolve().parents[2]
ROLE = f"attach_observer_{secrets.token_hex(3)}"
PASSWORD = "observer-pw-" + secrets.token_hex(4)
SPECS = {s.name: s for s in generators()}


@pytest.fixture(scope="module")
def synapse(postgres_server, redis_server):
    with running(SynapseHomeserver("attach.test", postgres_server.port, redis_server.port,
                                   database="synapse_attach")) as homeserver:
        yield homeserver


def execute(synapse, statement: str, *params) -> None:
    """A statement of the test's own on Synapse's database, as superuser (set-up, damage)."""
    with psycopg.connect(synapse.dsn, autocommit=True) as conn:
        conn.execute(statement, params or None)


@pytest.fixture(scope="module")
def observer_url(synapse):
    """A role with SELECT on Synapse's tables and sequences, nothing else (docs/attach.md)."""
    execute(synapse, f"CREATE ROLE {ROLE} LOGIN PASSWORD '{PASSWORD}'")
    for grant in (f"GRANT CONNECT ON DATABASE {synapse.database} TO {ROLE}",
                  f"GRANT USAGE ON SCHEMA public TO {ROLE}",
                  f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {ROLE}",
                  f"GRANT SELECT ON ALL SEQUENCES IN SCHEMA public TO {ROLE}"):
        execute(synapse, grant)
    yield f"postgresql://{ROLE}:{PASSWORD}@127.0.0.1:{synapse.pg_port}/{synapse.database}"
    execute(synapse, f"DROP OWNED BY {ROLE}")
    execute(synapse, f"DROP ROLE {ROLE}")


@pytest.fixture(scope="module")
def traffic(synapse):
    """Client traffic of every kind the fixture drives: messages, state, typing, receipts,
    account data, to-device."""
    return client_traffic(synapse, "attach")[2]


def run_status(url: str | None, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "STATE_DIR": str(tmp_path / "state")}
    env.pop("DATABASE_URL", None)
    env.pop("SYNAPSE_DATABASE_URL", None)
    if url is not None:
        env["SYNAPSE_DATABASE_URL"] = url
    return subprocess.run([sys.executable, "manage.py", "synapse_status", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def status_in_process(url: str, *args: str, state_url: str = "") -> str:
    """The command's output, run in this process (the damage cases: the subprocess path is
    test_every_figure_is_synapses_own's)."""
    from io import StringIO

    from django.conf import settings
    from django.core.management import call_command
    from django.test import override_settings

    out = StringIO()
    with override_settings(SYNAPSE_ATTACH={**settings.SYNAPSE_ATTACH, "DATABASE_URL": url,
                                           "STATE_DATABASE_URL": state_url}):
        call_command("synapse_status", *args, stdout=out)
    return out.getvalue()


def positions(synapse) -> set[tuple[str, str, int]]:
    return {tuple(r) for r in synapse.query("SELECT stream_name, instance_name, stream_id FROM stream_positions")}


def status_at_rest(synapse, url: str, tmp_path: Path | None = None) -> tuple[dict, set]:
    """``synapse_status --json`` (a subprocess given ``tmp_path``, else in this process) taken
    while Synapse's stream_positions did not move (Synapse records positions in the background
    after each write): polled until a read fits between two equal oracle reads."""
    deadline = time.monotonic() + 60
    while True:
        before = positions(synapse)
        if tmp_path is None:
            output = status_in_process(url, "--json")
        else:
            done = run_status(url, tmp_path, "--json")
            assert done.returncode == 0, done.stderr
            output = done.stdout
        if positions(synapse) == before:
            return json.loads(output), before
        assert time.monotonic() < deadline, "Synapse's stream_positions never held still"


def by_stream(status: dict) -> dict[str, dict]:
    return {s["stream"]: s for s in status["streams"]}


def test_every_figure_is_synapses_own(synapse, observer_url, traffic, tmp_path):
    status, oracle = status_at_rest(synapse, observer_url, tmp_path)
    streams = by_stream(status)
    assert [s.name for s in STREAMS] == [s["stream"] for s in status["streams"] if s["replicated"]]
    for name, spec in SPECS.items():
        got = streams[name]
        # per-writer positions: Synapse's stream_positions rows for the generator's name
        assert {(w["instance"], w["position"]) for w in got["writers"]} == {
            (i, v * spec.sign) for s, i, v in oracle if s == spec.positions_name}, name
        [(last_value, is_called)] = synapse.query(f"SELECT last_value, is_called FROM {spec.sequence}")
        assert (got["last_value"], got["is_called"]) == (last_value, is_called), name
        stored = max(synapse.query(f"SELECT GREATEST({'MAX' if spec.positive else '-MIN'}({t.column}), 0) "
                                   f"FROM {t.table}")[0][0] for t in spec.tables)
        assert got["max_stored"] == stored, name
        # persisted-upto: every ID above the lowest writer and up to it is stored
        upto, writers = got["persisted_upto"], [w["position"] for w in got["writers"]]
        assert got["persisted_upto_complete"] is True
        if writers:
            ids = {r[0] * spec.sign for t in spec.tables
                   for r in synapse.query(f"SELECT {t.column} FROM {t.table}")}
            assert set(range(min(writers) + 1, upto + 1)) <= ids, name
        else:
            assert upto == max(stored, 1), name
    # the traffic moved the streams it drives, and events' persisted-upto is an event
    for name in ("events", "receipts", "account_data", "to_device", "device_lists"):
        assert streams[name]["writers"] and streams[name]["persisted_upto"] > 1, name
    [(max_event,)] = synapse.query("SELECT MAX(stream_ordering) FROM events")
    assert 1 < streams["events"]["persisted_upto"] <= max_event
    assert streams["typing"]["in_memory"] and streams["typing"]["writers"] == []
    assert {q["sequence"] for q in status["sequences"]} == {
        "event_auth_chain_id", "application_services_txn_id_seq", "state_group_id_seq"}
    # a healthy Synapse: the doctor has nothing to say
    assert status["findings"] == []


def test_text_output_names_each_stream_and_says_the_doctor_is_content(synapse, observer_url, traffic):
    # the state database given apart (here: the same one) is read over a connection of its own
    text = status_in_process(observer_url, state_url=observer_url)
    assert "events: persisted-upto " in text and "writer master: " in text
    assert "typing: kept in memory" in text
    [(last_value, is_called)] = synapse.query("SELECT last_value, is_called FROM state_group_id_seq")
    assert f"sequence state_group_id_seq: allocated {last_value if is_called else last_value - 1}," in text
    assert text.rstrip().endswith("doctor: no findings (Synapse's start-up checks would pass)")


def test_a_sequence_behind_its_table_is_reported_with_synapses_fix(synapse, observer_url, traffic):
    # caches records no positions: winding its sequence back shows exactly one finding
    [(original,)] = synapse.query("SELECT last_value FROM cache_invalidation_stream_seq")
    [(stored,)] = synapse.query("SELECT MAX(stream_id) FROM cache_invalidation_stream_by_instance")
    assert stored > 2
    execute(synapse, "SELECT setval('cache_invalidation_stream_seq', %s)", stored - 2)
    try:
        status, _ = status_at_rest(synapse, observer_url)
    finally:
        execute(synapse, "SELECT setval('cache_invalidation_stream_seq', GREATEST(%s, "
                      "(SELECT last_value FROM cache_invalidation_stream_seq)))", original)
    [finding] = status["findings"]
    assert (finding["code"], finding["stream"], finding["table"], finding["allocated"]) == (
        "sequence_behind_table", "caches", "cache_invalidation_stream_by_instance", stored - 2)
    assert finding["found"] >= stored
    assert finding["fix"].endswith("SELECT setval('cache_invalidation_stream_seq', "
                                   "(SELECT GREATEST(MAX(stream_id), 0) FROM cache_invalidation_stream_by_instance));")


def test_a_position_ahead_of_its_sequence_is_synapses_incorrect_database_setup(synapse, observer_url, traffic):
    [(writer, original)] = synapse.query(
        "SELECT instance_name, stream_id FROM stream_positions WHERE stream_name = 'receipts'")
    [(last_value,)] = synapse.query("SELECT last_value FROM receipts_sequence")
    execute(synapse, "UPDATE stream_positions SET stream_id = %s WHERE stream_name = 'receipts'", last_value + 5)
    try:
        status, _ = status_at_rest(synapse, observer_url)
    finally:
        execute(synapse, "UPDATE stream_positions SET stream_id = %s WHERE stream_name = 'receipts'", original)
    [finding] = status["findings"]
    assert (finding["code"], finding["stream"], finding["found"], finding["allocated"]) == (
        "positions_ahead_of_sequence", "receipts", last_value + 5, last_value)
    assert "IncorrectDatabaseSetup" in finding["consequence"]
    assert finding["fix"].endswith("DELETE FROM stream_positions WHERE stream_name = 'receipts';")
    assert by_stream(status)["receipts"]["writers"] == [{"instance": writer, "position": last_value + 5}]


def test_the_attach_connection_cannot_write_even_as_superuser(synapse, observer_url):
    # the superuser may write anything: the connection's own option forbids it, and an
    # ``options`` in the URL cannot lift it
    for url in (synapse.dsn, synapse.dsn + "?options=-c%20default_transaction_read_only%3Doff", observer_url):
        with connect_read_only(url) as conn:
            with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
                conn.execute("INSERT INTO stream_positions (stream_name, instance_name, stream_id) "
                             "VALUES ('attach_test', 'attach', 1)")
    assert synapse.query("SELECT count(*) FROM stream_positions WHERE stream_name = 'attach_test'") == [(0,)]
    # and the role itself has no write privilege either
    with psycopg.connect(observer_url, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("UPDATE stream_positions SET stream_id = stream_id WHERE false")


def call_status(**attach: str) -> str:
    """The command in this process: its one-line error (a CommandError, which manage.py prints
    without a traceback, as test_a_missing_grant_names_the_table_and_the_grant shows)."""
    from django.conf import settings
    from django.core.management import CommandError, call_command
    from django.test import override_settings

    with override_settings(SYNAPSE_ATTACH={**settings.SYNAPSE_ATTACH, "DATABASE_URL": "", **attach}):
        with pytest.raises(CommandError) as raised:
            call_command("synapse_status")
    return str(raised.value)


def test_unset_variable_is_one_line():
    assert call_status().startswith("SYNAPSE_DATABASE_URL is not set")
    assert call_status(DATABASE_URL="mysql://u:pw@h/db") == (
        "SYNAPSE_DATABASE_URL=mysql://u:***@h/db: expected postgres://user:password@host/database "
        "(Synapse's PostgreSQL)")


def test_unreachable_database_is_one_line_without_the_password():
    error = call_status(DATABASE_URL=f"postgresql://{ROLE}:{PASSWORD}@127.0.0.1:{free_port()}/synapse")
    assert error.startswith(f"cannot connect to Synapse's database at postgresql://{ROLE}:***@127.0.0.1:")
    assert PASSWORD not in error and "\n" not in error


def test_a_missing_grant_names_the_table_and_the_grant(synapse, observer_url, tmp_path):
    execute(synapse, f"REVOKE SELECT ON events FROM {ROLE}")
    try:
        done = run_status(observer_url, tmp_path)
    finally:
        execute(synapse, f"GRANT SELECT ON events TO {ROLE}")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("CommandError: reading table events: ")
    assert "permission denied for table events" in done.stderr
    assert "GRANT SELECT ON ALL TABLES IN SCHEMA public" in done.stderr
    assert PASSWORD not in done.stderr


def test_a_statement_that_waits_is_cancelled_at_the_timeout(synapse, observer_url):
    # a table locked by someone else: the read gives up after SYNAPSE_STATEMENT_TIMEOUT_SECONDS
    with psycopg.connect(synapse.dsn) as holder:
        holder.execute("LOCK TABLE stream_positions IN ACCESS EXCLUSIVE MODE")
        error = call_status(DATABASE_URL=observer_url, STATEMENT_TIMEOUT_SECONDS=0.5)
        holder.rollback()
    assert error.startswith("reading table stream_positions: canceling statement due to statement timeout")
    assert error.endswith("(SYNAPSE_STATEMENT_TIMEOUT_SECONDS)")


@pytest.mark.parametrize("redis_url, server_name, expected", [
    ("", "attach.test", "--listen needs SYNAPSE_REDIS_URL and SYNAPSE_SERVER_NAME"),
    ("redis://127.0.0.1:6379", "", "--listen needs SYNAPSE_REDIS_URL and SYNAPSE_SERVER_NAME"),
    ("http://observer:hunter2@127.0.0.1:6379", "attach.test",
     "SYNAPSE_REDIS_URL=http://observer:***@127.0.0.1:6379: expected redis://"),
])
def test_listen_without_a_usable_redis_says_so_in_one_line(redis_url, server_name, expected):
    from django.conf import settings
    from django.core.management import CommandError, call_command
    from django.test import override_settings

    with override_settings(SYNAPSE_ATTACH={**settings.SYNAPSE_ATTACH, "DATABASE_URL": "postgres://o@127.0.0.1:1/s",
                                           "REDIS_URL": redis_url, "SERVER_NAME": server_name}):
        with pytest.raises(CommandError) as raised:
            call_command("synapse_status", "--listen", "1")
    assert expected in str(raised.value) and "hunter2" not in str(raised.value)


def test_listen_to_a_redis_that_is_not_there_exits_1_in_one_line(tmp_path):
    env = {**os.environ, "STATE_DIR": str(tmp_path / "state"), "SYNAPSE_DATABASE_URL": "postgres://o@127.0.0.1:1/s",
           "SYNAPSE_REDIS_URL": f"redis://observer:hunter2@127.0.0.1:{free_port()}", "SYNAPSE_SERVER_NAME": "x.test"}
    env.pop("DATABASE_URL", None)
    done = subprocess.run([sys.executable, "manage.py", "synapse_status", "--listen", "1"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith("CommandError: could not subscribe to "
                                                          "redis://observer:***@127.0.0.1:")
    assert "Traceback" not in done.stderr and "hunter2" not in done.stderr
