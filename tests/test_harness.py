"""vlora_va.testing.harness: what benches and tests share (the percentile against its plain definition)."""

import math
import random
import socket

from vlora_va.testing.harness import free_port, percentile


def nearest_rank(values: list[float], q: float) -> float:
    """The plain definition: the smallest value with at least q of the values at or below it."""
    ordered = sorted(values)
    return next(v for k, v in enumerate(ordered, 1) if k >= math.ceil(q * len(ordered)))


def test_percentile_is_the_nearest_rank_in_any_order():
    rng = random.Random(0)
    for n in (1, 2, 3, 10, 101):
        values = [rng.uniform(0, 100) for _ in range(n)]
        for q in (0.01, 0.5, 0.95, 0.99, 1.0):
            assert percentile(values, q) == nearest_rank(values, q), (n, q)
    assert percentile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.0  # the lower middle: rank ceil(0.5 * 4) = 2
    assert percentile([], 0.5) is None  # not measured, not 0


def test_free_port_can_be_bound():
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_row_books_name_every_duplicate_missing_and_extra_chunk():
    """The cluster tests' and benches' books: compared with a plain reading of the same rows."""
    from vlora_va.testing.harness import row_books

    rows = [{"stream": s, "chunk": c} for s, c in [("a", 0), ("a", 1), ("a", 1), ("b", 0), ("b", 5), ("c", 9)]]
    assert row_books(rows, {"a": 3, "b": 1}) == {"duplicates": {("a", 1): 2}, "missing": {"a": [2]},
                                                 "extra": {"b": [5]}}  # c: not in the books, not judged
    assert row_books(rows[:2], {"a": 2}) == {"duplicates": {}, "missing": {}, "extra": {}}
