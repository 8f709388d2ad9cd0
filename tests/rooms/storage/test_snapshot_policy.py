"""The snapshot policy of state groups (base deltas): the state of every group is the
one a dict model gives, whatever the chain, on big and small states; no chain is longer than
100 groups; a big state is not written again every 100 groups, a small one still is."""
from __future__ import annotations

import itertools
import random

import pytest
from django.db import connection, transaction
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rooms.storage.plan_needs import NeedsData
from rooms.storage.plan_writer import write_state_groups
from rooms.storage.sql import fetch_all, is_sqlite, store_cursor
from rooms.storage.state_groups import _CHAIN, MAX_STATE_DELTA_HOPS, SNAPSHOT_FRACTION, StateGroupStore, plan_group, read_state
from tests.rooms.storage.helpers import ON_BOTH_DATABASES, store  # noqa: F401
from tests.rooms.storage.test_state_groups import build, check

ROOMS = itertools.count()

MEMBER = "m.room.member"


def member(i: int) -> tuple[str, str]:
    return (MEMBER, f"@u{i}:hs")


class Planning:
    """Groups planned as the persister plans them: on a batch view of ``store`` with IDs it
    reserved, applied to the store once written (:meth:`written`)."""

    def __init__(self, store: StateGroupStore, cur) -> None:
        self.store, self.cur = store, cur
        self._open()

    def _open(self) -> None:
        self.batch = self.store.batch()
        self.ids = self.store.reserve(self.cur, 64)
        self.used = 0

    def loading(self, ask):
        """``ask()`` on the batch view, what it misses read first (as the persister does)."""
        while True:
            try:
                return ask()
            except NeedsData as needs:
                self.batch.load(self.cur, needs)

    def new_group(self, **kwargs):
        g = self.loading(lambda: self.batch.new_group(self.ids[self.used], **kwargs))
        self.used += 1
        return g

    def chain_length(self, group: int) -> int:
        return self.loading(lambda: self.batch.chain_length(group))

    def written(self) -> None:
        self.store.apply(self.batch.delta(self.ids[self.used:]))
        self._open()


class Model:
    """Groups planned by :func:`plan_group` with a dict per group: the state every group must
    have (``expected``), and what was stored (parent, rows, chain length)."""

    def __init__(self, snapshot_of: bool = True, since: bool = True) -> None:
        self.expected: dict[int, dict] = {}
        self.parent: dict[int, int | None] = {}
        self.rows: dict[int, dict] = {}
        self.length: dict[int, int] = {}
        self.use_snapshot_of = snapshot_of
        self.give_since = since
        self.next_id = 0

    def snapshot_of(self, g: int) -> tuple[int, dict, dict | None]:
        """The snapshot, its state and (``since``) the chain's rows after it, as the store
        gives them from its cache; else None, as for a chain it has not cached."""
        chain = self.chain(g)
        since: dict = {}
        for h in reversed(chain[:-1]):
            since.update(self.rows[h])
        return chain[-1], self.rows[chain[-1]], since if self.give_since else None

    def add(self, parent: int | None, delta: dict) -> int:
        state = {**(self.expected[parent] if parent is not None else {}), **delta}
        self.next_id += 1
        g = plan_group(self.next_id, room_id="!r:hs", event_id=f"$e{self.next_id}", parent=parent,
                       parent_chain_length=self.length[parent] if parent is not None else None,
                       delta=delta, full_state=lambda: state,
                       snapshot_of=self.snapshot_of if self.use_snapshot_of else None)
        self.expected[g.id], self.parent[g.id], self.rows[g.id], self.length[g.id] = state, g.parent, g.rows, \
            g.chain_length
        return g.id

    def chain(self, g: int) -> list[int]:
        out = [g]
        while self.parent[out[-1]] is not None:
            out.append(self.parent[out[-1]])  # type: ignore[arg-type]
        return out

    def state(self, g: int) -> dict:
        """Union along the chain, the group nearest ``g`` winning (Synapse's semantics)."""
        state: dict = {}
        for h in reversed(self.chain(g)):
            state.update(self.rows[h])
        return state


