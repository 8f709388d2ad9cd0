"""Read-only JSON endpoints of the room event store, for operators and workers (docs/storage.md)."""
