"""The bounded LRU that the read caches use: a bulk look-up is the look-ups one by one."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rooms.storage.state_groups import _LRU

keys = st.integers(0, 12)
ops = st.lists(st.tuples(st.sampled_from(["put", "get_many"]), st.lists(keys, max_size=6),
                         st.booleans()), max_size=40)


@given(ops, st.integers(1, 8))
def test_get_many_is_get_one_by_one(script, size):
    """Same answers (False values included: "known, not hashed" is an answer) and the same
    recency, so the same entries are evicted later."""
    bulk, single = _LRU(size), _LRU(size)
    for op, ks, value in script:
        if op == "put":
            for k in ks:
                bulk.put(k, value)
                single.put(k, value)
        else:
            one_by_one = {k: v for k in ks if (v := single.get(k)) is not None}
            assert bulk.get_many(ks) == one_by_one
        assert list(bulk._d.items()) == list(single._d.items())
