"""The chain cover index of a room's auth graph: auth chain questions answered from a few
numbers per event instead of walks over every ancestor (docs/storage.md, "The chain cover
index"; Synapse's ``docs/auth_chain_difference_algorithm.md``).

Every indexed state event gets a position ``(chain, seq)``. A *chain* is a run of events in
which each is an auth ancestor of the next (usually the successive versions of one state key:
Bob's member events, the power levels); seq counts from 1 at its oldest event. *Links*
``(origin chain, origin seq) -> (target chain, target seq)`` say that the origin reaches the
target. An event reaches (has in its auth chain) every earlier event of its own chain and,
transitively, every target of a link whose origin on its chain is at or below its own seq.

Positions are assigned in one pass over events in an order where auth events come first: an
event continues the chain of its first auth event with the same ``(type, state_key)`` if that
event is still the chain's head, else it starts a new chain. Links go to the event's auth
events on other chains, except those already reachable through another of its auth events,
and except those an existing link between the same two chains already implies. The result
depends only on the order the events are given in, so the batch job (ordered by stream
ordering) rebuilds exactly what the persist path built incrementally.

The auth difference of several state sets is then, per chain, the events above the lowest
and up to the highest position any set reaches there.
"""
from __future__ import annotations

import heapq
from collections.abc import Collection, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rooms.matrix.event_format import Event
from rooms.matrix.state_res import AuthGraphFacts, SplitSets, conflicted_subgraph
from rooms.matrix.state_res import auth_difference as walked_difference

Position = tuple[int, int]  # (chain ID, sequence number)
Link = tuple[int, int, int, int]  # (origin chain, origin seq, target chain, target seq)


@dataclass(frozen=True, slots=True)
class IndexEvent:
    """What the index needs of an event: its key and its auth events (in v12 including the
    implied create event)."""

    event_id: str
    type: str
    state_key: str
    auth_event_ids: tuple[str, ...]


@dataclass
class Added:
    """What one :meth:`ChainIndex.extend` call added, as rows to store."""

    positions: list[tuple[str, int, int]] = field(default_factory=list)  # (event, chain, seq)
    links: list[Link] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)  # auth events not indexed: not yet placed


class NotIndexed(KeyError):
    """An event the question is about has no position (not a state event, or its auth chain
    is incomplete): the caller walks instead."""


