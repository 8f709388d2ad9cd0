"""State resolution v2 (room versions 2-11) and v2.1 (room v12, MSC4297): the one room state
that several state sets (the states after each prev event of a merge) resolve to.
(docs/matrix.md; the Matrix spec's state resolution v2, as Synapse's ``synapse/state/v2.py``
implements it.)

Deterministic by construction: the result depends only on the events (their auth edges,
senders' power, ``origin_server_ts``, IDs) and which of them were rejected -- never on arrival
order, ``depth`` or any local number. ``prev_events`` only choose the state sets; the graph
walked here is the ``auth_events`` graph.

Outline (``resolve``):
1. split the keys: unconflicted (every set has the same event) and conflicted;
2. the full conflicted set: the conflicted events, the auth difference of the sets, and in
   v2.1 the conflicted state subgraph (events on an auth path between two conflicted events);
3. power events (and their auth ancestors in that set) in reverse topological power order,
   checked one by one from the unconflicted state (v2) or from nothing (v2.1);
4. the rest in mainline order (by the power-levels "epoch" each depends on), checked on top;
5. the unconflicted state overlaid last.
"""
from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

from rooms.matrix.auth_rules import CREATE, POWER_LEVELS, AuthFailed, auth_types_for_event, check_state_dependent, creators
from rooms.matrix.event_format import Event
from rooms.matrix.room_versions import CREATOR_POWER_LEVEL, RoomVersion, StateResAlgorithm

StateKey = tuple[str, str]
StateMap = Mapping[StateKey, str]

#: ``(state_sets, conflicted_event_ids or None) -> (auth_difference, conflicted_subgraph)``
#: (the state sets as given to :func:`resolve`; ``None`` asks for no subgraph, as in v2):
#: a faster source of the auth-graph facts (e.g. a chain cover index) may replace the walk.
AuthGraphFacts = Callable[[Sequence[StateMap], "set[str] | None"],
                          "tuple[set[str], set[str] | None]"]


class UnsupportedStateRes(ValueError):
    pass


def split(state_sets: Sequence[StateMap]) -> tuple[dict[StateKey, str], dict[StateKey, set[str]]]:
    """(unconflicted, conflicted): a key is unconflicted iff every set has it with the same
    event; a key missing from some set is conflicted among the events the others have.

    Big rooms have ~all keys unconflicted: one comprehension per further set finds them, and
    a set holding only unconflicted entries is not looked at again."""
    unconflicted: Mapping[StateKey, str] = state_sets[0]
    for other in state_sets[1:]:
        get = other.get
        unconflicted = {k: v for k, v in unconflicted.items() if get(k) == v}
    unconflicted = dict(unconflicted)
    conflicted: dict[StateKey, set[str]] = {}
    for s in state_sets:
        if len(s) == len(unconflicted):
            continue  # every entry of s is unconflicted
        for key, event_id in s.items():
            if key not in unconflicted:
                events = conflicted.get(key)
                if events is None:
                    conflicted[key] = {event_id}
                else:
                    events.add(event_id)
    return unconflicted, conflicted


def split_differing(state_sets: Sequence[StateMap], differing: Iterable[StateKey]) -> dict[StateKey, set[str]]:
    """The conflicted keys of ``state_sets`` (as :func:`split`), looking only at ``differing``:
    keys outside it must have the same event (or none) in every set. A fork's sets differ on
    the few keys its branches changed (found from the state groups' deltas), so this costs
    that, not the room's state size; the unconflicted part is every other key of any set."""
    conflicted: dict[StateKey, set[str]] = {}
    for key in differing:
        values = [s.get(key) for s in state_sets]
        first = values[0]
        if first is not None and all(v == first for v in values):
            continue
        events = {v for v in values if v is not None}
        if events:
            conflicted[key] = events
    return conflicted


class SplitSets(list[StateMap]):
    """The state sets of one resolution with their conflicted keys: an auth-graph facts
    source that knows it (``RoomAuthChains``, ``ChainIndex.graph_facts``) takes the events
    the sets do not share from the conflicted keys instead of comparing whole sets."""

    def __init__(self, state_sets: Sequence[StateMap], conflicted: Mapping[StateKey, Collection[str]]) -> None:
        super().__init__(state_sets)
        self.conflicted = conflicted

    def own_events(self) -> list[set[str]]:
        """Per set, its events that not every set has (an event has one key: they are its
        values at the conflicted keys)."""
        keys = list(self.conflicted)
        return [{s[k] for k in keys if k in s} for s in self]

    def is_common(self, event_id: str, key: StateKey) -> bool:
        """Whether every set holds ``event_id`` (whose key is ``key``)."""
        return key not in self.conflicted and self[0].get(key) == event_id


