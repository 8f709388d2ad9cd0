"""The persist path's planner, by value: events and a snapshot in, rows out, no database.

Rooms are built by ``rooms.matrix.room_builder.RoomBuilder`` (real PDUs, the core's own
verdicts and states, themselves checked against Synapse in tests/rooms/matrix/); the
planner must produce the rows those verdicts and states imply. ``MemoryStore`` plays the
database: it keeps what earlier plans decided as the next batch's snapshot.
"""
from __future__ import annotations

import json
from typing import Any, Callable

from rooms.matrix.room_builder import RoomBuilder
from rooms.matrix.room_versions import KNOWN_ROOM_VERSIONS
from rooms.storage.authorization import MatrixEvents, ResolvedStates, RoomAuthChains, RoomInfos
from rooms.storage.incoming_events import IncomingEvent, ParsedEvent, StateMap, parse_events
from rooms.storage.plan import CurrentStateRow, ExOutlierRow, Plan, RedactionRow, VisibilityRangeRow
from rooms.storage.plan_progress import Progress
from rooms.storage.plan_snapshot import KnownEvent, RoomContext, Snapshot
from rooms.storage.planner import plan_batch
from rooms.storage.state_deltas import GroupLineage
from rooms.storage.state_groups import NewGroup, plan_group
from rooms.storage.visibility_ranges import SHARED_ERAS, RangeSet

A, B, M = "@alice:a.example", "@bob:a.example", "@mallory:b.example"
MEMBER = "m.room.member"


class MemoryRoomInfos(RoomInfos):
    """Room versions from the create events planned so far (no database to ask)."""

    def __call__(self, body: dict):
        return self.get(body.get("room_id"))

    def created(self, room_id: str, info) -> None:
        self._d.setdefault(room_id, info)

    def load(self, room_ids, cursor=None) -> None:
        return None


class MemoryMatrixEvents(MatrixEvents):
    """The core's events over a dict standing for the ``events`` table: the persist path's
    cache keeps state events only and reads a miss (a redaction's stored target, a message)
    from the table."""

    def __init__(self, rooms: RoomInfos) -> None:
        super().__init__(rooms)
        self.table: dict[str, tuple] = {}

    def add(self, event, rejected: bool) -> None:
        super().add(event, rejected)
        self.table[event.event_id] = (event, rejected)

    def entry(self, event_id: str):
        return super().entry(event_id) or self.table.get(event_id)


class MemoryReader:
    """The planner's reader over dicts: group states, chain lengths, event facts."""

    def __init__(self, rooms: RoomInfos) -> None:
        self.matrix = MemoryMatrixEvents(rooms)  # no cursor: the events planned so far
        self.resolved = ResolvedStates()
        self.chains = RoomAuthChains().batch(stored=False)  # no database: the rooms' auth graphs as planned so far
        self.lineage = GroupLineage()  # the planned groups' parents and deltas
        self.groups: dict[int, StateMap] = {}
        self.lengths: dict[int, int] = {}
        self.facts: dict[str, tuple[str | None, str | None]] = {}
        #: groups whose state the planner handed over (the database reader caches them) and
        #: the others it asked for (the database reader would read them from the tables)
        self.remembered: set[int] = set()
        self.reads: list[int] = []

    def state_of_group(self, group: int) -> StateMap:
        if group not in self.remembered:
            self.reads.append(group)
        return self.groups[group]

    def chain_length(self, group: int) -> int:
        return self.lengths[group]

    def new_group(self, gid: int, *, room_id: str, event_id: str, parent: int | None,
                  parent_chain_length: int | None, delta: StateMap, full_state: Callable[[], StateMap]) -> NewGroup:
        g = plan_group(gid, room_id=room_id, event_id=event_id, parent=parent,
                       parent_chain_length=parent_chain_length, delta=delta, full_state=full_state)
        self.groups[g.id] = {**(self.groups[g.parent] if g.parent is not None else {}), **g.rows}
        self.lengths[g.id] = g.chain_length
        return g

    def remember_state(self, group: int, state: StateMap) -> None:
        assert self.groups[group] == state
        self.remembered.add(group)

    def load_facts(self, event_ids) -> None:
        # facts of other events (power levels, ...) are (None, None): only planned events may be asked
        missing = [e for e in event_ids if e not in self.facts and e not in self.matrix.table]
        assert not missing, f"facts asked of events never planned: {missing}"

    def put_facts(self, event_id: str, membership: str | None, visibility: str | None) -> None:
        self.facts[event_id] = (membership, visibility)

    def membership(self, event_id: str | None) -> str | None:
        return None if event_id is None else self.facts.get(event_id, (None, None))[0]

    def visibility(self, event_id: str | None) -> str:
        return "shared" if event_id is None else self.facts.get(event_id, (None, None))[1] or "shared"

    def delta(self, unused_group_ids: list[int]) -> None:
        return None  # the dicts are the "database" and the caches at once


