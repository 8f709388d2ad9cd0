"""The following side: the follower's pure rules (``follower``), the transport-independent worker
(``base``: lanes, catch-up runs), its sessions (``tcp_worker``, ``redis_worker``), the catch-up
client (``catchup_client``) and cache invalidation (``cache_invalidation``)."""
