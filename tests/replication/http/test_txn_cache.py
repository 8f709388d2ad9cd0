"""TxnResponseCache: answers kept by transaction ID (replication/http/txn_cache.py)."""
from hypothesis import given
from hypothesis import strategies as st

from replication.http.txn_cache import ENTRY_OVERHEAD, MAX_TXN_ID_LENGTH, TxnResponseCache, entry_cost, txn_id_problem


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


def test_bounded_in_bytes_the_ids_and_bookkeeping_included():
    one = entry_cost("a", b"x" * 4)
    assert one == 1 + 4 + ENTRY_OVERHEAD
    cache = TxnResponseCache(max_bytes=2 * one + 10, clock=Clock())
    cache.add("a", b"x" * 4)
    cache.add("b", b"y" * 4)
    assert cache.size_bytes == 2 * one
    cache.add("c", b"z" * 4)  # three entries: over the budget, the oldest goes
    assert (cache.get("a"), cache.get("b"), cache.get("c")) == (None, b"yyyy", b"zzzz")
    assert cache.size_bytes == 2 * one
    # Larger than the whole budget: given back, not kept, and nothing else is dropped for it.
    big = b"w" * (2 * one)
    assert cache.add("d", big) == big
    assert cache.get("d") is None and cache.get("b") == b"yyyy" and cache.size_bytes == 2 * one
    # A longer ID costs more: the same answers under 64-character IDs fit fewer.
    long_ids = TxnResponseCache(max_bytes=2 * one + 10, clock=Clock())
    for name in "abc":
        long_ids.add(name * MAX_TXN_ID_LENGTH, b"x" * 4)
    assert len(long_ids) == 1


def test_an_id_out_of_bounds_is_never_kept():
    cache = TxnResponseCache(clock=Clock())
    long_id = "a" * (MAX_TXN_ID_LENGTH + 1)
    assert cache.add(long_id, b"answer") == b"answer"
    assert cache.get(long_id) is None and len(cache) == 0 and cache.size_bytes == 0


def test_txn_ids_of_synapse_and_of_our_workers_are_accepted():
    import secrets

    from replication.worker.catchup_client import new_txn_id

    for txn_id in ("hJmTnQaRbX", new_txn_id(), secrets.token_hex(32), "interop-same-id", "txn.1~2_3"):
        assert txn_id_problem(txn_id) is None, txn_id


@given(st.text(min_size=MAX_TXN_ID_LENGTH + 1, max_size=500))
def test_longer_ids_are_refused_saying_the_bound(txn_id):
    assert f"1 to {MAX_TXN_ID_LENGTH} letters" in txn_id_problem(txn_id)


@given(st.text(min_size=1, max_size=MAX_TXN_ID_LENGTH).filter(lambda t: not t.isascii() or " " in t))
def test_ids_outside_url_safe_ascii_are_refused(txn_id):
    assert txn_id_problem(txn_id) is not None


def test_expiry_gives_the_bytes_back():
    clock = Clock()
    cache = TxnResponseCache(timeout=10, clock=clock)
    cache.add("a", b"12345")
    clock.now += 10
    assert cache.get("a") is None and cache.size_bytes == 0
