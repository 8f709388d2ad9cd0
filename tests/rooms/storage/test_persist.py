"""The persist path on PostgreSQL: orderings, DAG, extremities, state, stream rows, bad input."""
from __future__ import annotations

import contextlib
import copy
import json

import pytest
from django.db import connection

from rooms.models import CurrentStateDelta, Event
from rooms.storage import BadEvent, IncomingEvent
from rooms.storage.persist import EventPersister, persister_for
from rooms.storage.synthetic import RoomBuilder
from tests.rooms.storage.helpers import ON_BOTH_DATABASES, store  # noqa: F401

pytestmark = ON_BOTH_DATABASES


def rows(sql, *params):
    with connection.cursor() as c:
        c.execute(sql, params)
        return c.fetchall()


def simple_room(room_id="!r:localhost"):
    b = RoomBuilder(room_id)
    evs = [b.create("@alice:localhost"), b.member("@alice:localhost", "join"),
           b.message("@alice:localhost", "hi"), b.member("@bob:localhost", "join"), b.message("@bob:localhost", "yo")]
    return b, evs


def test_persist_orders_links_and_maps_state(store):
    b, evs = simple_room()
    persisted = store.persist(*[raw for _, raw in evs])
    streams = [p.stream_ordering for p in persisted]
    assert streams == sorted(streams) and streams[0] > 0
    assert [p.topological_ordering for p in persisted] == [1, 2, 3, 4, 5]
    ids = [e for e, _ in evs]
    assert sorted(rows("SELECT event_id, prev_event_id FROM event_edges")) == sorted(zip(ids[1:], ids[:-1]))
    assert rows("SELECT event_id FROM event_forward_extremities") == [(ids[-1],)]
    assert rows("SELECT count(*) FROM event_backward_extremities") == [(0,)]
    # a state event makes a new group; a message keeps the group of the event before it
    groups = [p.state_group for p in persisted]
    assert groups[2] == groups[1] and groups[0] != groups[1] != groups[3] and groups[4] == groups[3]
    assert sorted(rows("SELECT type, state_key, event_id, membership FROM current_state_events")) == [
        ("m.room.create", "", ids[0], None), ("m.room.member", "@alice:localhost", ids[1], "join"),
        ("m.room.member", "@bob:localhost", ids[3], "join")]
    # the events stream got the ev rows and one state row per current-state change
    assert Event.objects.count() == 5
    assert sorted(CurrentStateDelta.objects.values_list("event_id", flat=True)) == sorted([ids[0], ids[1], ids[3]])
    assert rows("SELECT user_id, membership FROM room_memberships ORDER BY event_stream_ordering") == [
        ("@alice:localhost", "join"), ("@bob:localhost", "join")]


def test_event_bytes_are_stored_exactly(store):
    b = RoomBuilder("!odd:localhost")
    create_id, create = b.create("@a:localhost")
    raw = ('{"type":"m.room.message",  "room_id":"!odd:localhost","sender":"@a:localhost",'
           '"event_id":"$odd:localhost","prev_events":["%s"],"depth":2,'
           '"content":{"body":"\\u00e9\\ud83d\\ude00 caf\u00e9","n":123456789012345678901234567890,'
           '"z":1,"a":2.50}, "x": [ ]}' % create_id).encode()
    store.persist(create, raw)
    assert bytes(Event.objects.get(event_id="$odd:localhost").json) == raw


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.pop("room_id"), "room_id"),
    (lambda d: d.pop("sender"), "sender"),
    (lambda d: d.update(prev_events=["$nope:x"]), "unknown prev_events"),
    (lambda d: d.update(depth=-1), "depth"),
    (lambda d: d.update(content="x"), "content"),
])
def test_bad_event_writes_nothing(store, mutate, message):
    b, evs = simple_room()
    store.persist(*[raw for _, raw in evs])
    before = rows("SELECT count(*) FROM events")[0][0], rows("SELECT count(*) FROM state_groups")[0][0]
    good_id, good = b.message("@alice:localhost", "fine")
    _, bad = b.message("@alice:localhost", "bad")
    d = json.loads(bad)
    mutate(d)
    with pytest.raises(BadEvent, match=message):
        store.persist(good, json.dumps(d).encode())
    after = rows("SELECT count(*) FROM events")[0][0], rows("SELECT count(*) FROM state_groups")[0][0]
    assert after == before
    # the room still works: the good event persists on its own afterwards
    store.persist(good)
    assert rows("SELECT event_id FROM event_forward_extremities") == [(good_id,)]


