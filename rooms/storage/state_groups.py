"""State groups: room states stored as deltas on a snapshot, no chain longer than 100 groups.

The state of group G is the union of the rows along G -> parent -> ... -> snapshot, the row
of the group nearest G along that chain winning per (type, state_key), as in Synapse. Group
IDs are never read as an order: each event writer takes IDs from ``state_group_id_seq`` in
pools, so with several writers a group's parent may have the larger ID. Groups never change,
so what is read is cached.

When a chain is full, the next group is not always a new snapshot (Synapse's policy: a big
room's 140,000-key state written again every 100 groups is most of the database): it is a
**base delta**, a group whose parent is the chain's snapshot and whose rows are everything
that changed since that snapshot, as long as that is at most :data:`SNAPSHOT_FRACTION` of
the state. So chains stay at most 100 groups long, a small state still snapshots every 100
groups, and a big one about every ``SNAPSHOT_FRACTION * size`` changes (docs/storage.md).
"""
from __future__ import annotations

import contextlib
import gc
import itertools
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

from rooms.storage.incoming_events import StateKey, StateMap
from rooms.storage.plan_needs import CHAIN_LENGTHS, GROUP_CHAINS, STATES, NeedsData
from rooms.storage.sql import array, fetch_all, in_array, is_sqlite

#: at most this many groups in a chain (snapshot + 99 deltas), as Synapse on PostgreSQL
MAX_STATE_DELTA_HOPS = 100

#: a full chain goes on from its snapshot with a base delta (the keys changed since the
#: snapshot) while those are at most this fraction of the state, else a new snapshot
SNAPSHOT_FRACTION = 0.05

#: a group's chain, the group itself first
_CHAIN = """
WITH RECURSIVE sgs(state_group, hop) AS (
    VALUES (CAST(%s AS BIGINT), 0)
  UNION ALL
    SELECT e.prev_state_group, s.hop + 1 FROM state_group_edges e JOIN sgs s ON s.state_group = e.state_group
)
SELECT state_group FROM sgs ORDER BY hop
"""

#: the chain as :data:`_CHAIN`, with whether each group has a packed copy
_CHAIN_PACKED = _CHAIN.replace(
    "SELECT state_group FROM sgs ORDER BY hop",
    "SELECT s.state_group, p.state_group IS NOT NULL FROM sgs s "
    "LEFT JOIN state_groups_packed p ON p.state_group = s.state_group ORDER BY s.hop")

#: a group with at least this many rows is also written packed (``PackedStateGroup``)
PACKED_MIN_ROWS = 10_000


#: PostgreSQL: each group of a list as a few strings, its members' (state_key, event_id) and
#: its other rows' (type, state_key, event_id) joined by a separator, with their counts
_GROUP_STRINGS = """
SELECT state_group,
       count(*) FILTER (WHERE type = 'm.room.member'),
       string_agg(state_key || %(sep)s || event_id, %(sep)s) FILTER (WHERE type = 'm.room.member'),
       count(*) FILTER (WHERE type <> 'm.room.member'),
       string_agg(type || %(sep)s || state_key || %(sep)s || event_id, %(sep)s) FILTER (WHERE type <> 'm.room.member')
FROM state_groups_state WHERE state_group = ANY(%(groups)s) GROUP BY state_group
"""
#: the same for a chain whose ``packed`` groups (maybe none) have a packed copy, taken as stored
_PACKED_AND_GROUP_STRINGS = (
    "SELECT state_group, members_count, members, others_count, others FROM state_groups_packed "
    "WHERE state_group = ANY(%(packed)s) UNION ALL " + _GROUP_STRINGS)
_SEP = "\x1f"
_MEMBER = "m.room.member"


