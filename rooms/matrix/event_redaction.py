"""The redaction algorithm per room version: what of an event survives a redaction.

Used twice: to apply a redaction (what readers see of a redacted event) and to compute v3+
event IDs, which are hashes of the *redacted* form (so content that redaction strips does not
change an ID). The kept keys are the ones the authorization rules read, so a redacted event
still has the same effect on room state.
"""
from __future__ import annotations

from typing import Any

from rooms.matrix.room_versions import RedactionRules, RoomVersion

_KEPT_TOP_LEVEL = frozenset({
    "event_id", "type", "room_id", "sender", "state_key", "content", "hashes", "signatures",
    "depth", "prev_events", "auth_events", "origin_server_ts",
    # dropped from v11 on (MSC2176, MSC3989):
    "origin", "membership", "prev_state",
})
_DROPPED_FROM_V11 = frozenset({"origin", "membership", "prev_state"})
_KEPT_TOP_LEVEL_V11 = _KEPT_TOP_LEVEL - _DROPPED_FROM_V11

_PL_KEYS = ("ban", "events", "events_default", "kick", "redact", "state_default", "users",
            "users_default")
_PL_KEYS_V11 = _PL_KEYS + ("invite",)

#: unsigned keys a redacted copy keeps (what Synapse keeps; never part of a hash)
_KEPT_UNSIGNED = ("age_ts", "replaces_state")


def _kept_content(rules: RedactionRules, aliases_special: bool, event_type: object,
                  content: object) -> dict[str, Any]:
    if not isinstance(content, dict):
        return {}

    def keep(*keys: str) -> dict[str, Any]:
        return {k: content[k] for k in keys if k in content}

    if event_type == "m.room.member":
        if rules.value >= RedactionRules.R11.value:
            kept = keep("membership", "join_authorised_via_users_server")
            tpi = content.get("third_party_invite")
            if isinstance(tpi, dict):
                kept["third_party_invite"] = {"signed": tpi["signed"]} if "signed" in tpi else {}
            return kept
        if rules.value >= RedactionRules.R9.value:
            return keep("membership", "join_authorised_via_users_server")
        return keep("membership")
    if event_type == "m.room.create":
        return dict(content) if rules is RedactionRules.R11 else keep("creator")
    if event_type == "m.room.join_rules":
        if rules.value >= RedactionRules.R8.value:
            return keep("join_rule", "allow")
        return keep("join_rule")
    if event_type == "m.room.power_levels":
        return keep(*(_PL_KEYS_V11 if rules is RedactionRules.R11 else _PL_KEYS))
    if event_type == "m.room.history_visibility":
        return keep("history_visibility")
    if event_type == "m.room.aliases" and aliases_special:
        return keep("aliases")
    if event_type == "m.room.redaction" and rules is RedactionRules.R11:
        return keep("redacts")
    return {}


def redact(event: dict[str, Any], version: RoomVersion) -> dict[str, Any]:
    """The redacted copy of ``event`` (a PDU dict) under ``version``'s rules; the input is
    not changed."""
    rules = version.redaction
    kept = _KEPT_TOP_LEVEL_V11 if rules is RedactionRules.R11 else _KEPT_TOP_LEVEL
    out = {k: v for k, v in event.items() if k in kept}
    if version.room_id_from_create_event and event.get("type") == "m.room.create":
        out.pop("room_id", None)  # v12: a create event has none to keep (its ID names the room)
    out["content"] = _kept_content(
        rules, version.special_case_aliases_auth, event.get("type"), event.get("content"))
    unsigned = event.get("unsigned")
    if isinstance(unsigned, dict):
        out["unsigned"] = {k: unsigned[k] for k in _KEPT_UNSIGNED if k in unsigned}
    return out