def test_invalid_json_and_duplicates_rejected(store):
    b, evs = simple_room()
    with pytest.raises(BadEvent, match="invalid JSON"):
        store.persist(evs[0][1], b"{not json")
    with pytest.raises(BadEvent, match="invalid JSON"):
        store.persist(b'{"event_id": "$x", "depth": NaN}')
    assert rows("SELECT count(*) FROM events") == [(0,)]
    store.persist(evs[0][1])
    with pytest.raises(BadEvent, match="already stored"):
        store.persist(evs[0][1])
    with pytest.raises(BadEvent, match="duplicate event_id in the batch"):
        store.persist(evs[1][1], evs[1][1])
    assert rows("SELECT count(*) FROM events") == [(1,)]


def test_fork_and_merge_extremities(store):
    b, evs = simple_room()
    store.persist(*[raw for _, raw in evs])
    tip = evs[-1][0]
    a_id, a = b.event("m.room.message", "@alice:localhost", {"body": "a"}, prev=[tip])
    c_id, c = b.event("m.room.name", "@bob:localhost", {"name": "N"}, state_key="", prev=[tip])
    store.persist(a, c)
    assert sorted(rows("SELECT event_id FROM event_forward_extremities")) == sorted([(a_id,), (c_id,)])
    m_id, m = b.event("m.room.message", "@alice:localhost", {"body": "merge"}, prev=[a_id, c_id])
    store.persist(m)
    assert rows("SELECT event_id FROM event_forward_extremities") == [(m_id,)]
    assert rows("SELECT event_id FROM current_state_events WHERE type = 'm.room.name'") == [(c_id,)]


def test_late_stream_marks_a_fork_and_is_never_lowered(store):
    b, evs = simple_room()
    store.persist(*[raw for _, raw in evs])
    late = "SELECT late_stream FROM rooms WHERE room_id = '!r:localhost'"
    assert rows(late) == [(None,)]
    # a fork off the second event: depth 3, after an event at depth 5 in the stream
    _, fork = b.event("m.room.message", "@alice:localhost", {"body": "late"}, prev=[evs[1][0]])
    (stored,) = store.persist(fork)
    assert stored.topological_ordering == 3
    assert rows(late) == [(stored.stream_ordering,)]
    # another writer's higher mark survives this writer's next batch (its context predates it)
    with connection.cursor() as c:
        c.execute("UPDATE rooms SET late_stream = 10000000 WHERE room_id = '!r:localhost'")
    store.persist(b.message("@alice:localhost", "in order")[1])
    assert rows(late) == [(10000000,)]


def test_backfill_negative_orderings_and_backward_extremities(store):
    # the room as we joined it: state given, prev events unknown
    b = RoomBuilder("!bf:localhost")
    old = [b.create("@a:localhost"), b.member("@a:localhost", "join"), b.message("@a:localhost", "old1"),
           b.message("@a:localhost", "old2")]
    state = {("m.room.create", ""): old[0][0], ("m.room.member", "@a:localhost"): old[1][0]}
    new_id, new = b.message("@a:localhost", "new")
    with pytest.raises(BadEvent, match="state_before names events we do not have"):
        store.persist(IncomingEvent(new, state_before=state))
    # the state arrives with the join as outliers
    store.persist(*[IncomingEvent(raw, outlier=True) for _, raw in old[:2]])
    p0 = store.persist(IncomingEvent(new, state_before=state))
    assert rows("SELECT event_id FROM event_backward_extremities") == [(old[3][0],)]
    # backfill the older history, newest first as backfill delivers it
    p = store.persist(IncomingEvent(old[3][1], state_before=state), backfill=True)
    assert p[0].stream_ordering < 0
    p2 = store.persist(IncomingEvent(old[2][1], state_before=state), backfill=True)
    assert p2[0].stream_ordering < p[0].stream_ordering < 0  # negative and decreasing
    # history below the head, stored after the live event: marked at the last stream ordering
    assert rows("SELECT late_stream, last_stream FROM rooms")[0] == (p0[0].stream_ordering,) * 2
    assert rows("SELECT event_id FROM event_backward_extremities") == [(old[1][0],)]  # an outlier: still a gap
    # backfill changed neither the forward extremities nor the current state
    assert rows("SELECT event_id FROM event_forward_extremities") == [(new_id,)]
    ordered = rows("SELECT event_id FROM events WHERE NOT outlier ORDER BY topological_ordering, stream_ordering")
    assert [r[0] for r in ordered] == [e for e, _ in old[2:]] + [new_id]