def read_state(cursor: Any, group: int) -> StateMap:
    """The state of ``group`` as stored: its chain, then the chain's rows by the list of its
    groups, applied from the snapshot to the group itself, so the row nearest the group wins
    per key (never the larger group ID: with several event writers each takes IDs from its
    own pool, and a group's parent may have the larger ID).

    Two statements: joined in one, the planner expects a recursive CTE of ~100 groups of
    ~1,800 rows each and hash-joins them against a scan of all of ``state_groups_state``
    (330 ms of server CPU per read at 1 M events; Synapse's issue #5064); a list of groups
    takes the index on state_group. The nearest row is kept in Python rather than by
    sorting the chain's rows by key on the server (``DISTINCT ON``), which was most of a big
    state's read. On PostgreSQL each group's rows come as a few joined strings, split and
    zipped into the map with no Python per row: a big room's snapshot is 20,000-140,000
    rows, and a tuple per row, unpacked in a loop, was two thirds of a cold read. A group with
    a packed copy (``PackedStateGroup``: a big snapshot) is taken as stored, one row, where
    aggregating its rows was half of an 80,000-key read at 10 M events."""
    state: StateMap = {}
    if is_sqlite(cursor):  # in-process: no aggregation to save round trips or objects
        chain = [g for (g,) in fetch_all(cursor, _CHAIN, [group])]
        rows: dict[int, list[tuple[str, str, str]]] = {g: [] for g in chain}
        for g, t, k, e in fetch_all(
                cursor, f"SELECT state_group, type, state_key, event_id FROM state_groups_state "
                        f"WHERE {in_array(cursor, 'state_group')}", [array(cursor, chain)]):
            rows[g].append((t, k, e))
        for g in reversed(chain):
            state.update(((t, k), e) for t, k, e in rows[g])
        return state
    chain, packed = [], []
    for g, is_packed in fetch_all(cursor, _CHAIN_PACKED, [group]):
        chain.append(g)
        if is_packed:
            packed.append(g)
    params = {"sep": _SEP, "packed": packed, "groups": [g for g in chain if g not in packed]}
    strings = {g: (nm, members, no, others)
               for g, nm, members, no, others in fetch_all(cursor, _PACKED_AND_GROUP_STRINGS, params)}
    with _collector_paused():
        _apply_strings(cursor, state, chain, strings)
    return state


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """No garbage collection while a big map is built: its 140,000 key tuples would start a
    young collection every 700, and the older generations' with them, which scan every
    object of the process (a quarter of a 140,000-key read, more in a process holding big
    caches). Nothing built here is cyclic. Left alone if someone else disabled it."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _apply_strings(cursor: Any, state: StateMap, chain: list[int],
                   strings: dict[int, tuple[int, str | None, int, str | None]]) -> None:
    """The chain's groups' joined strings over ``state``, from the snapshot to the group."""
    for g in reversed(chain):
        if g not in strings:
            continue
        n_members, members, n_others, others = strings[g]
        if members is not None:
            f = members.split(_SEP)
            if len(f) != 2 * n_members:  # a separator inside a key or ID: this group by rows
                _apply_rows(cursor, state, g)
                continue
            fields = iter(f)  # (key, id) pairs straight from the list: slicing it twice cost a third more
            state.update(zip(zip(itertools.repeat(_MEMBER), fields), fields))
        if others is not None:
            f = others.split(_SEP)
            if len(f) != 3 * n_others:
                _apply_rows(cursor, state, g)
                continue
            fields = iter(f)
            state.update(zip(zip(fields, fields), fields))


def packed_copies(cursor: Any, groups: Iterable[NewGroup]) -> list[tuple[int, int, str | None, int, str | None]]:
    """The ``state_groups_packed`` rows of those of ``groups`` with at least
    :data:`PACKED_MIN_ROWS` rows that can be packed; none on SQLite (its reads take rows)."""
    if is_sqlite(cursor):
        return []
    return [(g.id, *p) for g in groups if len(g.rows) >= PACKED_MIN_ROWS for p in [pack(g.rows)] if p is not None]


def pack(rows: StateMap) -> tuple[int, str | None, int, str | None] | None:
    """``rows`` as a packed copy stores them (members' pairs, other rows' triples, each joined
    by the separator, and their counts: what a cold read splits); None when a key or an ID
    holds the separator, which reads cannot split back."""
    members = [s for (t, k), e in rows.items() if t == _MEMBER for s in (k, e)]
    others = [s for (t, k), e in rows.items() if t != _MEMBER for s in (t, k, e)]
    joined = [_SEP.join(fields) if fields else None for fields in (members, others)]
    if any(text is not None and text.count(_SEP) != len(fields) - 1 for fields, text in zip((members, others), joined)):
        return None
    return len(members) // 2, joined[0], len(others) // 3, joined[1]


def _apply_rows(cursor: Any, state: StateMap, group: int) -> None:
    """Group ``group``'s rows over ``state``, one by one (its strings could not be split)."""
    for t, k, e in fetch_all(cursor, "SELECT type, state_key, event_id FROM state_groups_state "
                                     "WHERE state_group = %s", [group]):
        state[(t, k)] = e


