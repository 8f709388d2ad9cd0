"""One real Synapse homeserver (``testing/synapse_homeserver.py``) for every interop test of the
run, on the suite's PostgreSQL (its own C-collation database) and Redis. Each module registers
users and rooms of its own. Synapse failing to start fails the tests; nothing is skipped."""
from __future__ import annotations

import pytest

from testing.synapse_homeserver import SynapseHomeserver, running

SERVER_NAME = "interop.test"


@pytest.fixture(scope="session")
def synapse(postgres_server, redis_server):
    with running(SynapseHomeserver(SERVER_NAME, postgres_server.port, redis_server.port,
                                   database="synapse_interop")) as homeserver:
        yield homeserver
