"""``/api/sync`` against a real Synapse's ``/sync`` for the same user on the same room history
(docs/storage.md, "Sync's answer").

Users drive the session's Synapse 1.163.2 (tests/interop/conftest.py) through the
client-server API: a room with joins, a topic, messages; then, after a position both systems
take after the same event, a burst with a topic change, a ban, a power-level change, a join
and more messages. The room's events are copied from Synapse's own tables (``event_json`` in
``stream_ordering`` order) into our store through the persist path, on PostgreSQL and on
SQLite. For the same user, initial syncs and incremental syncs from that position, with
timeline limits that make them limited or not, must give what Synapse's ``/sync`` gives: the
same timeline event IDs, the same ``limited``, and the same state event IDs in ``state``; for
the member banned in the gap, what Synapse gives under ``leave`` (nothing after the ban); for
the one who joined in it, the whole state (Synapse's newly joined room).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from rooms.storage.reads import get_event
from testing.synapse_homeserver import ClientApi, SynapseHomeserver
from tests.rooms.storage.helpers import ON_BOTH_DATABASES, store  # noqa: F401

pytestmark = [pytest.mark.slow, ON_BOTH_DATABASES]
AUTH = {"HTTP_AUTHORIZATION": "Bearer sync-state-token"}
#: initial syncs: limited (3) and the whole room (100); incremental: the gap's state changes
#: all before the timeline (3), some in it (8), the whole burst (100)
INITIAL_LIMITS = (3, 100)
INCREMENTAL_LIMITS = (3, 8, 100)
#: the banned member's incremental syncs: limited (2: the ban and the message before it) or not
BANNED_LIMITS = (2, 100)
#: the member who joined in the gap (Synapse's newly joined room: the whole state, limited;
#: its timeline is the room's latest events, here all after the join)
JOINER_LIMITS = (3, 8)


@dataclass
class History:
    room: str
    reader: ClientApi
    #: banned in the gap: Synapse answers their room under ``leave``, its state ending at the ban
    banned: ClientApi
    #: joined in the gap
    joiner: ClientApi
    #: the last event before the burst (both systems' ``since`` is the position after it)
    last_before: str
    #: Synapse's ``next_batch`` taken right after ``last_before``
    synapse_since: str
    ban: str
    topic: str
    power_levels: str
    join: str
    #: (kind, limit) -> Synapse's answer for the room: (timeline IDs, limited, state IDs)
    synapse: dict[tuple[str, int], tuple[list[str], bool, set[str]]]
    #: the room's PDUs as Synapse stored them, in its stream order
    pdus: list[bytes]


def synapse_room(answer: dict, room: str, section: str = "join") -> tuple[list[str], bool, set[str]]:
    joined = answer["rooms"][section][room]
    return ([e["event_id"] for e in joined["timeline"]["events"]], joined["timeline"]["limited"],
            {e["event_id"] for e in joined.get("state", {}).get("events", [])})


def our_room(answer: dict, room: str) -> tuple[list[str], bool, set[str]]:
    joined = answer["rooms"][room]
    return ([e["event_id"] for e in joined["timeline"]["events"]], joined["timeline"]["limited"],
            {e["event_id"] for e in joined["state"]["events"]})


@pytest.fixture(scope="module")
def history(synapse: SynapseHomeserver) -> History:
    """The traffic, Synapse's answers, and the room's events as Synapse stored them: made
    once, compared on both of our databases."""
    alice, bob = synapse.register("state_alice"), synapse.register("state_bob")
    carol, dave = synapse.register("state_carol"), synapse.register("state_dave")
    room = alice.create_room(name="sync state", preset="public_chat")
    bob.join(room)
    carol.join(room)
    alice.set_topic(room, "before the gap")
    for i in range(5):
        alice.send_message(room, f"before {i}")
    last_before = bob.send_message(room, "the last one before the gap")
    synapse_since = bob.sync(timeline_limit=1)["next_batch"]
    carol_since = carol.sync(timeline_limit=1)["next_batch"]
    dave_since = dave.sync(timeline_limit=1)["next_batch"]

    topic = alice.set_topic(room, "during the gap")
    alice.send_message(room, "gap 0")
    ban = alice.ban(room, carol.user_id, "spam")
    levels = alice.state(room, "m.room.power_levels")
    levels.setdefault("users", {})[bob.user_id] = 50
    power_levels = alice.set_state(room, "m.room.power_levels", levels)
    dave.join(room)
    join = dave.state_event_id(room, "m.room.member", dave.user_id)
    for i in range(3):
        bob.send_message(room, f"gap {i + 1}")
    for i in range(4):
        alice.send_message(room, f"after {i}")

    answers = {("initial", n): synapse_room(bob.sync(timeline_limit=n), room) for n in INITIAL_LIMITS}
    answers.update({("incremental", n): synapse_room(bob.sync(since=synapse_since, timeline_limit=n), room)
                    for n in INCREMENTAL_LIMITS})
    answers.update({("banned", n): synapse_room(carol.sync(since=carol_since, timeline_limit=n), room, "leave")
                    for n in BANNED_LIMITS})
    answers.update({("joiner", n): synapse_room(dave.sync(since=dave_since, timeline_limit=n), room)
                    for n in JOINER_LIMITS})
    pdus = [bytes(raw, "utf-8") if isinstance(raw, str) else bytes(raw) for (raw,) in synapse.query(
        "SELECT j.json FROM events e JOIN event_json j USING (event_id) WHERE e.room_id = %s "
        "ORDER BY e.stream_ordering", room)]
    return History(room, bob, carol, dave, last_before, synapse_since, ban, topic, power_levels, join, answers, pdus)


def test_the_history_has_a_gap_with_state_changes(history):
    """The scenario, as Synapse answers it: a limited incremental sync whose state block holds
    the topic, the ban, the power levels and the join of the gap -- what the reader loses
    without a state block."""
    timeline, limited, state = history.synapse[("incremental", 3)]
    assert limited and len(timeline) == 3
    assert {history.topic, history.ban, history.power_levels, history.join} <= state
    assert not history.synapse[("incremental", 100)][1] and history.synapse[("initial", 3)][1]
    timeline, limited, state = history.synapse[("banned", 2)]
    assert limited and timeline[-1] == history.ban and state == {history.topic}
    timeline, limited, state = history.synapse[("joiner", 8)]
    assert limited and timeline[0] == history.join and history.power_levels in state


def test_our_sync_is_synapses(history, store, client, settings):
    settings.API_TOKEN = AUTH["HTTP_AUTHORIZATION"].split()[1]
    for pdu in history.pdus:  # one by one, in Synapse's stream order
        store.persist(pdu)
    since = get_event(history.last_before).token
    user = history.reader.user_id

    def ours(user: str = user, **params) -> tuple[list[str], bool, set[str]]:
        response = client.get("/api/sync", {"user_id": user, **params}, **AUTH)
        assert response.status_code == 200, response.content[:2000]
        return our_room(json.loads(response.content), history.room)

    for n in INITIAL_LIMITS:
        assert ours(limit=n) == history.synapse[("initial", n)], ("initial", n)
    for n in INCREMENTAL_LIMITS:
        assert ours(limit=n, since=str(since)) == history.synapse[("incremental", n)], ("incremental", n)
    for n in BANNED_LIMITS:  # nothing after the ban: the power levels and the join are not told
        assert ours(history.banned.user_id, limit=n, since=str(since)) == history.synapse[("banned", n)], \
            ("banned", n)
    for n in JOINER_LIMITS:  # the state from before the join is news to them
        assert ours(history.joiner.user_id, limit=n, since=str(since)) == history.synapse[("joiner", n)], \
            ("joiner", n)