def auth_closure(starts: Iterable[str], events: Mapping[str, Event],
                 stop: Collection[str] = ()) -> set[str]:
    """The starts and every event reachable from them over ``auth_events`` edges (events in
    ``stop`` are neither included nor walked through; unknown IDs are included, not walked).

    Breadth-first by whole frontiers, so the set work happens in C. A mapping with an
    ``ensure(ids)`` method (one backed by a database) is handed each frontier first, to load
    what it lacks in one go rather than one look-up per event."""
    seen = set(starts)
    if stop:
        seen.difference_update(stop)
    frontier = seen
    get = events.get
    prefetch = getattr(events, "ensure", None)
    while frontier:
        if prefetch is not None:
            prefetch(frontier)
        reached: set[str] = set()
        for event_id in frontier:
            event = get(event_id)
            if event is not None:
                reached.update(event.auth_event_ids)
        reached -= seen
        if stop:
            reached.difference_update(stop)
        seen |= reached
        frontier = reached
    return seen


def auth_difference(state_sets: Sequence[Collection[str]], events: Mapping[str, Event]) -> set[str]:
    """Union minus intersection of the sets' auth chains (each set's events counted in its
    own chain, as Synapse counts them).

    Whatever every set's chain holds cancels out, so the walk starts from the events the sets
    do not all share and stops at the closure of the shared ones."""
    sets = [set(s) for s in state_sets]
    common: set[str] = sets[0].intersection(*sets[1:]) if sets else set()
    common_chain = auth_closure(common, events)
    chains = [auth_closure(s - common, events, stop=common_chain) for s in sets]
    return set[str]().union(*chains) - chains[0].intersection(*chains[1:])


def conflicted_subgraph(conflicted_ids: Collection[str], events: Mapping[str, Event]) -> set[str]:
    """v2.1: every event on an auth path from one conflicted event to another (both ends
    included): auth ancestors-or-self of a conflicted event that are also auth
    descendants-or-self of one."""
    conflicted = set(conflicted_ids)
    ancestors = auth_closure(conflicted, events)
    # an ancestor is a descendant-or-self of a conflicted event iff it is conflicted or one of
    # its auth events (within the ancestors) is; memoised walk, iterative
    is_desc: dict[str, bool] = {}
    for start in ancestors:
        if start in is_desc:
            continue
        stack = [(start, False)]
        while stack:
            node, expanded = stack.pop()
            if node in is_desc:
                continue
            event = events.get(node)
            parents = [a for a in event.auth_event_ids if a in ancestors] if event else []
            if not expanded:
                stack.append((node, True))
                stack.extend((p, False) for p in parents if p not in is_desc)
            else:
                is_desc[node] = node in conflicted or any(is_desc.get(p, False) for p in parents)
    return {e for e, d in is_desc.items() if d}


def graph_facts_by_walking(events: Mapping[str, Event]) -> AuthGraphFacts:
    """The auth difference and (v2.1) conflicted subgraph computed by walking the events."""
    def facts(state_sets: Sequence[StateMap], conflicted_ids: set[str] | None) -> tuple[set[str], set[str] | None]:
        difference = auth_difference([set(s.values()) for s in state_sets], events)
        subgraph = None if conflicted_ids is None else conflicted_subgraph(conflicted_ids, events)
        return difference, subgraph
    return facts


def is_power_event(event: Event) -> bool:
    """Events that change who may do what: power levels, join rules, the create event, and
    kicks and bans (a leave or ban sent by someone else)."""
    if event.state_key == "" and event.type in ("m.room.power_levels", "m.room.join_rules",
                                                "m.room.create"):
        return True
    if event.type == "m.room.member" and event.membership in ("leave", "ban"):
        return event.sender != event.state_key
    return False


