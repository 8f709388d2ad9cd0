"""The replication protocol, sans-I/O: commands and their wire form, the connection state
machine, line batches, RESP and the Redis subscription core."""
