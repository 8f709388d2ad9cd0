"""The persist path runs the Matrix core: six findings as regressions.

Rooms are built by ``rooms.matrix.room_builder.RoomBuilder`` (real PDUs of each room
version: IDs per version, auth events, the verdict of the core, itself checked against
Synapse in tests/rooms/matrix/), then persisted as the JSON federation would carry; what
the store says (current state, state at events, rejections, visibility, redactions) must be
what the builder computed.
"""
from __future__ import annotations

import json
import random

import pandas as pd
import pytest

from jobs.topology import room_orderings
from rooms.matrix.event_redaction import redact
from rooms.matrix.room_builder import RoomBuilder
from rooms.matrix.room_versions import KNOWN_ROOM_VERSIONS
from rooms.storage import IncomingEvent, persist_events
from rooms.storage.reads import NotFound, get_event, room_messages, state_at_event
from rooms.storage.synthetic import RoomBuilder as LegacyBuilder
from streams.conf import stream_writers
from streams.runtime import StreamRuntime
from tests.rooms.storage.helpers import ON_BOTH_DATABASES, Store, rows, store  # noqa: F401

pytestmark = ON_BOTH_DATABASES

A, M, E = "@alice:a.example", "@mallory:a.example", "@eve:b.example"


def pdu_bytes(room: RoomBuilder, event_id: str) -> bytes:
    return json.dumps(room.pdu(event_id), separators=(",", ":")).encode()


def new_room(version_id: str, room_id: str = "!r:a.example") -> RoomBuilder:
    version = KNOWN_ROOM_VERSIONS[version_id]
    room = RoomBuilder(version, room_id=None if version.room_id_from_create_event else room_id)
    content = {"room_version": version_id}
    if not version.implicit_room_creator:
        content["creator"] = A
    room.send(A, "m.room.create", content, state_key="")
    room.send(A, "m.room.member", {"membership": "join"}, state_key=A)
    users = {} if version.creators_have_infinite_power else {A: 100}
    room.send(A, "m.room.power_levels", {"users": users}, state_key="")
    room.send(A, "m.room.join_rules", {"join_rule": "public"}, state_key="")
    return room


def persist_all(store, room: RoomBuilder, ids=None, **kw):
    return store.persist(*[pdu_bytes(room, e) for e in (ids or room.order)], **kw)


def current_state(room_id):
    return {(t, k): e for t, k, e in rows(
        "SELECT type, state_key, event_id FROM current_state_events WHERE room_id = %s", room_id)}


@pytest.mark.parametrize("version_id", ["2", "10", "12"])
def test_a_ban_is_not_undone_by_a_longer_fork(store, version_id):
    room = new_room(version_id)
    room.send(M, "m.room.member", {"membership": "join"}, state_key=M)
    start = room.send(M, "m.room.message", {"body": "start"})
    ban = room.send(A, "m.room.member", {"membership": "ban"}, state_key=M, prev_ids=[start])
    last = start
    for n in range(4):  # Mallory's branch is longer: deeper prev events
        last = room.send(M, "m.room.message", {"body": f"chat {n}"}, prev_ids=[last])
    merge = room.send(A, "m.room.message", {"body": "merge"}, prev_ids=[ban, last])
    after = room.send(A, "m.room.message", {"body": "after the merge"})
    # Mallory goes on citing her join as her authority: fine by its own auth events, not by
    # the state before it (spec step 5)
    stale = room.send(M, "m.room.message", {"body": "still here"}, prev_ids=[after],
                      auth_from=room.state_after[last])
    assert room.state_after[merge][("m.room.member", M)] == ban  # what the core (= Synapse) says
    assert stale in room.rejected
    persist_all(store, room)
    assert rows("SELECT rejected FROM events WHERE event_id = %s", stale) == [(True,)]

    assert state_at_event(merge)[("m.room.member", M)] == ban
    assert current_state(room.room_id) == room.state_after[after]
    assert rows("SELECT membership FROM current_state_events WHERE state_key = %s", M) == [("ban",)]
    seen = [r.event_id for r in room_messages(room.room_id, M, limit=50)["chunk"]]
    assert after not in seen and merge not in seen and ban in seen


