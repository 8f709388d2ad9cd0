"""What the planner is given about the database: plain records, loaded once per batch by
``plan_loader`` (or built by hand in tests), and the narrow :class:`PlanReader` it asks for
anything whose answer depends on decisions made earlier in the same batch (the state of a
group planned a moment ago, the verdict on an event of the batch). The planner changes
none of it: it works on forks of the snapshot's room contexts.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, NamedTuple, Protocol

from rooms.storage.authorization import ChainsDelta, MatrixEventsDelta
from rooms.storage.incoming_events import RoomInfo, StateMap
from rooms.storage.state_deltas import LineageDelta, Resolution, StateRef
from rooms.storage.state_groups import GroupsDelta, NewGroup
from rooms.storage.visibility_ranges import RangeSet

Key = tuple[int, int]
#: ``rooms.late_stream`` for a room whose orderings cannot be trusted to follow the stream
#: (moved by the ordering job, or a backfilled event above the head): every incremental sync
#: walks ``*shared``'s ranges, and each range's walk has no stream-ordering bounds, as before
#: the column existed
LATE_ALWAYS = 2**63 - 1


@dataclass
class CacheDelta:
    """What a batch adds to the persister's caches, applied only once its transaction
    commits (``EventPersister``): the state groups it planned and the stored ones it read,
    the event facts it learned, the Matrix events it planned or loaded, its resolutions,
    the auth chains it extended, its groups' lineage, the rooms it learned the version of,
    and its rooms' contexts after it. A batch that rolls back leaves every cache as it was."""

    groups: GroupsDelta
    facts: dict[str, tuple[str | None, str | None]]
    facts_used: set[str]
    matrix: MatrixEventsDelta
    resolved: dict[frozenset[int], Resolution]
    chains: ChainsDelta
    lineage: LineageDelta
    room_infos: dict[str, RoomInfo]
    rooms: list[RoomContext] = field(default_factory=list)


@dataclass(slots=True)
class KnownEvent:
    """A stored event the batch refers to (itself, a prev, a redaction target, a state event)."""

    event_id: str
    room_id: str
    topological_ordering: int
    stream_ordering: int
    outlier: bool
    rejected: bool
    state_group: int | None  #: the group after it (None: an outlier, or no state known)

    @property
    def key(self) -> Key:
        return (self.topological_ordering, self.stream_ordering)


@dataclass(slots=True)
class PrevInfo:
    """What an event needs of one of its prev events."""

    key: Key
    state_group: int | None  #: the state after the prev
    has_state: bool  #: False for an outlier: its state is not known


@dataclass(frozen=True, slots=True)
class WaitingRedaction:
    """A stored redaction whose target is in the batch (it arrived first)."""

    target: str
    room_id: str
    redaction_id: str


class Extremity(NamedTuple):
    """A forward extremity of a room: where it is, and the state group after it."""

    key: Key
    state_group: int | None