class MemoryStore:
    """Plans batches one after the other, keeping what the database would: stored events,
    room contexts, group states."""

    def __init__(self) -> None:
        self.room_infos = MemoryRoomInfos()
        self.reader = MemoryReader(self.room_infos)
        self.known: dict[str, KnownEvent] = {}
        self.rooms: dict[str, RoomContext] = {}
        self.next_stream = 1
        self.next_group = 101

    def plan(self, *items: Any, backfill: bool = False) -> Plan:
        events, ids, snapshot = self.snapshot_for(*items)
        plan = plan_batch(events, ids, snapshot, self.reader, backfill=backfill, now_ms=1)
        assert [g.id for g in plan.state_groups] == snapshot.group_ids[:plan.group_ids_used]
        self.next_group += plan.group_ids_used
        self.rooms.update({ctx.room_id: ctx for ctx in plan.rooms_after})
        for ev in plan.decided:
            self.known[ev.event_id] = KnownEvent(ev.event_id, ev.room_id, ev.topological_ordering,
                                                 ev.stream_ordering, ev.outlier, bool(ev.rejected_reason),
                                                 ev.state_group_after)
        return plan

    def progress(self, *items: Any, backfill: bool = False) -> Progress:
        """The planner's working state for a batch, before any step (to run steps one by one)."""
        events, _, snapshot = self.snapshot_for(*items)
        return Progress.start(events, snapshot, self.reader, backfill=backfill, now_ms=1)

    def snapshot_for(self, *items: Any) -> tuple[list[ParsedEvent], list[int], Snapshot]:
        """The batch's events, stream IDs and snapshot (as the loader would make them)."""
        events = parse_events(list(items), self.room_infos)
        ids = list(range(self.next_stream, self.next_stream + len(events)))
        self.next_stream += len(events)
        rooms = {}
        for room_id in sorted({ev.room_id for ev in events}):
            ctx = self.rooms.get(room_id)
            if ctx is None:
                ctx = RoomContext(room_id, info=self.room_infos.get(room_id))
                ctx.ranges[SHARED_ERAS] = RangeSet()
            ctx.info = self.room_infos.get(room_id)
            rooms[room_id] = ctx
        wanted = {ev.event_id for ev in events} | {p for ev in events for p in ev.prev_events} \
            | {ev.redacts for ev in events if ev.redacts} \
            | {e for ev in events if ev.state_before for e in ev.state_before.values()}
        snapshot = Snapshot(rooms=rooms, known={e: self.known[e] for e in wanted if e in self.known},
                            group_ids=list(range(self.next_group, self.next_group + 2 * len(events))))
        return events, ids, snapshot


def pdu(room: RoomBuilder, event_id: str) -> bytes:
    return json.dumps(room.pdu(event_id), separators=(",", ":")).encode()