@dataclass
class ChainIndex:
    """An in-memory chain cover index (of one room or several)."""

    positions: dict[str, Position] = field(default_factory=dict)
    keys: dict[str, tuple[str, str]] = field(default_factory=dict)  # event -> (type, state_key)
    #: chain -> its events by seq (index seq-1); its length is the chain's head seq
    chains: dict[int, list[str]] = field(default_factory=dict)
    #: origin chain -> target chain -> [(origin seq, target seq)], none implied by another
    links: dict[int, dict[int, list[tuple[int, int]]]] = field(default_factory=dict)
    #: the same links the other way round: target chain -> origin chain -> [(origin seq, target seq)]
    incoming: dict[int, dict[int, list[tuple[int, int]]]] = field(default_factory=dict, compare=False, repr=False)
    next_chain_id: int = 1
    #: event -> its reach; a placed event's reach never changes (new links start above
    #: every existing seq of their chain), so it is computed once per event
    _reach_cache: dict[str, dict[int, int]] = field(default_factory=dict, compare=False, repr=False)

    def copy(self) -> ChainIndex:
        """An index of the same graph that can be extended without changing this one (a
        placed event's reach never changes: the memo's entries are shared)."""
        return ChainIndex(positions=dict(self.positions), keys=dict(self.keys),
                          chains={c: list(events) for c, events in self.chains.items()},
                          links={o: {t: list(p) for t, p in to.items()} for o, to in self.links.items()},
                          incoming={t: {o: list(p) for o, p in fr.items()} for t, fr in self.incoming.items()},
                          next_chain_id=self.next_chain_id, _reach_cache=dict(self._reach_cache))

    # -- building ---------------------------------------------------------------------------

    def add_position(self, event_id: str, key: tuple[str, str], chain: int, seq: int) -> None:
        """Load a stored position (events of a chain in seq order)."""
        self.positions[event_id] = (chain, seq)
        self.keys[event_id] = key
        events = self.chains.setdefault(chain, [])
        while len(events) < seq:
            events.append("")
        events[seq - 1] = event_id
        self.next_chain_id = max(self.next_chain_id, chain + 1)
        self._reach_cache.clear()

    def add_link(self, link: Link) -> bool:
        """Add a link unless one between the same chains already implies it (its origin at or
        below, its target at or above). True if added. (Links it implies stay: rows once
        stored are never rewritten, and the in-memory index matches the stored one.)"""
        self._reach_cache.clear()
        return self._add_link(link)

    def _add_link(self, link: Link) -> bool:
        oc, os_, tc, ts = link
        pairs = self.links.setdefault(oc, {}).setdefault(tc, [])
        for o, t in pairs:
            if o <= os_ and t >= ts:
                return False
        pairs.append((os_, ts))
        self.incoming.setdefault(tc, {}).setdefault(oc, []).append((os_, ts))
        return True

    def extend(self, events: Iterable[IndexEvent]) -> Added:
        """Place new events (state events; already indexed ones are skipped). Auth events must
        be indexed already or among ``events``; an event whose auth chain is incomplete is
        reported as pending and placed by a later call that brings what it lacks. Within the
        batch, auth events go first, then the order given."""
        added = Added()
        batch: dict[str, IndexEvent] = {}
        rank: dict[str, int] = {}
        for event in events:
            if event.event_id not in self.positions and event.event_id not in batch:
                rank[event.event_id] = len(batch)
                batch[event.event_id] = event
        waiting: dict[str, int] = {}
        dependants: dict[str, list[str]] = {}
        unplaceable: set[str] = set()
        for event_id, event in batch.items():
            n = 0
            for auth_id in event.auth_event_ids:
                if auth_id == event_id or auth_id in self.positions:
                    continue
                if auth_id in batch:
                    n += 1
                    dependants.setdefault(auth_id, []).append(event_id)
                else:
                    unplaceable.add(event_id)
            waiting[event_id] = n
        ready = [(rank[e], e) for e, n in waiting.items() if n == 0 and e not in unplaceable]
        heapq.heapify(ready)
        placed: set[str] = set()
        while ready:
            _, event_id = heapq.heappop(ready)
            self._place(batch[event_id], added)
            placed.add(event_id)
            for child in dependants.get(event_id, ()):
                waiting[child] -= 1
                if waiting[child] == 0 and child not in unplaceable:
                    heapq.heappush(ready, (rank[child], child))
        added.pending = [e for e in batch if e not in placed]
        return added

    def _place(self, event: IndexEvent, added: Added) -> None:
        key = (event.type, event.state_key)
        auth = [a for a in dict.fromkeys(event.auth_event_ids) if a != event.event_id]
        chain: int | None = None
        seq = 0
        for auth_id in auth:
            if self.keys[auth_id] == key:
                c, s = self.positions[auth_id]
                if len(self.chains[c]) == s:  # the chain's head: continue it
                    chain, seq = c, s + 1
                break
        if chain is None:
            chain, seq = self.next_chain_id, 1
            self.next_chain_id += 1
        self.positions[event.event_id] = (chain, seq)
        self.keys[event.event_id] = key
        self.chains.setdefault(chain, []).append(event.event_id)
        added.positions.append((event.event_id, chain, seq))

        targets = [a for a in auth if self.positions[a][0] != chain]
        if not targets:
            return
        reaches = {a: self._reach_of(a) for a in auth} if len(auth) > 1 else {}
        for target in targets:
            tc, ts = self.positions[target]
            if any(other != target and reach.get(tc, 0) >= ts for other, reach in reaches.items()):
                continue  # reachable through another auth event
            link = (chain, seq, tc, ts)
            if self._add_link(link):
                added.links.append(link)

    # -- questions --------------------------------------------------------------------------

    def position(self, event_id: str) -> Position:
        try:
            return self.positions[event_id]
        except KeyError:
            raise NotIndexed(event_id) from None

    def reach(self, event_ids: Iterable[str]) -> dict[int, int]:
        """Per chain, the highest seq the events' auth chains (events included) hold there."""
        return self._raised({}, event_ids)

    def _reach_of(self, event_id: str) -> dict[int, int]:
        cache = self._reach_cache
        reach = cache.get(event_id)
        if reach is None:
            if len(cache) > 50_000:  # bounded memory in huge rooms
                cache.clear()
            reach = cache[event_id] = self.reach([event_id])
        return reach

    def is_ancestor(self, ancestor: str, descendant: str) -> bool:
        """``ancestor`` is in the auth chain of ``descendant`` (or is it)."""
        chain, seq = self.position(ancestor)
        return self.reach([descendant]).get(chain, 0) >= seq

    def auth_chain(self, event_ids: Iterable[str]) -> set[str]:
        """The events and their whole auth chains."""
        out: set[str] = set()
        for chain, top in self.reach(event_ids).items():
            out.update(self.chains[chain][:top])
        return out

    def auth_difference(self, state_sets: Sequence[Collection[str]]) -> set[str]:
        """Union minus intersection of the sets' auth chains (each set's own events counted in
        its chain, as Synapse counts them). Raises :class:`NotIndexed` for an event without a
        position.

        Every set's chain is the chain of the events all sets share (``common``: in a big
        room nearly the whole state) plus that of its own other events. Per chain, the
        difference is the positions between the lowest and the highest of the sets, above
        what ``common`` already reaches there. So only the few events the sets do not share
        are followed forward, and ``common`` is asked -- backwards, from the chains where the
        sets differ -- whether it reaches a position; it is never walked as a whole (that
        walk over a big room's entire auth history was the cost)."""
        sets = [set(s) for s in state_sets]
        if not sets:
            return set()
        common = set.intersection(*sets)
        if not common <= self.positions.keys():  # NotIndexed as before, whatever the sets share
            self.position(next(e for e in common if e not in self.positions))
        return self._difference([s - common for s in sets], common)

    def state_difference(self, state_sets: Sequence[Mapping[tuple[str, str], str]],
                         common_placed: bool = False) -> set[str]:
        """The auth difference of state maps: from their conflicted keys when they are
        :class:`SplitSets` (:meth:`split_difference`), else of their whole value sets."""
        if isinstance(state_sets, SplitSets):
            return self.split_difference(state_sets, common_placed)
        return self.auth_difference([set(s.values()) for s in state_sets])

    def split_difference(self, sets: SplitSets, common_placed: bool = False) -> set[str]:
        """:meth:`auth_difference` of state sets that know their conflicted keys: each set's
        own events are its values there, and ``common`` is asked event by event (by key),
        never built -- so a fork costs what its branches changed, not the state size.
        ``common_placed``: the caller knows every event of the first set has a position
        (else that is checked here, a pass over the first set)."""
        if not sets:
            return set()
        if not common_placed and not self.positions.keys() >= set(sets[0].values()):
            missing = [e for k, e in sets[0].items() if sets.is_common(e, k) and e not in self.positions]
            if missing:
                raise NotIndexed(missing[0])
        return self._difference(sets.own_events(), _Common(sets, self.keys))

    def _difference(self, own: Sequence[Collection[str]], common: Container[str]) -> set[str]:
        """Per chain, the positions between the lowest and highest of what each set's ``own``
        events reach, above what the ``common`` events reach."""
        reaches = [self._raised({}, s) for s in own]
        out: set[str] = set()
        for chain in set().union(*reaches):
            values = [r.get(chain, 0) for r in reaches]
            lo, hi = min(values), max(values)
            if hi == lo:
                continue
            floor = self._common_reach(chain, lo, hi, common)
            if hi > floor:
                out.update(self.chains[chain][floor:hi])
        return out

    def _common_reach(self, chain: int, lo: int, hi: int, common: Container[str]) -> int:
        """The highest seq in ``(lo, hi]`` of ``chain`` that the auth chains of ``common``
        reach, else ``lo`` (they hold a prefix of every chain: a binary search)."""
        if self._reached_by(chain, hi, common):
            return hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._reached_by(chain, mid, common):
                lo = mid
            else:
                hi = mid
        return lo

    def _reached_by(self, chain: int, seq: int, events: Container[str]) -> bool:
        """Whether ``(chain, seq)`` is in the auth chain of one of ``events``: a search back
        over the positions that reach it -- later ones on its chain, and those at or above the
        origin of a link into it at or above it -- for one of ``events``."""
        lowest = {chain: seq}  # per chain, from which seq on its positions reach the target
        todo = [chain]
        scanned: dict[int, int] = {}  # per chain, the lowest seq already checked
        while todo:
            c = todo.pop()
            m = lowest[c]
            ids = self.chains.get(c, ())
            end = scanned.get(c, len(ids) + 1)
            for event_id in ids[m - 1:end - 1]:
                if event_id in events:
                    return True
            scanned[c] = m
            for origin, pairs in self.incoming.get(c, {}).items():
                best = 0
                for o, t in pairs:
                    if t >= m and (best == 0 or o < best):
                        best = o
                if best and best < lowest.get(origin, best + 1):
                    lowest[origin] = best
                    todo.append(origin)
        return False

    def _raised(self, base: Mapping[int, int], event_ids: Iterable[str]) -> dict[int, int]:
        """The reach of ``base``'s events plus ``event_ids``, where it is above ``base``."""
        over: dict[int, int] = {}
        todo: list[int] = []
        for event_id in event_ids:
            chain, seq = self.position(event_id)
            if seq > over.get(chain, base.get(chain, 0)):
                over[chain] = seq
                todo.append(chain)
        links = self.links
        while todo:
            chain = todo.pop()
            top = over[chain]
            for target, pairs in links.get(chain, {}).items():
                best = 0
                for o, t in pairs:
                    if o <= top and t > best:
                        best = t
                if best > over.get(target, base.get(target, 0)):
                    over[target] = best
                    todo.append(target)
        return over

    def graph_facts(self, events: Mapping[str, Event]) -> AuthGraphFacts:
        """A ``graph_facts`` for ``state_res.resolve``: the auth difference from the index (a
        walk when an event has no position), the v2.1 conflicted subgraph by walking."""

        def facts(state_sets: Sequence[Mapping[tuple[str, str], str]],
                  conflicted_ids: set[str] | None) -> tuple[set[str], set[str] | None]:
            try:
                difference = self.state_difference(state_sets)
            except NotIndexed:
                difference = walked_difference([set(s.values()) for s in state_sets], events)
            subgraph = None if conflicted_ids is None else conflicted_subgraph(conflicted_ids, events)
            return difference, subgraph
        return facts


