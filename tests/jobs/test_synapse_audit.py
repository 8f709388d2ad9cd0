"""The Synapse audit jobs against a real Synapse 1.163.2 (testing/synapse_homeserver.py), read
through a PostgreSQL role with SELECT only, as docs/attach.md has an operator create it. One
homeserver for the module; the jobs run on the session's Spark. After client traffic of every
kind the fixture drives, forks included, every audit finds nothing; then damage made as the
database's superuser (Synapse's own rows changed behind its back) is found, and only it."""
from __future__ import annotations

import threading

import psycopg
import pytest
from django.conf import settings
from django.test import override_settings

from jobs.synapse_audit_jobs import AUDIT_JOBS
from jobs.synapse_source import SynapseDatabases, SynapseSourceError, synapse_cut
from testing.synapse_homeserver import SynapseHomeserver, client_traffic, running
from tests.synapse_attach.test_synapse_status import execute, observer_url  # noqa: F401  (the SELECT-only role)

#: Every test in pytest-django's plain database group (the end-to-end run records a JobRun), so
#: they stay together and the homeserver, a module fixture, starts once.
pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def synapse(postgres_server, redis_server):
    with running(SynapseHomeserver("audit.test", postgres_server.port, redis_server.port,
                                   database="synapse_audit")) as homeserver:
        yield homeserver


def concurrently(*calls) -> None:
    """Each call in a thread of its own, all started together (Synapse creates up to five
    events of a room at once: concurrent ones share prev events, and the room forks)."""
    barrier = threading.Barrier(len(calls))
    errors: list[BaseException] = []

    def run(call) -> None:
        barrier.wait()
        try:
            call()
        except BaseException as e:  # reported below, on the test's thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(c,)) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors


@pytest.fixture(scope="module")
def traffic(synapse):
    """Messages, state, typing, receipts, account data and to-device in a private room; in a
    public room, two admins changing power levels and memberships at the same time (forks)."""
    alice, bob, quiet = client_traffic(synapse, "audit")
    carol = synapse.register("carol")

    busy = alice.create_room(preset="public_chat")
    bob.join(busy)
    levels = alice.state(busy, "m.room.power_levels")
    levels["users"][bob.user_id] = 100
    alice.set_state(busy, "m.room.power_levels", levels)
    for round_ in range(4):
        def alice_turn(r=round_) -> None:
            pl = dict(levels, users={**levels["users"], carol.user_id: 10 + r})
            alice.set_state(busy, "m.room.power_levels", pl)
            alice.send_message(busy, f"alice {r}")

        def bob_turn(r=round_) -> None:
            if r % 2 == 0:
                bob.invite(busy, carol.user_id)
            else:
                bob.set_state(busy, "m.room.member", {"membership": "leave"}, state_key=carol.user_id)
            bob.set_topic(busy, f"bob {r}")

        concurrently(alice_turn, bob_turn)
    alice.send_message(busy, "merged")
    return {"quiet": quiet, "busy": busy, "alice": alice, "bob": bob}


@pytest.fixture
def audit(observer_url):  # noqa: F811
    """The audits pointed at Synapse through the SELECT-only role."""
    with override_settings(SYNAPSE_ATTACH={**settings.SYNAPSE_ATTACH, "DATABASE_URL": observer_url,
                                           "STATE_DATABASE_URL": "", "EXTREMITY_THRESHOLD": 10}):
        yield


def run(spark, job: str, rooms=None):
    return AUDIT_JOBS[job](spark, rooms)


def findings(outcome) -> list[tuple[str, str | None, str | None]]:
    return sorted((d["finding"], d["room_id"], d["event_id"]) for d in outcome.sample
                  if d["finding"] not in ("room_state_summary", "chain_cover_backlog"))


def test_the_traffic_forked_a_room(synapse, traffic):
    forks = synapse.query("SELECT count(*) FROM events e WHERE e.room_id = %s AND 1 < (SELECT count(*) "
                          "FROM event_edges x WHERE x.event_id = e.event_id)", traffic["busy"])[0][0]
    assert forks >= 1, "no event of the busy room merged a fork"


@pytest.mark.parametrize("job", sorted(AUDIT_JOBS))
def test_a_healthy_synapse_gives_no_findings(spark, synapse, traffic, audit, job):
    outcome = run(spark, job)
    assert (outcome.differences, findings(outcome)) == (0, []), outcome.sample[:5]
    assert outcome.rows_in > 0
    if job == "synapse_state_group_health":
        summaries = {d["room_id"]: d for d in outcome.sample if d["finding"] == "room_state_summary"}
        assert set(summaries) >= {traffic["quiet"], traffic["busy"]}
        rows = synapse.query("SELECT count(*) FROM state_groups_state s JOIN state_groups g "
                             "ON g.id = s.state_group WHERE g.room_id = %s", traffic["busy"])[0][0]
        assert summaries[traffic["busy"]]["found"].startswith(f"{rows} rows in ")