class Memberships(dict[str, str]):
    """user -> membership, with the invited users kept apart: the visibility rules ask for
    them at every history-visibility change, and a scan of a big room's members for them
    cost ~8 ms a fork at 20,000 members."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.invited = {u for u, m in self.items() if m == "invite"}

    def __setitem__(self, user: str, membership: str) -> None:
        super().__setitem__(user, membership)
        if membership == "invite":
            self.invited.add(user)
        else:
            self.invited.discard(user)

    def __delitem__(self, user: str) -> None:
        super().__delitem__(user)
        self.invited.discard(user)

    def pop(self, user: str, *default: Any) -> Any:
        self.invited.discard(user)
        return super().pop(user, *default)

    def copy(self) -> Memberships:
        """An equal, independent copy (at C speed: no pass over the members)."""
        new = Memberships.__new__(Memberships)
        dict.update(new, self)
        new.invited = set(self.invited)
        return new

    def _unsupported(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("set memberships one by one (the invited are kept apart)")

    update = setdefault = popitem = clear = __ior__ = _unsupported


@dataclass
class RoomContext:
    """What the persist path knows about a room between batches (valid while the ``rooms`` row
    still says ``version``). The planner changes a fork of it (:meth:`fork`) to the room
    after the batch; the persister keeps that for the next batch once the transaction
    commits."""

    room_id: str
    head: Key | None = None
    last_stream: int = 0
    min_depth: int | None = None
    current_group: int | None = None
    current_chain: int | None = None
    #: current state, owned by this context (changed in place on the fast path)
    current: StateMap = field(default_factory=dict)
    #: the last changes made to ``current`` in place, oldest first: ``(group, key, value)``
    #: = before ``key`` changed, the room's state was ``group``, where ``key`` had ``value``
    #: (None: absent). The states of the room's recent groups, which a fork reads back, are
    #: ``current`` with these undone, not a read of a big room's whole state.
    undo: list[tuple[int, tuple[str, str], str | None]] = field(default_factory=list)
    #: with no ``current_group`` (a resolution of several forward extremities): the group
    #: and keys the current state is known to differ from that group's state on
    current_base: StateRef | None = None
    #: user -> current membership (a :class:`Memberships`: the invited kept apart)
    memberships: dict[str, str] = field(default_factory=lambda: Memberships())
    visibility: str = "shared"
    #: forward extremities by event ID
    forward: dict[str, Extremity] = field(default_factory=dict)
    #: visibility ranges per user (``*`` and ``*shared`` included)
    ranges: dict[str, RangeSet] = field(default_factory=dict)
    #: each user's latest join key (set it with :meth:`joined_at`)
    last_join: dict[str, Key] = field(default_factory=dict)
    #: ``(key, user)``, sorted: each user's latest range bound (``RangeSet.last_bound``) and
    #: latest join, among stale earlier ones. A user with no mark at or after key ``k`` sees
    #: ``k`` exactly when their last range is open and joins nowhere after ``k``, so an event
    #: off the head is decided only for the users marked since it (``plan_visibility``).
    marks: list[tuple[Key, str]] = field(default_factory=list)
    #: the room's version and whether its events are authorized (None: no create event yet)
    info: RoomInfo | None = None
    #: the highest ``rooms.late_stream`` this context has set (None: none); the writer keeps
    #: the row's larger value, so a context older than the row never lowers it
    late_stream: int | None = None
    #: copy on write, for a fork: ``current`` is the forked context's map, and these users'
    #: range sets are its (:meth:`writable_current`, :meth:`user_ranges` copy them first)
    current_shared: bool = field(default=False, compare=False, repr=False)
    shared_ranges: set[str] = field(default_factory=set, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.memberships, Memberships):
            self.memberships = Memberships(self.memberships)

    def fork(self) -> RoomContext:
        """A context equal to this one that a batch can change while this one stays as it is
        (the persister's cached context until the batch commits). The containers are copied
        at C speed; a big room's current state and its users' range sets are copied only
        when the batch first changes them."""
        memberships = self.memberships
        assert isinstance(memberships, Memberships)
        # the fields as they are (a dict update: the dataclass's __init__ would be most of a fork),
        # then a copy of each container a batch changes
        fork = RoomContext.__new__(RoomContext)
        fork.__dict__.update(self.__dict__)
        fork.undo = list(self.undo)
        fork.memberships = memberships.copy()
        fork.forward = dict(self.forward)
        fork.ranges = dict(self.ranges)
        fork.last_join = dict(self.last_join)
        fork.marks = list(self.marks)
        fork.current_shared = True
        fork.shared_ranges = set(self.ranges)
        return fork

    def writable_current(self) -> StateMap:
        """``current``, to be changed in place (a fork's own copy from now on)."""
        if self.current_shared:
            self.current = dict(self.current)
            self.current_shared = False
        return self.current

    @property
    def invited(self) -> set[str]:
        """The users whose current membership is an invite."""
        invited: set[str] = self.memberships.invited  # type: ignore[attr-defined]
        return invited

    @property
    def version(self) -> tuple[Any, ...]:
        return (self.head, self.current_group, self.last_stream)

    def note_order(self, key: Key, live: bool) -> None:
        """Before an accepted event at ``key`` moves the head: raise ``late_stream`` if the
        event sits behind one stored before it (``rooms.late_stream``).

        A live event is behind when it is below the head or below the last stream ordering
        (stored out of stream order, as several writers do): from its stream ordering or the
        last one, whichever is higher, events after a token may sit before events up to it.
        A backfilled event does not move the head: below the head it is marked at the last
        stream ordering; above it, later live events could not see it, so the room is marked
        for good (:data:`LATE_ALWAYS`).
        """
        if self.head is None:
            return
        if live:
            if key >= self.head and key[1] >= self.last_stream:
                return
            mark = max(key[1], self.last_stream)
        else:
            mark = LATE_ALWAYS if key > self.head else max(key[1], self.last_stream)
        if mark > 0 and (self.late_stream is None or mark > self.late_stream):
            self.late_stream = mark

    def user_ranges(self, user: str) -> RangeSet:
        """``user``'s range set, to be changed (made if none; a fork's own copy)."""
        rs = self.ranges.get(user)
        if rs is None:
            rs = self.ranges[user] = RangeSet()
        elif user in self.shared_ranges:
            self.shared_ranges.discard(user)
            rs = self.ranges[user] = RangeSet([list(r) for r in rs.ranges], stored=rs.stored)
        return rs

    def joined_at(self, user: str, key: Key) -> None:
        """``user``'s join at ``key`` (kept if it is their latest)."""
        prev = self.last_join.get(user)
        if prev is None or key > prev:
            self.last_join[user] = key
            self.mark(user, key)

    def mark(self, user: str, key: Key | None) -> None:
        """``user``'s ranges or latest join now reach ``key`` (see ``marks``)."""
        if key is None:
            return
        bisect.insort(self.marks, (key, user))
        if len(self.marks) > 2 * (len(self.ranges) + len(self.last_join)) + 64:
            self.remark()

    def remark(self) -> None:
        """``marks`` rebuilt from the ranges and joins (the stale ones dropped)."""
        marks = [(rs.last_bound, u) for u, rs in self.ranges.items() if not u.startswith("*") and rs.ranges]
        marks.extend((k, u) for u, k in self.last_join.items())
        marks.sort()
        self.marks = marks  # type: ignore[assignment]

    def marked_since(self, key: Key) -> set[str]:
        """The users with a mark at or after ``key``."""
        return {u for _, u in self.marks[bisect.bisect_left(self.marks, (key,)):]}


@dataclass
class Snapshot:
    """Everything the batch's plan starts from."""

    rooms: dict[str, RoomContext]
    known: dict[str, KnownEvent] = field(default_factory=dict)
    waiting_redactions: list[WaitingRedaction] = field(default_factory=list)
    #: state group IDs reserved for the batch, ascending: its new groups take them in order
    #: (at most two per event: the state before it and the state after it)
    group_ids: list[int] = field(default_factory=list)


class PlanReader(Protocol):
    """The reads the planner makes while planning, none of them I/O: the loader's reader
    answers from what the loader read for the batch and the persister's caches, and raises
    :class:`~rooms.storage.plan_needs.NeedsData` for what it has not read; a test's answers
    from dicts."""

    #: event_id -> the core's event, with ``entry``/``add``/``rejected`` (``authorization.MatrixEvents``)
    matrix: Any
    #: (state groups) -> the state they resolve to (``authorization.ResolvedStates``)
    resolved: Any
    #: rooms' auth graphs as chain cover indexes, fed with each planned state event
    #: (``authorization.RoomAuthChains``)
    chains: Any
    #: planned groups' parents and deltas (``state_deltas.GroupLineage``)
    lineage: Any

    def state_of_group(self, group: int) -> StateMap:
        """The full state of a stored group or one planned earlier (shared: do not change it)."""

    def chain_length(self, group: int) -> int:
        """The number of groups in ``group``'s delta chain."""

    def new_group(self, gid: int, *, room_id: str, event_id: str, parent: int | None,
                  parent_chain_length: int | None, delta: StateMap, full_state: Callable[[], StateMap]) -> NewGroup:
        """New group ``gid`` (an ID of ``Snapshot.group_ids``): see ``state_groups.plan_group``."""

    def remember_state(self, group: int, state: StateMap) -> None:
        """The full state of a planned group, which the planner will not change any more."""

    def load_facts(self, event_ids: Iterable[str]) -> None:
        """Make :meth:`membership` / :meth:`visibility` answer for these events."""

    def put_facts(self, event_id: str, membership: str | None, visibility: str | None) -> None:
        """What a state event of the batch says (not in the database yet)."""

    def membership(self, event_id: str | None) -> str | None:
        """The membership a member event sets (None: unknown, or no event)."""

    def visibility(self, event_id: str | None) -> str:
        """The history visibility an ``m.room.history_visibility`` event sets (``shared``
        for none or an unknown value)."""

    def delta(self, unused_group_ids: list[int]) -> CacheDelta | None:
        """What the batch learned (its answers and what the plan told it), for the caches
        once it commits; ``unused_group_ids``: the reserved IDs the plan left (None: the
        reader keeps no caches)."""
