"""One real Synapse homeserver (``testing/synapse_homeserver.py``) for every interop test of the
run, on the suite's PostgreSQL (its own C-collation database) and Redis. Each module registers
users and rooms of its own. Synapse failing to start fails the tests; nothing is skipped."""
from __future__ import annotations

import pytest

from testing.synapse_homeserver import SynapseHomeserver, SynapseUnavailable

SERVER_NAME = "interop.test"


@pytest.fixture(scope="session")
def synapse(postgres_server, redis_server):
    homeserver = SynapseHomeserver(SERVER_NAME, postgres_server.port, redis_server.port,
                                   database="synapse_interop")
    try:
        homeserver.configure().start()
    except SynapseUnavailable as e:  # fail, never skip: the suite must have every part
        homeserver.remove()
        pytest.fail(str(e), pytrace=False)
    yield homeserver
    homeserver.remove()