def test_the_cut_is_read_only_and_one_snapshot(spark, synapse, traffic):
    """Even as the database's superuser (a careless URL), the audits' connections cannot write,
    and what they read stays as of the cut while Synapse's tables change."""
    room = traffic["quiet"]
    with synapse_cut(SynapseDatabases(synapse.dsn)) as cut:
        read_only = cut.read(spark, "SELECT current_setting('transaction_read_only') AS ro, "
                                    "current_setting('transaction_isolation') AS iso", "ro string, iso string")
        assert [tuple(r) for r in read_only.collect()] == [("on", "repeatable read")]
        with pytest.raises(SynapseSourceError, match="read-only transaction"):
            cut.rows("DELETE FROM event_forward_extremities")
    with synapse_cut(SynapseDatabases(synapse.dsn)) as cut:
        extremities = cut.read(spark, "SELECT event_id FROM event_forward_extremities WHERE room_id = "
                                      f"'{room}'", "event_id string")
        before = sorted(r.event_id for r in extremities.collect())
        event = synapse.query("SELECT event_id FROM events WHERE room_id = %s AND type = 'm.room.create'", room)[0][0]
        execute(synapse, "INSERT INTO event_forward_extremities (event_id, room_id) VALUES (%s, %s)", event, room)
        try:
            assert sorted(r.event_id for r in extremities.collect()) == before
        finally:
            execute(synapse, "DELETE FROM event_forward_extremities WHERE event_id = %s", event)


def test_an_unset_or_unreachable_database_is_one_clear_line(spark):
    with override_settings(SYNAPSE_ATTACH={**settings.SYNAPSE_ATTACH, "DATABASE_URL": ""}):
        with pytest.raises(SynapseSourceError, match="^SYNAPSE_DATABASE_URL is not set"):
            run(spark, "synapse_check_orderings")
    with pytest.raises(SynapseSourceError, match=r"cannot connect .*postgresql://u:\*\*\*@127.0.0.1:1/x"):
        with synapse_cut(SynapseDatabases("postgresql://u:secret@127.0.0.1:1/x")):
            pass


# -- damage, as the database's superuser ------------------------------------------------------------

def message_in(synapse, room: str, nth: int = 2) -> str:
    return synapse.query("SELECT event_id FROM events WHERE room_id = %s AND type = 'm.room.message' "
                         "ORDER BY stream_ordering LIMIT 1 OFFSET %s", room, nth)[0][0]


def untriggered(synapse, statement: str, *params) -> None:
    """A statement run past Synapse's triggers (it guards some copies of the stream ordering
    with one): what a restore from a bad dump or a hand-made fix-up can leave."""
    with psycopg.connect(synapse.dsn) as conn:
        conn.execute("SET LOCAL session_replication_role = replica")
        conn.execute(statement, params or None)


def test_a_changed_depth_is_found(spark, synapse, traffic, audit):
    room = traffic["quiet"]
    event = message_in(synapse, room)
    execute(synapse, "UPDATE events SET depth = depth - 100 WHERE event_id = %s", event)
    try:
        outcome = run(spark, "synapse_check_orderings")
    finally:
        execute(synapse, "UPDATE events SET depth = depth + 100 WHERE event_id = %s", event)
    assert findings(outcome) == [("depth_not_the_events", room, event), ("topological_ordering_not_depth", room, event)]
    depth = synapse.query("SELECT depth FROM events WHERE event_id = %s", event)[0][0]
    by_kind = {d["finding"]: d for d in outcome.sample}
    assert (by_kind["depth_not_the_events"]["found"], by_kind["depth_not_the_events"]["expected"]) == (
        str(depth - 100), str(depth))


