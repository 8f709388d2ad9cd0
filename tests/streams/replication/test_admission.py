"""Allowed networks and connection caps, without sockets (streams/replication/admission.py)."""
import pytest
from django.core.exceptions import ImproperlyConfigured

from streams.replication.admission import (
    ADMITTED,
    NOT_ALLOWED,
    TOO_MANY,
    TOO_MANY_FROM_ADDRESS,
    PeerPolicy,
    parse_networks,
)


def policy(networks="127.0.0.0/8,::1/128", total=3, per_address=2):
    return PeerPolicy(parse_networks(networks), total, per_address)


def test_default_is_loopback_only():
    p = policy()
    assert p.allowed("127.0.0.1") and p.allowed("127.9.9.9") and p.allowed("::1")
    assert p.allowed("::ffff:127.0.0.1")  # IPv4-mapped, on a dual-stack socket
    assert not p.allowed("10.0.0.1") and not p.allowed("::2") and not p.allowed("::ffff:10.0.0.1")
    assert not p.allowed("not-an-address")


def test_caps_count_admitted_connections_until_released():
    p = policy()
    assert p.admit("10.1.1.1") == NOT_ALLOWED
    assert p.admit("127.0.0.1") == ADMITTED
    assert p.admit("127.0.0.1") == ADMITTED
    assert p.admit("127.0.0.1") == TOO_MANY_FROM_ADDRESS
    assert p.admit("127.0.0.2") == ADMITTED
    assert p.admit("127.0.0.3") == TOO_MANY
    assert p.total == 3 and p.open == {"127.0.0.1": 2, "127.0.0.2": 1}
    p.release("127.0.0.1")
    assert p.admit("127.0.0.3") == ADMITTED
    for host in ("127.0.0.1", "127.0.0.2", "127.0.0.3"):
        p.release(host)
    assert p.total == 0 and not p.open
    assert p.refused == {NOT_ALLOWED: 1, TOO_MANY_FROM_ADDRESS: 1, TOO_MANY: 1}


def test_bad_network_is_named():
    with pytest.raises(ImproperlyConfigured, match="10.0.0.300"):
        parse_networks("127.0.0.0/8, 10.0.0.300/8")