def new_room(version_id: str = "10", visibility: str | None = None) -> RoomBuilder:
    version = KNOWN_ROOM_VERSIONS[version_id]
    room = RoomBuilder(version, room_id=None if version.room_id_from_create_event else "!r:a.example")
    content = {"room_version": version_id}
    if not version.implicit_room_creator:
        content["creator"] = A
    room.send(A, "m.room.create", content, state_key="")
    room.send(A, MEMBER, {"membership": "join"}, state_key=A)
    room.send(A, "m.room.power_levels", {"users": {} if version.creators_have_infinite_power else {A: 100}},
              state_key="")
    room.send(A, "m.room.join_rules", {"join_rule": "public"}, state_key="")
    if visibility is not None:
        room.send(A, "m.room.history_visibility", {"history_visibility": visibility}, state_key="")
    return room


def group_of(plan: Plan, event_id: str) -> int:
    (group,) = [g for e, g in plan.event_to_state_groups if e == event_id]
    return group


def current_rows(plan: Plan) -> dict[tuple[str, str], str | None]:
    return {(r.type, r.state_key): r.event_id for r in plan.current_state}


def test_a_fork_is_resolved_into_a_new_group_and_current_state():
    """Ban vs a longer branch (state resolution v2): the ban wins at the merge, in the group
    before the merge and in current state, whatever the branch lengths."""
    room = new_room()
    room.send(M, MEMBER, {"membership": "join"}, state_key=M)
    start = room.send(M, "m.room.message", {"body": "start"})
    ban = room.send(A, MEMBER, {"membership": "ban"}, state_key=M, prev_ids=[start])
    last = start
    for n in range(4):
        last = room.send(M, "m.room.message", {"body": f"chat {n}"}, prev_ids=[last])
    merge = room.send(A, "m.room.message", {"body": "merge"}, prev_ids=[ban, last])
    assert room.state_after[merge][(MEMBER, M)] == ban

    store = MemoryStore()
    plan = store.plan(*[pdu(room, e) for e in room.order])
    merge_ev_group = group_of(plan, merge)
    assert store.reader.groups[merge_ev_group] == room.state_after[merge]
    # the resolved state is a new group (a one-row delta of the latest prev's group)
    (resolved,) = [g for g in plan.state_groups if g.event_id == merge]
    assert resolved.rows == {(MEMBER, M): ban} and resolved.parent == group_of(plan, last)
    assert current_rows(plan)[(MEMBER, M)] == ban
    assert plan.forward_extremities == {room.room_id: [merge]}
    assert plan.rejections == []


def test_a_fork_reads_recent_states_from_the_current_one_not_the_reader():
    """A branch that starts a few state events back: its state before, and the state of the
    other branch's tip once current state is resolved, are the room's current state with the
    changes since undone (``remember_state`` checks each against the true group state); the
    reader is never asked for them."""
    room = new_room(visibility="shared")
    room.send(M, MEMBER, {"membership": "join"}, state_key=M)
    tip = room.send(A, "m.room.topic", {"topic": "t0"}, state_key="")
    store = MemoryStore()
    store.plan(*[pdu(room, e) for e in room.order])
    head = [room.send(A, "m.room.topic", {"topic": f"t{n}"}, state_key="") for n in (1, 2)]
    head.append(room.send(A, "m.room.name", {"name": "n"}, state_key=""))
    store.plan(*[pdu(room, e) for e in head])
    branch = room.send(M, "m.room.message", {"body": "from back then"}, prev_ids=[tip])
    side = room.send(A, MEMBER, {"membership": "leave"}, state_key=M, prev_ids=[branch])
    merge = room.send(A, "m.room.message", {"body": "merge"}, prev_ids=[head[-1], side])
    store.reader.reads.clear()
    plan = store.plan(*[pdu(room, e) for e in (branch, side, merge)])
    assert store.reader.reads == []
    for e in (branch, side, merge):
        assert store.reader.groups[group_of(plan, e)] == room.state_after[e], e
    assert current_rows(plan) == {(MEMBER, M): side}  # the rest of current state stays


