"""Where a stream's chunks go, and the ledger of what went where (cluster mode).

    controller ─► Route.set(endpoint, daemon)      ─► the worker's send loop re-points its sockets before its next send
    send loop  ─► SentLedger.sent(daemon, header)  ─► controller: SentLedger.take(lost daemon) when a daemon dies

A plain `vlora-va run` has one daemon and needs neither: its workers connect to daemon.endpoint for good. In cluster
mode the controller moves streams between daemons (one died, one joined, one is overloaded), so a worker must follow
without restarting its source (a file would start over). Chunks still waiting in the worker's queue go to the new
daemon; those already handed to ZeroMQ go where they were sent (a live daemon answers them: the old socket lingers;
a dead one cannot: the ledger says which, and the controller writes their rows).

The ledger keeps every sent chunk for LEDGER_WINDOW_S (a daemon answers a chunk within its deadline, a few seconds, or
is lost), bounded by LEDGER_MAX_PER_DAEMON: what the daemons answer is known to the collector, not here.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass

from vlora_va.contracts.wire import ChunkHeader

LEDGER_WINDOW_S = 120.0  # a chunk unanswered this long after it was sent is past any deadline: forgotten
LEDGER_MAX_PER_DAEMON = 100_000  # sent chunks kept per daemon at most (memory bound)


class Route:
    """A stream's current daemon: its data endpoint and its name. Changed by the controller's thread, read by the
    worker's send loop (which compares `version` before each send)."""

    def __init__(self, endpoint: str, daemon: str = ""):
        self._lock = threading.Lock()
        self._endpoint, self._daemon, self._linger_s, self._version = endpoint, daemon, 0.0, 0
        self._followed = 0  # the version the worker's sockets point at

    def set(self, endpoint: str, daemon: str, linger_s: float = 0.0) -> None:
        """From now on to `endpoint` (daemon `daemon`). linger_s: how long what the old socket still holds may take
        to reach the old daemon (0 when it is dead: nothing there will answer)."""
        with self._lock:
            self._endpoint, self._daemon, self._linger_s = endpoint, daemon, linger_s
            self._version += 1

    def mark_followed(self, version: int) -> None:
        """The worker's sockets now point at this version's endpoint (everything sent from now on goes there)."""
        with self._lock:
            self._followed = version

    def followed(self) -> bool:
        """The worker has followed the latest set(): every chunk sent to an earlier endpoint is in the ledger."""
        with self._lock:
            return self._followed == self._version

    def current(self) -> tuple[int, str, str, float]:
        """(version, endpoint, daemon, linger_s of the previous endpoint)."""
        with self._lock:
            return self._version, self._endpoint, self._daemon, self._linger_s


@dataclass(frozen=True)
class SentChunk:
    """What a daemon owes for one chunk: a row per task."""

    stream: str
    seq: int
    tasks: tuple[tuple[str, str, float], ...]  # (task, adapter, deadline_ms)
    frame_ts: tuple[float, ...]
    ready_wall: float  # the sender's clock
    sent_wall: float
    dropped_before: int = 0
    outage_s: float = 0.0

    @classmethod
    def of(cls, header: ChunkHeader) -> "SentChunk":
        tasks = tuple((t.name, t.adapter, t.deadline_ms) for t in header.tasks)
        return cls(header.stream, header.seq, tasks, tuple(header.frame_ts), header.ready_wall, header.sent_wall,
                   header.dropped_before, header.outage_s)

    def to_json(self) -> dict:
        return {"stream": self.stream, "seq": self.seq, "tasks": [list(t) for t in self.tasks],
                "frame_ts": list(self.frame_ts), "ready_wall": self.ready_wall, "sent_wall": self.sent_wall,
                "dropped_before": self.dropped_before, "outage_s": self.outage_s}

    @classmethod
    def from_json(cls, d: dict) -> "SentChunk":
        return cls(d["stream"], int(d["seq"]), tuple((str(a), str(b), float(c)) for a, b, c in d["tasks"]),
                   tuple(d["frame_ts"]), float(d["ready_wall"]), float(d["sent_wall"]), int(d["dropped_before"]),
                   float(d["outage_s"]))


class SentLedger:
    """Per daemon name, the chunks sent to it in the last LEDGER_WINDOW_S (thread-safe: the send loops write, the
    controller reads)."""

    def __init__(self, window_s: float = LEDGER_WINDOW_S, max_per_daemon: int = LEDGER_MAX_PER_DAEMON):
        self.window_s = window_s
        self._lock = threading.Lock()
        self._sent: dict[str, collections.deque[SentChunk]] = collections.defaultdict(
            lambda: collections.deque(maxlen=max_per_daemon))

    def sent(self, daemon: str, header: ChunkHeader) -> None:
        with self._lock:
            q = self._sent[daemon]
            q.append(SentChunk.of(header))
            self._forget(q, time.time())

    def take(self, daemon: str) -> list[SentChunk]:
        """The chunks sent to `daemon` in the window, oldest first; they are forgotten here (handed over)."""
        with self._lock:
            q = self._sent.pop(daemon, None)
            if not q:
                return []
            self._forget(q, time.time())
            return list(q)

    def count(self, daemon: str) -> int:
        with self._lock:
            return len(self._sent.get(daemon, ()))

    def latest(self, daemon: str) -> dict[str, int]:
        """Per stream, the highest chunk seq sent to `daemon` in the window (the ledger is left as it is)."""
        with self._lock:
            latest: dict[str, int] = {}
            for c in self._sent.get(daemon, ()):
                latest[c.stream] = max(c.seq, latest.get(c.stream, -1))
            return latest

    def _forget(self, q: collections.deque, now: float) -> None:
        while q and q[0].sent_wall < now - self.window_s:
            q.popleft()