@pytest.mark.parametrize("version_id", ["2", "10", "12"])
def test_a_powerless_remote_user_cannot_redact_the_admins_message(store, version_id):
    room = new_room(version_id)
    room.send(E, "m.room.member", {"membership": "join"}, state_key=E)
    admins = room.send(A, "m.room.message", {"body": "the rules"})
    evil = room.send(E, "m.room.redaction", {"redacts": admins, "reason": "x"}, extra={"redacts": admins})
    eves = room.send(E, "m.room.message", {"body": "spam"})
    fair = room.send(A, "m.room.redaction", {"redacts": eves}, extra={"redacts": eves})
    persist_all(store, room)

    assert json.loads(get_event(admins).json)["content"] == {"body": "the rules"}
    assert rows("SELECT redacted FROM events WHERE event_id = %s", admins) == [(False,)]
    assert json.loads(get_event(eves).json)["content"] == {}  # the admin's redaction does work
    rejected = {e for (e,) in rows("SELECT event_id FROM rejections")}
    # v1-2 decide it in the auth rules (rejected); from v3 it is accepted without effect
    assert (evil in rejected) == (evil in room.rejected) == (version_id == "2")
    assert fair not in rejected


@pytest.mark.parametrize("version_id", ["2", "10", "11", "12"])
def test_redaction_prunes_by_the_room_version(store, version_id):
    version = KNOWN_ROOM_VERSIONS[version_id]
    room = new_room(version_id)
    legacy = {"origin": "a.example", "membership": "join", "prev_state": []}
    msg = room.send(A, "m.room.message", {"body": "secret"}, extra=legacy)
    pl = room.send(A, "m.room.power_levels", {"users": room.events[room.order[2]].content["users"],
                                              "invite": 0, "kick": 50}, state_key="")
    for target in (msg, pl):
        room.send(A, "m.room.redaction", {"redacts": target}, extra={"redacts": target})
    persist_all(store, room)

    for target in (msg, pl):
        got = json.loads(get_event(target).json)
        want = redact(room.pdu(target), version)
        assert got["content"] == want["content"]
        assert {k for k in got if k not in ("unsigned", "event_id")} == \
            {k for k in want if k not in ("unsigned", "event_id")}
        assert got["event_id"] == target
        assert got["unsigned"]["redacted"] is True
    kept = set(json.loads(get_event(msg).json))
    assert ({"origin", "membership", "prev_state"} <= kept) == (version_id in ("2", "10"))
    assert ("invite" in json.loads(get_event(pl).json)["content"]) == (version_id in ("11", "12"))


def _two_writers(default_database):
    writers = stream_writers("events=w1,w2", vendor=default_database)
    return [Store(StreamRuntime(instance_name=n, writers=writers, using="default"), default_database)
            for n in ("w1", "w2")]


@pytest.mark.parametrize("order", ["w1 first", "w2 first"])
def test_state_at_event_is_the_same_whichever_writer_persisted_it(store, order):
    if store.vendor == "sqlite":
        stores = [store, store]  # one writer there: still two orders of persisting
    else:
        stores = _two_writers(store.vendor)
        if order == "w2 first":
            stores.reverse()
    try:
        room = new_room("10")
        first = room.send(A, "m.room.topic", {"topic": "one"}, state_key="")
        # each writer holds a pool of state-group IDs: the second writer's groups are numbered
        # past the first's, so a later group may well have a *smaller* ID than its parent
        stores[0].persist(*[pdu_bytes(room, e) for e in room.order[:3]])
        stores[1].persist(*[pdu_bytes(room, e) for e in room.order[3:]])
        topics = [first]
        for n in range(6):
            topics.append(room.send(A, "m.room.topic", {"topic": f"t{n}"}, state_key=""))
            stores[n % 2].persist(pdu_bytes(room, topics[-1]))
        for e in room.order:
            assert state_at_event(e) == room.state_after[e], e
        assert current_state(room.room_id) == room.state_after[topics[-1]]
    finally:
        if store.vendor != "sqlite":
            for s in stores:
                s.runtime.close()


