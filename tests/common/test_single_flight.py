"""The readiness probe's decision core (common/single_flight.py): one run at a time, its
result reused while fresh; the time is passed in."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.single_flight import Join, Reuse, SingleFlight, Start


def test_the_first_caller_starts_the_others_join_until_it_finishes():
    flight: SingleFlight[str] = SingleFlight(fresh_for=1.0)
    assert flight.next_step(0.0) == Start()
    assert flight.next_step(0.1) == Join()
    assert flight.next_step(5.0) == Join()  # however long it runs: never a second run
    flight.finished("ok", now=5.0)
    assert flight.next_step(5.5) == Reuse("ok")


def test_a_result_is_reused_for_fresh_for_seconds_then_run_again():
    flight: SingleFlight[str] = SingleFlight(fresh_for=1.0)
    flight.next_step(0.0)
    flight.finished("first", now=0.2)
    assert flight.next_step(1.19) == Reuse("first")
    assert flight.next_step(1.2) == Start()
    assert flight.next_step(1.3) == Join()  # the stale result is not answered meanwhile
    flight.finished("second", now=1.4)
    assert flight.next_step(1.5) == Reuse("second")


def test_a_clock_that_went_back_runs_again_rather_than_trusting_the_result():
    flight: SingleFlight[str] = SingleFlight(fresh_for=1.0)
    flight.next_step(10.0)
    flight.finished("r", now=10.0)
    assert flight.next_step(9.0) == Start()


def test_fresh_for_zero_never_reuses():
    flight: SingleFlight[str] = SingleFlight(fresh_for=0.0)
    flight.next_step(0.0)
    flight.finished("r", now=0.0)
    assert flight.next_step(0.0) == Start()


def test_a_negative_freshness_is_refused():
    with pytest.raises(ValueError, match="fresh_for"):
        SingleFlight(fresh_for=-1)


@settings(deadline=None, suppress_health_check=list(HealthCheck))  # about correctness, not speed
@given(st.lists(st.tuples(st.sampled_from(["ask", "finish"]), st.floats(0, 3)), max_size=40))
def test_never_two_runs_in_flight_and_never_a_stale_reuse(events):
    """Any interleaving of callers and finishing runs, time moving forward."""
    flight: SingleFlight[int] = SingleFlight(fresh_for=1.0)
    now, in_flight, finished_at, runs = 0.0, False, None, 0
    for kind, step in events:
        now += step
        if kind == "finish":
            if in_flight:
                flight.finished(runs, now)
                in_flight, finished_at = False, now
            continue
        decision = flight.next_step(now)
        if isinstance(decision, Start):
            assert not in_flight
            in_flight, runs = True, runs + 1
        elif isinstance(decision, Join):
            assert in_flight
        else:
            assert decision == Reuse(runs) and finished_at is not None and now - finished_at < 1.0
