"""The planner does no I/O: its reader's views hold no cursor, a miss raises ``NeedsData``,
and the persister reads exactly that and plans the batch again from the same snapshot.

Rooms are built by ``rooms.matrix.room_builder.RoomBuilder`` (real PDUs, the core's own
verdicts and states); what is persisted is checked against the core's states.
"""
from __future__ import annotations

import contextlib

import pytest
from django.db import transaction

from rooms.storage import IncomingEvent
from rooms.storage import persist as persist_module
from rooms.storage.authorization import MatrixEvents, ResolvedStates, RoomAuthChains, RoomInfos
from rooms.storage.incoming_events import parse_events
from rooms.storage.persist import EventPersister
from rooms.storage.plan_loader import BatchReader, EventFacts, load_needed, load_snapshot
from rooms.storage.plan_needs import AUTH_CHAINS, CHAIN_LENGTHS, EVENTS, FACTS, STATES, NeedsData
from rooms.storage.reads import state_at_event
from rooms.storage.sql import store_cursor
from rooms.storage.state_deltas import GroupLineage
from rooms.storage.state_groups import StateGroupStore
from tests.rooms.storage.helpers import ON_BOTH_DATABASES, rows, store  # noqa: F401
from tests.rooms.storage.test_matrix_persist import A, M, current_state, new_room, pdu_bytes

B, C = "@bob:a.example", "@carol:b.example"
MEMBER = "m.room.member"


class Refusing:
    """A cursor that fails the test on any use while the planner runs."""

    def __init__(self, cursor, planning: list[bool]) -> None:
        self._cursor = cursor
        self._planning = planning

    def __getattr__(self, name):
        if self._planning[0] and name != "vendor":
            raise AssertionError(f"the planner used the cursor ({name})")
        return getattr(self._cursor, name)


@pytest.fixture
def planner_refuses_io(monkeypatch):
    """Every persist from now on: a cursor that raises while ``plan_batch`` runs; returns the
    number of plans made (a list, to read after)."""
    planning = [False]
    plans = [0]
    real_store_cursor, real_plan_batch = persist_module.store_cursor, persist_module.plan_batch

    @contextlib.contextmanager
    def refusing_cursor(using):
        with real_store_cursor(using) as cur:
            yield Refusing(cur, planning)

    def plan_batch(*args, **kwargs):
        planning[0] = True
        plans[0] += 1
        try:
            return real_plan_batch(*args, **kwargs)
        finally:
            planning[0] = False

    monkeypatch.setattr(persist_module, "store_cursor", refusing_cursor)
    monkeypatch.setattr(persist_module, "plan_batch", plan_batch)
    return plans