def grow(model: Model, size: int, ops: list[tuple[int, int, int]], rng: random.Random) -> None:
    """A room of ``size`` keys, then ``ops``: (kind, back, n) -- a new member, a changed one,
    several rows at once (a resolved fork), from the latest group or one ``back`` groups ago."""
    groups = [model.add(None, {member(i): f"$m{i}" for i in range(size)})]
    users = size
    for n_op, (kind, back, n) in enumerate(ops):
        parent = groups[-1 - min(back, len(groups) - 1)]
        if kind == 0:
            delta = {member(users): f"$j{n_op}"}
            users += 1
        elif kind == 1:
            delta = {member(rng.randrange(max(users, 1))): f"$c{n_op}"}
        else:
            delta = {member(rng.randrange(users + n)): f"$r{n_op}.{i}" for i in range(n)}
            users += n
        groups.append(model.add(parent, delta))


ops = st.lists(st.tuples(st.integers(0, 2), st.sampled_from([0, 0, 0, 0, 1, 5, 150]), st.integers(1, 40)),
               min_size=1, max_size=700)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([0, 3, 50, 400, 3000]), ops, st.randoms(use_true_random=False), st.booleans())
def test_every_group_holds_the_model_state_and_chains_stay_bounded(size, steps, rng, since):
    model = Model(since=since)
    grow(model, size, steps, rng)
    for g, expected in model.expected.items():
        chain = model.chain(g)
        assert model.state(g) == expected, g
        assert len(chain) == model.length[g] <= MAX_STATE_DELTA_HOPS
        if model.length[g] == 2 and model.parent[g] is not None:  # a base delta is small, or a plain one-step delta
            assert len(model.rows[g]) <= max(SNAPSHOT_FRACTION * len(expected), 40)


def test_a_big_state_snapshots_rarely_and_a_small_one_every_100_groups():
    rng = random.Random(7)
    for size, most_snapshots in ((10_000, 2), (30, 6)):
        new, whole, old = Model(), Model(since=False), Model(snapshot_of=False)
        steps = [(rng.choice((0, 1, 1)), 0, 1) for _ in range(500)]
        grow(new, size, steps, random.Random(1))
        grow(whole, size, steps, random.Random(1))
        grow(old, size, steps, random.Random(1))
        # from the chain's rows or from the whole maps: the same groups
        assert (new.rows, new.parent) == (whole.rows, whole.parent)
        for g in list(new.expected)[::7]:
            assert new.state(g) == old.state(g) == new.expected[g]
        snapshots = sum(1 for p in new.parent.values() if p is None)
        assert snapshots <= most_snapshots, (size, snapshots)
        old_rows, new_rows = (sum(map(len, m.rows.values())) for m in (old, new))
        assert sum(1 for p in old.parent.values() if p is None) == 6  # 501 groups: 1-100, 101-200, ...
        if size > 1_000:
            assert new_rows * 4 < old_rows, (new_rows, old_rows)
        else:
            assert new_rows == old_rows  # the same groups: a small state changes too much for a base delta


def store_groups(store: StateGroupStore, cur, size: int, steps: list[tuple[int, int, int]], rng: random.Random,
                 start: int | None = None, users: int = 0) -> tuple[list[int], dict[int, dict], int]:
    """Groups made by ``store`` (its policy: base deltas) and written, in batches of 50, the
    model's state of each beside it."""
    expected: dict[int, dict] = {}
    planning = Planning(store, cur)
    if start is None:
        state = {member(i): f"$m{i}" for i in range(size)}
        first = planning.new_group(room_id="!r:hs", event_id="$0", parent=None, parent_chain_length=None,
                                   delta={}, full_state=lambda: state)
        groups, users = [first], size
        expected[first.id] = state
    else:
        groups = []
        expected[start] = read_state(cur, start)
    ids = [g.id for g in groups] or [start]
    for n_op, (kind, back, n) in enumerate(steps):
        parent = ids[-1 - min(back, len(ids) - 1)]
        if kind == 0:
            delta = {member(users): f"$j{n_op}.{rng.random()}"}
            users += 1
        else:
            delta = {member(rng.randrange(users)): f"$c{n_op}.{i}.{rng.random()}" for i in range(n)}
        state = {**expected[parent], **delta}
        g = planning.new_group(room_id="!r:hs", event_id=f"$e{n_op}", parent=parent,
                               parent_chain_length=planning.chain_length(parent), delta=delta,
                               full_state=lambda: state)
        expected[g.id] = state
        ids.append(g.id)
        groups.append(g)
        if len(groups) >= 50:
            write_state_groups(cur, groups)
            planning.written()
            groups = []
    write_state_groups(cur, groups)
    planning.written()
    return ids, expected, users


