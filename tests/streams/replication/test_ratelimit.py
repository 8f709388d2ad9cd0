"""The token bucket behind the inbound command rate limit (streams/replication/ratelimit.py)."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.replication.ratelimit import TokenBucket


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
