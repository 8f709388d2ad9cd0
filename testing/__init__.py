"""The harness that tests and benchmarks share, outside the deployable project.

Nothing under ``synapse_repl/``, ``streams/`` or ``dashboard/`` imports it. It starts throwaway
servers (PostgreSQL, Redis, a Spark standalone cluster) on free loopback ports
(:mod:`testing.services`), runs a cluster's processes and waits for their ports
(:mod:`testing.processes`), accounts their CPU and memory from ``/proc``
(:mod:`testing.accounting`), and drives many protocol-level workers from one process
(:mod:`testing.line_workers`).
"""
