"""Chunk order: a tracked task's rows are handed on in chunk order, whatever order its batches finish in.

Every request the daemon accepts gets exactly one row (served, shed or error), so a row can wait for the rows of
the earlier chunks the daemon holds without ever waiting forever: `expect` is told each accepted chunk, `done`
each row, and a row leaves once every earlier expected chunk has left. A chunk the daemon never received (dropped
by ingest) is never expected, so nothing waits for it.
"""

from __future__ import annotations

import heapq
from typing import Generic, TypeVar

T = TypeVar("T")


class ChunkOrder(Generic[T]):
    def __init__(self):
        self._expected: list[int] = []  # heap of the chunks whose rows have not left yet
        self._waiting: set[int] = set(self._expected)
        self._done: dict[int, T] = {}

    def __len__(self) -> int:
        """Rows held back, waiting for an earlier chunk's row."""
        return len(self._done)

    def expect(self, seq: int) -> None:
        if seq not in self._waiting:
            self._waiting.add(seq)
            heapq.heappush(self._expected, seq)

    def done(self, seq: int, item: T) -> list[T]:
        """The rows that can leave now, in chunk order (item's, once the chunks before it have left)."""
        self.expect(seq)  # a row that was never announced still leaves, in its place
        self._done[seq] = item
        out = []
        while self._expected and self._expected[0] in self._done:
            first = heapq.heappop(self._expected)
            self._waiting.discard(first)
            out.append(self._done.pop(first))
        return out

    def flush(self) -> list[T]:
        """Every held row, in chunk order, without waiting any longer (the stream leaves this daemon); the order
        starts afresh."""
        out = [self._done[seq] for seq in sorted(self._done)]
        self._expected, self._waiting, self._done = [], set(), {}
        return out
