"""``LiveRooms``: the demo's and ``write_facts events``' traffic is coherent, authorized room
history, continued from what the store holds, and the batch jobs' checks find nothing."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from rooms.matrix.auth_rules import auth_state_from, check_against_auth_events, check_state_dependent
from rooms.matrix.event_format import content_hash_matches, parse_pdu
from rooms.matrix.room_versions import room_version
from rooms.models import Event
from rooms.storage.synthetic import LIVE_ROOM_VERSION, LiveRooms
from tests.rooms.storage.helpers import ON_BOTH_DATABASES, rows, store  # noqa: F401

ROOT = Path(__file__).resolve().parents[3]


def stored_history() -> list[dict]:
    return [json.loads(bytes(raw)) for raw in Event.objects.order_by("stream_ordering").values_list("json", flat=True)]


@ON_BOTH_DATABASES
def test_every_event_is_authorized_and_follows_the_rooms_extremities(store):
    # several writers' worth of calls, each a fresh LiveRooms continuing from the store
    for seed in range(6):
        LiveRooms("lr-", rooms=3, users=8, rng=random.Random(seed)).write(25, runtime=store.runtime)
    version = room_version(LIVE_ROOM_VERSION)
    events, state, head, depth = {}, {}, {}, {}
    history = stored_history()
    assert len(history) == 150
    for body in history:
        ev = parse_pdu(body, version)  # the room version's format (v2: the ID is a field)
        assert ev.event_id == body["event_id"] and ev.room_id == body["room_id"]
        assert content_hash_matches(body)
        room = ev.room_id
        if room not in state:  # how every room starts
            assert ev.type == "m.room.create" and ev.prev_event_ids == ()
            state[room] = {}
        else:
            assert list(ev.prev_event_ids) == [head[room]]  # the forward extremity before it
            assert ev.depth == depth[room] + 1
        events[ev.event_id] = ev
        check_against_auth_events(ev, events.get)  # raises AuthFailed
        if ev.type != "m.room.create":
            check_state_dependent(ev, auth_state_from(ev, state[room], events.get))
        if ev.is_state:
            state[room][ev.key] = ev.event_id
        head[room], depth[room] = ev.event_id, ev.depth
    for room, room_state in state.items():
        first = [b["type"] for b in history if b["room_id"] == room][:4]
        assert first == ["m.room.create", "m.room.member", "m.room.power_levels", "m.room.join_rules"]
        assert ("m.room.join_rules", "") in room_state
    types = {b["type"] for b in history}
    assert "m.room.message" in types
    memberships = {b["content"].get("membership") for b in history if b["type"] == "m.room.member"}
    assert memberships == {"join", "leave"}
    # the store agrees: one forward extremity per room, the last event written
    assert sorted(rows("SELECT room_id, event_id FROM event_forward_extremities")) == sorted(head.items())


def test_the_plan_is_pure_and_continues_a_loaded_room():
    """plan() is data in, events out: a second planner given the first one's rooms goes on."""
    a = LiveRooms("p-", rooms=1, users=4, rng=random.Random(1), clock=lambda: 5)
    from rooms.storage.synthetic import LiveRoom

    rooms = {"!p-0:localhost": LiveRoom("!p-0:localhost")}
    first = [json.loads(e) for e in a.plan(rooms, 6)]
    assert [e["type"] for e in first[:4]] == ["m.room.create", "m.room.member", "m.room.power_levels",
                                              "m.room.join_rules"]
    assert rooms["!p-0:localhost"].extremities == [first[-1]["event_id"]]
    assert rooms["!p-0:localhost"].depth == 6
    nxt = json.loads(LiveRooms("p-", rooms=1, users=4, rng=random.Random(2), clock=lambda: 5).plan(rooms, 1)[0])
    assert nxt["prev_events"] == [[first[-1]["event_id"], {}]] and nxt["depth"] == 7  # v2: (ID, hashes) pairs
    assert nxt["type"] in ("m.room.member", "m.room.message")


@pytest.mark.slow
def test_a_fresh_embedded_install_checks_clean(tmp_path):
    """A fresh ``make run`` checks clean: the demo and ``write_facts events`` write no messages
    into rooms with no create event (which the checks would count as differences)."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(STATE_DIR=str(tmp_path), SPARK_MASTER="local[1]", DJANGO_SETTINGS_MODULE="synapse_repl.settings")

    def manage(*args: str) -> str:
        done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    manage("migrate", "--noinput", "-v", "0")
    manage("demo", "--ticks", "40", "--rate", "1000")  # the dataset, the rooms, then 40 trickle writes
    manage("write_facts", "events", "--count", "200", "--per-txn", "7", "--no-progress")
    script = ("from jobs.runner import run_job\n"
              "from rooms.models import Event\n"
              "print('events', Event.objects.count())\n"
              "for job in ('check_topological_ordering', 'check_visibility'):\n"
              "    run = run_job(job)\n"
              "    print(job, run.status, run.differences, run.difference_sample[:3])\n")
    out = manage("shell", "-c", script)
    assert int(out.split("events ")[1].split()[0]) >= 2000 + 120 + 200
    assert "check_topological_ordering succeeded 0 []" in out, out
    assert "check_visibility succeeded 0 []" in out, out


@pytest.mark.django_db(transaction=True)
def test_write_facts_events_threads_keep_to_their_own_rooms():
    """With --concurrency each thread continues rooms of its own: no two transactions race on
    one room's extremities, so every room keeps a single forward extremity."""
    from io import StringIO

    from django.core.management import call_command

    call_command("write_facts", "events", "--count", "60", "--per-txn", "3", "--concurrency", "2",
                 "--no-progress", stdout=StringIO())
    rooms = {r for (r,) in rows("SELECT DISTINCT room_id FROM events")}
    assert {r.split("-")[2] for r in rooms} == {"t0", "t1"}  # !live-master-t0-3:localhost
    assert rows("SELECT count(*) FROM events") == [(60,)]
    extremities = rows("SELECT room_id, count(*) FROM event_forward_extremities GROUP BY room_id")
    assert {r for r, _ in extremities} == rooms and {n for _, n in extremities} == {1}
