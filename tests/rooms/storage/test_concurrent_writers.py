"""Two event writers (``STREAM_WRITERS=events=w1,w2``, PostgreSQL: SQLite has one writer)
persisting branches of one room at the same time, each on its own connection: the state at
every event and the current state equal what the Matrix core computes for the room, whatever
interleaving the two transactions took (group IDs come from two pools, contexts go stale)."""
from __future__ import annotations

import json
import threading

import pytest
from django.db import connection, connections

from rooms.storage import persist_events
from rooms.storage.caches import storage_caches
from rooms.storage.reads import state_at_event
from streams.conf import stream_writers
from streams.runtime import StreamRuntime
from tests.rooms.storage.test_matrix_persist import A, E, M, current_state, new_room

pytestmark = pytest.mark.django_db(transaction=True)


def test_two_writers_persist_two_branches_at_once():
    storage_caches().forget()
    writers = stream_writers("events=w1,w2", vendor="postgresql")
    runtimes = [StreamRuntime(instance_name=n, writers=writers, using="default") for n in ("w1", "w2")]
    try:
        room = new_room("10")
        for user in (M, E):
            room.send(user, "m.room.member", {"membership": "join"}, state_key=user)
        base = room.order[-1]
        branch_a, branch_b = [], []
        tip = base
        for n in range(12):  # the admin: topics, a power change, a ban of Eve
            if n == 4:
                tip = room.send(A, "m.room.power_levels", {"users": {A: 100, M: 50}}, state_key="", prev_ids=[tip])
            elif n == 8:
                tip = room.send(A, "m.room.member", {"membership": "ban"}, state_key=E, prev_ids=[tip])
            else:
                tip = room.send(A, "m.room.topic", {"topic": f"a{n}"}, state_key="", prev_ids=[tip])
            branch_a.append(tip)
        tip = base
        for n in range(14):  # the others (a longer branch): chat, a topic by Mallory (level 0: rejected)
            sender = M if n % 2 else E
            if n == 5:
                tip = room.send(M, "m.room.topic", {"topic": "m"}, state_key="", prev_ids=[tip])
            else:
                tip = room.send(sender, "m.room.message", {"body": f"b{n}"}, prev_ids=[tip])
            branch_b.append(tip)
        merge = room.send(A, "m.room.message", {"body": "merge"}, prev_ids=[branch_a[-1], branch_b[-1]])
        after = room.send(M, "m.room.topic", {"topic": "by the new moderator"}, state_key="")

        def pdu(e):
            return json.dumps(room.pdu(e)).encode()

        persist_events([pdu(e) for e in room.order[:room.order.index(base) + 1]], runtime=runtimes[0])
        errors: list[BaseException] = []

        def write(rt, events):
            try:
                for e in events:
                    persist_events([pdu(e)], runtime=rt)
            except BaseException as exc:  # reported below
                errors.append(exc)
            finally:
                connections.close_all()

        threads = [threading.Thread(target=write, args=(rt, br)) for rt, br in zip(runtimes, (branch_a, branch_b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert not errors, errors
        # w1 builds on w2's merge: a group whose parent came from the other writer's pool
        persist_events([pdu(merge)], runtime=runtimes[1])
        persist_events([pdu(after)], runtime=runtimes[0])

        storage_caches().forget()
        for e in room.order:
            assert state_at_event(e) == room.state_after[e], e
        assert current_state(room.room_id) == room.state_after[after]
        with connection.cursor() as c:
            c.execute("SELECT event_id FROM events WHERE rejected")
            assert {r[0] for r in c.fetchall()} == set(room.rejected) and room.rejected
            c.execute("SELECT DISTINCT instance_name FROM events")
            assert {r[0] for r in c.fetchall()} == {"w1", "w2"}
    finally:
        for rt in runtimes:
            rt.close()
        storage_caches().forget()
