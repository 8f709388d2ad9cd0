"""Room event storage: the events and their DAG, state groups, Matrix authorization and
state resolution at persist, sync and pagination reads, the read-only ``/api/`` (docs/storage.md)."""
