"""The pure Matrix core: room versions, canonical JSON, event IDs and hashes, redaction,
the authorization rules, and state resolution v2/v2.1 (docs/matrix.md).

Data in, data out: plain dicts and :class:`~rooms.matrix.event_format.Event` objects, with
every lookup passed in. No Django and no database, so the persist path, jobs and tests can all
call it; Synapse is used only by the tests, as the oracle these modules are checked against.
"""
