"""Backing tables of the streams, and the tables that track their positions."""
from .base import FactModel, FactsAreAppendOnly
from .events import CurrentStateDelta, Event
from .facts import AccountData, CacheInvalidation, DeviceInbox, Receipt
from .jobs import JobRun
from .positions import StreamPosition, StreamReservation, StreamSequence

__all__ = (
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
)
