"""The token bucket behind the inbound command rate limit (replication/endpoint/ratelimit.py)."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from replication.endpoint.ratelimit import HISTORY_REQUEST_COST, TokenBucket, command_cost
from replication.protocol.commands import parse_line


def test_burst_then_rate():
    bucket = TokenBucket(rate=4, burst=5, now=100.0)
    assert [bucket.take(100.0) for _ in range(6)] == [True] * 5 + [False]
    assert bucket.take(100.25)  # 0.25 s at 4/s: one more
    assert not bucket.take(100.25)
    assert [bucket.take(200.0) for _ in range(6)] == [True] * 5 + [False]  # never above burst


def test_a_clock_going_backwards_gives_nothing():
    bucket = TokenBucket(rate=1, burst=1, now=10.0)
    assert bucket.take(10.0)
    assert not bucket.take(5.0)


def test_bad_parameters():
    with pytest.raises(ValueError):
        TokenBucket(rate=0, burst=1, now=0)
    with pytest.raises(ValueError):
        TokenBucket(rate=1, burst=0, now=0)


@given(rate=st.floats(0.5, 1000), burst=st.integers(1, 100),
       gaps=st.lists(st.floats(0, 2), min_size=1, max_size=300))
def test_never_more_than_burst_plus_rate_times_elapsed(rate, burst, gaps):
    now = 0.0
    bucket = TokenBucket(rate, burst, now)
    taken = 0
    for gap in gaps:
        now += gap
        taken += bucket.take(now)
    assert taken <= burst + rate * now + 1e-6


def test_commands_are_weighed_by_what_they_cost_the_endpoint():
    assert command_cost(parse_line("PING 1")) == 1
    assert command_cost(parse_line("REPLICATE ")) == 1
    assert command_cost(parse_line("REPLICATE receipts NOW")) == 1
    assert command_cost(parse_line("REPLICATE receipts 0")) == HISTORY_REQUEST_COST > 1
    assert command_cost(parse_line("REMOTE_SERVER_UP example.com")) > 1
    # With the default burst (5000), 50 history reads at once and no more.
    bucket = TokenBucket(rate=1000, burst=5000, now=0.0)
    taken = [bucket.take(0.0, HISTORY_REQUEST_COST) for _ in range(60)]
    assert taken.count(True) == 50 and not any(taken[50:])


def test_work_paid_from_the_bucket_keeps_a_reserve_and_says_how_long_to_wait():
    bucket = TokenBucket(rate=10, burst=100, now=0.0)
    assert bucket.take(0.0, 50, keep=10)
    assert not bucket.take(0.0, 50, keep=10)  # 50 left: 40 would go below the reserve
    assert bucket.wait_time(0.0, 50, keep=10) == pytest.approx(1.0)
    assert bucket.take(1.0, 50, keep=10) and bucket.tokens == pytest.approx(10)
    assert bucket.take(1.0)  # the reserve is there for commands
    assert bucket.wait_time(100.0, 1) == 0.0
