"""Synapse-compatible stream replication (design: docs/replication.md)."""