def test_state_group_ids_stay_unique_after_a_rollback(store):
    """A rolled-back batch took state group ids (on SQLite from the ID table, inside the
    transaction, so the rollback gives them back): later batches must not reuse any of them."""
    b = RoomBuilder("!ids:localhost")
    store.persist(b.create("@a:localhost")[1], b.member("@a:localhost", "join")[1])
    many = [b.event("m.room.topic", "@a:localhost", {"topic": str(i)}, state_key=f"t{i}")[1] for i in range(80)]
    _, bad = b.event("m.room.message", "@a:localhost", {"body": "bad"}, advance=False)
    d = json.loads(bad)
    d.pop("sender")
    with pytest.raises(BadEvent):
        store.persist(*many, json.dumps(d))
    store.persist(*many)
    store.persist(*[b.event("m.room.topic", "@a:localhost", {"topic": str(i)}, state_key=f"u{i}")[1]
                    for i in range(80)])
    ids = [r[0] for r in rows("SELECT id FROM state_groups ORDER BY id")]
    assert len(ids) == len(set(ids)) == 2 + 80 + 80


def test_persist_inside_an_open_transaction(store):
    """On SQLite the stream IDs are reserved before the write transaction opens (one writer,
    the reservation commits on its own): persisting inside the caller's transaction is refused
    with the reason and writes nothing. PostgreSQL reserves on a connection of its own."""
    from django.db import transaction

    b = RoomBuilder("!tx:localhost")
    with transaction.atomic():
        if store.vendor == "sqlite":
            with pytest.raises(RuntimeError, match="reserve stream IDs before opening the transaction"):
                store.persist(b.create("@a:localhost")[1])
        else:
            store.persist(b.create("@a:localhost")[1])
    assert rows("SELECT count(*) FROM events") == [(0 if store.vendor == "sqlite" else 1,)]


def test_stream_rows_reach_the_replication_journal(store):
    """The ev and state rows are recorded for replication when the transaction completes, and
    the advance carries them."""
    from streams.notifier import WireJournal

    writer = store.runtime.writer("events")
    writer.journal = WireJournal()
    advances = []
    unsubscribe = store.runtime.notifier.subscribe(advances.append)
    b, evs = simple_room()
    try:
        persisted = store.persist(*[raw for _, raw in evs[:3]])
    finally:
        unsubscribe()
    facts = dict(fact for a in advances if a.stream_name == "events" for fact in a.facts)
    first = persisted[0]
    kinds = [row[0] for row in facts[first.stream_ordering]]
    assert kinds == ["ev", "state"]
    ev_row, state_row = facts[first.stream_ordering]
    assert ev_row[1][:4] == [first.event_id, "!r:localhost", "m.room.create", ""]
    assert state_row[1] == ["!r:localhost", "m.room.create", "", first.event_id]
    assert [row[0] for row in facts[persisted[2].stream_ordering]] == ["ev"]  # a message changes no state


