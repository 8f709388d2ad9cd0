"""Replication: Synapse's line protocol over TCP and Redis, the writers' publishing side, the
endpoint, the workers and the HTTP catch-up (docs/replication.md)."""
