"""Synapse (matrix-synapse, a test-only dependency) is the oracle for the Matrix core.

``synapse.event_auth`` must be imported before anything under ``synapse.state`` (otherwise
``synapse.state`` fails with a circular import), so it is imported here, first."""
import pytest

try:
    import synapse.event_auth  # noqa: F401  (import order, see above)
except ImportError:  # fail, never skip: the oracle is part of the tests
    pytest.exit("matrix-synapse is missing: pip install 'matrix-synapse==1.163.2' "
                "(requirements-test.in; make test installs it)", returncode=1)