@ON_BOTH_DATABASES
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from([5, 2_000]), ops, st.randoms(use_true_random=False))
@example(2_000, [(1, 0, 1)] * 350, random.Random(3))  # base deltas, and the other writer's past a full chain
def test_stored_groups_read_back_as_the_model_on_both_databases(default_database, size, steps, rng):
    with transaction.atomic(), store_cursor() as cur:
        store = StateGroupStore()
        ids, expected, users = store_groups(store, cur, size, steps, rng)
        # another writer (or a restarted one) goes on from the stored groups: it finds the
        # snapshots by walking the chains, with nothing cached
        other = StateGroupStore()
        more, expected_more, _ = store_groups(other, cur, size, steps[:200], rng, start=ids[-1], users=users)
        expected.update(expected_more)
        cold = StateGroupStore(cache_keys=10)
        for g in ids + more:
            assert cold.get_state(cur, g) == expected[g], g
            chain = [h for (h,) in fetch_all(cur, _CHAIN, [g])]
            assert len(chain) == cold.chain_length(cur, g) <= MAX_STATE_DELTA_HOPS
        if steps == [(1, 0, 1)] * 350:  # one row per change: more rows in a group of a chain are a base delta
            bases = fetch_all(cur, "SELECT count(*) FROM state_groups g WHERE chain_length = 2 AND 1 < "
                                   "(SELECT count(*) FROM state_groups_state s WHERE s.state_group = g.id)", [])
            assert bases[0][0] >= 2
        transaction.set_rollback(True)
    assert is_sqlite(cur) == (default_database == "sqlite")


@ON_BOTH_DATABASES
def test_a_rolled_back_batch_leaves_the_store_as_it_was(default_database):
    """A batch's groups and IDs are its own until it is applied: after a rollback the store
    is exactly as before, its ID pool included, so the next batch takes the same ID again
    and reads that group back with its own state, not the rolled-back one's."""
    store = StateGroupStore()
    with store_cursor() as cur:
        with transaction.atomic():
            kept = Planning(store, cur)
            k = kept.new_group(room_id="!r:hs", event_id="$k", parent=None, parent_chain_length=None,
                               delta={}, full_state=lambda: {member(0): "$kept"})
            write_state_groups(cur, [k])
            kept.written()
        before = store.cached()
        try:
            with transaction.atomic():
                planning = Planning(store, cur)
                g = planning.new_group(room_id="!r:hs", event_id="$a", parent=None, parent_chain_length=None,
                                       delta={}, full_state=lambda: {member(1): "$old"})
                planning.batch.remember(g.id, {member(1): "$old"})  # as the planner does with the states it plans
                write_state_groups(cur, [g])
                raise RuntimeError("roll back")
        except RuntimeError:
            pass
        assert store.cached() == before
        with transaction.atomic():
            planning = Planning(store, cur)
            h = planning.new_group(room_id="!r:hs", event_id="$b", parent=None, parent_chain_length=None,
                                   delta={}, full_state=lambda: {member(2): "$new"})
            write_state_groups(cur, [h])
            planning.written()
        assert h.id == g.id  # the pool is as it was before the rolled-back batch: its first ID again
        assert store.get_state(cur, h.id) == {member(2): "$new"}
        assert StateGroupStore().get_state(cur, h.id) == {member(2): "$new"}


@ON_BOTH_DATABASES
def test_keys_holding_the_read_separator_read_back(default_database):
    """The cold read joins a group's rows by a separator on PostgreSQL: a state key, type or
    event ID holding that character must come back whole (that group is read by rows)."""
    base = {member(i): f"$m{i}" for i in range(50)}
    odd = {(MEMBER, "@a\x1fb:hs"): "$x", ("m.room.name", "\x1f"): "$y\x1f", ("t\x1fu", ""): "$z"}
    with transaction.atomic(), store_cursor() as cur:
        planning = Planning(StateGroupStore(), cur)
        first = planning.new_group(room_id="!r:hs", event_id="$a", parent=None, parent_chain_length=None,
                                   delta={}, full_state=lambda: {**base, **odd})
        second = planning.new_group(room_id="!r:hs", event_id="$b", parent=first.id, parent_chain_length=1,
                                    delta={(MEMBER, "@c\x1f:hs"): "$w", member(3): "$n\x1f"},
                                    full_state=lambda: {})
        third = planning.new_group(room_id="!r:hs", event_id="$c", parent=second.id, parent_chain_length=2,
                                   delta={member(4): "$plain"}, full_state=lambda: {})
        write_state_groups(cur, [first, second, third])
        assert read_state(cur, first.id) == {**base, **odd}
        assert read_state(cur, third.id) == {**base, **odd, (MEMBER, "@c\x1f:hs"): "$w", member(3): "$n\x1f",
                                             member(4): "$plain"}
        transaction.set_rollback(True)



