"""Redactions: the flag on the target event, and the pruned form reads return.

``events`` rows are facts and never change, with one documented exception: the ``redacted``
flag. :func:`mark_redacted` is the only code that updates it (one narrow ``UPDATE`` of that
column, inside the persist transaction); the stored JSON is never touched, so the original
stays available until a censoring job (not part of this store) decides otherwise.
"""
from __future__ import annotations

import json
from typing import Any, Sequence

from .events import CREATE
from .sql import array, in_array

_KEEP_TOP = ("event_id", "type", "room_id", "sender", "state_key", "content", "hashes", "signatures",
             "depth", "prev_events", "auth_events", "origin_server_ts")
#: content keys kept by the redaction algorithm, per event type (room versions 1-11, merged)
_KEEP_CONTENT = {
    "m.room.member": ("membership", "join_authorised_via_users_server"),
    "m.room.create": None,  # all of it
    "m.room.join_rules": ("join_rule", "allow"),
    "m.room.power_levels": ("ban", "events", "events_default", "invite", "kick", "redact", "state_default",
                            "users", "users_default"),
    "m.room.history_visibility": ("history_visibility",),
    "m.room.redaction": ("redacts",),
}


def mark_redacted(cursor: Any, event_ids: Sequence[str]) -> None:
    """Set ``events.redacted`` on the targets (the one permitted change to an event row)."""
    if event_ids:
        cursor.execute(f"UPDATE events SET redacted = TRUE WHERE {in_array(cursor, 'event_id')} AND type <> %s",
                       [array(cursor, event_ids), CREATE])


def prune_event(body: dict[str, Any]) -> dict[str, Any]:
    """The redacted form of an event: only the keys the redaction algorithm keeps."""
    pruned = {k: v for k, v in body.items() if k in _KEEP_TOP}
    keep = _KEEP_CONTENT.get(body.get("type"), ())
    content = body.get("content") if isinstance(body.get("content"), dict) else {}
    pruned["content"] = dict(content) if keep is None else {k: v for k, v in content.items() if k in keep}
    unsigned = body.get("unsigned")
    if isinstance(unsigned, dict) and "age_ts" in unsigned:
        pruned["unsigned"] = {"age_ts": unsigned["age_ts"]}
    return pruned


def client_json(raw: bytes, redacted: bool) -> bytes:
    """The bytes a read returns: as stored, or pruned when the event is redacted."""
    if not redacted:
        return raw
    pruned = prune_event(json.loads(raw))
    pruned.setdefault("unsigned", {})["redacted"] = True
    return json.dumps(pruned, separators=(",", ":"), ensure_ascii=False).encode()