def test_an_ordering_before_its_prev_events_and_a_stream_ordering_copy_are_found(spark, synapse, traffic, audit):
    room = traffic["quiet"]
    event = message_in(synapse, room)
    member = synapse.query("SELECT event_id FROM room_memberships WHERE room_id = %s LIMIT 1", room)[0][0]
    execute(synapse, "UPDATE events SET topological_ordering = 1, depth = 1 WHERE event_id = %s", event)
    untriggered(synapse, "UPDATE room_memberships SET event_stream_ordering = event_stream_ordering + 1000 "
                         "WHERE event_id = %s", member)
    try:
        outcome = run(spark, "synapse_check_orderings")
    finally:
        execute(synapse, "UPDATE events SET topological_ordering = (j.json::json ->> 'depth')::bigint, "
                         "depth = (j.json::json ->> 'depth')::bigint FROM event_json j "
                         "WHERE j.event_id = events.event_id AND events.event_id = %s", event)
        untriggered(synapse, "UPDATE room_memberships SET event_stream_ordering = event_stream_ordering - 1000 "
                             "WHERE event_id = %s", member)
    assert findings(outcome) == sorted([("depth_not_the_events", room, event),
                                        ("ordering_not_after_prev_events", room, event),
                                        ("stream_ordering_differs", room, member)])


def test_an_added_extremity_and_a_crowded_room_are_found(spark, synapse, traffic, audit):
    room = traffic["quiet"]
    event = message_in(synapse, room)
    execute(synapse, "INSERT INTO event_forward_extremities (event_id, room_id) VALUES (%s, %s)", event, room)
    try:
        outcome = run(spark, "synapse_forward_extremities")
        with override_settings(SYNAPSE_ATTACH={**settings.SYNAPSE_ATTACH, "EXTREMITY_THRESHOLD": 1}):
            crowded = run(spark, "synapse_forward_extremities")
    finally:
        execute(synapse, "DELETE FROM event_forward_extremities WHERE event_id = %s", event)
    assert findings(outcome) == [("forward_extremity_has_children", room, event)]
    assert outcome.sample[0]["found"] == "1 event(s) after it"
    assert findings(crowded) == [("forward_extremity_has_children", room, event),
                                 ("too_many_forward_extremities", room, None)]
    assert crowded.sample[0] == {"finding": "too_many_forward_extremities", "room_id": room, "event_id": None,
                                 "key": "event_forward_extremities", "found": "2", "expected": "<= 1"}


def test_an_orphan_state_group_is_found(spark, synapse, traffic, audit):
    room = traffic["quiet"]
    (group,) = synapse.query("SELECT max(id) + 1000 FROM state_groups")[0]
    event = message_in(synapse, room)
    execute(synapse, "INSERT INTO state_groups (id, room_id, event_id) VALUES (%s, %s, %s)", group, room, event)
    execute(synapse, "INSERT INTO state_groups_state (state_group, room_id, type, state_key, event_id) "
                     "SELECT %s, room_id, type, state_key, event_id FROM current_state_events WHERE room_id = %s",
            group, room)
    try:
        outcome = run(spark, "synapse_state_group_health")
    finally:
        execute(synapse, "DELETE FROM state_groups_state WHERE state_group = %s", group)
        execute(synapse, "DELETE FROM state_groups WHERE id = %s", group)
    assert findings(outcome) == [("state_group_unreferenced", room, str(group))]


def test_a_removed_chain_link_is_found_by_reachability(spark, synapse, traffic, audit):
    room = traffic["busy"]
    link = synapse.query(
        "SELECT l.origin_chain_id, l.origin_sequence_number, l.target_chain_id, l.target_sequence_number, c.event_id "
        "FROM event_auth_chain_links l JOIN event_auth_chains c ON c.chain_id = l.origin_chain_id "
        "AND c.sequence_number = l.origin_sequence_number JOIN events e ON e.event_id = c.event_id "
        "WHERE e.room_id = %s ORDER BY e.stream_ordering LIMIT 1", room)[0]
    where = ("origin_chain_id = %s AND origin_sequence_number = %s AND target_chain_id = %s "
             "AND target_sequence_number = %s")
    execute(synapse, f"DELETE FROM event_auth_chain_links WHERE {where}", *link[:4])
    try:
        outcome = run(spark, "synapse_check_chain_cover")
    finally:
        execute(synapse, "INSERT INTO event_auth_chain_links (origin_chain_id, origin_sequence_number, "
                         "target_chain_id, target_sequence_number) VALUES (%s, %s, %s, %s)", *link[:4])
    found = findings(outcome)
    assert found and {(f, r) for f, r, _ in found} == {("auth_chain_cover_differs", room)}
    assert ("auth_chain_cover_differs", room, link[4]) in found  # the link's own origin
    assert all(d["found"].startswith("lacks ") for d in outcome.sample if d["finding"] == "auth_chain_cover_differs")