@ON_BOTH_DATABASES
def test_the_planner_uses_no_cursor_over_forks_backfill_outliers_rejections_and_redactions(store, planner_refuses_io):
    """Batches with a fork resolved (a ban against a longer branch), a rejected event, a
    redaction of a stored event, an outlier later de-outliered, an event sent with its
    ``state_before`` and a backfilled one -- persisted by a cold persister (every cache
    empty, so its plans miss and are planned again) and a warm one, with a cursor that
    fails the test if anything touches it while a plan is made. The states stored are the
    core's."""
    writer = store.runtime.writer("events")
    warm, cold = EventPersister(), EventPersister()
    room = new_room("10")
    room.send(B, MEMBER, {"membership": "join"}, state_key=B)
    room.send(M, MEMBER, {"membership": "join"}, state_key=M)
    stored = room.send(B, "m.room.message", {"body": "to be redacted"})
    warm.persist([pdu_bytes(room, e) for e in room.order], writer, backfill=False)

    # a fork: Mallory's longer branch against her ban, merged; a rejected topic (Carol never
    # joined); a redaction of a stored message
    start = room.send(M, "m.room.message", {"body": "start"})
    ban = room.send(A, MEMBER, {"membership": "ban"}, state_key=M, prev_ids=[start])
    last = start
    for n in range(3):
        last = room.send(M, "m.room.message", {"body": f"chat {n}"}, prev_ids=[last])
    merge = room.send(A, "m.room.message", {"body": "merge"}, prev_ids=[ban, last])
    topic = room.send(C, "m.room.topic", {"topic": "mine"}, state_key="")
    redaction = room.send(A, "m.room.redaction", {}, extra={"redacts": stored})
    done = room.order.index(start)
    cold.persist([pdu_bytes(room, e) for e in room.order[done:]], writer, backfill=False)
    assert topic in room.rejected and rows("SELECT rejected FROM events WHERE event_id = %s", topic) == [(True,)]
    assert rows("SELECT redacted FROM events WHERE event_id = %s", stored) == [(True,)]
    assert rows("SELECT redacts FROM redactions WHERE event_id = %s", redaction) == [(stored,)]
    assert rows("SELECT count(*) FROM event_edges WHERE event_id = %s", merge) == [(2,)]
    assert cold.replans > 0  # its caches were empty: it missed, read and planned again

    # an outlier, then the same event as a full one (de-outliered), with the state before it
    # sent (its prev is not stored); then the event between them, backfilled
    gap = room.send(B, "m.room.message", {"body": "gap"})
    later = room.send(B, "m.room.message", {"body": "after the gap"})
    warm.persist([IncomingEvent(pdu_bytes(room, later), outlier=True)], writer, backfill=False)
    cold.persist([IncomingEvent(pdu_bytes(room, later), state_before=room.state_after[gap])], writer, backfill=False)
    EventPersister().persist([pdu_bytes(room, gap)], store.runtime.writer("backfill"), backfill=True)
    assert rows("SELECT outlier FROM events WHERE event_id = %s", later) == [(False,)]
    assert rows("SELECT stream_ordering < 0 FROM events WHERE event_id = %s", gap) == [(True,)]

    for e in room.order:
        if e not in room.rejected:
            assert state_at_event(e) == room.state_after[e], e
    assert current_state(room.room_id)[(MEMBER, M)] == ban
    assert planner_refuses_io[0] > 4  # every batch was planned (cold ones more than once)


def test_a_batch_view_with_nothing_loaded_names_what_it_misses_instead_of_reading():
    """The views hold no cursor: a stored group's state or chain length, a stored event's
    facts, a stored Matrix event, a room's stored auth chains -- each a ``NeedsData`` naming
    exactly what is missing; once loaded (here by hand, as the loader does) it is answered."""
    infos = RoomInfos()
    reader = BatchReader(StateGroupStore(), EventFacts(), MatrixEvents(infos), ResolvedStates(),
                         RoomAuthChains(), GroupLineage(), infos.batch("default"))
    for ask, kind, keys in [
        (lambda: reader.state_of_group(7), STATES, {7}),
        (lambda: reader.chain_length(7), CHAIN_LENGTHS, {7}),
        (lambda: reader.load_facts(["$m", "$n"]), FACTS, {"$m", "$n"}),
        (lambda: reader.matrix.get("$e"), EVENTS, {"$e"}),
        (lambda: reader.chains.index("!r"), AUTH_CHAINS, {"!r"}),
    ]:
        with pytest.raises(NeedsData) as needs:
            ask()
        assert (needs.value.kind, needs.value.keys) == (kind, keys)
    reader.state.loaded_states[7] = {(MEMBER, A): "$j"}
    reader.state.loaded_lengths[7] = 3
    reader.facts.learn("$m", "join", None)
    reader.facts.learn("$n", "leave", None)
    reader.matrix.absent.add("$e")  # looked for, not stored
    assert reader.state_of_group(7) == {(MEMBER, A): "$j"} and reader.chain_length(7) == 3
    reader.load_facts(["$m", "$n"])
    assert (reader.membership("$m"), reader.membership("$n")) == ("join", "leave")
    assert reader.matrix.get("$e") is None
    # a new plan of the batch keeps what was loaded and drops what the plan decided
    reader.put_facts("$own", "invite", None)
    reader.reset()
    assert reader.membership("$own") is None and reader.membership("$m") == "join"
    assert reader.chain_length(7) == 3


