"""The persist path's decisions (rooms/storage/authorization.py) by value, without a
database: an event's verdict from its auth events and the state before it, and the state at
a fork, on rooms built by the Matrix core's RoomBuilder (whose verdicts and states are checked
against Synapse in tests/rooms/matrix/)."""
from __future__ import annotations

import pytest

from rooms.matrix.room_builder import RoomBuilder
from rooms.matrix.room_versions import KNOWN_ROOM_VERSIONS
from rooms.storage.authorization import authorize, resolve_state
from rooms.storage.incoming_events import BadEvent
from tests.rooms.storage.test_matrix_persist import _random_actions


@pytest.mark.parametrize("version_id, seed", [("2", 11), ("10", 12), ("11", 13), ("12", 14), ("12", 15)])
def test_verdicts_and_fork_states_equal_the_cores(version_id, seed):
    from tests.rooms.matrix.test_generated_rooms import play, start_room

    room = start_room(version_id)
    play(room, _random_actions(seed, 60))
    rejected: set[str] = set()
    forks = 0
    for event_id in room.order:
        event = room.events[event_id]
        prevs = [room.state_after[p] for p in event.prev_event_ids]
        if len(prevs) > 1:
            forks += 1
            assert resolve_state(room.version, prevs, room.events, rejected) == room.state_before[event_id]
        before = room.state_before[event_id] if event.prev_event_ids else None
        reason = authorize(event, before, room.events, rejected)
        assert (reason is None) == (event_id not in room.rejected), (event_id, reason, room.rejected.get(event_id))
        if reason is not None:
            assert reason.startswith("auth_error: ")
            rejected.add(event_id)
    assert forks and rejected


def test_v1_forks_are_left_to_the_caller():
    room = RoomBuilder(KNOWN_ROOM_VERSIONS["1"], room_id="!v1:a")
    create = room.send("@a:a", "m.room.create", {"creator": "@a:a"}, state_key="")
    join = room.send("@a:a", "m.room.member", {"membership": "join"}, state_key="@a:a")
    t1 = room.send("@a:a", "m.room.topic", {"topic": "x"}, state_key="", prev_ids=[join])
    t2 = room.send("@a:a", "m.room.topic", {"topic": "y"}, state_key="", prev_ids=[join])
    assert create and resolve_state(room.version, [room.state_after[t1], room.state_after[t2]], room.events) is None


def test_an_unknown_auth_event_is_a_bad_event_not_a_verdict():
    room = RoomBuilder(KNOWN_ROOM_VERSIONS["10"], room_id="!u:a")
    room.send("@a:a", "m.room.create", {"creator": "@a:a", "room_version": "10"}, state_key="")
    join = room.send("@a:a", "m.room.member", {"membership": "join"}, state_key="@a:a")
    known = {e: ev for e, ev in room.events.items() if e != room.order[0]}  # the create is missing
    with pytest.raises(BadEvent, match="is not stored"):
        authorize(room.events[join], room.state_before[join], known, set())


# -- the persister's caches (the persist rate falls if they age out) ------------------------------

def _small_room(n_topics: int):
    room = RoomBuilder(KNOWN_ROOM_VERSIONS["10"], room_id="!c:a")
    room.send("@a:a", "m.room.create", {"creator": "@a:a", "room_version": "10"}, state_key="")
    room.send("@a:a", "m.room.member", {"membership": "join"}, state_key="@a:a")
    for i in range(n_topics):
        room.send("@a:a", "m.room.topic", {"topic": str(i)}, state_key="")
    room.send("@a:a", "m.room.message", {"body": "hi"})
    return room


def test_the_auth_event_cache_evicts_the_least_recently_used_not_the_oldest():
    from rooms.storage.authorization import MatrixEvents, RoomInfos

    room = _small_room(4)
    cache = MatrixEvents(RoomInfos(), size=3)
    create, join, *topics = [room.events[e] for e in room.order if room.events[e].is_state]
    cache.add(create, rejected=False)
    for topic in [join, *topics]:
        assert cache.get(create.event_id) is create  # read for every event of the room
        cache.add(topic, rejected=False)
    assert create.event_id in cache  # read just now: kept; the oldest topics went instead
    assert topics[0].event_id not in cache and len(cache) == 3


def test_messages_do_not_take_the_auth_event_caches_room():
    from rooms.storage.authorization import MatrixEvents, RoomInfos

    room = _small_room(1)
    cache = MatrixEvents(RoomInfos(), size=10)
    message = room.events[room.order[-1]]
    assert not message.is_state
    cache.add(room.events[room.order[0]], rejected=False)
    cache.add(message, rejected=False)
    assert message.event_id not in cache and len(cache) == 1


