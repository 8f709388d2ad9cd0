"""The following side: the follower's pure rules and the worker clients (TCP, Redis) with their catch-up."""
