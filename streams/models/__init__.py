"""Backing tables of the streams, and the tables that track their positions."""
from streams.models.base import FactModel, FactsAreAppendOnly
from streams.models.chain_cover import EventAuthChain, EventAuthChainLink, EventAuthChainToCalculate
from streams.models.events import CurrentStateDelta, Event
from streams.models.facts import AccountData, CacheInvalidation, DeviceInbox, Receipt
from streams.models.jobs import JobRun
from streams.models.positions import StreamPosition, StreamReservation, StreamSequence
from streams.models.storage import (
    BackwardExtremity,
    CurrentStateEvent,
    EventAuth,
    EventEdge,
    EventToStateGroup,
    ExOutlier,
    ForwardExtremity,
    PackedStateGroup,
    Redaction,
    Rejection,
    Room,
    RoomMembership,
    StateGroup,
    StateGroupEdge,
    StateGroupState,
    VisibilityRange,
)
from streams.models.user_ips import UserIp

__all__ = (
    "BackwardExtremity",
    "CurrentStateEvent",
    "EventAuth",
    "EventAuthChain",
    "EventAuthChainLink",
    "EventAuthChainToCalculate",
    "EventEdge",
    "ExOutlier",
    "EventToStateGroup",
    "ForwardExtremity",
    "PackedStateGroup",
    "Redaction",
    "Rejection",
    "Room",
    "RoomMembership",
    "StateGroup",
    "StateGroupEdge",
    "StateGroupState",
    "VisibilityRange",
    "AccountData",
    "CacheInvalidation",
    "CurrentStateDelta",
    "DeviceInbox",
    "Event",
    "FactModel",
    "FactsAreAppendOnly",
    "JobRun",
    "Receipt",
    "StreamPosition",
    "StreamReservation",
    "StreamSequence",
    "UserIp",
)