def sender_power(event: Event, events: Mapping[str, Event]) -> int:
    """The sender's level by the event's **own** auth events (not by any resolved state)."""
    pl = create = None
    for auth_id in event.auth_event_ids:
        auth_event = events.get(auth_id)
        if auth_event is None:
            continue
        if auth_event.key == POWER_LEVELS and pl is None:
            pl = auth_event
        elif auth_event.key == CREATE and create is None:
            create = auth_event
    if create is not None and event.version.creators_have_infinite_power \
            and event.sender in creators(create):
        return CREATOR_POWER_LEVEL
    if pl is None:
        return 100 if create is not None and event.sender in creators(create) else 0
    users = pl.content.get("users")
    level = users.get(event.sender) if isinstance(users, dict) else None
    if level is None:
        level = pl.content.get("users_default", 0)
    try:
        return int(level)
    except (TypeError, ValueError):
        return 0


def reverse_topological_power_order(event_ids: Collection[str], events: Mapping[str, Event]) -> list[str]:
    """Kahn's algorithm over the auth edges among ``event_ids``: an event is ready once its
    auth events in the set are out; among the ready ones the highest sender power goes first,
    then the earliest ``origin_server_ts``, then the smallest ID. Oldest first."""
    members = set(event_ids)
    waiting_on: dict[str, int] = {}
    dependants: dict[str, list[str]] = {e: [] for e in members}
    for event_id in members:
        parents = {a for a in events[event_id].auth_event_ids if a in members}
        waiting_on[event_id] = len(parents)
        for parent in parents:
            dependants[parent].append(event_id)

    def sort_key(event_id: str) -> tuple[int, int, str]:
        event = events[event_id]
        return (-sender_power(event, events), event.origin_server_ts, event_id)

    ready = [sort_key(e) for e, n in waiting_on.items() if n == 0]
    heapq.heapify(ready)
    out: list[str] = []
    while ready:
        _, _, event_id = heapq.heappop(ready)
        out.append(event_id)
        for child in dependants[event_id]:
            waiting_on[child] -= 1
            if waiting_on[child] == 0:
                heapq.heappush(ready, sort_key(child))
    return out


def iterative_auth_checks(ordered_ids: Iterable[str], base: Mapping[StateKey, str],
                          events: Mapping[str, Event], rejected: Collection[str]) -> dict[StateKey, str]:
    """Apply the events in order: each is checked (rules 4 on) against its own non-rejected
    auth events, overridden by what the state built so far holds for its auth keys; one that
    passes takes its key. Events already rejected never come back (as in Synapse)."""
    state = dict(base)
    state.update(_auth_checked(ordered_ids, base.get, events, rejected))
    return state


def _auth_checked(ordered_ids: Iterable[str], base: Callable[[StateKey], str | None],
                  events: Mapping[str, Event], rejected: Collection[str]) -> dict[StateKey, str]:
    """:func:`iterative_auth_checks` on a state read through ``base`` (a look-up, so a big
    state is never copied): only the keys the events took."""
    taken: dict[StateKey, str] = {}
    for event_id in ordered_ids:
        event = events[event_id]
        auth_state: dict[StateKey, Event] = {}
        for auth_id in event.auth_event_ids:
            auth_event = events.get(auth_id)
            if auth_event is not None and auth_id not in rejected:
                auth_state[auth_event.key] = auth_event
        for key in auth_types_for_event(event):
            current = taken[key] if key in taken else base(key)
            if current is not None and current not in rejected and current in events:
                auth_state[key] = events[current]
        if event_id in rejected:
            continue
        try:
            check_state_dependent(event, auth_state)
        except AuthFailed:
            continue
        taken[event.key] = event_id
    return taken


def mainline_order(event_ids: Iterable[str], pivot: str | None,
                   events: Mapping[str, Event]) -> list[str]:
    """Sort by (mainline position, ts, ID). The mainline is the pivot power-levels event and
    the chain of power-levels events each cites, numbered from the oldest (1); an event's
    position is that of the first mainline event reached by following power-levels auth
    events, 0 if none (so events of older "epochs" are applied first and newer ones win)."""
    mainline: list[str] = []
    current = pivot
    while current is not None:
        mainline.append(current)
        current = _power_levels_auth_event(events[current], events)
    position = {event_id: i for i, event_id in enumerate(reversed(mainline), start=1)}

    def depth(event_id: str) -> int:
        seen: str | None = event_id
        while seen is not None:
            if seen in position:
                return position[seen]
            event = events.get(seen)
            seen = _power_levels_auth_event(event, events) if event is not None else None
        return 0

    keyed = []
    for event_id in event_ids:
        event = events[event_id]
        keyed.append((depth(event_id), event.origin_server_ts, event_id))
    keyed.sort()
    return [k[2] for k in keyed]


