"""Redactions: the flag on the target event, and the pruned form reads return.

``events`` rows are facts and never change, with one documented exception: the ``redacted``
flag. :func:`mark_redacted` is the only code that updates it (one narrow ``UPDATE`` of that
column, inside the persist transaction); the stored JSON is never touched, so the original
stays available until a censoring job (not part of this store) decides otherwise.
"""
from __future__ import annotations

import json
from typing import Any, Sequence

from rooms.matrix.event_redaction import redact
from rooms.matrix.room_versions import UnknownRoomVersion, room_version
from rooms.storage.incoming_events import CREATE
from rooms.storage.sql import array, in_array


def mark_redacted(cursor: Any, event_ids: Sequence[str]) -> None:
    """Set ``events.redacted`` on the targets (the one permitted change to an event row)."""
    if event_ids:
        cursor.execute(f"UPDATE events SET redacted = TRUE WHERE {in_array(cursor, 'event_id')} AND type <> %s",
                       [array(cursor, event_ids), CREATE])


def prune_event(body: dict[str, Any], version_id: str | None) -> dict[str, Any]:
    """The redacted form of an event: what the redaction algorithm of the room's version
    keeps (rooms/matrix/event_redaction.py; an unknown version: the v1 rules, the most keeping)."""
    try:
        version = room_version(version_id or "1")
    except UnknownRoomVersion:
        version = room_version("1")
    return redact(body, version)


def client_json(raw: bytes, redacted_in: str | None | bool) -> bytes:
    """The bytes a read returns: as stored, or pruned when the event is redacted
    (``redacted_in``: the room version of a redacted event, None/False for the others)."""
    if not redacted_in:
        return raw
    pruned = prune_event(json.loads(raw), redacted_in if isinstance(redacted_in, str) else None)
    pruned.setdefault("unsigned", {})["redacted"] = True
    return json.dumps(pruned, separators=(",", ":"), ensure_ascii=False).encode()