class _Common:
    """The events every state set holds, asked one by one (through the event's key)."""

    __slots__ = ("_sets", "_keys")

    def __init__(self, sets: SplitSets, keys: Mapping[str, tuple[str, str]]) -> None:
        self._sets, self._keys = sets, keys

    def __contains__(self, event_id: object) -> bool:
        key = self._keys.get(event_id)  # type: ignore[call-overload]
        return key is not None and self._sets.is_common(event_id, key)  # type: ignore[arg-type]


def build(events: Iterable[IndexEvent]) -> ChainIndex:
    """A fresh index of ``events`` (the pending ones are left out)."""
    index = ChainIndex()
    index.extend(events)
    return index


def canonical(positions: Iterable[tuple[str, int, int]], links: Iterable[Link]
              ) -> tuple[dict[str, tuple[str, int]], set[tuple[str, int, str, int]]]:
    """Positions and links with each chain named by its first event instead of its number, so
    two indexes built with different chain numbering compare equal when they agree."""
    positions = list(positions)
    root = {chain: event_id for event_id, chain, seq in positions if seq == 1}
    by_event = {e: (root.get(c, f"#{c}"), s) for e, c, s in positions}
    named_links = {(root.get(oc, f"#{oc}"), os_, root.get(tc, f"#{tc}"), ts) for oc, os_, tc, ts in links}
    return by_event, named_links


def auth_events_of(pdu: Mapping[str, Any], room_id: str | None = None) -> tuple[str, ...]:
    """An event's auth event IDs as its stored JSON lists them (v1-2 ``[id, hashes]`` pairs or
    plain IDs), plus the implied create event of a v12 room (whose room ID is ``!`` + the
    create event's hash, with no server part)."""
    ids = []
    for ref in pdu.get("auth_events") or ():
        ref = ref[0] if isinstance(ref, (list, tuple)) and ref else ref
        if isinstance(ref, str):
            ids.append(ref)
    room_id = room_id or pdu.get("room_id")
    is_create = pdu.get("type") == "m.room.create" and pdu.get("state_key") == ""
    if isinstance(room_id, str) and room_id.startswith("!") and ":" not in room_id and not is_create:
        create_id = "$" + room_id[1:]
        if create_id not in ids:
            ids.append(create_id)
    return tuple(ids)
