"""TxnResponseCache: answers kept by transaction ID (streams/replication/txn_cache.py)."""
from streams.replication.txn_cache import TxnResponseCache


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_first_answer_is_kept_until_the_timeout():
    clock = Clock()
    cache = TxnResponseCache(timeout=1800, clock=clock)
    assert cache.get("a") is None
    assert cache.add("a", b"first") == b"first"
    assert cache.add("a", b"second") == b"first"  # two requests at once: the first one wins
    clock.now += 1799
    assert cache.get("a") == b"first"
    clock.now += 1
    assert cache.get("a") is None and len(cache) == 0
    assert cache.add("a", b"third") == b"third"


def test_bounded_oldest_first():
    cache = TxnResponseCache(max_entries=3, clock=Clock())
    for i in range(5):
        cache.add(str(i), i)
    assert len(cache) == 3
    assert [cache.get(str(i)) for i in range(5)] == [None, None, 2, 3, 4]