def test_rejected_event_is_stored_but_changes_nothing(store):
    from rooms.storage.reads import room_messages, state_at_event

    b, evs = simple_room()
    store.persist(*[raw for _, raw in evs])
    rid, raw = b.event("m.room.name", "@bob:localhost", {"name": "evil"}, state_key="")
    store.persist(IncomingEvent(raw, rejected_reason="not allowed"))
    assert rows("SELECT rejected FROM events WHERE event_id = %s", rid) == [(True,)]
    assert rows("SELECT reason FROM rejections") == [("not allowed",)]
    assert ("m.room.name", "") not in state_at_event(rid)  # mapped to the state before it
    assert rows("SELECT count(*) FROM current_state_events WHERE type = 'm.room.name'") == [(0,)]
    assert rows("SELECT event_id FROM event_forward_extremities") == [(evs[-1][0],)]
    assert rid not in [e.event_id for e in room_messages("!r:localhost", "@alice:localhost", limit=50)["chunk"]]


@pytest.mark.parametrize("bulk_gc", ["freeze", "collect"])
def test_a_persister_set_to_freeze_moves_its_objects_out_of_the_collectors_way(store, bulk_gc):
    """``freeze_every`` (generate_rooms, the benchmark): after that many committed batches
    what is alive goes to the collector's permanent generation. The ``"freeze"`` way turns
    the automatic collector off with the first batch and freezes a cycle made before the
    freeze uncollected; the ``"collect"`` way raises the collector's thresholds and collects
    the cycle first. Off (the default), neither."""
    import gc
    import weakref

    from rooms.storage.persist import BULK_GC_THRESHOLD, EventPersister

    class Node:
        pass

    writer = store.runtime.writer("events")
    b, evs = simple_room()
    gc.unfreeze()
    thresholds = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    gc.enable()
    try:
        off = EventPersister()
        for _, raw in evs[:2]:
            off.persist([raw], writer, backfill=False)
        assert gc.get_freeze_count() == 0
        assert gc.get_threshold() == (700, 10, 10) and gc.isenabled()
        on = EventPersister(freeze_every=3)
        on.bulk_gc = bulk_gc
        on.persist([evs[2][1]], writer, backfill=False)
        if bulk_gc == "freeze":
            assert not gc.isenabled() and gc.get_threshold() == (700, 10, 10)
        else:
            assert gc.isenabled() and gc.get_threshold() == BULK_GC_THRESHOLD
        on.persist([evs[3][1]], writer, backfill=False)
        assert gc.get_freeze_count() == 0
        cycle = Node()
        cycle.me = cycle  # type: ignore[attr-defined]
        garbage = weakref.ref(cycle)
        del cycle
        on.persist([evs[4][1]], writer, backfill=False)
        assert gc.get_freeze_count() > 0
        assert (garbage() is not None) == (bulk_gc == "freeze")  # frozen uncollected, or collected
        with pytest.raises(ValueError, match="'freeze' or 'collect'"):
            on.bulk_gc = "sweep"
        on.end_bulk()  # the collector as it was before the first freeze; the frozen stay frozen
        assert gc.isenabled() and gc.get_threshold() == (700, 10, 10) and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.enable()
        gc.set_threshold(*thresholds)
    assert rows("SELECT count(*) FROM events") == [(5,)]


def test_scale_caches_multiplies_every_cache_bound_of_the_persister():
    """``bench_storage --cache-scale`` (a working set of 100,000 rooms): each cache of the
    persister holds ``factor`` times as much, none is left at its default."""
    from rooms.storage.persist import EventPersister

    p = EventPersister()
    before = (p.rooms.size, p.matrix.size, p.facts.size, p.state._states.size, p.state._chain_lengths.size,
              p.resolved._lru.size, p.chains.size)
    p.scale_caches(5)
    after = (p.rooms.size, p.matrix.size, p.facts.size, p.state._states.size, p.state._chain_lengths.size,
             p.resolved._lru.size, p.chains.size)
    assert after == tuple(5 * b for b in before)
    for bad in (0, -1, float("nan")):
        with pytest.raises(ValueError, match="above 0"):
            p.scale_caches(bad)
    assert p.matrix.size == 5 * before[1]  # a refused scale changes nothing


# -- a transaction that fails: the caches as they were ------------------------------------------