#: SQLite has no sequences: the next state group ids come from a row of ``stream_sequences``
#: (the ID table the SQLite stream-ID store keeps), bumped inside the write transaction
_SQLITE_SEQUENCE = "state_group_id_seq"


@dataclass
class NewGroup:
    id: int
    room_id: str
    event_id: str
    parent: int | None
    rows: StateMap
    chain_length: int


def plan_group(gid: int, *, room_id: str, event_id: str, parent: int | None, parent_chain_length: int | None,
               delta: StateMap, full_state: Callable[[], StateMap],
               snapshot_of: Callable[[int], tuple[int, StateMap, StateMap | None]] | None = None) -> NewGroup:
    """Group ``gid`` for ``parent`` + ``delta``, so no read walks more than
    :data:`MAX_STATE_DELTA_HOPS` groups:

    * a delta (``delta``'s rows on ``parent``) while the parent's chain is not full;
    * a full snapshot (``full_state()``: the whole map) without a parent;
    * once the chain is full, a base delta: the keys of ``full_state()`` that differ from the
      chain's snapshot (``snapshot_of(parent)``: its id, its state, and the rows of the
      chain after it when the store has them cached), on that snapshot, while
      they are at most :data:`SNAPSHOT_FRACTION` of the state; else a snapshot. Without
      ``snapshot_of`` a full chain always ends in a snapshot (Synapse's policy)."""
    if parent is None or parent_chain_length is None:
        return NewGroup(gid, room_id, event_id, None, dict(full_state()), 1)
    if parent_chain_length < MAX_STATE_DELTA_HOPS:
        return NewGroup(gid, room_id, event_id, parent, dict(delta), parent_chain_length + 1)
    full = full_state()
    if snapshot_of is not None:
        base, base_state, since = snapshot_of(parent)
        changed = _changed_since(full, base_state, since, delta)
        if changed is not None and len(changed) <= SNAPSHOT_FRACTION * len(full):
            return NewGroup(gid, room_id, event_id, base, changed, 2)
    return NewGroup(gid, room_id, event_id, None, dict(full), 1)


def _changed_since(full: StateMap, base_state: StateMap, since: StateMap | None,
                   delta: StateMap) -> StateMap | None:
    """The keys of ``full`` whose event differs from the snapshot's ``base_state``; None if a
    key of the snapshot is gone (a delta cannot remove one).

    ``since``: the rows of the chain after the snapshot, nearest group winning, when known.
    ``full`` is then the chain's state with ``delta`` on it, so only those keys can differ:
    a few thousand at most (the base delta is at most 5% of the state), where comparing the
    whole maps hashed every (key, event) pair of a 140,000-key state twice at every full
    chain (15% of the persist path's time at 2 M events)."""
    def keeps_every_key(changed: StateMap) -> bool:  # every key of the snapshot is still there
        return len(full) - len(base_state) == sum(1 for k in changed if k not in base_state)

    if since is not None:
        changed = {k: v for k, v in itertools.chain(since.items(), delta.items()) if base_state.get(k) != v}
        if keeps_every_key(changed):
            return changed
        # not the chain's state after all: compare the maps
    changed = dict(full.items() - base_state.items())
    return changed if keeps_every_key(changed) else None


class _LRU:
    """Least-recently-used cache bounded by total weight (``weigh``: 1 per entry by default;
    state maps weigh their number of keys, so a few huge rooms cannot exhaust memory)."""

    def __init__(self, size: int, weigh: Any = None) -> None:
        self.size = size
        self._weigh = weigh or (lambda v: 1)
        self._weight = 0
        self._d: OrderedDict[Any, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: int) -> Any:
        with self._lock:
            v = self._d.get(key)
            if v is not None:
                self._d.move_to_end(key)
            return v

    def get_many(self, keys: Iterable[Any]) -> dict[Any, Any]:
        """The cached values of ``keys`` (those cached), under one acquisition of the lock: a
        sync looks up ~300 rooms at once."""
        out: dict[Any, Any] = {}
        with self._lock:
            d = self._d
            for key in keys:
                v = d.get(key)
                if v is not None:
                    d.move_to_end(key)
                    out[key] = v
        return out

    def put(self, key: Any, value: Any) -> None:
        with self._lock:
            old = self._d.pop(key, None)
            if old is not None:
                self._weight -= self._weigh(old)
            self._d[key] = value
            self._weight += self._weigh(value)
            while self._weight > self.size and len(self._d) > 1:
                _, evicted = self._d.popitem(last=False)
                self._weight -= self._weigh(evicted)

    def discard(self, key: Any) -> None:
        with self._lock:
            old = self._d.pop(key, None)
            if old is not None:
                self._weight -= self._weigh(old)

    def clear(self) -> None:
        with self._lock:
            self._d.clear()
            self._weight = 0


