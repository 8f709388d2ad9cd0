"""``StreamChangeCache`` against a model of its semantics (Synapse's), with several entities
at one position, eviction, and a bulk prefill."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rooms.storage.change_cache import StreamChangeCache

entities = st.sampled_from([f"!r{i}:hs" for i in range(8)])
changes = st.lists(st.tuples(entities, st.integers(0, 30)), max_size=60)


class Model:
    """The last change per entity; the oldest positions forgotten beyond ``size`` of them."""

    def __init__(self, earliest: int, size: int) -> None:
        self.earliest, self.size, self.latest = earliest, size, {}

    def changed(self, entity: str, pos: int) -> None:
        if pos <= self.earliest or self.latest.get(entity, -1) >= pos:
            return
        self.latest[entity] = pos
        while len(set(self.latest.values())) > self.size:
            oldest = min(self.latest.values())
            self.earliest = max(self.earliest, oldest)
            self.latest = {e: p for e, p in self.latest.items() if p != oldest}

    def all_changed(self, since: int) -> list[tuple[int, str]] | None:
        if since < self.earliest:
            return None
        return sorted((p, e) for e, p in self.latest.items() if p > since)


def check(cache: StreamChangeCache, model: Model) -> None:
    assert cache.earliest_known_position == model.earliest
    everyone = {f"!r{i}:hs" for i in range(8)}
    for since in range(-1, 32):
        found = cache.get_all_entities_changed(since)
        expected = model.all_changed(since)
        if expected is None:
            assert found is None
            assert cache.get_entities_changed(everyone, since) == everyone  # unknowable: all may have
            continue
        assert found is not None
        positions = [cache.get_max_pos_of_last_change(e) for e in found]
        assert positions == sorted(positions)  # in change order
        assert sorted(zip(positions, found)) == expected
        for e in [f"!r{i}:hs" for i in range(8)]:
            assert cache.has_entity_changed(e, since) == (e in model.latest and since < model.latest[e])
        # (an empty cache answers "all of them", as it always has: more rooms read, none missed)
        assert cache.get_entities_changed(everyone, since) == ({e for _, e in expected} if model.latest else everyone)


@given(changes, st.integers(1, 6), st.integers(0, 5))
def test_cache_follows_the_model(script, size, earliest):
    cache, model = StreamChangeCache("t", earliest, max_size=size), Model(earliest, size)
    for entity, pos in script:
        cache.entity_has_changed(entity, pos)
        model.changed(entity, pos)
        check(cache, model)


@given(st.dictionaries(entities, st.integers(0, 30)), st.integers(1, 6), st.integers(0, 5), changes)
def test_prefill_is_the_changes_one_by_one(prefill, size, earliest, later):
    """Built in bulk (a room per position, or several), as if each entity had changed in
    turn; then kept up to date the same way."""
    bulk = StreamChangeCache("t", earliest, max_size=size, prefilled=prefill)
    model = Model(earliest, size)
    for entity, pos in sorted(prefill.items(), key=lambda item: item[1]):
        model.changed(entity, pos)
    check(bulk, model)
    for entity, pos in later:
        bulk.entity_has_changed(entity, pos)
        model.changed(entity, pos)
    check(bulk, model)