def plan_rows(plan):
    """A plan's rows and decisions, by value."""
    fields = {name: value for name, value in vars(plan).items() if name not in ("delta", "rooms_after", "decided")}
    fields["decided"] = [(ev.event_id, ev.stream_ordering, ev.topological_ordering, ev.state_group_before,
                          ev.state_group_after, ev.rejected_reason, ev.redacted) for ev in plan.decided]
    return fields


@ON_BOTH_DATABASES
@pytest.mark.parametrize("default_database", ["postgresql"], indirect=True)  # (the loads' SQL: tested on both above)
def test_a_plan_that_misses_reads_it_and_plans_again_to_the_warm_plans_rows(store, monkeypatch):
    """The same batch (a fork from a few events back and its merge, a member leaving, a
    redaction of a stored message, a history visibility change) planned by the persister
    that stored the room (warm caches) and by a cold one whose loader prefetches nothing:
    the cold plan misses stored states, chain lengths, facts and Matrix events, has each
    read and plans again, and its rows equal the warm plan's."""
    writer = store.runtime.writer("events")
    warm = EventPersister()
    room = new_room("10")
    for user in (B, M):
        room.send(user, MEMBER, {"membership": "join"}, state_key=user)
    room.send(A, "m.room.history_visibility", {"history_visibility": "shared"}, state_key="")
    said = room.send(B, "m.room.message", {"body": "said"})
    for n in range(3):
        room.send(A, "m.room.topic", {"topic": f"t{n}"}, state_key="")
    warm.persist([pdu_bytes(room, e) for e in room.order], writer, backfill=False)
    done = len(room.order)
    side = room.send(M, "m.room.message", {"body": "from back then"}, prev_ids=[said])
    leave = room.send(M, MEMBER, {"membership": "leave"}, state_key=M, prev_ids=[side])
    merge = room.send(A, "m.room.message", {"body": "merge"}, prev_ids=[room.order[done - 1], leave])
    room.send(A, "m.room.redaction", {}, extra={"redacts": said})
    room.send(A, "m.room.history_visibility", {"history_visibility": "joined"}, state_key="")
    items = [pdu_bytes(room, e) for e in room.order[done:]]
    assert merge in room.order

    def plan_with(persister, *, prefetch: bool):
        if not prefetch:
            monkeypatch.setattr("rooms.storage.plan_loader.prefetch", lambda *args, **kwargs: None)
        try:
            with transaction.atomic(), store_cursor() as cur:
                infos = persister.room_infos.batch("default")
                events = parse_events(items, infos)
                reader = BatchReader(persister.state, persister.facts, persister.matrix, persister.resolved,
                                     persister.chains, persister.lineage, infos)
                ids = list(range(10_000, 10_000 + len(events)))
                snapshot = load_snapshot(cur, reader, events, persister.rooms, list(range(5_000, 5_100)))
                return persister.plan(cur, reader, events, ids, snapshot, backfill=False, now_ms=1)
        finally:
            monkeypatch.undo()

    warm_plan = plan_with(warm, prefetch=True)
    cold = EventPersister()
    cold_plan = plan_with(cold, prefetch=False)
    assert set(cold.replan_kinds) >= {STATES, CHAIN_LENGTHS, EVENTS, AUTH_CHAINS}, cold.replan_kinds
    assert cold.replans == sum(cold.replan_kinds.values())
    assert warm.replans == 0
    assert plan_rows(cold_plan) == plan_rows(warm_plan)
    assert cold_plan.current_state and cold_plan.redactions and cold_plan.visibility_ranges


def test_load_needed_reads_with_more_auth_levels_each_time():
    """A walk of the auth graph misses level by level: the events it misses come with
    1, 3, 7, ... levels of their auth events on the first, second, third replan."""
    asked: list[int] = []

    class Matrix:
        def load(self, cursor, keys, auth_depth):
            asked.append(auth_depth)

    class Reader:
        matrix = Matrix()

    for replans in range(4):
        load_needed(None, Reader(), NeedsData(EVENTS, ["$e"]), replans)  # type: ignore[arg-type]
    assert asked == [0, 1, 3, 7]


def test_needs_data_names_a_kind_it_knows():
    with pytest.raises(ValueError, match="no such data"):
        NeedsData("tables", ["x"])
