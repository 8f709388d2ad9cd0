"""The planner's authorization and state step by value (``plan_room_state``): group states
from the room's context, where states differ, new groups on reserved IDs, the state before
and after an event, a fork's stand-in resolution, verdicts, redactions and current state."""
from __future__ import annotations

import pytest

from rooms.storage.incoming_events import MEMBER
from rooms.storage.plan_progress import Progress
from rooms.storage.plan_room_state import (
    authorize_event,
    current_ref,
    differing,
    new_group,
    recompute_current,
    redactions,
    resolve,
    state_after,
    state_before,
    state_of,
)
from rooms.storage.plan_snapshot import Extremity, PrevInfo, RoomContext, Snapshot
from rooms.storage.state_deltas import StateRef
from tests.rooms.storage.test_plan_orderings import ROOM, raw, stored_room
from tests.rooms.storage.test_planner import A, B, M, MemoryStore, new_room, pdu

CREATE, TOPIC, NAME = ("m.room.create", ""), ("m.room.topic", ""), ("m.room.name", "")


def progress_with(store: MemoryStore, ctx: RoomContext, *items: bytes, group_ids=(500, 501, 502)) -> Progress:
    events, _, _ = store.snapshot_for(*items)
    return Progress.start(events, Snapshot(rooms={ctx.room_id: ctx}, group_ids=list(group_ids)), store.reader,
                          backfill=False, now_ms=7)


def test_a_recent_groups_state_is_the_current_one_with_the_changes_since_undone():
    """Groups 1-4: the create, a topic, another topic, a name, each changed in place."""
    store = MemoryStore()
    ctx = RoomContext(ROOM, current_group=4, current={CREATE: "$c", TOPIC: "$t2", NAME: "$n"},
                      undo=[(1, TOPIC, None), (2, TOPIC, "$t1"), (3, NAME, None)])
    store.reader.groups.update({1: {CREATE: "$c"}, 2: {CREATE: "$c", TOPIC: "$t1"}, 3: {CREATE: "$c", TOPIC: "$t2"},
                                9: {CREATE: "$old"}})
    p = progress_with(store, ctx)
    assert state_of(p, ctx, 4) is ctx.current
    assert state_of(p, ctx, 3) == {CREATE: "$c", TOPIC: "$t2"}
    assert state_of(p, ctx, 2) == {CREATE: "$c", TOPIC: "$t1"}
    assert state_of(p, ctx, 1) == {CREATE: "$c"}
    assert set(p.rebuilt) == {1, 2, 3} and store.reader.remembered == {1, 2, 3}  # handed to the reader, not read
    assert state_of(p, ctx, 9) == {CREATE: "$old"} and store.reader.reads == [9]
    assert state_of(p, ctx, None) == {}


def test_states_differ_where_the_lineage_says_else_where_the_maps_do():
    store = MemoryStore()
    ctx = RoomContext(ROOM)
    p = progress_with(store, ctx)
    p.lineage.add(11, 10, {TOPIC: "$t"})
    p.lineage.add(12, 10, {NAME: "$n"})
    maps = [{CREATE: "$c", TOPIC: "$t", ("x", ""): "$same"}, {CREATE: "$c", NAME: "$n", ("x", ""): "$same"}]
    assert differing(p, [StateRef(11), StateRef(12, frozenset({("y", "")}))], maps) == {TOPIC, NAME, ("y", "")}
    assert differing(p, [StateRef(11), StateRef(99)], maps) == {TOPIC, NAME}  # no common ancestor: the maps
    assert current_ref(RoomContext(ROOM, current_group=4)) == StateRef(4)
    assert current_ref(RoomContext(ROOM, current_base=StateRef(5, frozenset({TOPIC})))) == StateRef(5, frozenset({TOPIC}))


