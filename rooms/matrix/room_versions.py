"""Room versions 1-12 as data: what each version changes in event IDs, redaction, the
authorization rules and state resolution (docs/matrix.md; the Matrix spec's room versions, as
Synapse's ``synapse/api/room_versions.py`` flags them).

A room's version is fixed by its create event (``content.room_version``, missing = "1"); every
rule that differs between versions reads one of these flags instead of comparing version
strings, so adding a version is adding a row.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class EventIdFormat(Enum):
    """How an event's ID is obtained."""

    GIVEN = 1  # v1-2: ``$opaque:server`` sent in the ``event_id`` field
    HASH_BASE64 = 2  # v3: ``$`` + standard unpadded base64 of the reference hash
    HASH_URLSAFE = 3  # v4+: ``$`` + URL-safe unpadded base64 of the reference hash


class StateResAlgorithm(Enum):
    V1 = 1
    V2 = 2
    V2_1 = 3  # MSC4297 (room v12): first pass from empty state, plus the conflicted subgraph


class RedactionRules(Enum):
    """The redaction algorithm variants (which content keys survive)."""

    R1 = 1  # v1-5
    R6 = 6  # v6-7: aliases content no longer kept
    R8 = 8  # v8: join_rules keeps ``allow``
    R9 = 9  # v9-10: member keeps ``join_authorised_via_users_server``
    R11 = 11  # v11-12: MSC2176/MSC3989 (create keeps all, PL keeps invite, redacts in content)


@dataclass(frozen=True)
class RoomVersion:
    identifier: str
    event_id_format: EventIdFormat
    state_res: StateResAlgorithm
    redaction: RedactionRules
    #: v1-5: the ``m.room.aliases`` auth rule (and aliases content survives redaction)
    special_case_aliases_auth: bool
    #: v6+: integers outside +-(2**53-1) and floats make the event invalid
    strict_canonical_json: bool
    #: v6+: ``notifications`` is covered by the power-level change checks
    limit_notifications_power_levels: bool
    knock_join_rule: bool  # v7+
    restricted_join_rule: bool  # v8+
    knock_restricted_join_rule: bool  # v10+
    #: v10+: power-level values must be JSON integers (no numeric strings, no floats)
    enforce_int_power_levels: bool
    #: v1-5: power-level values may be floats (truncated); v1-9 numeric strings
    allow_float_power_levels: bool
    #: v11+: the creator is the create event's sender, not ``content.creator``
    implicit_room_creator: bool
    #: v1-2: redactions are authorized by the auth rules (power or same domain of IDs)
    redaction_in_auth_rules: bool
    #: v12 (MSC4289): creators have infinite power and may not be listed in ``users``
    creators_have_infinite_power: bool
    #: v12 (MSC4291): room ID = ``!`` + create event hash; the create event is implied in
    #: ``auth_events`` (never listed)
    room_id_from_create_event: bool

    @property
    def event_ids_are_hashes(self) -> bool:
        return self.event_id_format is not EventIdFormat.GIVEN

    @property
    def refs_are_pairs(self) -> bool:
        """v1-2 list ``prev_events``/``auth_events`` as ``[id, {hashes}]`` pairs."""
        return self.event_id_format is EventIdFormat.GIVEN


def _version(n: int) -> RoomVersion:
    if n <= 2:
        id_format = EventIdFormat.GIVEN
    elif n == 3:
        id_format = EventIdFormat.HASH_BASE64
    else:
        id_format = EventIdFormat.HASH_URLSAFE
    if n >= 11:
        redaction = RedactionRules.R11
    elif n >= 9:
        redaction = RedactionRules.R9
    elif n == 8:
        redaction = RedactionRules.R8
    elif n >= 6:
        redaction = RedactionRules.R6
    else:
        redaction = RedactionRules.R1
    return RoomVersion(
        identifier=str(n),
        event_id_format=id_format,
        state_res=(StateResAlgorithm.V1 if n == 1 else
                   StateResAlgorithm.V2_1 if n >= 12 else StateResAlgorithm.V2),
        redaction=redaction,
        special_case_aliases_auth=n <= 5,
        strict_canonical_json=n >= 6,
        limit_notifications_power_levels=n >= 6,
        knock_join_rule=n >= 7,
        restricted_join_rule=n >= 8,
        knock_restricted_join_rule=n >= 10,
        enforce_int_power_levels=n >= 10,
        allow_float_power_levels=n <= 5,
        implicit_room_creator=n >= 11,
        redaction_in_auth_rules=n <= 2,
        creators_have_infinite_power=n >= 12,
        room_id_from_create_event=n >= 12,
    )


#: The stable room versions, by identifier.
KNOWN_ROOM_VERSIONS: dict[str, RoomVersion] = {str(n): _version(n) for n in range(1, 13)}

#: Synapse 1.163's default for new rooms.
DEFAULT_ROOM_VERSION = KNOWN_ROOM_VERSIONS["12"]

#: MSC4289: a creator's level in v12 rooms, above every level canonical JSON can express
#: (Synapse uses the same number, so orderings by power agree).
CREATOR_POWER_LEVEL = 2**53


class UnknownRoomVersion(ValueError):
    pass


def room_version(identifier: str | None) -> RoomVersion:
    """The version named by a create event's ``content.room_version`` (missing means "1")."""
    key = "1" if identifier is None else identifier
    try:
        return KNOWN_ROOM_VERSIONS[key]
    except (KeyError, TypeError):
        raise UnknownRoomVersion(f"unknown room version {identifier!r}") from None