@contextlib.contextmanager
def failing_inserts(table: str):
    """Every insert into ``table`` fails in the database (a trigger), until the block ends."""
    with connection.cursor() as c:
        if connection.vendor == "sqlite":
            c.execute(f"CREATE TRIGGER fail_inserts BEFORE INSERT ON {table} BEGIN "
                      "SELECT RAISE(ABORT, 'injected failure'); END")
        else:
            c.execute("CREATE FUNCTION fail_inserts() RETURNS trigger LANGUAGE plpgsql AS "
                      "$$ BEGIN RAISE EXCEPTION 'injected failure'; END $$")
            c.execute(f"CREATE TRIGGER fail_inserts BEFORE INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION fail_inserts()")
    try:
        yield
    finally:
        with connection.cursor() as c:
            if connection.vendor == "sqlite":
                c.execute("DROP TRIGGER fail_inserts")
            else:
                c.execute(f"DROP TRIGGER fail_inserts ON {table}")
                c.execute("DROP FUNCTION fail_inserts()")


def cache_values(persister: EventPersister) -> dict:
    """Every cache of the persister, by value (deep-copied by the caller to compare)."""
    def context(ctx):
        return (ctx.head, ctx.last_stream, ctx.min_depth, ctx.current_group, ctx.current_chain, dict(ctx.current),
                list(ctx.undo), ctx.current_base, dict(ctx.memberships), set(ctx.invited), ctx.visibility,
                dict(ctx.forward), {u: (rs.as_tuples(), rs.stored) for u, rs in ctx.ranges.items()},
                dict(ctx.last_join), list(ctx.marks), ctx.info, ctx.late_stream)

    return {"state groups": persister.state.cached(), "event facts": persister.facts.cached(),
            "room infos": persister.room_infos.cached(), "matrix events": persister.matrix.cached(),
            "resolutions": persister.resolved.cached(), "auth chains": persister.chains.cached(),
            "lineage": persister.lineage.entries(),
            "room contexts": {r: context(ctx) for r, ctx in persister.rooms.cached().items()}}


def test_a_persist_failing_in_its_transaction_leaves_every_cache_as_it_was(store):
    """The database refuses a row of the batch (a trigger): the transaction rolls back, and
    every cache of the persister -- state groups and their ID pool, event facts, room
    versions, Matrix events, resolutions, auth chains, lineage, room contexts -- is what it
    was before the batch. The same batch then persists, to the Matrix core's states, and
    changes each of those caches (so the comparison above could fail)."""
    from tests.rooms.storage.test_matrix_persist import A, current_state, new_room, pdu_bytes

    B = "@bob:a.example"
    room = new_room("10")
    room.send(B, "m.room.member", {"membership": "join"}, state_key=B)
    fork_at = room.order[-1]
    a = room.send(A, "m.room.topic", {"topic": "a"}, state_key="", prev_ids=[fork_at])
    b = room.send(B, "m.room.name", {"name": "b"}, state_key="", prev_ids=[fork_at])
    room.send(A, "m.room.message", {"body": "merge"}, prev_ids=[a, b])
    store.persist(*[pdu_bytes(room, e) for e in room.order])  # committed: the caches warm, a fork resolved
    done = len(room.order)
    # the batch that fails: more state, a fork and its merge, a new room
    c = room.send(A, "m.room.history_visibility", {"history_visibility": "joined"}, state_key="")
    d = room.send(B, "m.room.topic", {"topic": "d"}, state_key="", prev_ids=[room.order[done - 1]])
    merge = room.send(A, "m.room.message", {"body": "merge again"}, prev_ids=[c, d])
    other = new_room("10", "!other:a.example")
    batch = [pdu_bytes(room, e) for e in room.order[done:]] + [pdu_bytes(other, e) for e in other.order]

    persister = persister_for(store.runtime)
    before = copy.deepcopy(cache_values(persister))
    with failing_inserts("event_edges"):
        with pytest.raises(Exception, match="injected failure"):
            store.persist(*batch)
    assert cache_values(persister) == before
    assert rows("SELECT count(*) FROM events WHERE event_id IN (%s, %s)", c, merge) == [(0,)]

    store.persist(*batch)
    assert current_state(room.room_id) == room.state_after[merge]
    assert current_state(other.room_id) == other.state_after[other.order[-1]]
    after = cache_values(persister)
    changed = {name for name in before if after[name] != before[name]}
    assert changed == set(before), set(before) - changed