def test_new_groups_take_the_reserved_ids_in_order_and_keep_their_state():
    store = MemoryStore()
    store.reader.groups[40] = {CREATE: "$c"}
    store.reader.lengths[40] = 1
    ctx = RoomContext(ROOM)
    p = progress_with(store, ctx, raw("$e", prev=["$c"], depth=2), group_ids=[500, 501])
    ev = p.events[0]
    g = new_group(p, ev, parent=None, parent_chain_length=None, delta={}, full_state={CREATE: "$c", TOPIC: "$t"})
    h = new_group(p, ev, parent=g.id, parent_chain_length=1, delta={NAME: "$n"},
                  full_state={CREATE: "$c", TOPIC: "$t", NAME: "$n"})
    assert (g.id, g.parent, g.rows, g.chain_length) == (500, None, {CREATE: "$c", TOPIC: "$t"}, 1)
    assert (h.id, h.parent, h.rows, h.chain_length) == (501, 500, {NAME: "$n"}, 2)
    assert p.groups == [g, h] and {500, 501} <= store.reader.remembered
    with pytest.raises(RuntimeError, match="reserved 2 state group IDs"):
        new_group(p, ev, parent=None, parent_chain_length=None, delta={}, full_state={})


def test_on_the_fast_path_a_fork_copies_the_current_state_before_changing_it():
    store = MemoryStore()
    cached = RoomContext(ROOM, head=(1, 1), current_group=40, current_chain=1, current={CREATE: "$c"})
    store.reader.groups[40] = {CREATE: "$c"}
    ctx = cached.fork()
    p = progress_with(store, ctx, raw("$t", prev=["$c"], depth=2, type="m.room.topic", state_key=""))
    ev = p.events[0]
    after, chain = state_after(p, ctx, ev, TOPIC, True, 40, 1, ctx.current)
    assert after is ctx.current and after == {CREATE: "$c", TOPIC: "$t"} and chain == 2
    assert cached.current == {CREATE: "$c"}  # the cached context is as it was
    assert ctx.undo == [(40, TOPIC, None)] and ev.state_group_after == 500
    assert p.groups[0].rows == {TOPIC: "$t"} and p.lineage.get(500).delta == {TOPIC: "$t"}
    # off the fast path: a copy of the state before, remembered as the group's
    before = {CREATE: "$c"}
    n = raw("$n", prev=["$c"], depth=2, type="m.room.name", state_key="")
    q = progress_with(store, RoomContext(ROOM), n, group_ids=[600])
    after, chain = state_after(q, q.rooms[ROOM], q.events[0], NAME, False, 40, 1, before)
    assert after == {CREATE: "$c", NAME: "$n"} and before == {CREATE: "$c"} and 600 in store.reader.remembered


def test_the_state_before_is_state_before_the_prevs_group_or_their_resolution():
    store = MemoryStore()
    store.reader.groups.update({40: {CREATE: "$c"}, 41: {CREATE: "$c", TOPIC: "$t"}, 42: {CREATE: "$c", NAME: "$n"}})
    store.reader.lengths.update({40: 1, 41: 2, 42: 2})
    ctx = RoomContext(ROOM, current_group=41, current_chain=2, current=dict(store.reader.groups[41]))
    p = progress_with(store, ctx, raw("$e", prev=["$a", "$b"], depth=3))
    ev = p.events[0]
    assert state_before(p, ctx, ev, []) == (None, None, {})
    assert state_before(p, ctx, ev, [PrevInfo((2, 2), 41, True)]) == (41, 2, ctx.current)
    assert state_before(p, ctx, ev, [PrevInfo((2, 2), 42, True)]) == (42, 2, {CREATE: "$c", NAME: "$n"})
    # two groups (a legacy room: the stand-in): the latest prev's state plus what only the other has
    group, chain, state = state_before(p, ctx, ev, [PrevInfo((2, 3), 41, True), PrevInfo((2, 2), 42, True)])
    assert state == {CREATE: "$c", TOPIC: "$t", NAME: "$n"} and (group, chain) == (500, 3)
    assert p.groups[0].parent == 41 and p.groups[0].rows == {NAME: "$n"}
    given = progress_with(store, ctx, raw("$g", prev=["$far"], depth=9))
    given.events[0].state_before = {CREATE: "$c", ("m.room.member", B): "$bj"}
    assert state_before(given, ctx, given.events[0], []) == (500, 1, {CREATE: "$c", ("m.room.member", B): "$bj"})


