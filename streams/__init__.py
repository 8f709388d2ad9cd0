"""Streams: append-only logs of facts, their backing tables and their stream ID generators."""
