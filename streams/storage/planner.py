"""The persist path's decisions: parsed events + a loaded :class:`Snapshot` in, a
:class:`~streams.storage.plan.Plan` out. No cursor and no SQL: what the database knows comes
from the snapshot and the :class:`PlanReader` (docs/storage.md, "The persist path").

Per event, in the given order: orderings, then (not an outlier) the state before it, its
authorization, the state after it, current state and visibility; then the batch's
redactions; then the rows. The room contexts of the snapshot are changed in place into the
rooms after the batch (the persister keeps them once the transaction commits).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..matrix.chain_cover import IndexEvent
from ..matrix.state_res import apply_changes
from .authorization import authorize, redaction_applies, resolve_state_changes
from .chain_cover import ChainEvent
from .events import CREATE, MEMBER, BadEvent, ParsedEvent, RoomInfo, StateKey, StateMap
from .plan import (
    ALL_RANGES,
    CurrentStateRow,
    EventRow,
    ExOutlierRow,
    Plan,
    RedactionRow,
    RejectionRow,
    RoomRow,
    VisibilityCut,
    VisibilityRangeRow,
)
from .plan_visibility import HV_KEY, Touched, at_head, off_head, set_open
from .snapshot import Extremity, Key, KnownEvent, PlanReader, PrevInfo, RoomContext, Snapshot
from .state_deltas import GroupLineage, Resolution, StateRef, changes_between, keys_differing
from .state_groups import NewGroup
from .visibility import ANYONE, SHARED_ERAS, grants, normalise_visibility, shared_era

#: the largest depth a computed topological ordering takes (the spec's integer bound)
MAX_DEPTH = 2**53 - 1
#: how many in-place changes of a room's current state can be undone to give a recent group's
#: state (a fork's branches start a few events back)
UNDO_STEPS = 16


def plan_batch(events: Sequence[ParsedEvent], ids: Sequence[int], snapshot: Snapshot, reader: PlanReader, *,
               backfill: bool, now_ms: int) -> Plan:
    """The rows that persist ``events`` (stream IDs ``ids``, reserved in order). Sets each
    event's orderings, state groups and verdict on it; raises :class:`BadEvent` for a batch
    that cannot be stored."""
    return _Planner(events, snapshot, reader, backfill, now_ms).plan(ids)


class _Planner:
    """The working state of one :func:`plan_batch` call (what it has decided so far)."""

    def __init__(self, events: Sequence[ParsedEvent], snapshot: Snapshot, reader: PlanReader, backfill: bool,
                 now_ms: int) -> None:
        self.events = list(events)
        self.by_id = {ev.event_id: ev for ev in self.events}
        self.rooms = snapshot.rooms
        self.known = snapshot.known
        self.snapshot = snapshot
        self.reader = reader
        self.backfill = backfill
        self.now_ms = now_ms
        #: stored outliers of the batch, now with their place in the room
        self.ex_outliers: dict[str, KnownEvent] = {}
        self.stream_ids: dict[str, int] = {}
        self.groups: list[NewGroup] = []
        self.deltas: dict[str, list[dict[str, Any]]] = {}
        self.current_rows: dict[tuple[str, str, str], CurrentStateRow] = {}
        self.touched: Touched = set()
        self.fwd_changed: set[str] = set()
        self.room_changes: dict[str, int] = {}
        self.member_changes: dict[str, int] = {}
        self.redaction_rows: list[RedactionRow] = []
        self.redacted_stored: list[str] = []
        #: recent groups' states rebuilt from current state in this batch (a fork asks twice)
        self.rebuilt: dict[int, StateMap] = {}
        lineage = getattr(reader, "lineage", None)
        self.lineage: GroupLineage = lineage if lineage is not None else GroupLineage()

    def plan(self, ids: Sequence[int]) -> Plan:
        self._check_known()
        # What each state event of the batch says (membership, visibility value), outliers
        # included: a later event of the same batch may have them in its state, and they are
        # not in the database yet.
        for ev in self.events:
            if ev.is_state and (ev.type == MEMBER or (ev.type, ev.state_key) == HV_KEY):
                self.reader.put_facts(ev.event_id, ev.membership, normalise_visibility(
                    ev.body["content"].get("history_visibility")) if ev.type != MEMBER else None)
        self._load_auth_events()
        for ev, sid in zip(self.events, ids):
            ex = self.ex_outliers.get(ev.event_id)
            ev.stream_ordering = sid if ex is None else ex.stream_ordering
            self.stream_ids[ev.event_id] = sid
            prevs = self._order(ev)
            if ex is not None:
                ev.topological_ordering = ex.topological_ordering
            if not ev.outlier:
                self._state_and_visibility(ev, prevs)
            elif ev.matrix is not None:  # an outlier: only its own auth events (spec step 4)
                self._authorize(ev, None)
        self._redactions()
        return self._rows()

    # -- what is stored already ---------------------------------------------------------------

    def _check_known(self) -> None:
        """Duplicates (refused) and stored outliers sent again as full events (de-outliered:
        Synapse's ex_outlier; they keep their row and stream ordering and gain their state);
        ``state_before`` naming unknown events; redactions that arrived before their target."""
        for eid, ev in self.by_id.items():
            row = self.known.get(eid)
            if row is None:
                continue
            if row.outlier and not row.rejected and not ev.outlier:
                self.ex_outliers[eid] = row
                continue
            raise BadEvent(eid, "an event with this event_id is already stored")
        for ev in self.events:
            if ev.state_before:
                unknown = sorted(e for e in ev.state_before.values() if e not in self.known and e not in self.by_id)
                if unknown:
                    raise BadEvent(ev.event_id, f"state_before names events we do not have {unknown[:5]} "
                                                f"(persist them first, as outliers)")
        for waiting in self.snapshot.waiting_redactions:
            target = self.by_id[waiting.target]
            if target.room_id == waiting.room_id and target.type != CREATE and self._redaction_applies(
                    self.reader.matrix.get(waiting.redaction_id) if target.matrix is not None else None,
                    target.matrix):
                target.redacted = True

    # -- orderings ----------------------------------------------------------------------------

    def _prev_info(self, ev: ParsedEvent, prev_id: str) -> PrevInfo | None:
        """What ``ev`` needs of prev event ``prev_id``; None if we do not have it."""
        prev = self.by_id.get(prev_id)
        if prev is not None:
            if prev.stream_ordering == 0:
                raise BadEvent(ev.event_id, f"prev_event {prev_id} comes later in the batch")
            if prev.room_id != ev.room_id:
                raise BadEvent(ev.event_id, f"prev_event {prev_id} is in another room")
            return PrevInfo(prev.key, prev.state_group_after, not prev.outlier)
        row = self.known.get(prev_id)
        if row is None:
            return None
        if row.room_id != ev.room_id:
            raise BadEvent(ev.event_id, f"prev_event {prev_id} is in another room")
        return PrevInfo(row.key, row.state_group, not row.outlier)

    def _order(self, ev: ParsedEvent) -> list[PrevInfo | None]:
        """The event's topological ordering: its ``depth``, else 1 + its deepest prev's (the old
        unsigned format). Returns what its prevs are."""
        infos = [self._prev_info(ev, p) for p in ev.prev_events]
        known = [i for i in infos if i is not None]
        if ev.depth is not None:
            ev.topological_ordering = ev.depth
        elif len(known) == len(infos) or ev.outlier:
            ev.topological_ordering = min(max((i.key[0] for i in known), default=0) + 1, MAX_DEPTH)
        else:
            raise BadEvent(ev.event_id, "no 'depth' and prev_events we do not have")
        return infos

    # -- state --------------------------------------------------------------------------------

    def _state_and_visibility(self, ev: ParsedEvent, infos: list[PrevInfo | None]) -> None:
        ctx = self.rooms[ev.room_id]
        usable = [i for i in infos if i is not None and i.has_state]
        if ev.state_before is None and len(usable) != len(infos):
            if not self.backfill and not ev.rejected_reason:
                missing = [p for p, i in zip(ev.prev_events, infos) if i is None or not i.has_state]
                raise BadEvent(ev.event_id, f"unknown prev_events {missing} (send state_before, or persist them first)")
            raise BadEvent(ev.event_id, "prev_events we do not have: a backfilled event then needs state_before")
        before_group, before_chain, before_map = self._state_before(ctx, ev, usable)
        ev.state_group_before = before_group
        if ev.matrix is not None:
            self._authorize(ev, before_map)
        live = not self.backfill
        fast = (live and not ev.rejected_reason and before_group == ctx.current_group
                and (before_group is not None or ctx.head is None) and (ctx.head is None or ev.key > ctx.head))
        accepted = not ev.rejected_reason
        key = (ev.type, ev.state_key) if ev.state_key is not None else None
        if key is not None and accepted:
            self.reader.put_facts(ev.event_id, ev.membership, normalise_visibility(
                ev.body["content"].get("history_visibility")) if key == HV_KEY else None)
        # the facts the visibility rules need about the state before the event
        if not fast:
            wanted = [before_map.get(HV_KEY), before_map.get((MEMBER, ev.state_key))  # type: ignore[arg-type]
                      if ev.type == MEMBER else None]
            self.reader.load_facts([e for e in wanted if e is not None])
        vis_before = ctx.visibility if fast else self.reader.visibility(before_map.get(HV_KEY))
        member_before = None
        if ev.type == MEMBER:
            member_before = (ctx.memberships.get(ev.state_key) if fast  # type: ignore[arg-type]
                             else self.reader.membership(before_map.get((MEMBER, ev.state_key))))  # type: ignore[arg-type]
        prev_current = None
        after_chain: int | None
        if key is not None and accepted:
            prev_current = ctx.current.get(key) if fast else None
            after_map, after_chain = self._state_after(ctx, ev, key, fast, before_group, before_chain, before_map)
        else:
            after_map, ev.state_group_after, after_chain = before_map, before_group, before_chain
        if not accepted:
            return
        self._room_bookkeeping(ctx, ev, live)
        if fast:
            ctx.current_group, ctx.current_chain, ctx.current_base = ev.state_group_after, after_chain, None
            if key is not None:
                self._current_changed(ev, key, ev.event_id, prev_current)
                if ev.type == MEMBER:
                    ctx.memberships[ev.state_key] = ev.membership  # type: ignore[index,assignment]
            at_head(ctx, self.touched, ev, vis_before, member_before)
            if key == HV_KEY:
                ctx.visibility = self.reader.visibility(ev.event_id)
        else:
            if live:
                self._recompute_current(ctx, ev)
            differing = None if after_map is ctx.current else self._differing(
                [StateRef(ev.state_group_after), self._current_ref(ctx)], [after_map, ctx.current])
            off_head(ctx, self.touched, self.reader, ev, after_map, vis_before, member_before, differing)

    def _state_before(self, ctx: RoomContext, ev: ParsedEvent,
                      usable: list[PrevInfo]) -> tuple[int | None, int | None, StateMap]:
        """(group, its chain length, state) before ``ev``: ``state_before`` as a snapshot, the
        prevs' one group, or their states resolved into a new group."""
        if ev.state_before is not None:
            before_map = ev.state_before
            g = self._new_group(ev, parent=None, parent_chain_length=None, delta={}, full_state=before_map)
            return g.id, 1, before_map
        groups = {i.state_group for i in usable}
        if not usable:
            return None, None, {}
        if len(groups) == 1:
            group = next(iter(groups))
            if group is None:
                return None, None, {}
            if group == ctx.current_group:
                return group, ctx.current_chain, ctx.current
            return group, self.reader.chain_length(group), self._state_of(ctx, group)
        res = self._resolve(ctx, [(i.key, i.state_group) for i in usable])
        resolved = res.state
        # the parent of the new group: any prev's group will do (the latest by key keeps
        # deltas small); its number says nothing about order
        _, base_group = max((i.key, i.state_group) for i in usable)
        base_map = self._state_of(ctx, base_group)
        # what the resolution changed, from the keys where the two can differ (the groups'
        # deltas since their common ancestor and the resolution's own changes)
        delta = changes_between(base_map, resolved, self._differing([StateRef(base_group), StateRef(res.base, res.keys)],
                                                                    [base_map, resolved]))
        if not delta:
            return base_group, self.reader.chain_length(base_group) if base_group is not None else None, base_map
        added = {k: v for k, v in delta.items() if v is not None}
        dropped = len(added) != len(delta)  # a delta cannot remove a key
        parent = None if dropped else base_group
        g = self._new_group(ev, parent=parent, parent_chain_length=self.reader.chain_length(parent) if parent else None,
                            delta=added, full_state=resolved)
        self.lineage.add(g.id, base_group, delta)
        return g.id, g.chain_length, resolved

    def _state_after(self, ctx: RoomContext, ev: ParsedEvent, key: StateKey, fast: bool, before_group: int | None,
                     before_chain: int | None, before_map: StateMap) -> tuple[StateMap, int]:
        """An accepted state event's group after it (a one-row delta); on the fast path the
        room's current map is changed in place and is the group's state."""
        delta = {key: ev.event_id}
        if fast:
            if before_group is not None:
                ctx.undo.append((before_group, key, ctx.current.get(key)))
                del ctx.undo[:-UNDO_STEPS]
            ctx.current[key] = ev.event_id
            after_map = ctx.current
            g = self.reader.new_group(room_id=ev.room_id, event_id=ev.event_id, parent=before_group,
                                      parent_chain_length=before_chain, delta=delta, full_state=lambda: ctx.current,
                                      hint=len(self.events))
        else:
            after_map = dict(before_map)
            after_map[key] = ev.event_id
            g = self.reader.new_group(room_id=ev.room_id, event_id=ev.event_id, parent=before_group,
                                      parent_chain_length=before_chain, delta=delta, full_state=lambda: after_map,
                                      hint=len(self.events))
            self.reader.remember_state(g.id, after_map)
        self.groups.append(g)
        self.lineage.add(g.id, before_group, delta)
        ev.state_group_after = g.id
        return after_map, g.chain_length

    def _new_group(self, ev: ParsedEvent, *, parent: int | None, parent_chain_length: int | None,
                   delta: dict[StateKey, str], full_state: StateMap) -> NewGroup:
        g = self.reader.new_group(room_id=ev.room_id, event_id=ev.event_id, parent=parent,
                                  parent_chain_length=parent_chain_length, delta=delta, full_state=lambda: full_state)
        self.groups.append(g)
        self.reader.remember_state(g.id, full_state)
        return g

    def _room_bookkeeping(self, ctx: RoomContext, ev: ParsedEvent, live: bool) -> None:
        """An accepted event's effect on the room's head, extremities, depth and joins."""
        ctx.note_order(ev.key, live)
        if live:
            ctx.head = ev.key if ctx.head is None or ev.key > ctx.head else ctx.head
            ctx.last_stream = max(ctx.last_stream, ev.stream_ordering)
            self.room_changes[ev.room_id] = ev.stream_ordering
            for p in ev.prev_events:
                ctx.forward.pop(p, None)
            ctx.forward[ev.event_id] = Extremity(ev.key, ev.state_group_after)
            self.fwd_changed.add(ev.room_id)
        elif ctx.head is None:
            ctx.head = ev.key
        ctx.min_depth = ev.topological_ordering if ctx.min_depth is None else min(ctx.min_depth, ev.topological_ordering)
        if ev.type == MEMBER:
            assert ev.state_key is not None
            if ev.stream_ordering > 0:
                self.member_changes[ev.state_key] = ev.stream_ordering
            if ev.membership == "join":
                ctx.joined_at(ev.state_key, ev.key)

    def _load_auth_events(self) -> None:
        """The batch's stored auth events the cache lacks, in one query: each event asking
        for its own cost a round trip per miss, and at 100,000 rooms the members' events
        outgrow the cache (a fifth of the build's time at 5 M events)."""
        wanted = {a for ev in self.events if ev.matrix is not None
                  for a in ev.matrix.auth_event_ids if a not in self.by_id}
        if wanted:
            self.reader.matrix.ensure(wanted)

    def _authorize(self, ev: ParsedEvent, before: StateMap | None) -> None:
        """The verdict of an event of an authorized room (``before``: the state before it;
        None for an outlier, checked against its own auth events only)."""
        assert ev.matrix is not None
        if not ev.rejected_reason:
            ev.rejected_reason = authorize(ev.matrix, before, self.reader.matrix)
        self.reader.matrix.add(ev.matrix, rejected=bool(ev.rejected_reason))
        if ev.state_key is not None:  # the room's auth graph, for state resolution
            self.reader.chains.add(ev.room_id, IndexEvent(ev.event_id, ev.type, ev.state_key,
                                                          ev.matrix.auth_event_ids))

    def _resolve(self, ctx: RoomContext, prevs: list[tuple[Key, int | None]]) -> Resolution:
        """The state at a fork of the prevs' ``(key, state group after)``: Matrix state
        resolution in an authorized room (v2, or v2.1 from room v12; the same groups resolve
        the same way, so the reader caches the result by them); the older unsigned format (and
        room v1) keeps the stand-in. Either way decided from the keys where the prevs' states
        differ (found from the groups' deltas), never a pass over whole states."""
        info: RoomInfo | None = ctx.info
        groups = [g for _, g in prevs]
        if info is not None and info.authorized and info.version is not None:
            cacheable = None not in groups
            if cacheable:
                cached: Resolution | None = self.reader.resolved.get(groups)
                if cached is not None:
                    return cached
            maps = [self._state_of(ctx, g) for g in groups]
            differing = self._differing([StateRef(g) for g in groups], maps)
            changes = resolve_state_changes(
                info.version, maps, self.reader.matrix, differing=differing,
                graph_facts=self.reader.chains.graph_facts(ctx.room_id, self.reader.matrix, groups, self.lineage))
            if changes is not None:
                res = Resolution(apply_changes(maps[0], changes), groups[0], frozenset(changes))
                if cacheable:
                    self.reader.resolved.put(groups, res)
                return res
        # the stand-in: the state after the latest prev, plus the keys only the others have
        # (the latest of them that has it)
        ordered = sorted(prevs, key=lambda p: p[0], reverse=True)
        maps = [self._state_of(ctx, g) for _, g in ordered]
        state = dict(maps[0])
        added = set()
        for k in self._differing([StateRef(g) for _, g in ordered], maps):
            if k not in state:
                for m in maps[1:]:
                    v = m.get(k)
                    if v is not None:
                        state[k] = v
                        added.add(k)
                        break
        return Resolution(state, ordered[0][1], frozenset(added))

    def _differing(self, refs: list[StateRef], maps: list[StateMap]) -> set[StateKey]:
        """The keys where the states ``maps`` (named by ``refs``) may differ: from the groups'
        lineage, else (no common ancestor known) by comparing the maps."""
        keys = self.lineage.differing_keys([r.group for r in refs])
        if keys is None:
            return keys_differing(maps)
        for r in refs:
            keys.update(r.keys)
        return keys

    @staticmethod
    def _current_ref(ctx: RoomContext) -> StateRef:
        if ctx.current_group is not None:
            return StateRef(ctx.current_group)
        return ctx.current_base or StateRef(None)

    def _state_of(self, ctx: RoomContext, group: int | None) -> StateMap:
        """A group's state: the room's current one, a recent one rebuilt from it by undoing
        the changes since (then cached), else the reader's."""
        if group is None:
            return {}
        if group == ctx.current_group:
            return ctx.current
        state = self.rebuilt.get(group)
        if state is not None:
            return state
        for i in range(len(ctx.undo) - 1, -1, -1):
            if ctx.undo[i][0] == group:
                state = self.rebuilt[group] = dict(ctx.current)
                for _, key, value in reversed(ctx.undo[i:]):
                    if value is None:
                        state.pop(key, None)
                    else:
                        state[key] = value
                self.reader.remember_state(group, state)
                return state
        return self.reader.state_of_group(group)

    # -- current state --------------------------------------------------------------------------

    def _current_changed(self, ev: ParsedEvent, key: StateKey, event_id: str | None, prev: str | None) -> None:
        """Current state changed at ``ev``: a row of current_state_events and a ``state`` row."""
        membership = self.reader.membership(event_id) if key[0] == MEMBER else None
        self.current_rows[(ev.room_id, key[0], key[1])] = CurrentStateRow(
            ev.room_id, key[0], key[1], event_id, membership, ev.stream_ordering)
        self.deltas.setdefault(ev.event_id, []).append(
            {"room_id": ev.room_id, "type": key[0], "state_key": key[1], "event_id": event_id,
             "prev_event_id": prev})

    def _recompute_current(self, ctx: RoomContext, ev: ParsedEvent) -> None:
        """After an event off the room's linear head: current state = the resolved state of the
        forward extremities; open visibility ranges follow it."""
        old, old_ref = ctx.current, self._current_ref(ctx)
        if len(ctx.forward) == 1:
            (only,) = ctx.forward.values()
            group = only.state_group
            new = dict(self._state_of(ctx, group))
            new_ref = StateRef(group)
            chain = self.reader.chain_length(group) if group is not None else None
        else:
            res = self._resolve(ctx, [(x.key, x.state_group) for x in ctx.forward.values()])
            new, new_ref = res.state, StateRef(res.base, res.keys)
            group, chain = None, None
        # only after a fork can a key go (None)
        changed = changes_between(old, new, self._differing([old_ref, new_ref], [old, new]))
        self.reader.load_facts([v for v in changed.values() if v is not None])
        old_vis = ctx.visibility
        if ctx.current_group is not None:  # no longer changed in place: the group's state as it is
            self.reader.remember_state(ctx.current_group, old)
        ctx.current, ctx.current_group, ctx.current_chain = new, group, chain
        ctx.current_base = None if group is not None else new_ref
        ctx.undo.clear()
        for k, eid in changed.items():
            self._current_changed(ev, k, eid, old.get(k))
            if k[0] == MEMBER:
                if eid is None:
                    ctx.memberships.pop(k[1], None)
                else:
                    ctx.memberships[k[1]] = self.reader.membership(eid) or "leave"
        ctx.visibility = self.reader.visibility(new.get(HV_KEY))
        users = {k[1] for k in changed if k[0] == MEMBER}
        if old_vis != ctx.visibility:
            users.update(ctx.invited)
        for u in users:
            set_open(ctx, self.touched, u, grants(ctx.memberships.get(u), ctx.visibility), ev.key)
        set_open(ctx, self.touched, ANYONE, ctx.visibility == "world_readable", ev.key)
        set_open(ctx, self.touched, SHARED_ERAS, shared_era(ctx.visibility), ev.key)

    # -- redactions ---------------------------------------------------------------------------

    def _redactions(self) -> None:
        for ev in self.events:
            if ev.redacts is None or ev.rejected_reason or ev.event_id in self.ex_outliers:
                continue
            self.redaction_rows.append(RedactionRow(ev.event_id, ev.redacts, self.now_ms))
            target = self.by_id.get(ev.redacts)
            if target is not None:
                if target.room_id == ev.room_id and target.type != CREATE and \
                        self._redaction_applies(ev.matrix, target.matrix):
                    target.redacted = True
            else:
                stored = self.known.get(ev.redacts)
                if stored is not None and stored.room_id == ev.room_id and (
                        ev.matrix is None or self._redaction_applies(ev.matrix, self.reader.matrix.get(ev.redacts))):
                    self.redacted_stored.append(ev.redacts)

    def _redaction_applies(self, redaction: Any, target: Any) -> bool:
        """Legacy rooms: any redaction in the room applies. Authorized rooms: the spec's check
        (redact level in the redaction's auth events, or the target's own server)."""
        if redaction is None and target is None:
            return True
        if redaction is None or target is None:
            return False
        return redaction_applies(redaction, target, self.reader.matrix)

    # -- the rows -------------------------------------------------------------------------------

    def _rows(self) -> Plan:
        plan = Plan(room_changes=self.room_changes, member_changes=self.member_changes,
                    redacted_stored=self.redacted_stored, redactions=self.redaction_rows,
                    state_groups=self.groups)
        new = [ev for ev in self.events if ev.event_id not in self.ex_outliers]
        # a de-outliered event that is now rejected changes nothing (as in Synapse)
        deoutliered = [ev for ev in self.events if ev.event_id in self.ex_outliers and not ev.rejected_reason]
        skip = {ev.event_id for ev in self.events if ev.event_id in self.ex_outliers and ev.rejected_reason}
        for ev in self.events:
            deltas = [] if self.backfill else self.deltas.get(ev.event_id, [])
            plan.events.append(EventRow(None if ev.event_id in self.ex_outliers else self._event_values(ev), deltas))
        plan.ex_outliers = [ExOutlierRow(self.stream_ids[ev.event_id], ev.event_id, ev.state_group_after)
                            for ev in deoutliered]
        if not self.backfill:
            plan.ex_outlier_wire = [(self.stream_ids[ev.event_id],
                                     [ev.event_id, ev.room_id, ev.type, ev.state_key, ev.redacts, ev.relates_to,
                                      ev.membership, False, False]) for ev in deoutliered]
        plan.rejections = [RejectionRow(ev.event_id, ev.rejected_reason, str(self.now_ms))
                           for ev in new if ev.rejected_reason]
        # auth edges and the chain cover index of the same auth graph (rejected events and
        # outliers too: they are in it, as in Synapse's)
        plan.event_auth = [(ev.event_id, a, ev.room_id) for ev in new if ev.matrix is not None
                           for a in dict.fromkeys(ev.matrix.auth_event_ids)]
        plan.chain_events = [ChainEvent(ev.room_id, IndexEvent(ev.event_id, ev.type, ev.state_key,
                                                               ev.matrix.auth_event_ids))
                             for ev in new if ev.matrix is not None and ev.state_key is not None]
        plan.event_to_state_groups = [(ev.event_id, ev.state_group_after) for ev in self.events
                                      if not ev.outlier and ev.state_group_after is not None
                                      and ev.event_id not in skip]
        accepted = [ev for ev in self.events if not ev.outlier and not ev.rejected_reason]
        plan.event_edges = [(ev.event_id, p, ev.room_id) for ev in accepted
                            for p in dict.fromkeys(ev.prev_events)]
        plan.memberships = [(ev.event_id, ev.state_key, ev.sender, ev.room_id, ev.membership,  # type: ignore[misc]
                             ev.stream_ordering, ev.topological_ordering)
                            for ev in accepted if ev.type == MEMBER]
        plan.resolved_backward = list(self.by_id)
        plan.backward_extremities = self._backward_extremities(accepted)
        plan.forward_extremities = {r: list(self.rooms[r].forward) for r in sorted(self.fwd_changed)}
        plan.current_state = list(self.current_rows.values())
        for r, u in sorted(self.touched):
            rs = self.rooms[r].user_ranges(u)
            # the ranges before the first one changed stay as stored
            kept = rs.stored
            after = rs.ranges[kept - 1][0] if kept else ALL_RANGES
            plan.visibility_cuts.append(VisibilityCut(r, u, after[0], after[1]))
            plan.visibility_ranges.extend(
                VisibilityRangeRow(r, u, start[0], start[1], None if end is None else end[0],
                                   None if end is None else end[1])
                for start, end in rs.ranges[kept:])
            rs.stored = len(rs.ranges)  # once committed (a rollback drops the room's context)
        plan.rooms = [self._room_row(ctx) for ctx in self.rooms.values()]
        return plan

    def _event_values(self, ev: ParsedEvent) -> dict[str, Any]:
        return {
            "topological_ordering": ev.topological_ordering, "depth": ev.topological_ordering,
            "event_id": ev.event_id, "room_id": ev.room_id, "type": ev.type, "state_key": ev.state_key,
            "sender": ev.sender, "membership": ev.membership, "redacts": ev.redacts,
            "relates_to": ev.relates_to, "rejected": bool(ev.rejected_reason), "outlier": ev.outlier,
            "received_ts": self.now_ms, "json": ev.raw, "redacted": ev.redacted,
        }

    def _backward_extremities(self, accepted: list[ParsedEvent]) -> list[tuple[str, str]]:
        """Prevs we do not have (as accepted, non-outlier events)."""
        have = {ev.event_id for ev in accepted}
        missing: dict[tuple[str, str], None] = {}
        for ev in accepted:
            for p in ev.prev_events:
                if p in have:
                    continue
                row = self.known.get(p)
                if row is None or row.outlier:
                    missing[(p, ev.room_id)] = None
        return list(missing)

    @staticmethod
    def _room_row(ctx: RoomContext) -> RoomRow:
        head = ctx.head or (0, 0)
        info = ctx.info
        return RoomRow(ctx.room_id, head[0], head[1], ctx.last_stream, ctx.current_group, ctx.min_depth,
                       info.version.identifier if info is not None and info.version is not None else None,
                       bool(info is not None and info.authorized), ctx.late_stream)