class StateGroupStore:
    """Reads group states (cached) and plans new groups for the persist path."""

    def __init__(self, cache_keys: int = 1_000_000, *, base_deltas: bool = True) -> None:
        #: False: a full chain always ends in a snapshot (Synapse's policy; the benchmark's baseline)
        self.base_deltas = base_deltas
        self._states = _LRU(cache_keys, weigh=lambda state: len(state) + 1)
        self._chain_lengths = _LRU(200_000)
        #: group -> the snapshot its chain ends in (where a base delta starts again)
        self._snapshots = _LRU(200_000)
        #: a delta group -> (its parent, its rows): a full chain's base delta is made from the
        #: chain's rows instead of comparing the whole state with the snapshot's
        self._deltas = _LRU(400_000, weigh=lambda entry: len(entry[1]) + 1)
        #: for the reads' deltas (:meth:`changed_keys`): a stored group's chain, and the keys
        #: of its own rows
        self._chains = _LRU(2_000_000, weigh=len)
        self._own_keys = _LRU(400_000, weigh=lambda keys: len(keys) + 1)
        #: IDs taken from the sequence and not used yet, ascending (:meth:`reserve`)
        self._id_pool: list[int] = []
        self.hits = 0
        self.misses = 0

    def scale(self, factor: float) -> None:
        """The caches' bounds times ``factor`` (:meth:`EventPersister.scale_caches`)."""
        self._states.size = int(self._states.size * factor)
        self._chain_lengths.size = int(self._chain_lengths.size * factor)
        self._snapshots.size = int(self._snapshots.size * factor)
        self._deltas.size = int(self._deltas.size * factor)
        self._chains.size = int(self._chains.size * factor)
        self._own_keys.size = int(self._own_keys.size * factor)

    # -- reading ----------------------------------------------------------------------------

    def get_state(self, cursor: Any, group: int) -> StateMap:
        """The full state of ``group``. The returned map is shared: do not change it."""
        state: StateMap | None = self._states.get(group)
        if state is not None:
            self.hits += 1
            return state
        self.misses += 1
        state = read_state(cursor, group)
        self._states.put(group, state)
        return state

    def changed_keys(self, cursor: Any, old: int, new: int) -> set[StateKey]:
        """The keys where (stored) the states of groups ``old`` and ``new`` may differ (a superset: a
        key changed and changed back is included). When one group is on the other's chain,
        they are the keys of the groups' own rows between the two (a delta chain is at most
        100 small groups): a sync's state block costs what changed in the gap, not the
        room's state size. Otherwise (a new snapshot or base delta in between, a fork) the
        two whole maps are compared."""
        if old == new:
            return set()
        for top, bottom in ((new, old), (old, new)):
            chain = self._chain(cursor, top)
            if bottom in chain:
                between = chain[:chain.index(bottom)]
                keys: set[StateKey] = set()
                for rows in self._group_keys(cursor, between):
                    keys.update(rows)
                return keys
        a, b = self.get_state(cursor, old), self.get_state(cursor, new)
        return {k for k, _ in a.items() ^ b.items()}

    def _chain(self, cursor: Any, group: int) -> list[int]:
        """``group``'s chain, itself first (cached: a stored group's chain never changes)."""
        chain: list[int] | None = self._chains.get(group)
        if chain is None:
            chain = [g for (g,) in fetch_all(cursor, _CHAIN, [group])]
            self._chains.put(group, chain)
        return chain

    def _group_keys(self, cursor: Any, groups: Sequence[int]) -> list[frozenset[StateKey]]:
        """The keys of each group's own rows (cached; the groups not cached in one query)."""
        found = self._own_keys.get_many(groups)
        missing = [g for g in groups if g not in found]
        if missing:
            read: dict[int, set[StateKey]] = {g: set() for g in missing}
            for g, t, k in fetch_all(cursor, "SELECT state_group, type, state_key FROM state_groups_state WHERE "
                                             + in_array(cursor, "state_group"), [array(cursor, missing)]):
                read[g].add((t, k))
            for g, keys in read.items():
                found[g] = frozenset(keys)
                self._own_keys.put(g, found[g])
        return [found[g] for g in groups]

    def chain_length(self, cursor: Any, group: int) -> int:
        n = self._chain_lengths.get(group)
        return n if n is not None else self.load_chain_lengths(cursor, [group])[group]

    def load_chain_lengths(self, cursor: Any, groups: Iterable[int]) -> dict[int, int]:
        """The chain lengths of ``groups`` not cached yet, in one query (a batch reloading
        many rooms' contexts asked for each room's current group one by one)."""
        missing = {g for g in groups if self._chain_lengths.get(g) is None}
        if not missing:
            return {}
        cursor.execute("SELECT id, chain_length FROM state_groups WHERE " + in_array(cursor, "id"),
                       [array(cursor, sorted(missing))])
        found = dict.fromkeys(missing, MAX_STATE_DELTA_HOPS)  # (as before: a group not stored)
        found.update(cursor.fetchall())
        for group, n in found.items():
            self._chain_lengths.put(group, n)
        return found

    def forget(self) -> None:
        self._states.clear()
        self._chain_lengths.clear()
        self._snapshots.clear()
        self._deltas.clear()
        self._chains.clear()
        self._own_keys.clear()

    # -- the groups of a batch ------------------------------------------------------------------

    def reserve(self, cursor: Any, n: int) -> list[int]:
        """At least ``n`` group IDs for a batch, ascending: the pool's, then new ones from the
        sequence if it holds fewer (on SQLite a bump of ``stream_sequences`` inside the open
        transaction, undone with it). The pool is not changed here: :meth:`apply` keeps the
        IDs a committed batch left unused (those after the ones it took, in order); after a
        rollback the pool is as it was (on PostgreSQL the new IDs are skipped)."""
        ids = list(self._id_pool)
        if len(ids) < n:
            more = max(n - len(ids), 64)
            if is_sqlite(cursor):
                ids += self._sqlite_ids(cursor, more)
            else:
                cursor.execute("SELECT nextval('state_group_id_seq') FROM generate_series(1, %s)", [more])
                ids += sorted(r[0] for r in cursor.fetchall())
        return ids

    @staticmethod
    def _sqlite_ids(cursor: Any, n: int) -> list[int]:
        """``n`` new ids, ascending. The bump belongs to the write transaction (a rollback undoes
        it); the row starts past any stored group."""
        cursor.execute(
            "INSERT INTO stream_sequences (name, last_value) SELECT %s, coalesce(max(id), 0) FROM state_groups "
            "WHERE true ON CONFLICT (name) DO NOTHING", [_SQLITE_SEQUENCE])
        cursor.execute("UPDATE stream_sequences SET last_value = last_value + %s WHERE name = %s RETURNING last_value",
                       [n, _SQLITE_SEQUENCE])
        last = int(cursor.fetchone()[0])
        return list(range(last - n + 1, last + 1))

    def batch(self) -> StateGroupsBatch:
        """A view for one batch: what it reads and plans is kept apart until :meth:`apply`."""
        return StateGroupsBatch(self)

    def apply(self, delta: GroupsDelta) -> None:
        """A committed batch's groups and what it read: cached like any other (groups never
        change); the IDs it left unused are the pool."""
        for group, n in delta.chain_lengths.items():
            self._chain_lengths.put(group, n)
        for group, snapshot in delta.snapshots.items():
            self._snapshots.put(group, snapshot)
        for group, entry in delta.deltas.items():
            self._deltas.put(group, entry)
        for group, state in delta.states.items():
            self._states.put(group, state)
        if delta.unused_ids is not None:
            self._id_pool = list(delta.unused_ids)

    def remember(self, group: int, state: StateMap) -> None:
        """Cache a state the caller will not change any more."""
        self._states.put(group, state)

    def cached(self) -> dict[str, dict[Any, Any]]:
        """A copy of every cache's entries and the ID pool (what tests compare)."""
        return {"states": dict(self._states._d), "chain_lengths": dict(self._chain_lengths._d),
                "snapshots": dict(self._snapshots._d), "deltas": dict(self._deltas._d),
                "chains": dict(self._chains._d), "own_keys": dict(self._own_keys._d),
                "id_pool": dict.fromkeys(self._id_pool)}


