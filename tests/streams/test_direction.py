"""IdDirection's many-at-once helpers say what its one-at-a-time ``to_wire`` says."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from streams.direction import BACKWARDS, FORWARDS

_directions = st.sampled_from([FORWARDS, BACKWARDS])


@given(_directions, st.sets(st.integers(-50, 50)), st.integers(-60, 60), st.integers(-60, 60))
def test_select_in_order_is_the_ids_with_their_token_in_the_range_in_token_order(signs, ids, lo, hi):
    expected = sorted((i for i in ids if lo < signs.to_wire(i) <= hi), key=signs.to_wire)
    assert signs.select_in_order(ids, lo, hi) == expected


@given(_directions, st.lists(st.tuples(st.integers(-50, 50), st.text(max_size=2))))
def test_pairs_to_wire_converts_each_stored_id(signs, pairs):
    assert list(signs.pairs_to_wire(pairs)) == [(signs.to_wire(i), value) for i, value in pairs]
