import pytest
from django.db import connections


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_both_databases_are_real():
    assert connections["default"].vendor == "postgresql"
    assert connections["sqlite"].vendor == "sqlite"
    with connections["default"].cursor() as c:
        c.execute("SELECT count(*) FROM stream_positions")
        assert c.fetchone() == (0,)