@dataclass
class GroupsDelta:
    """What one batch adds to a :class:`StateGroupStore`: its groups' states, chain lengths,
    snapshots and rows, the stored states it read, and the reserved IDs it left unused (None:
    the pool as it is)."""

    states: dict[int, StateMap]
    chain_lengths: dict[int, int]
    snapshots: dict[int, int]
    deltas: dict[int, tuple[int, StateMap]]
    unused_ids: list[int] | None = None


class StateGroupsBatch:
    """One batch's view of a :class:`StateGroupStore`: reads go to its own entries, then what
    the loader loaded for the batch, then the store's caches; a miss raises
    :class:`~rooms.storage.plan_needs.NeedsData` (the view holds no cursor: the loader reads
    it with :meth:`load`, and the batch is planned again). What the plan decides is kept in
    its own entries (:meth:`reset` drops them for a new plan; what was loaded stays). The
    store is never changed."""

    def __init__(self, store: StateGroupStore) -> None:
        self.store = store
        #: read from the database for this batch (kept across its plans)
        self.loaded_states: dict[int, StateMap] = {}
        self.loaded_lengths: dict[int, int] = {}
        #: a stored group -> its chain, itself first, down to its snapshot
        self.loaded_chains: dict[int, list[int]] = {}
        self.reset()

    def reset(self) -> None:
        """What a plan decided dropped (a new plan of the batch starts from what was loaded)."""
        self.states: dict[int, StateMap] = {}
        self.chain_lengths: dict[int, int] = {}
        self.snapshots: dict[int, int] = {}
        self.deltas: dict[int, tuple[int, StateMap]] = {}
        #: the groups planned in this batch (not in the database until it commits)
        self.planned: dict[int, NewGroup] = {}

    def get_state(self, group: int) -> StateMap:
        """The full state of ``group``. The returned map is shared: do not change it."""
        state = self.states.get(group)
        if state is not None:
            return state
        state = self.loaded_states.get(group)
        if state is not None:
            return state
        store = self.store
        cached: StateMap | None = store._states.get(group)
        if cached is not None:
            store.hits += 1
            return cached
        planned = self.planned.get(group)
        if planned is None:
            raise NeedsData(STATES, [group])
        store.misses += 1
        state = dict(self.get_state(planned.parent)) if planned.parent is not None else {}
        state.update(planned.rows)
        self.states[group] = state
        return state

    def remember(self, group: int, state: StateMap) -> None:
        """A state the caller will not change any more."""
        self.states[group] = state

    def chain_length(self, group: int) -> int:
        n = self.chain_lengths.get(group)
        if n is None:
            n = self.loaded_lengths.get(group)
            if n is None:
                n = self.store._chain_lengths.get(group)
                if n is None:
                    raise NeedsData(CHAIN_LENGTHS, [group])
        return n

    def cached_states(self, groups: Iterable[int]) -> set[int]:
        """Those of ``groups`` whose state the batch has without a read."""
        cached = self.store._states
        return {g for g in groups if g in self.states or g in self.loaded_states or cached.get(g) is not None}

    # -- loading (the loader's, on the open transaction's cursor) ---------------------------------

    def load(self, cursor: Any, needs: NeedsData) -> None:
        """Read what ``needs`` names (states, chain lengths or chains of stored groups)."""
        if needs.kind == STATES:
            self.load_states(cursor, needs.keys)  # type: ignore[arg-type]
        elif needs.kind == CHAIN_LENGTHS:
            self.load_chain_lengths(cursor, needs.keys)  # type: ignore[arg-type]
        elif needs.kind == GROUP_CHAINS:
            self.load_chains(cursor, needs.keys)  # type: ignore[arg-type]
        else:
            raise ValueError(f"state groups do not load {needs.kind}")

    def load_states(self, cursor: Any, groups: Iterable[int]) -> None:
        """The states of stored ``groups`` the batch does not have yet."""
        missing = set(groups) - self.cached_states(groups)
        for group in sorted(missing):
            self.store.misses += 1
            self.loaded_states[group] = read_state(cursor, group)

    def load_chain_lengths(self, cursor: Any, groups: Iterable[int]) -> dict[int, int]:
        """The chain lengths of ``groups`` not known yet, in one query (a batch reloading
        many rooms' contexts asked for each room's current group one by one)."""
        cached = self.store._chain_lengths
        missing = {g for g in groups if g not in self.loaded_lengths and cached.get(g) is None}
        if not missing:
            return {}
        cursor.execute("SELECT id, chain_length FROM state_groups WHERE " + in_array(cursor, "id"),
                       [array(cursor, sorted(missing))])
        found = dict.fromkeys(missing, MAX_STATE_DELTA_HOPS)  # (as before: a group not stored)
        found.update(cursor.fetchall())
        self.loaded_lengths.update(found)
        return found

    def load_chains(self, cursor: Any, groups: Iterable[int]) -> None:
        """The delta chains of stored ``groups`` (for the snapshot a base delta starts from)."""
        for group in sorted(set(groups) - set(self.loaded_chains)):
            self.loaded_chains[group] = [g for (g,) in fetch_all(cursor, _CHAIN, [group])]

    def _snapshot(self, group: int) -> int | None:
        snapshot = self.snapshots.get(group)
        return snapshot if snapshot is not None else self.store._snapshots.get(group)

    def _delta(self, group: int) -> tuple[int, StateMap] | None:
        entry = self.deltas.get(group)
        return entry if entry is not None else self.store._deltas.get(group)

    def snapshot_of(self, group: int) -> tuple[int, StateMap, StateMap | None]:
        """The snapshot ``group``'s chain ends in, its state, and the rows of the chain's
        groups after it up to ``group`` (nearest winning; None when one is not known)."""
        snapshot = self._snapshot(group)
        if snapshot is None:
            chain = [group]
            while chain[-1] in self.planned:
                parent = self.planned[chain[-1]].parent
                if parent is None:
                    break
                chain.append(parent)
            if chain[-1] not in self.planned:  # stored groups' parents are stored
                stored = self.loaded_chains.get(chain[-1])
                if stored is None:
                    raise NeedsData(GROUP_CHAINS, [chain[-1]])
                chain[-1:] = stored
            snapshot = chain[-1]
            self.snapshots[group] = snapshot
        return snapshot, self.get_state(snapshot), self._rows_since(group, snapshot)

    def _rows_since(self, group: int, snapshot: int) -> StateMap | None:
        parts: list[StateMap] = []
        g = group
        for _ in range(MAX_STATE_DELTA_HOPS):
            if g == snapshot:
                since: StateMap = {}
                for rows in reversed(parts):
                    since.update(rows)
                return since
            entry = self._delta(g)
            if entry is None:
                return None
            g, rows = entry
            parts.append(rows)
        return None

    def new_group(self, gid: int, *, room_id: str, event_id: str, parent: int | None,
                  parent_chain_length: int | None, delta: StateMap, full_state: Callable[[], StateMap]) -> NewGroup:
        """:func:`plan_group` as group ``gid`` (an ID the batch reserved)."""
        group = plan_group(gid, room_id=room_id, event_id=event_id, parent=parent,
                           parent_chain_length=parent_chain_length, delta=delta, full_state=full_state,
                           snapshot_of=self.snapshot_of if self.store.base_deltas else None)
        self.chain_lengths[group.id] = group.chain_length
        if group.parent is None:
            # the next base deltas of its chain compare with it: keep it (the rows are not
            # changed any more; on the fast path the room's map would be)
            self.snapshots[group.id] = group.id
            self.states[group.id] = group.rows
        else:
            self.deltas[group.id] = (group.parent, group.rows)
            snapshot = group.parent if group.chain_length == 2 else self._snapshot(group.parent)
            if snapshot is not None:
                self.snapshots[group.id] = snapshot
        self.planned[group.id] = group
        return group

    def delta(self, unused_ids: list[int] | None = None) -> GroupsDelta:
        """What the batch read and planned (the plan's entries winning)."""
        return GroupsDelta({**self.loaded_states, **self.states}, {**self.loaded_lengths, **self.chain_lengths},
                           self.snapshots, self.deltas, unused_ids)
