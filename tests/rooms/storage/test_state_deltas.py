"""Forks decided from the state groups' deltas (``state_deltas``) against the same decisions
from the whole maps: the keys the lineage names cover every key where the states differ, on
random group trees; and planning random rooms with forks and merges (real PDUs, state
resolution v2 and v2.1) gives exactly the rows it gives when every fork compares whole maps."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rooms.matrix.state_res import split, split_differing
from rooms.storage.state_deltas import GroupLineage, changes_between, keys_differing
from tests.rooms.matrix.test_generated_rooms import action, play, start_room
from tests.rooms.storage.test_planner import MemoryStore, pdu

KEYS = [("t", str(i)) for i in range(8)]

#: a group tree: each group's parent (an earlier group) and its delta (None removes a key)
tree = st.lists(
    st.tuples(st.integers(0, 1_000),
              st.dictionaries(st.sampled_from(KEYS), st.one_of(st.none(), st.sampled_from(["$a", "$b", "$c"])),
                              max_size=3)),
    min_size=1, max_size=40)


def build_tree(spec) -> tuple[GroupLineage, dict[int, dict]]:
    lineage = GroupLineage()
    states = {0: {k: "$root" for k in KEYS[:4]}}
    for i, (pick, delta) in enumerate(spec, start=1):
        parent = pick % i
        state = dict(states[parent])
        for k, v in delta.items():
            if v is None:
                state.pop(k, None)
            else:
                state[k] = v
        states[i] = state
        lineage.add(i, parent, delta)
    return lineage, states


@settings(max_examples=300, deadline=None)
@given(spec=tree, picks=st.lists(st.integers(0, 1_000), min_size=2, max_size=4))
def test_lineage_names_every_key_where_group_states_differ(spec, picks):
    lineage, states = build_tree(spec)
    groups = [p % len(states) for p in picks]
    keys = lineage.differing_keys(groups)
    assert keys is not None  # every group descends from group 0 here
    maps = [states[g] for g in groups]
    truth = keys_differing(maps)
    assert truth <= keys
    # and so the decisions taken from them are the whole maps' ones
    assert split_differing(maps, keys) == split(maps)[1]
    assert changes_between(maps[0], maps[1], keys) == changes_between(maps[0], maps[1], set(maps[0]) | set(maps[1]))


def test_lineage_without_a_common_ancestor_says_so():
    lineage = GroupLineage()
    batch = lineage.batch()
    batch.add(2, 1, {KEYS[0]: "$a"})
    batch.add(4, 3, {KEYS[0]: "$b"})
    assert batch.differing_keys([2, 1]) == {KEYS[0]}
    assert batch.differing_keys([2, 4]) is None and batch.differing_keys([2, None]) is None
    assert batch.differing_keys([2, 2]) == set()
    # a batch's groups are its own: a rolled-back one (never applied) leaves nothing
    assert lineage.differing_keys([2, 1]) is None and lineage.entries() == {}
    lineage.apply(batch.delta())  # once it commits they are everyone's
    assert lineage.differing_keys([2, 1]) == {KEYS[0]}
    assert lineage.unknown == 3  # the batch's two unanswered questions, and the one asked of it before


class WholeMaps(GroupLineage):
    """A lineage that never knows a common ancestor: every fork compares whole maps."""

    def differing_keys(self, groups):
        return None if len(set(groups)) > 1 else set()


class Counting(GroupLineage):
    """Counts the forks decided from deltas."""

    answered = 0

    def differing_keys(self, groups):
        keys = super().differing_keys(groups)
        if keys is not None and len(set(groups)) > 1:
            Counting.answered += 1
        return keys


def plan_both_ways(version_id: str, actions, batch: int) -> None:
    room = start_room(version_id)
    play(room, actions)
    deltas, whole = MemoryStore(), MemoryStore()
    deltas.reader.lineage, whole.reader.lineage = Counting(), WholeMaps()
    items = [pdu(room, e) for e in room.order]
    for i in range(0, len(items), batch):
        got = deltas.plan(*items[i:i + batch])
        want = whole.plan(*items[i:i + batch])
        assert got == want
    for event_id in room.order:  # and both are Matrix-correct (RoomBuilder's states are Synapse's)
        known = deltas.known[event_id]
        if not known.rejected:
            assert deltas.reader.groups[known.state_group] == room.state_after[event_id]
    for room_id, ctx in deltas.rooms.items():
        assert ctx.current == whole.rooms[room_id].current
        assert {u: r.as_tuples() for u, r in ctx.ranges.items()} == \
               {u: r.as_tuples() for u, r in whole.rooms[room_id].ranges.items()}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(version_id=st.sampled_from(["10", "12"]), actions=st.lists(action, min_size=10, max_size=40),
       batch=st.integers(1, 7))
def test_forks_decided_from_deltas_plan_what_whole_maps_plan(version_id, actions, batch):
    plan_both_ways(version_id, actions, batch)


def test_a_room_with_forks_and_merges_takes_the_delta_path():
    """Topic and power-level changes on two branches, merged (else the comparison above could
    pass without a fork ever decided from deltas)."""
    Counting.answered = 0
    actions = [(kind, s, (s + 1) % 4, shape, pick, [(1, 50)])
               for s, (kind, shape, pick) in enumerate([
                   ("topic", "extend", 0), ("topic", "fork", 1), ("power_levels", "extend", 2),
                   ("name", "fork", 3), ("topic", "merge", 0), ("message", "extend", 0),
                   ("topic", "fork", 2), ("ban", "extend", 1), ("name", "merge", 1)] * 3)]
    plan_both_ways("10", [(k, s % 4, t, sh, p, lv) for k, s, t, sh, p, lv in actions], 2)
    assert Counting.answered > 10
