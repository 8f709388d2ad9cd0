"""Builds real rooms of any version, event by event, as a homeserver would: each event's
``auth_events`` are selected from the state before it (resolved across its prev events), its
ID is computed per room version, and it is authorized -- accepted events change the state,
rejected ones do not.

For generators and tests: the events come out as the PDU dicts federation would carry, with
the state before each and the verdict, so another implementation can be checked against them.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from rooms.matrix.auth_rules import (
    AuthFailed,
    MissingAuthEvent,
    auth_state_from,
    auth_types_for_event,
    check_against_auth_events,
    check_state_dependent,
)
from rooms.matrix.event_format import Event, parse_pdu, with_content_hash
from rooms.matrix.room_versions import RoomVersion
from rooms.matrix.state_res import StateKey, resolve


@dataclass
class RoomBuilder:
    version: RoomVersion
    room_id: str | None = None  # v1-11: chosen by the creator; v12: from the create event
    events: dict[str, Event] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)  # event ID -> reason
    state_before: dict[str, dict[StateKey, str]] = field(default_factory=dict)
    state_after: dict[str, dict[StateKey, str]] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    _clock: itertools.count[int] = field(default_factory=lambda: itertools.count(1_700_000_000_000))
    _serial: itertools.count[int] = field(default_factory=itertools.count)

    def state_at(self, prev_ids: list[str]) -> dict[StateKey, str]:
        """The state before an event with these prev events."""
        if not prev_ids:
            return {}
        if len(prev_ids) == 1:
            return dict(self.state_after[prev_ids[0]])
        return resolve(self.version, [self.state_after[p] for p in prev_ids], self.events,
                       self.rejected.keys())

    def send(self, sender: str, event_type: str, content: dict[str, Any], *, state_key: str | None = None,
             prev_ids: list[str] | None = None, extra: dict[str, Any] | None = None,
             auth_ids: list[str] | None = None, auth_from: dict[StateKey, str] | None = None) -> str:
        """Create, authorize and add one event; returns its ID (check ``rejected``).

        ``auth_ids`` overrides the selection of auth events, ``auth_from`` selects them from
        another state than the one before the event (to build what a buggy or stale server
        would send)."""
        if prev_ids is None:
            prev_ids = [self.order[-1]] if self.order else []
        before = self.state_at(prev_ids)
        pdu = {"type": event_type, "sender": sender, "content": content,
               "depth": 1 + max((self.events[p].depth for p in prev_ids), default=0),
               "origin_server_ts": next(self._clock), "prev_events": list(prev_ids),
               "auth_events": []}
        if state_key is not None:
            pdu["state_key"] = state_key
        is_create = event_type == "m.room.create" and state_key == ""
        if not (is_create and self.version.room_id_from_create_event):
            pdu["room_id"] = self.room_id
        if extra:
            pdu.update(extra)
        if not self.version.event_ids_are_hashes:
            pdu["event_id"] = f"${next(self._serial)}:{sender.partition(':')[2]}"
        draft = parse_pdu(with_content_hash(self._as_refs(pdu)), self.version)
        if auth_ids is None:
            source = before if auth_from is None else auth_from
            auth_ids = [source[k] for k in sorted(auth_types_for_event(draft)) if k in source]
        if self.version.room_id_from_create_event:
            auth_ids = [a for a in auth_ids if self.events[a].key != ("m.room.create", "")]
        pdu["auth_events"] = auth_ids
        event = parse_pdu(with_content_hash(self._as_refs(pdu)), self.version)
        if is_create and self.version.room_id_from_create_event:
            self.room_id = event.room_id
        self.events[event.event_id] = event
        self.order.append(event.event_id)
        self.state_before[event.event_id] = before
        try:
            # receipt steps 4 and 5: against its own auth events, then the state before it
            check_against_auth_events(event, self.events.get, self.rejected.keys())
            if not is_create:
                check_state_dependent(event, auth_state_from(event, before, self.events.get))
        except (AuthFailed, MissingAuthEvent) as e:
            self.rejected[event.event_id] = str(e)
            self.state_after[event.event_id] = before
            return event.event_id
        after = dict(before)
        if event.is_state:
            after[event.key] = event.event_id
        self.state_after[event.event_id] = after
        return event.event_id

    def _as_refs(self, pdu: dict[str, Any]) -> dict[str, Any]:
        if not self.version.refs_are_pairs:
            return pdu
        return dict(pdu, prev_events=[[p, {}] for p in pdu["prev_events"]],
                    auth_events=[[a, {}] for a in pdu["auth_events"]])

    def pdu(self, event_id: str) -> dict[str, Any]:
        return self.events[event_id].pdu