def test_a_rejected_event_is_a_rejection_row_and_never_state():
    room = new_room()
    msg = room.send(A, "m.room.message", {"body": "hi"})
    # Mallory never joined: her topic change fails the auth rules
    topic = room.send(M, "m.room.topic", {"topic": "mine"}, state_key="")
    assert topic in room.rejected
    after = room.send(A, "m.room.message", {"body": "after"}, prev_ids=[topic])

    store = MemoryStore()
    plan = store.plan(*[pdu(room, e) for e in room.order])
    (rejection,) = plan.rejections
    assert rejection.event_id == topic and rejection.reason.startswith("auth_error")
    assert ("m.room.topic", "") not in current_rows(plan)
    assert all(g.event_id != topic for g in plan.state_groups)
    # the state after it is the state before it, for it and for what follows it
    assert group_of(plan, topic) == group_of(plan, msg) == group_of(plan, after)
    assert [e.values["rejected"] for e in plan.events if e.values["event_id"] == topic] == [True]
    assert topic not in {e for e, _, _ in plan.event_edges}
    # never an extremity: what cites only it leaves the event before it one as well
    assert plan.forward_extremities[room.room_id] == [msg, after]
    assert not any(r.start_topological == store.known[topic].topological_ordering
                   and r.end_topological == r.start_topological for r in plan.visibility_ranges)


def test_a_stored_outlier_sent_again_is_de_outliered():
    room = new_room()
    msg = room.send(A, "m.room.message", {"body": "hi"})
    store = MemoryStore()
    first = store.plan(*[pdu(room, e) for e in room.order[:-1]], IncomingEvent(pdu(room, msg), outlier=True))
    assert [r for r in first.event_to_state_groups if r[0] == msg] == []
    outlier = store.known[msg]
    assert outlier.outlier

    stream_id = store.next_stream
    plan = store.plan(pdu(room, msg))
    (row,) = plan.events
    assert row.values is None  # it keeps its events row ...
    (ex,) = plan.ex_outliers
    join_rules_group = store.known[room.order[-2]].state_group
    # ... and its stream ordering; the new stream position is the ex_outlier row's
    assert ex == ExOutlierRow(stream_id, msg, join_rules_group)
    assert store.known[msg].stream_ordering == outlier.stream_ordering
    assert plan.event_to_state_groups == [(msg, join_rules_group)]
    assert plan.event_edges == [(msg, room.order[-2], room.room_id)]
    assert plan.event_auth == [] and plan.chain_events == []  # written when it was stored


def test_a_redaction_prunes_a_stored_event_and_one_of_its_batch():
    room = new_room()
    room.send(B, MEMBER, {"membership": "join"}, state_key=B)
    old = room.send(B, "m.room.message", {"body": "old"})
    store = MemoryStore()
    store.plan(*[pdu(room, e) for e in room.order])
    new = room.send(B, "m.room.message", {"body": "new"})
    r1 = room.send(A, "m.room.redaction", {}, extra={"redacts": old})
    r2 = room.send(A, "m.room.redaction", {}, extra={"redacts": new})
    plan = store.plan(*[pdu(room, e) for e in (new, r1, r2)])
    assert plan.redacted_stored == [old]
    assert plan.redactions == [RedactionRow(r1, old, 1), RedactionRow(r2, new, 1)]
    assert [e.values["redacted"] for e in plan.events] == [True, False, False]


def test_a_redaction_without_power_from_another_server_prunes_nothing():
    room = new_room()
    room.send(B, MEMBER, {"membership": "join"}, state_key=B)
    room.send(M, MEMBER, {"membership": "join"}, state_key=M)
    msg = room.send(B, "m.room.message", {"body": "mine"})
    redaction = room.send(M, "m.room.redaction", {}, extra={"redacts": msg})
    store = MemoryStore()
    plan = store.plan(*[pdu(room, e) for e in room.order])
    assert redaction not in room.rejected  # accepted (v3+), but it does not take effect
    assert plan.redactions == [RedactionRow(redaction, msg, 1)]
    assert [e.values["redacted"] for e in plan.events if e.values["event_id"] == msg] == [False]


