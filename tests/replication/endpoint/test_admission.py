"""Allowed networks and connection caps, without sockets (replication/endpoint/admission.py)."""
import pytest
from django.core.exceptions import ImproperlyConfigured

from replication.endpoint.admission import (
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
    assert p.admit("10.1.1.1").verdict == NOT_ALLOWED
    a1, a2 = p.admit("127.0.0.1"), p.admit("127.0.0.1")
    assert a1.verdict == a2.verdict == ADMITTED
    for a in (a1, a2):  # workers: nobody may take their place
        a.ticket.update(handshake_done=True, pings=True)
    assert p.admit("127.0.0.1").verdict == TOO_MANY_FROM_ADDRESS
    b = p.admit("127.0.0.2")
    assert b.verdict == ADMITTED
    b.ticket.update(handshake_done=True, pings=True)
    assert p.admit("127.0.0.3").verdict == TOO_MANY
    assert p.total == 3 and p.open == {"127.0.0.1": 2, "127.0.0.2": 1}
    p.release(a1.ticket)
    p.release(a1.ticket)  # idempotent
    c = p.admit("127.0.0.3")
    assert c.verdict == ADMITTED and c.evicted is None
    for t in (a2.ticket, b.ticket, c.ticket):
        p.release(t)
    assert p.total == 0 and not p.open and not p.tickets
    assert p.refused == {NOT_ALLOWED: 1, TOO_MANY_FROM_ADDRESS: 1, TOO_MANY: 1}


def test_a_newcomer_takes_the_place_of_the_oldest_connection_in_its_handshake():
    """Squatters (connections that never subscribe) cannot lock a worker out: at a cap, the
    oldest still in its handshake is evicted, then the oldest that never PINGed; workers never."""
    p = policy(total=4, per_address=3)
    squat = [p.admit("127.0.0.1") for _ in range(3)]
    assert p.admit("127.0.0.1").verdict == ADMITTED  # in place of the oldest squatter
    assert p.evictions == 1 and squat[0].ticket.released and not squat[1].ticket.released
    assert p.open["127.0.0.1"] == 3
    # The per-address cap evicts only from the same address.
    other = p.admit("127.0.0.2")
    other.ticket.update(handshake_done=True, pings=True)
    assert p.total == 4
    # The global cap: any address; handshaking first, then the never-PINGing, oldest first.
    squat[1].ticket.update(handshake_done=True, pings=False)  # a netcat session
    got = p.admit("127.0.0.3")
    assert got.evicted is squat[2].ticket
    got.ticket.update(handshake_done=True, pings=True)
    last = p.admit("127.0.0.4")
    assert p.evictions == 3 and p.total == 4
    assert last.verdict == ADMITTED and p.admit("127.0.0.5").verdict == ADMITTED  # evicts `last`
    assert last.ticket.released
    # Only workers left (and one that will be): refused.
    for t in list(p.tickets):
        t.update(handshake_done=True, pings=True)
    assert p.admit("127.0.0.6").verdict == TOO_MANY
    assert other.evicted is None and not other.ticket.released


def test_the_last_tenth_is_kept_for_small_addresses():
    p = policy(total=20, per_address=20)
    assert p.reserve == 2 and p.small_share == 2
    big = [p.admit("127.0.0.1") for _ in range(18)]
    for a in big:
        a.ticket.update(handshake_done=True, pings=True)
    assert p.admit("127.0.0.1").verdict == TOO_MANY  # 18 of 20: the rest is reserved
    assert p.admit("127.0.0.2").verdict == ADMITTED  # a new worker host gets in
    assert p.admit("127.0.0.2").verdict == ADMITTED


def test_bad_network_is_named():
    with pytest.raises(ImproperlyConfigured, match="10.0.0.300"):
        parse_networks("127.0.0.0/8, 10.0.0.300/8")


def test_refusals_and_evictions_are_logged_at_most_every_ten_seconds(caplog):
    """A flood of connections must not become a flood of log lines."""
    import logging

    from replication.endpoint.admission import ThrottledLog

    now = [0.0]
    log = ThrottledLog(every=10, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="replication.endpoint.admission"):
        assert log.warning("evicted", "a %s", 1) is True
        for _ in range(250):
            now[0] += 0.01
            assert log.warning("evicted", "a %s", 2) is False
        assert log.warning("too many", "b") is True  # another kind is its own
        now[0] = 12.0
        assert log.warning("evicted", "a %s", 3) is True
    assert [r.getMessage() for r in caplog.records] == [
        "a 1", "b", "a 3 (250 more like it in the last 12 s)"]
