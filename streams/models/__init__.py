"""Backing tables of the streams, and the tables that track their positions."""
from .base import FactModel, FactsAreAppendOnly
from .events import CurrentStateDelta, Event
from .facts import AccountData, CacheInvalidation, DeviceInbox, Receipt
from .positions import StreamPosition, StreamReservation, StreamSequence

__all__ = (
    "AccountData",
    "CacheInvalidation",
    "CurrentStateDelta",
    "DeviceInbox",
    "Event",
    "FactModel",
    "FactsAreAppendOnly",
    "Receipt",
    "StreamPosition",
    "StreamReservation",
    "StreamSequence",
)