def test_topological_ordering_is_the_events_own_depth_and_the_job_agrees(store):
    b = LegacyBuilder("!t:a.example")
    create_id, create = b.create(A)
    join_id, join = b.member(A, "join")
    # a remote server's depths need not be 1 + max(prev): Synapse orders by the depth given
    far_id, far = b.event("m.room.message", A, {"body": "deep"}, depth=40)
    next_id, nxt = b.message(A, "after")
    store.persist(create, join, far, nxt)
    stored = dict(rows("SELECT event_id, topological_ordering FROM events"))
    assert stored[far_id] == 40 and stored[next_id] == 41
    assert dict(rows("SELECT event_id, depth FROM events")) == stored
    # the ordering job recomputes exactly what persist stored: a handed-out t token keeps its meaning
    events = pd.DataFrame(rows("SELECT room_id, event_id, stream_ordering, "
                               "topological_ordering AS depth FROM events"),
                          columns=["room_id", "event_id", "stream_ordering", "depth"])
    events["depth"] = [json.loads(bytes(r[0]))["depth"] for r in
                       (rows("SELECT json FROM events WHERE event_id = %s", e)[0] for e in events["event_id"])]
    edges = pd.DataFrame(rows("SELECT room_id, event_id, prev_event_id FROM event_edges"),
                         columns=["room_id", "event_id", "prev_event_id"])
    recomputed = room_orderings(events, edges)
    assert dict(zip(recomputed["event_id"], recomputed["topological_ordering"])) == stored


def test_an_outlier_persisted_again_with_its_state_is_de_outliered(store):
    room = new_room("10")
    room.send(M, "m.room.member", {"membership": "join"}, state_key=M)
    topic = room.send(A, "m.room.topic", {"topic": "hello"}, state_key="")
    msg = room.send(M, "m.room.message", {"body": "hi"})
    persist_all(store, room, room.order[:-2])
    # the topic arrives first as an outlier (say, in the auth chain of something else)
    (outlier,) = store.persist(IncomingEvent(pdu_bytes(room, topic), outlier=True))
    assert rows("SELECT outlier FROM events WHERE event_id = %s", topic) == [(True,)]
    with pytest.raises(NotFound):
        get_event(topic, user_id=M)
    (again,) = store.persist(IncomingEvent(pdu_bytes(room, topic)))
    store.persist(pdu_bytes(room, msg))

    assert rows("SELECT outlier FROM events WHERE event_id = %s", topic) == [(False,)]
    assert rows("SELECT count(*) FROM events WHERE event_id = %s", topic) == [(1,)]
    assert again.stream_ordering == outlier.stream_ordering  # the event keeps its place
    assert state_at_event(topic) == room.state_after[topic]
    assert state_at_event(msg) == room.state_after[msg]
    assert get_event(topic, user_id=M).event_id == topic
    assert current_state(room.room_id) == room.state_after[msg]
    # workers hear of it: an ex-outlier row at a new position of the events stream
    ((ex_stream, group),) = rows("SELECT event_stream_ordering, state_group FROM ex_outlier_stream "
                                 "WHERE event_id = %s", topic)
    assert ex_stream > outlier.stream_ordering
    assert rows("SELECT state_group FROM event_to_state_groups WHERE event_id = %s", topic) == [(group,)]


@pytest.mark.parametrize("version_id", ["10", "12"])
def test_a_rejected_event_is_stored_but_never_state_nor_shown(store, version_id):
    from rooms.storage.reads import initial_sync, topological_events

    room = new_room(version_id)
    room.send(E, "m.room.member", {"membership": "join"}, state_key=E)
    topic = room.send(E, "m.room.topic", {"topic": "mine now"}, state_key="")  # level 0 < state_default 50
    after = room.send(A, "m.room.message", {"body": "still here"})
    assert topic in room.rejected
    persist_all(store, room)

    assert rows("SELECT rejected FROM events WHERE event_id = %s", topic) == [(True,)]
    (reason,) = rows("SELECT reason FROM rejections WHERE event_id = %s", topic)[0]
    assert reason.startswith("auth_error")
    assert ("m.room.topic", "") not in state_at_event(after) and ("m.room.topic", "") not in current_state(room.room_id)
    assert rows("SELECT count(*) FROM event_auth WHERE event_id = %s", topic)[0][0] == \
        len(room.events[topic].auth_event_ids)
    with pytest.raises(NotFound):
        get_event(topic)
    for user in (A, E):
        assert topic not in [r.event_id for r in room_messages(room.room_id, user, limit=50)["chunk"]]
        timeline = initial_sync(user)["rooms"][room.room_id]["timeline"]["events"]
        assert after in [r.event_id for r in timeline] and topic not in [r.event_id for r in timeline]
    assert topic not in [r.event_id for r in topological_events(room.room_id, limit=50)["chunk"]]