def test_the_stand_in_resolution_keeps_the_latest_prevs_state():
    store = MemoryStore()
    store.reader.groups.update({41: {CREATE: "$c", TOPIC: "$t1"}, 42: {CREATE: "$c", TOPIC: "$t2", NAME: "$n"}})
    ctx = RoomContext(ROOM)
    p = progress_with(store, ctx)
    res = resolve(p, ctx, [((3, 1), 41), ((2, 9), 42)])
    assert res.state == {CREATE: "$c", TOPIC: "$t1", NAME: "$n"} and res.base == 41 and res.keys == {NAME}


def test_verdicts_are_the_cores_and_the_batch_learns_its_state_events():
    room = new_room()
    bad = room.send(M, "m.room.topic", {"topic": "not yours"}, state_key="")  # never joined
    assert bad in room.rejected
    store = MemoryStore()
    store.plan(*[pdu(room, e) for e in room.order[:-1]])
    p = store.progress(pdu(room, bad))
    ev = p.events[0]
    authorize_event(p, ev, room.state_before[bad])
    assert ev.rejected_reason and ev.rejected_reason.startswith("auth_error")
    assert store.reader.matrix.entry(bad)[1] is True  # known as rejected to the events after it
    assert [e.event_id for e in store.reader.chains.added[ev.room_id]][-1] == bad


def test_redactions_prune_their_targets_in_the_room():
    store = stored_room()
    store.plan(raw("$stored", prev=["$j"]))
    p = store.progress(raw("$m", prev=["$stored"]), raw("$r1", prev=["$m"], type="m.room.redaction", redacts="$m"),
                       raw("$r2", prev=["$r1"], type="m.room.redaction", redacts="$stored"),
                       raw("$r3", prev=["$r2"], type="m.room.redaction", redacts="$elsewhere"))
    redactions(p)
    assert [r.event_id for r in p.redaction_rows] == ["$r1", "$r2", "$r3"]
    assert p.events[0].redacted and p.redacted_stored == ["$stored"]
    assert {r.received_ts for r in p.redaction_rows} == {1}


def test_current_state_after_a_merge_is_the_one_extremitys_and_its_rows_say_what_changed():
    store = MemoryStore()
    store.reader.groups.update({41: {CREATE: "$c", (MEMBER, A): "$aj"}, 42: {CREATE: "$c", (MEMBER, A): "$aj", TOPIC: "$t"}})
    store.reader.lengths.update({41: 2, 42: 3})
    store.reader.facts.update({"$aj": ("join", None), "$t": (None, None)})
    ctx = RoomContext(ROOM, head=(2, 2), current_group=41, current_chain=2, current=dict(store.reader.groups[41]),
                      memberships={A: "join"}, forward={"$x": Extremity((3, 3), 42)})
    p = progress_with(store, ctx, raw("$x", prev=["$c"], depth=3))
    ev = p.events[0]
    ev.stream_ordering = 3
    recompute_current(p, ctx, ev)
    assert ctx.current == {CREATE: "$c", (MEMBER, A): "$aj", TOPIC: "$t"} and (ctx.current_group, ctx.current_chain) == (42, 3)
    assert [(r.type, r.event_id) for r in p.current_rows.values()] == [("m.room.topic", "$t")]
    assert p.deltas["$x"] == [{"room_id": ROOM, "type": "m.room.topic", "state_key": "", "event_id": "$t",
                               "prev_event_id": None}]
