"""The TCP replication endpoint: admission, the consumer per connection, the relay, legacy subscribers, what workers send."""