def _random_actions(seed: int, n: int) -> list:
    """What the core's hypothesis strategy draws (tests/rooms/matrix/test_generated_rooms.py),
    drawn from a seeded random instead: each test gets a fresh database."""
    from tests.rooms.matrix.test_generated_rooms import KINDS, LEVELS, USERS

    rng = random.Random(seed)
    return [(rng.choice(KINDS), rng.randrange(len(USERS)), rng.randrange(len(USERS)),
             rng.choice(["extend", "fork", "merge", "merge"]), rng.randrange(1001),
             [(rng.randrange(len(USERS)), rng.choice(LEVELS)) for _ in range(rng.randrange(4))])
            for _ in range(n)]


@pytest.mark.parametrize("version_id, seed", [("2", 1), ("10", 2), ("10", 3), ("11", 4), ("12", 5), ("12", 6)])
def test_generated_rooms_persist_to_the_cores_verdicts_and_states(store, version_id, seed):
    """Forks, merges, power changes, bans, kicks, join-rule changes, redactions, stale auth
    events, senders on three servers: persisted in random batch sizes, every verdict, the state
    at every event and the current state equal the core's (itself checked against Synapse)."""
    from rooms.matrix.state_res import resolve
    from tests.rooms.matrix.test_generated_rooms import play, start_room

    room = start_room(version_id)
    play(room, _random_actions(seed, 45))
    rng = random.Random(seed)
    i = 0
    while i < len(room.order):
        n = rng.randint(1, 8)
        persist_all(store, room, room.order[i:i + n])
        i += n
    assert {e for (e,) in rows("SELECT event_id FROM events WHERE rejected")} == set(room.rejected)
    assert room.rejected, "the actions should make some events fail"
    for e in room.order:
        assert state_at_event(e) == room.state_after[e], e
    accepted = [e for e in room.order if e not in room.rejected]
    children = {p for e in accepted for p in room.events[e].prev_event_ids}
    tips = [room.state_after[e] for e in accepted if e not in children]
    want = tips[0] if len(tips) == 1 else resolve(room.version, tips, room.events, room.rejected.keys())
    assert current_state(room.room_id) == want


@pytest.mark.parametrize("version_id", ["2", "10", "12"])
def test_reads_give_clients_the_event_id_of_hashed_id_events(store, version_id):
    from rooms.storage.reads import incremental_sync, initial_sync
    from rooms.storage.tokens import RoomStreamToken

    room = new_room(version_id)
    msg = room.send(A, "m.room.message", {"body": "hi"})
    persist_all(store, room, room.order[:-1])
    since = initial_sync(A)["next_batch"]
    persist_all(store, room, [msg])
    red = room.send(A, "m.room.redaction", {"redacts": msg}, extra={"redacts": msg})
    persist_all(store, room, [red])
    for row in [get_event(msg), get_event(red)] + room_messages(room.room_id, A, limit=50)["chunk"]:
        body = json.loads(row.json)
        assert body["event_id"] == row.event_id
        # the rest is the PDU as received (pruned, for the redacted message)
        assert {k: v for k, v in body.items() if k not in ("event_id", "unsigned")} == \
            {k: v for k, v in (redact(room.pdu(row.event_id), room.version) if row.event_id == msg
                               else room.pdu(row.event_id)).items() if k not in ("event_id", "unsigned")}
    new = incremental_sync(A, since)["rooms"][room.room_id]["timeline"]["events"]
    assert [json.loads(r.json)["event_id"] for r in new] == [r.event_id for r in new] and new
    assert isinstance(since, RoomStreamToken)


