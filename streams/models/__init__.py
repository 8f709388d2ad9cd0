"""Backing tables of the streams, and the tables that track their positions."""
from .base import FactModel, FactsAreAppendOnly
from .chain_cover import EventAuthChain, EventAuthChainLink, EventAuthChainToCalculate
from .events import CurrentStateDelta, Event
from .facts import AccountData, CacheInvalidation, DeviceInbox, Receipt
from .jobs import JobRun
from .positions import StreamPosition, StreamReservation, StreamSequence
from .storage import (
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
from .user_ips import UserIp

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