def test_a_changed_state_row_is_found_against_the_recomputed_state(spark, synapse, traffic, audit):
    """The topic's own group (the last event of the quiet room is its topic) made to name
    another event: the state Synapse would serve for that event is no longer what the events
    give, and nothing else is touched."""
    room = traffic["quiet"]
    topic, group = synapse.query(
        "SELECT e.event_id, s.state_group FROM events e JOIN event_to_state_groups s ON s.event_id = e.event_id "
        "WHERE e.room_id = %s ORDER BY e.stream_ordering DESC LIMIT 1", room)[0]
    assert synapse.query("SELECT type FROM events WHERE event_id = %s", topic) == [("m.room.topic",)]
    assert synapse.query("SELECT count(*) FROM state_group_edges WHERE prev_state_group = %s", group) == [(0,)]
    other = message_in(synapse, room)
    where = "state_group = %s AND type = 'm.room.topic' AND state_key = ''"
    execute(synapse, f"UPDATE state_groups_state SET event_id = %s WHERE {where}", other, group)
    try:
        outcome = run(spark, "synapse_check_state")
    finally:
        execute(synapse, f"UPDATE state_groups_state SET event_id = %s WHERE {where}", topic, group)
    assert outcome.differences == 1
    assert outcome.sample == [{"finding": "state_differs", "room_id": room, "event_id": topic,
                               "key": "m.room.topic|", "found": other, "expected": topic}]


def test_through_celery_a_crowded_room_becomes_a_job_run_a_metric_and_an_alert_input(spark, synapse, traffic,
                                                                                       audit, admin_client):
    """The whole path an operator has: the Celery task (eager here: no broker) runs the audit
    through the runner, which records it; /metrics shows the room it listed."""
    from jobs.models import JobRun
    from jobs.tasks import run_job_task

    room = traffic["busy"]
    extra = message_in(synapse, room, nth=0)
    execute(synapse, "INSERT INTO event_forward_extremities (event_id, room_id) VALUES (%s, %s)", extra, room)
    try:
        with override_settings(SYNAPSE_ATTACH={**settings.SYNAPSE_ATTACH, "EXTREMITY_THRESHOLD": 1}):
            answer = run_job_task.delay("synapse_forward_extremities", [room], trigger="test").get()
    finally:
        execute(synapse, "DELETE FROM event_forward_extremities WHERE event_id = %s", extra)
    run = JobRun.objects.get(pk=answer["run"])
    assert (run.status, run.trigger, run.parameters, run.differences) == (
        JobRun.Status.SUCCEEDED, "test", {"rooms": [room]}, 2)
    assert [(d["finding"], d["room_id"], d["event_id"]) for d in run.difference_sample] == [
        ("too_many_forward_extremities", room, None), ("forward_extremity_has_children", room, extra)]
    assert run.verdict_text == "failed: 2 differences"
    metrics = admin_client.get("/metrics").content.decode()
    assert f'synapse_repl_synapse_room_forward_extremities{{room_id="{room}"}} 2.0' in metrics
    assert "synapse_repl_synapse_rooms_over_extremity_threshold 1.0" in metrics
    assert 'synapse_repl_job_last_run_differences{job="synapse_forward_extremities"} 2.0' in metrics


# -- the pure per-room functions, by value ----------------------------------------------------------

def test_the_compression_dry_run_follows_the_compressors_levels():
    import pandas as pd

    from jobs.synapse_audit import room_state_health

    rows = pd.DataFrame([
        ("!r", 1, None, "a", "", "$a1"), ("!r", 1, None, "b", "", "$b1"), ("!r", 1, None, "c", "", "$c1"),
        ("!r", 2, 1, "a", "", "$a2"), ("!r", 3, 2, "b", "", "$b2")],
        columns=["room_id", "state_group", "prev_state_group", "type", "state_key", "event_id"])
    as_is = room_state_health(rows).iloc[0].to_dict()
    assert as_is == {"room_id": "!r", "groups": 3, "snapshots": 1, "rows": 5, "max_delta_depth": 2,
                     "rows_after_compression": 5}
    # levels of 2: group 3 finds the first level full and the second empty, so it is stored whole
    assert room_state_health(rows, levels=(2, 2)).iloc[0]["rows_after_compression"] == 3 + 1 + 3


