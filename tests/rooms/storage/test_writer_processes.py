"""Two event writer processes (``STREAM_WRITERS=events=w1,w2``, PostgreSQL) persisting the
same room at the same time: real OS processes, each its own Django and
``persist_events``, each extending the room from what the other persisted (round after round
both fork from the last merge, and the merges alternate between them). The state at every
event and ``current_state_events`` must equal what the Matrix core computes for the same
events from scratch in one process (``RoomBuilder``, itself checked against Synapse in
tests/rooms/matrix/); the run must contain groups whose parent has the larger ID (each
writer draws group IDs from its own pool), so a read taking group IDs as an order fails."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rooms.storage.caches import storage_caches
from rooms.storage.reads import state_at_event
from tests.rooms.storage.helpers import rows
from tests.rooms.storage.test_matrix_persist import A, E, M, current_state, new_room

ROOT = Path(__file__).resolve().parents[3]
WRITERS = "events=w1,w2"
ROUNDS, BRANCH = 4, 5
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def build_room():
    """The room, and each writer's plan: ``[event_id, pdu, prev_event_ids]`` in order."""
    room = new_room("10")
    for user in (M, E):
        room.send(user, "m.room.member", {"membership": "join"}, state_key=user)
    room.send(A, "m.room.power_levels", {"users": {A: 100, M: 50}}, state_key="")
    plans: dict[str, list[str]] = {"w1": list(room.order), "w2": []}
    tip = room.order[-1]
    for r in range(ROUNDS):
        a = b = tip
        for n in range(BRANCH):  # the admin's branch (w1): topics, names, in the third round a ban of Eve
            if r == 2 and n == 2:
                a = room.send(A, "m.room.member", {"membership": "ban"}, state_key=E, prev_ids=[a])
            elif n % 2:
                a = room.send(A, "m.room.name", {"name": f"a{r}.{n}"}, state_key="", prev_ids=[a])
            else:
                a = room.send(A, "m.room.topic", {"topic": f"a{r}.{n}"}, state_key="", prev_ids=[a])
            plans["w1"].append(a)
        for n in range(BRANCH):  # the moderator's and Eve's (w2): the same keys, and chat
            if n % 2:
                b = room.send(E, "m.room.message", {"body": f"b{r}.{n}"}, prev_ids=[b])
            else:
                key = "m.room.topic" if n != 2 else "m.room.name"
                b = room.send(M, key, {key.rsplit(".", 1)[1]: f"b{r}.{n}"}, state_key="", prev_ids=[b])
            plans["w2"].append(b)
        tip = room.send(A, "m.room.message", {"body": f"merge {r}"}, prev_ids=[a, b])
        plans["w2" if r % 2 == 0 else "w1"].append(tip)
    return room, {w: [[e, json.dumps(room.pdu(e)), list(room.pdu(e)["prev_events"])] for e in order]
                  for w, order in plans.items()}


def test_two_writer_processes_one_room(pg_url, tmp_path):
    room, plans = build_room()
    assert room.rejected  # Eve's messages after the ban
    procs = []
    for writer, plan in plans.items():
        path = tmp_path / f"{writer}.json"
        path.write_text(json.dumps(plan))
        env = dict(os.environ, DATABASE_URL=pg_url, INSTANCE_NAME=writer, STREAM_WRITERS=WRITERS, PYTHONUNBUFFERED="1")
        env.pop("REDIS_URL", None)
        procs.append(subprocess.Popen([sys.executable, "-m", "tests.rooms.storage.persist_process", str(path)],
                                      cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"writer failed ({proc.returncode}):\n{out}\n{err[-3000:]}"

    assert {w for (w,) in rows("SELECT DISTINCT instance_name FROM events")} == {"w1", "w2"}
    # the case a read by group ID gets wrong is there: a group whose parent has the larger ID
    # (w1's pool below w2's, or the other way), both holding rows (the chain must be read by
    # position to pick the child's)
    inverted = rows("SELECT count(*) FROM state_group_edges e WHERE e.prev_state_group > e.state_group "
                    "AND EXISTS (SELECT 1 FROM state_groups_state s WHERE s.state_group = e.state_group) "
                    "AND EXISTS (SELECT 1 FROM state_groups_state p WHERE p.state_group = e.prev_state_group)")
    assert inverted[0][0] > 0

    storage_caches().forget()  # read everything back from the database, as a third process would
    wrong = {e: state_at_event(e) for e in room.order if state_at_event(e) != room.state_after[e]}
    assert not wrong, sorted(wrong)[:5]
    assert current_state(room.room_id) == room.state_after[room.order[-1]]
    assert {e for (e,) in rows("SELECT event_id FROM events WHERE rejected")} == set(room.rejected)