def _tampered(room: RoomBuilder, target: str, **changes) -> bytes:
    pdu = dict(room.pdu(target))
    pdu.update(changes)
    return json.dumps(pdu, separators=(",", ":")).encode()


@pytest.mark.parametrize("make, message", [
    (lambda room, e: _tampered(room, e, event_id="$mine:a.example"), "must not carry an event_id"),
    (lambda room, e: _tampered(room, e, auth_events="nope"), "auth_events must be a list"),
    (lambda room, e: _tampered(room, e, auth_events=["$unknown"] + room.pdu(e)["auth_events"]),
     "is not stored"),
    (lambda room, e: _tampered(room, e, room_id="!elsewhere:a.example"), "create event is not stored"),
])
def test_bad_pdus_in_an_authorized_room_write_nothing(store, make, message):
    from rooms.storage import BadEvent

    room = new_room("10")
    persist_all(store, room)
    msg = room.send(A, "m.room.message", {"body": "hi"})
    counts = rows("SELECT count(*) FROM events")[0][0], rows("SELECT count(*) FROM event_auth")[0][0]
    with pytest.raises(BadEvent, match=message):
        store.persist(pdu_bytes(room, msg), make(room, msg))
    assert (rows("SELECT count(*) FROM events")[0][0], rows("SELECT count(*) FROM event_auth")[0][0]) == counts
    store.persist(pdu_bytes(room, msg))  # the good one alone still goes in
    assert get_event(msg).event_id == msg


def test_a_content_hash_mismatch_is_stored_redacted(store):
    room = new_room("10")
    persist_all(store, room)
    msg = room.send(A, "m.room.message", {"body": "hi"})
    pdu = dict(room.pdu(msg), content={"body": "changed on the way"})  # same ID: content is redacted away
    store.persist(json.dumps(pdu).encode())
    assert rows("SELECT redacted FROM events WHERE event_id = %s", msg) == [(True,)]
    assert json.loads(get_event(msg).json)["content"] == {}


@pytest.mark.parametrize("version_id", ["10", "12"])
def test_persist_extends_the_chain_cover_index(store, version_id):
    """The persist path indexes every state event of an authorized room in its transaction
    (rejected ones too): the stored index is the one built at once from the same events."""
    from rooms.matrix.chain_index import IndexEvent, build, canonical

    room = new_room(version_id)
    room.send(M, "m.room.member", {"membership": "join"}, state_key=M)
    room.send(A, "m.room.topic", {"topic": "t1"}, state_key="")
    fork = room.send(M, "m.room.topic", {"topic": "mallory's"}, state_key="")  # rejected: no power
    room.send(A, "m.room.name", {"name": "n"}, state_key="", prev_ids=[room.order[-2]])
    room.send(A, "m.room.topic", {"topic": "t2"}, state_key="", prev_ids=[room.order[-1], fork])
    for i in range(0, len(room.order), 3):  # several batches
        persist_all(store, room, room.order[i:i + 3])
    state = [room.events[e] for e in room.order if room.events[e].is_state]
    expected = build(IndexEvent(e.event_id, e.type, e.state_key, e.auth_event_ids) for e in state)
    positions = rows("SELECT event_id, chain_id, sequence_number FROM event_auth_chains")
    links = rows("SELECT origin_chain_id, origin_sequence_number, target_chain_id, target_sequence_number "
                 "FROM event_auth_chain_links")
    assert len(positions) == len(state)
    assert canonical(positions, links) == canonical(
        [(e, c, s) for e, (c, s) in expected.positions.items()],
        [(oc, o, tc, t) for oc, d in expected.links.items() for tc, ps in d.items() for o, t in ps])


