"""Attaching read-only to a live Synapse: its streams, writers and sequences (docs/attach.md)."""
