"""TxnResponseCache: answers kept by transaction ID (streams/replication/http/txn_cache.py)."""
from streams.replication.http.txn_cache import TxnResponseCache


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


def test_bounded_in_count_oldest_first():
    cache = TxnResponseCache(max_entries=3, clock=Clock())
    for i in range(5):
        cache.add(str(i), b"%d" % i)
    assert len(cache) == 3
    assert [cache.get(str(i)) for i in range(5)] == [None, None, b"2", b"3", b"4"]


def test_bounded_in_bytes():
    cache = TxnResponseCache(max_bytes=10, clock=Clock())
    cache.add("a", b"x" * 4)
    cache.add("b", b"y" * 4)
    assert cache.size_bytes == 8
    cache.add("c", b"z" * 4)  # 12 bytes: the oldest goes
    assert (cache.get("a"), cache.get("b"), cache.get("c")) == (None, b"yyyy", b"zzzz")
    assert cache.size_bytes == 8
    # Larger than the whole budget: given back, not kept, and nothing else is dropped for it.
    assert cache.add("d", b"w" * 11) == b"w" * 11
    assert cache.get("d") is None and cache.get("b") == b"yyyy" and cache.size_bytes == 8


def test_expiry_gives_the_bytes_back():
    clock = Clock()
    cache = TxnResponseCache(timeout=10, clock=clock)
    cache.add("a", b"12345")
    clock.now += 10
    assert cache.get("a") is None and cache.size_bytes == 0