@pytest.mark.parametrize("version_id", ["10", "12"])
def test_forks_resolve_from_the_chain_cover_index_also_after_another_writer(store, version_id):
    """State resolution in the persist path reads the auth difference from the rooms' chain
    cover indexes (loaded once, then fed by each planned state event), never walking; a
    persister whose room index misses events another writer persisted reloads the room, and
    every state still equals the core's."""
    from rooms.storage.persist import EventPersister

    writer = store.runtime.writer("events")
    ours, theirs = EventPersister(), EventPersister()  # two processes' caches, one database
    room = new_room(version_id)

    def fork(sender_a, sender_b, n):
        tip = room.order[-1]
        a = room.send(A, "m.room.topic", {"topic": f"a{n}"}, state_key="", prev_ids=[tip])
        b = room.send(sender_b, "m.room.member", {"membership": "join"}, state_key=sender_b, prev_ids=[tip])
        return room.send(sender_a, "m.room.message", {"body": f"merge {n}"}, prev_ids=[a, b])

    def persist(persister, ids):
        persister.persist([pdu_bytes(room, e) for e in ids], writer, backfill=False)

    fork(A, M, 0)
    persist(ours, room.order)
    assert (ours.chains.loads, ours.chains.walks) == (1, 0)  # the room's index, loaded once
    done = len(room.order)
    fork(A, "@bob:a.example", 1)
    fork(M, "@carol:b.example", 2)
    persist(theirs, room.order[done:])  # another process: ours does not see these events
    done = len(room.order)
    fork(A, "@dave:b.example", 3)  # its state sets hold the other writer's events
    persist(ours, room.order[done:])
    assert (ours.chains.loads, ours.chains.walks) == (2, 0)  # reloaded once, then answered
    for e in room.order:
        assert state_at_event(e) == room.state_after[e], e
    assert current_state(room.room_id) == room.state_after[room.order[-1]]
    # and each auth difference the index gave equals the walk's
    from rooms.matrix.state_res import auth_difference

    index = ours.chains.room_index(room.room_id)
    assert index is not None
    for e in room.order:
        prevs = room.events[e].prev_event_ids
        if len(prevs) > 1:
            sets = [set(room.state_after[p].values()) for p in prevs]
            assert index.auth_difference(sets) == auth_difference(sets, room.events)


def test_a_cold_persister_reads_a_batchs_auth_events_and_chain_lengths_in_one_query_each(store, monkeypatch):
    """A persister whose caches are cold (a restarted writer, or rooms that aged out) reads
    what a batch needs in one query per kind: the stored auth events of all its events, the
    chain lengths of all its rooms' current groups -- not one round trip per event or room
    (at 100,000 rooms those round trips were a fifth of the build's time). The verdicts are
    the core's either way."""
    import contextlib

    from rooms.storage import persist as persist_module
    from rooms.storage.persist import EventPersister

    writer = store.runtime.writer("events")
    members = [f"@m{i}:a.example" for i in range(5)]
    rooms = [new_room("10", room_id=f"!r{n}:a.example") for n in range(3)]
    for room in rooms:
        for m in members:
            room.send(m, "m.room.member", {"membership": "join"}, state_key=m)
    EventPersister().persist([pdu_bytes(r, e) for r in rooms for e in r.order], writer, backfill=False)

    sent = []
    for room in rooms:
        for m in [A, *members]:
            sent.append(pdu_bytes(room, room.send(m, "m.room.message", {"body": f"hi from {m}"})))
    statements: list[str] = []
    real_store_cursor = persist_module.store_cursor

    class Counting:
        def __init__(self, cursor):
            self._cursor = cursor

        def execute(self, sql, *args, **kw):
            statements.append(sql)
            return self._cursor.execute(sql, *args, **kw)

        def __getattr__(self, name):
            return getattr(self._cursor, name)

    @contextlib.contextmanager
    def counting_cursor(using):
        with real_store_cursor(using) as cur:
            yield Counting(cur)

    monkeypatch.setattr(persist_module, "store_cursor", counting_cursor)
    cold = EventPersister()
    cold.persist(sent, writer, backfill=False)
    assert cold.matrix.loads == 1
    assert sum(s.startswith("SELECT event_id, room_id, json, rejected FROM events") for s in statements) == 1
    assert sum(s.startswith("SELECT id, chain_length FROM state_groups") for s in statements) == 1
    assert rows("SELECT count(*) FROM events WHERE rejected") == [(0,)]
    for room in rooms:
        assert current_state(room.room_id) == room.state_after[room.order[-1]]
