"""The /_synapse/replication/ HTTP endpoints: catch-up, their secret, typing."""