def _power_levels_auth_event(event: Event, events: Mapping[str, Event]) -> str | None:
    for auth_id in event.auth_event_ids:
        auth_event = events.get(auth_id)
        if auth_event is not None and auth_event.key == POWER_LEVELS:
            return auth_id
    return None


def resolve(version: RoomVersion, state_sets: Sequence[StateMap], events: Mapping[str, Event],
            rejected: Collection[str] = frozenset(),
            graph_facts: AuthGraphFacts | None = None,
            differing: Iterable[StateKey] | None = None) -> dict[StateKey, str]:
    """The resolved state (``key -> event ID``) of ``state_sets`` in a room of ``version``.

    ``events`` must hold every event of the sets and of their auth chains; ``rejected`` the
    IDs of those that were rejected. ``graph_facts`` may supply the auth difference and
    conflicted subgraph (default: walk the events); ``differing`` as for
    :func:`resolve_changes`."""
    if not state_sets:
        if version.state_res is StateResAlgorithm.V1:
            raise UnsupportedStateRes("room version 1 uses state resolution v1, not implemented")
        return {}
    return apply_changes(state_sets[0], resolve_changes(version, state_sets, events, rejected, graph_facts, differing))


def apply_changes(base: Mapping[StateKey, str], changes: Mapping[StateKey, str | None]) -> dict[StateKey, str]:
    """A copy of ``base`` with ``changes`` (:func:`resolve_changes`' form: None removes the key)."""
    resolved = dict(base)
    for key, event_id in changes.items():
        if event_id is None:
            del resolved[key]
        else:
            resolved[key] = event_id
    return resolved


def resolve_changes(version: RoomVersion, state_sets: Sequence[StateMap], events: Mapping[str, Event],
                    rejected: Collection[str] = frozenset(),
                    graph_facts: AuthGraphFacts | None = None,
                    differing: Iterable[StateKey] | None = None) -> dict[StateKey, str | None]:
    """The resolved state of ``state_sets`` as its changes to the first set: ``key -> event
    ID``, None for a key it removes (a conflicted key no event of which passed).

    ``differing``: keys outside it have the same event (or none) in every set -- e.g. the
    keys changed since the sets' common ancestor state. Given, nothing walks the whole sets:
    the unconflicted state is read through the first set, the result is the first set plus
    what changed on the conflicted keys. Not given, the sets are compared whole."""
    if version.state_res is StateResAlgorithm.V1:
        raise UnsupportedStateRes("room version 1 uses state resolution v1, not implemented")
    if not state_sets:
        return {}
    first = state_sets[0]
    if differing is None:
        _, conflicted = split(state_sets)
    else:
        conflicted = split_differing(state_sets, differing)
    if not conflicted:
        return {}
    v2_1 = version.state_res is StateResAlgorithm.V2_1
    conflicted_ids = set().union(*conflicted.values())
    facts = graph_facts or graph_facts_by_walking(events)
    difference, subgraph = facts(SplitSets(state_sets, conflicted), conflicted_ids if v2_1 else None)
    full = conflicted_ids | difference
    if v2_1 and subgraph:
        full |= subgraph
    full = {e for e in full if e in events}

    power = set()
    for event_id in full:
        if is_power_event(events[event_id]):
            todo = [event_id]
            while todo:
                current = todo.pop()
                if current in power:
                    continue
                power.add(current)
                todo.extend(a for a in events[current].auth_event_ids
                            if a in full and a not in power)
    power_order = reverse_topological_power_order(power, events)

    def unconflicted(key: StateKey) -> str | None:
        return None if key in conflicted else first.get(key)

    def nothing(key: StateKey) -> str | None:
        return None

    base = nothing if v2_1 else unconflicted
    taken = _auth_checked(power_order, base, events, rejected)

    def partial(key: StateKey) -> str | None:
        return taken[key] if key in taken else base(key)

    others = mainline_order((e for e in full if e not in power), partial(POWER_LEVELS), events)
    taken.update(_auth_checked(others, partial, events, rejected))
    # the unconflicted state is overlaid last: the first set's value of every key but the
    # conflicted ones and those no set has
    changes: dict[StateKey, str | None] = {}
    for key in conflicted:
        chosen = taken.get(key)
        if chosen != first.get(key):
            changes[key] = chosen
    for key, event_id in taken.items():
        if key not in conflicted and key not in first:
            changes[key] = event_id
    return changes