def test_visibility_ranges_follow_joins_under_joined_history():
    room = new_room(visibility="joined")
    before = room.send(A, "m.room.message", {"body": "before Bob"})
    join = room.send(B, MEMBER, {"membership": "join"}, state_key=B)
    room.send(A, "m.room.message", {"body": "for Bob"})
    store = MemoryStore()
    plan = store.plan(*[pdu(room, e) for e in room.order])
    ranges = {}
    for r in plan.visibility_ranges:
        ranges.setdefault(r.user_id, []).append(((r.start_topological, r.start_stream),
                                                 None if r.end_topological is None else (r.end_topological,
                                                                                         r.end_stream)))
    key = {e: store.known[e].key for e in room.order}
    hv = room.order[4]
    # from his join on, open; the shared era before the visibility change (the change
    # itself included) is *shared's, which the reads clip at his join: not copied to him
    assert ranges[B] == [(key[join], None)]
    assert ranges[SHARED_ERAS] == [(key[room.order[0]], key[hv])]
    assert ranges[A] == [(key[room.order[1]], None)]  # from her join (the create event: *shared before it)
    assert "*" not in ranges  # never world-readable
    assert not any(s <= key[before] and (e is None or key[before] <= e) for s, e in ranges[B])
    # Bob leaves: his range closes at his leave
    leave = room.send(B, MEMBER, {"membership": "leave"}, state_key=B)
    plan = store.plan(pdu(room, leave))
    assert [r for r in plan.visibility_ranges if r.user_id == B] == [
        VisibilityRangeRow(room.room_id, B, *key[join], *store.known[leave].key)]
    assert current_rows(plan) == {(MEMBER, B): leave}
    assert plan.current_state == [CurrentStateRow(room.room_id, MEMBER, B, leave, "leave",
                                                  store.known[leave].stream_ordering)]


def test_plan_batch_changes_neither_its_events_nor_its_snapshot():
    """A batch with a fork resolved, a rejected event and a redaction, planned twice from the
    same events and snapshot (as the persister plans again after a miss): the same rows and
    decisions both times, the events as parsed, the snapshot's room contexts as they were."""
    import copy

    room = new_room()
    room.send(M, MEMBER, {"membership": "join"}, state_key=M)
    said = room.send(M, "m.room.message", {"body": "said"})
    store = MemoryStore()
    store.plan(*[pdu(room, e) for e in room.order])
    done = len(room.order)
    ban = room.send(A, MEMBER, {"membership": "ban"}, state_key=M, prev_ids=[said])
    last = said
    for n in range(2):
        last = room.send(M, "m.room.message", {"body": f"chat {n}"}, prev_ids=[last])
    room.send(A, "m.room.message", {"body": "merge"}, prev_ids=[ban, last])
    room.send(B, "m.room.topic", {"topic": "never joined"}, state_key="")
    room.send(A, "m.room.redaction", {}, extra={"redacts": said})
    events, ids, snapshot = store.snapshot_for(*[pdu(room, e) for e in room.order[done:]])
    parsed = copy.deepcopy(events)
    rooms_before = copy.deepcopy(snapshot.rooms)

    def by_value(plan: Plan) -> dict:
        out = {k: v for k, v in vars(plan).items() if k not in ("rooms_after", "decided", "delta")}
        out["decided"] = [(e.event_id, e.stream_ordering, e.topological_ordering, e.state_group_before,
                           e.state_group_after, e.rejected_reason, e.redacted) for e in plan.decided]
        return out

    first = plan_batch(events, ids, snapshot, store.reader, backfill=False, now_ms=1)
    second = plan_batch(events, ids, snapshot, store.reader, backfill=False, now_ms=1)
    assert by_value(first) == by_value(second)
    assert first.rejections and first.redacted_stored == [said] and len(first.state_groups) >= 2
    assert [vars(e) for e in events] == [vars(e) for e in parsed]
    assert snapshot.rooms == rooms_before
    assert first.rooms_after[0] is not snapshot.rooms[room.room_id]
