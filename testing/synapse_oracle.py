"""Synapse 1.163.2 called in process as the reference implementation (docs/matrix.md,
"How it is checked").

Its events are built from the very PDU dicts ours are built from; its verdicts come from
``check_state_independent_auth_rules`` + ``check_state_dependent_auth_rules``, its resolved
states from ``synapse.state.v2.resolve_events_with_store``. The auth difference its store
hands it is computed here, independently of ``rooms.matrix.state_res``, by plain walks over
Synapse's own event objects; the v2.1 conflicted subgraph is left to Synapse (all events go in
``event_map``, the store answers ``set()``, which the spec shows gives Synapse's own answer).
"""
from __future__ import annotations

import synapse.event_auth as synapse_auth  # first: synapse.state needs it imported before it (circular import)
from synapse.api.errors import SynapseError
from synapse.api.room_versions import KNOWN_ROOM_VERSIONS
from synapse.events import make_event_from_dict
from synapse.state import v2 as synapse_v2
from synapse.storage.databases.main.event_federation import StateDifference
from twisted.internet import defer


def run_sync(coro):
    """Run a Synapse coroutine that never waits on the reactor; fail if it would."""
    box = []
    defer.ensureDeferred(coro).addBoth(box.append)
    assert box, "the Synapse call did not finish synchronously"
    result = box[0]
    if hasattr(result, "raiseException"):
        result.raiseException()
    return result


class NoWaitClock:
    """Synapse's clock, for calls that never need to wait."""

    async def sleep(self, duration):
        return None


class SynapseEvents:
    """Synapse's copies of a room's events, with their rejections."""

    def __init__(self, version_id: str):
        self.version_id = version_id
        self.room_version = KNOWN_ROOM_VERSIONS[version_id]
        self.events = {}

    def add(self, pdu: dict, rejected: bool = False):
        event = make_event_from_dict(dict(pdu), self.room_version,
                                     rejected_reason="auth_error" if rejected else None)
        self.events[event.event_id] = event
        return event

    def mark_rejected(self, pdu: dict):
        self.add(pdu, rejected=True)

    # the store protocol of check_state_independent_auth_rules
    async def get_events(self, event_ids, redact_behaviour=None, get_prev_content=False,
                         allow_rejected=False):
        return {e: self.events[e] for e in event_ids if e in self.events
                and (allow_rejected or self.events[e].rejected_reason is None)}

    def verdict(self, event, state_before: dict | None) -> bool:
        """Accepted at receipt? (its own auth events, then the state before it)"""
        try:
            run_sync(synapse_auth.check_state_independent_auth_rules(
                _AllowRejected(self), event))
            own = [self.events[i] for i in event.auth_event_ids()]
            synapse_auth.check_state_dependent_auth_rules(event, own)
            if state_before is not None:
                keys = synapse_auth.auth_types_for_event(self.room_version, event)
                before = [self.events[state_before[k]] for k in keys if k in state_before]
                synapse_auth.check_state_dependent_auth_rules(event, before)
            return True
        except SynapseError:
            return False

    def resolve(self, room_id: str, state_sets: list[dict]) -> dict:
        return dict(run_sync(synapse_v2.resolve_events_with_store(
            NoWaitClock(), room_id, self.room_version, state_sets, dict(self.events),
            _ResolutionStore(self))))

    def auth_difference(self, room_id: str, state_sets: list[dict]) -> set:
        """Synapse's own auth difference (v2, no conflicted subgraph): its state-res code
        computes it itself for events it is handed as not yet persisted, which is all here."""
        return set(run_sync(synapse_v2._get_auth_chain_difference(
            room_id, state_sets, dict(self.events), _ResolutionStore(self), None)))


class _AllowRejected:
    """The independent rules must see rejected auth events to reject on them."""

    def __init__(self, events: SynapseEvents):
        self._events = events

    async def get_events(self, event_ids, redact_behaviour=None, get_prev_content=False,
                         allow_rejected=False):
        return await self._events.get_events(event_ids, allow_rejected=True)


class _ResolutionStore:
    def __init__(self, events: SynapseEvents):
        self._events = events.events

    async def get_events(self, event_ids, allow_rejected=False):
        return {e: self._events[e] for e in event_ids if e in self._events}

    def _chain(self, starts):
        seen, todo = set(), list(starts)
        while todo:
            e = todo.pop()
            if e in seen:
                continue
            seen.add(e)
            if e in self._events:
                todo.extend(self._events[e].auth_event_ids())
        return seen

    async def get_auth_chain_difference(self, room_id, state_sets, conflicted_state=None,
                                        additional_backwards_reachable_conflicted_events=None):
        chains = [self._chain(s) for s in state_sets]
        difference = set.union(*chains) - set.intersection(*chains)
        return StateDifference(auth_difference=difference,
                               conflicted_subgraph=set() if conflicted_state is not None else None)