def test_an_auth_walk_asks_a_database_backed_mapping_for_each_frontier_at_once():
    from rooms.matrix.state_res import auth_closure

    room = _small_room(3)

    class Loading(dict):
        """Starts empty; ensure() 'loads' from the room, as MatrixEvents does from the table."""

        def __init__(self):
            super().__init__()
            self.calls: list[set[str]] = []

        def ensure(self, ids):
            self.calls.append(set(ids))
            self.update({e: room.events[e] for e in ids if e in room.events})

    events = Loading()
    last = room.order[-2]  # the last topic: its auth chain is the create and the join
    assert auth_closure([last], events) == {last, room.order[0], room.order[1]}
    assert events.calls[0] == {last} and len(events.calls) <= 3  # one call per level, not per event


def test_resolutions_are_cached_by_their_groups():
    from rooms.storage.authorization import ResolvedStates
    from rooms.storage.state_deltas import Resolution

    cache = ResolvedStates(size_keys=100)
    assert cache.get([1, 2]) is None
    state = {("m.room.topic", ""): "$t"}
    cache.put([2, 1], Resolution(state, 2, frozenset({("m.room.topic", "")})))
    got = cache.get([1, 2])
    assert got == (state, 2, {("m.room.topic", "")})
    # shared, not copied (the planner never changes a resolved state in place)
    assert cache.get([2, 1]).state is state and (cache.hits, cache.misses) == (2, 1)


def test_room_auth_chains_reload_once_then_walk_for_an_event_never_placed():
    """An event of a state set without a position (its auth event never arrives): the room's
    index is reloaded once, then the difference is walked -- and the same answer as the
    walk -- without reloading the room at every fork until RELOAD_AFTER transactions pass."""
    from types import SimpleNamespace

    from rooms.matrix.chain_index import IndexEvent
    from rooms.matrix.state_res import auth_difference
    from rooms.storage.authorization import RoomAuthChains

    def ev(event_id, key, *auth):
        return IndexEvent(event_id, key, "", auth)

    events = [ev("C", "create"), ev("P1", "pl", "C"), ev("P2", "pl", "C", "P1"), ev("X", "x", "C", "missing")]
    chains = RoomAuthChains()
    batch = chains.batch(stored=False)  # no database: a load starts from the transaction's events
    for e in events:
        batch.add("!r", e)
    walkable = {e.event_id: SimpleNamespace(auth_event_ids=e.auth_event_ids) for e in events}
    facts = batch.graph_facts("!r", walkable)
    indexed = [{("pl", ""): "P1"}, {("pl", ""): "P2"}]
    assert facts(indexed, None) == ({"P2"}, None) and (batch.loads, batch.walks) == (1, 0)
    unplaced = [{("pl", ""): "P1", ("x", ""): "X"}, {("pl", ""): "P2"}]
    want = auth_difference([set(s.values()) for s in unplaced], walkable)
    assert facts(unplaced, None) == (want, None) and (batch.loads, batch.walks) == (2, 1)
    assert facts(unplaced, None) == (want, None) and (batch.loads, batch.walks) == (2, 2)
    chains.apply(batch.delta())
    assert (chains.loads, chains.walks) == (2, 2) and "!r" in chains._rooms
    later = chains.batch(stored=False)
    for _ in range(RoomAuthChains.RELOAD_AFTER - 1):  # the throttle counts committed batches
        chains.apply(later.delta())
    facts = later.graph_facts("!r", walkable)
    assert facts(unplaced, None) == (want, None) and (later.loads, later.walks) == (1, 1)


def test_room_auth_chains_keep_their_bound_on_positions_as_rooms_load_grow_and_roll_back():
    """The index cache is bounded by the rooms' positions in all, kept as a running count:
    after loads, events added to cached rooms, evictions and a rolled-back batch (never
    applied: the cache as it was) it is the sum over the cached rooms, and never over the
    bound with two rooms or more."""
    from rooms.matrix.chain_index import IndexEvent
    from rooms.storage.authorization import RoomAuthChains

    chains = RoomAuthChains(size_positions=12)

    def exact() -> int:
        return sum(len(i.positions) for i in chains._rooms.values())

    for r in range(6):
        room = f"!r{r}"
        batch = chains.batch(stored=False)
        batch.add(room, IndexEvent(f"C{r}", "create", "", ()))
        batch.index(room)
        for i in range(3):  # grows while loaded
            batch.add(room, IndexEvent(f"M{r}.{i}", "member", f"@u{i}", (f"C{r}",)))
        before = chains.cached()
        if r == 4:  # room 4's transaction rolls back: its batch is never applied
            assert chains.cached() == before
            continue
        chains.apply(batch.delta())
        assert chains._positions == exact()
        assert len(chains._rooms) == 1 or exact() <= 12
    assert "!r4" not in chains._rooms and "!r5" in chains._rooms
    grow = chains.batch(stored=False)
    grow.add("!r5", IndexEvent("M5.x", "member", "@x", ("C5",)))
    assert "M5.x" not in chains._rooms["!r5"].positions  # the cached index is not the batch's
    chains.apply(grow.delta())
    assert "M5.x" in chains._rooms["!r5"].positions and chains._positions == exact()
    reload = chains.batch(stored=False)
    reload.index("!r5", reload=True)  # a reload replaces the room's index
    chains.apply(reload.delta())
    assert chains._positions == exact()