def test_the_cover_is_compared_by_reachability_not_by_rows():
    import pandas as pd

    from jobs.synapse_audit import room_cover_findings

    def rows(links):
        out = [("p", "!r", e, None, c, s, None, None) for e, c, s in (("$c", 1, 1), ("$m", 2, 1), ("$p", 3, 1))]
        out += [("l", "!r", None, None, c, s, t, ts) for c, s, t, ts in links]
        out += [("a", "!r", e, a, None, None, None, None) for e, a in (("$m", "$c"), ("$p", "$c"), ("$p", "$m"))]
        out += [("s", "!r", e, None, None, None, None, None) for e in ("$c", "$m", "$p")]
        return pd.DataFrame(out, columns=["kind", "room_id", "event_id", "other_id", "chain_id", "sequence_number",
                                          "target_chain_id", "target_sequence_number"])

    # the same reachability with or without the redundant link $p -> $c
    assert room_cover_findings(rows([(2, 1, 1, 1), (3, 1, 2, 1)])).empty
    assert room_cover_findings(rows([(2, 1, 1, 1), (3, 1, 2, 1), (3, 1, 1, 1)])).empty
    lost = room_cover_findings(rows([(2, 1, 1, 1)]))
    assert lost.to_dict("records") == [{"finding": "auth_chain_cover_differs", "room_id": "!r", "event_id": "$p",
                                        "key": "event_auth_chains/links", "found": "lacks $c, $m",
                                        "expected": "2 auth events (closure of event_auth)"}]


def test_a_state_database_apart_is_where_the_state_is_read(spark, synapse, traffic, observer_url):  # noqa: F811
    """Synapse's state tables in a database of their own (``SYNAPSE_STATE_DATABASE_URL``): a
    copy of them, damaged in the copy only (a topic row changed, an orphan group added), is
    what the audits read and find; Synapse's main database still holds its healthy state, so
    a read of it there would find nothing. A group newer than any the main cut's events name
    is judged by no audit (Synapse writes a group before its event: it may be a new event's),
    so only the orphan below them is found."""
    import subprocess

    from testing.services import _find_pg_bin

    state_db = f"{synapse.database}_state"
    execute(synapse, f'DROP DATABASE IF EXISTS "{state_db}"')
    execute(synapse, f"""CREATE DATABASE "{state_db}" ENCODING 'UTF8' LC_COLLATE='C' LC_CTYPE='C' TEMPLATE template0""")
    main_role = observer_url.split("//", 1)[1].split(":", 1)[0]
    superuser = synapse.dsn.rsplit("/", 1)[0] + f"/{state_db}"
    try:
        dump = subprocess.run([_find_pg_bin("pg_dump"), "--no-owner", "--no-privileges", "-t", "state_groups",
                               "-t", "state_group_edges", "-t", "state_groups_state", "-t", "state_group_id_seq",
                               synapse.dsn], capture_output=True, check=True)
        subprocess.run([_find_pg_bin("psql"), "-q", "-v", "ON_ERROR_STOP=1", superuser], input=dump.stdout,
                       capture_output=True, check=True)
        room = traffic["quiet"]
        topic, group = synapse.query(
            "SELECT e.event_id, s.state_group FROM events e JOIN event_to_state_groups s ON s.event_id = e.event_id "
            "WHERE e.room_id = %s ORDER BY e.stream_ordering DESC LIMIT 1", room)[0]
        other = message_in(synapse, room)
        (orphan, newer) = synapse.query("SELECT min(id) - 1, max(id) + 1000 FROM state_groups")[0]
        with psycopg.connect(superuser, autocommit=True) as conn:
            for grant in (f'GRANT CONNECT ON DATABASE "{state_db}" TO {main_role}',
                          f"GRANT USAGE ON SCHEMA public TO {main_role}",
                          f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {main_role}",
                          f"GRANT SELECT ON ALL SEQUENCES IN SCHEMA public TO {main_role}"):
                conn.execute(grant)
            conn.execute("UPDATE state_groups_state SET event_id = %s WHERE state_group = %s "
                         "AND type = 'm.room.topic' AND state_key = ''", [other, group])
            for unreferenced in (orphan, newer):
                conn.execute("INSERT INTO state_groups (id, room_id, event_id) VALUES (%s, %s, %s)",
                             [unreferenced, room, other])
        state_url = observer_url.rsplit("/", 1)[0] + f"/{state_db}"
        with override_settings(SYNAPSE_ATTACH={**settings.SYNAPSE_ATTACH, "DATABASE_URL": observer_url,
                                               "STATE_DATABASE_URL": state_url, "EXTREMITY_THRESHOLD": 10}):
            state = run(spark, "synapse_check_state")
            health = run(spark, "synapse_state_group_health")
    finally:
        execute(synapse, f'DROP DATABASE IF EXISTS "{state_db}" WITH (FORCE)')
    assert state.sample == [{"finding": "state_differs", "room_id": room, "event_id": topic,
                             "key": "m.room.topic|", "found": other, "expected": topic}]
    assert findings(health) == [("state_group_unreferenced", room, str(orphan))]