# -- through persist_events: base deltas everywhere ------------------------------------------

@pytest.fixture
def base_deltas_everywhere(monkeypatch):
    """Every full chain goes on with a base delta (a fraction no state can pass), so the
    persist path makes them in rooms of a few keys, at forks and merges too."""
    monkeypatch.setattr("rooms.storage.state_groups.SNAPSHOT_FRACTION", 1.0)


@ON_BOTH_DATABASES
def test_a_long_chain_of_persisted_events_reads_back_through_base_deltas(store, base_deltas_everywhere):
    steps = [(1, 0, "member", i % 7) for i in range(250)] + [(2, 3, "state", i) for i in range(60)]
    check(store, build(steps, "!longbase:localhost"), 50)
    with connection.cursor() as c:
        c.execute("SELECT max(chain_length), count(*) FILTER (WHERE chain_length = 1) FROM state_groups "
                  "WHERE room_id = '!longbase:localhost'")
        longest, snapshots = c.fetchone()
    assert (longest, snapshots) == (100, 1)  # one snapshot, then base deltas: no chain past 100 groups


long_dags = st.lists(st.tuples(st.integers(1, 2), st.integers(0, 3), st.sampled_from(["msg", "state", "member"]),
                               st.integers(0, 6)), min_size=120, max_size=260)


@ON_BOTH_DATABASES
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(long_dags, st.integers(1, 40))
def test_forks_and_merges_read_back_through_base_deltas(store, base_deltas_everywhere, steps, batch):
    check(store, build(steps, f"!dagbase{next(ROOMS)}:localhost"), batch)


# -- packed copies of big groups (PostgreSQL) -------------------------------------------------

@pytest.fixture
def packed_everywhere(monkeypatch):
    """Every group of at least 2 rows gets its packed copy, so small rooms read through them."""
    monkeypatch.setattr("rooms.storage.state_groups.PACKED_MIN_ROWS", 2)


def _packed_groups(cur) -> set[int]:
    return {g for (g,) in fetch_all(cur, "SELECT state_group FROM state_groups_packed", [])}


@ON_BOTH_DATABASES
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(long_dags, st.integers(1, 40))
def test_forks_and_merges_read_back_through_packed_copies(store, packed_everywhere, base_deltas_everywhere,
                                                          steps, batch):
    room = f"!dagpacked{next(ROOMS)}:localhost"
    check(store, build(steps, room), batch)
    with store_cursor() as cur:
        big = {g for (g,) in fetch_all(cur, "SELECT state_group FROM state_groups_state GROUP BY 1 "
                                            "HAVING count(*) >= 2", [])}
        assert _packed_groups(cur) == (set() if is_sqlite(cur) else big)


texts = st.text(st.sampled_from("ab@:\x1f$é"), max_size=6)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.tuples(st.sampled_from([MEMBER, "m.room.name", "x\x1f"]), texts), texts, min_size=2,
                       max_size=30),
       st.dictionaries(st.tuples(st.sampled_from([MEMBER, "m.room.topic"]), texts), texts, min_size=2, max_size=8))
@pytest.mark.django_db(transaction=True)
def test_any_keys_read_back_through_packed_copies_or_rows(packed_everywhere, snapshot, delta):
    """A packed copy is written exactly when its strings split back (no separator in a key
    or an ID), and the state reads back the same either way."""
    with transaction.atomic(), store_cursor() as cur:
        planning = Planning(StateGroupStore(), cur)
        first = planning.new_group(room_id="!r:hs", event_id="$a", parent=None, parent_chain_length=None,
                                   delta={}, full_state=lambda: snapshot)
        second = planning.new_group(room_id="!r:hs", event_id="$b", parent=first.id, parent_chain_length=1,
                                    delta=delta, full_state=lambda: {})
        write_state_groups(cur, [first, second])
        assert read_state(cur, first.id) == snapshot
        assert read_state(cur, second.id) == {**snapshot, **delta}
        splits = {g.id for g in (first, second)
                  if not any("\x1f" in s for (t, k), e in g.rows.items() for s in (t, k, e))}
        assert _packed_groups(cur) == splits
        transaction.set_rollback(True)
