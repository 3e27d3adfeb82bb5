"""A worker's chunk queue: bounded, shared by its streams, with a named drop policy (IngestConfig.drop_policy), and
each stream's running figures (StreamStats).

    stream threads ─► ChunkQueue.put (full: drop_oldest | drop_newest | block) ─► the send loop's get

A dropped chunk is counted for its stream, its outage is owed to the stream's next sent chunk, and a frame filter
that took it as its reference sends the next chunk's frames (ingest/filtering.py).
"""

from __future__ import annotations

import collections
import logging
import threading
from dataclasses import dataclass

from vlora_va.contracts.config import DROP_POLICIES
from vlora_va.ingest.chunker import ReadyChunk

log = logging.getLogger("vlora_va.ingest.worker")  # the worker's log: operators filter on it
POLL_S = 0.1  # how often a blocked put looks at the stop event


@dataclass
class StreamStats:
    chunks_made: int = 0
    chunks_sent: int = 0
    chunks_dropped: int = 0
    errors: int = 0
    reconnects: int = 0  # successful RTSP reopenings
    outages: int = 0  # chunks that came after missing media (a reconnect, or a stall)
    outage_s: float = 0.0  # media seconds missing in those outages, in all
    last_error: str | None = None
    state: str = "live"  # what the heartbeat says (wire.SOURCE_STATES): live, ended (by itself) or failed
    last_frame: float = 0.0  # time.monotonic() the source last delivered a frame (or the stream started)
    waiting: bool = False  # the stream thread waits for room in the queue (the daemon is slow), not for its source


class ChunkQueue:
    """A bounded FIFO of ReadyChunks shared by a worker's streams, with a named drop policy."""

    def __init__(self, maxsize: int, policy: str, stats: dict[str, StreamStats]):
        if policy not in DROP_POLICIES:
            raise ValueError(f"unknown drop policy {policy!r}")
        self.maxsize, self.policy, self.stats = maxsize, policy, stats
        self._items: collections.deque[ReadyChunk] = collections.deque()
        self._cond = threading.Condition()
        self._lost_outage: dict[str, float] = {}  # outage_s of dropped chunks, owed to the stream's next sent one
        # stream -> its tasks' frame filters: a dropped chunk that a filter took as its reference is no reference
        self.filters: dict[str, dict] = {}

    def __len__(self) -> int:
        return len(self._items)

    def put(self, chunk: ReadyChunk, stop: threading.Event) -> bool:
        """Queue a chunk; False when it was dropped (drop_newest) or the wait was stopped (block)."""
        with self._cond:
            if len(self._items) >= self.maxsize:
                if self.policy == "drop_newest":
                    self._dropped(chunk)
                    return False
                if self.policy == "drop_oldest":
                    self._dropped(self._items.popleft())
                else:  # block: wait for room, looking at the stop event now and then
                    while len(self._items) >= self.maxsize:
                        if stop.is_set():
                            self._dropped(chunk)
                            return False
                        self._cond.wait(POLL_S)
            self._items.append(chunk)
            self._cond.notify_all()
            return True

    def get(self, timeout: float) -> ReadyChunk | None:
        with self._cond:
            if not self._items:
                self._cond.wait(timeout)
            if not self._items:
                return None
            chunk = self._items.popleft()
            self._cond.notify_all()
            return chunk

    def take_lost_outage(self, stream: str) -> float:
        """The outage seconds of this stream's chunks dropped since the last call (the next sent chunk reports them)."""
        with self._cond:
            return self._lost_outage.pop(stream, 0.0)

    def _dropped(self, chunk: ReadyChunk) -> None:
        h = chunk.header
        self.stats[h.stream].chunks_dropped += 1
        for task, f in self.filters.get(h.stream, {}).items():
            if f.invalidate(h.seq):
                log.debug("stream %s: dropped chunk %d held task %s's reference frames; its next chunk sends them",
                          h.stream, h.seq, task)
        if h.outage_s:
            self._lost_outage[h.stream] = self._lost_outage.get(h.stream, 0.0) + h.outage_s
        log.debug("stream %s: dropped chunk %d (%s)", h.stream, h.seq, self.policy)
