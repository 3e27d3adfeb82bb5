"""The collector: every daemon's rows reach the configured sinks once (one JSONL file, one webhook, one MQTT tree).

    daemon ─► CollectorSink (PUSH) ─┐
    daemon ─► CollectorSink (PUSH) ─┼─► PULL (one thread) ─► once per (stream, task, chunk) ─► counts carried across
    controller: lost(daemon, sent)  ┘                         daemons ─► "daemon" stamped ─► the configured sinks

- **Once.** A result row is keyed (stream, task, chunk); a second row for a key is dropped and counted. That happens
  when a daemon's row arrives after the controller wrote the chunk's "daemon lost" row (a dead daemon's last
  packets), so the sinks still see exactly one row per chunk and task.
- **Nothing vanishes.** When a daemon dies, the controller hands over what ingest sent it (`SentChunk`s, ingest's
  sent ledger); every (chunk, task) with no row yet gets one: status error, reason "daemon lost: <name>".
- **Counts continue.** A line's or zone's running totals live in the daemon that tracks the stream; when the stream
  moves, the new daemon counts from zero. Each counter epoch is (daemon, counts_since); an event's cumulative totals
  are the sum of the latest totals of every epoch of its stream's rule, and its counts_since the earliest. "inside"
  (who is in a zone now) is the serving daemon's alone: tracks restart with the move.
- **Restart.** The collector is one actor (Ray restarts it). Rows it had read but not yet handed to a sink are lost
  with it; rows still queued in the daemons' PUSH sockets (up to their SNDHWM) are delivered to the restarted one,
  which binds the same address. Its memory of answered chunks restarts too: a duplicate is then possible only
  for a chunk whose daemon died while the collector was down.
"""

from __future__ import annotations

import collections
import json
import logging
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass

import zmq

from vlora_va.contracts.config import PipelineConfig
from vlora_va.contracts.results import RESULT_VERSION, iso_utc
from vlora_va.contracts.security import bind_server, close_server
from vlora_va.ingest.route import SentChunk
from vlora_va.outputs.attach import configured_sinks

log = logging.getLogger(__name__)

ANSWERED_WINDOW_S = 300.0  # keys of answered chunks are kept this long (longer than ingest's sent ledger, 120 s)
ANSWERED_MAX = 2_000_000  # ...and at most this many (memory bound, about 200 MB at worst)
POLL_MS = 100
CUMULATIVE = ("in", "out", "entered", "left")  # count fields that add up across daemons ("inside" does not)


class JsonRow:
    """A row that arrived as JSON, as the sinks take it (they need .stream, .type and .to_json())."""

    __slots__ = ("row",)

    def __init__(self, row: dict):
        self.row = row

    @property
    def stream(self) -> str:
        return str(self.row.get("stream", ""))

    @property
    def type(self) -> str:
        return str(self.row.get("type", "result"))

    def to_json(self) -> dict:
        return self.row


@dataclass
class CollectorTotals:
    rows: int = 0  # handed to the sinks
    duplicates: int = 0  # second rows for a (stream, task, chunk): dropped
    lost: int = 0  # "daemon lost" rows written
    malformed: int = 0  # messages that were not [daemon, row JSON]
    by_daemon: dict = None

    def to_json(self) -> dict:
        return {"rows": self.rows, "duplicates": self.duplicates, "lost": self.lost, "malformed": self.malformed,
                "by_daemon": dict(self.by_daemon or {})}


class Counts:
    """Running totals carried across the daemons a stream has been on (see the module docstring)."""

    def __init__(self):
        # (stream, task, rule) -> epoch (daemon, counts_since) -> {(field, class): n}
        self._epochs: dict[tuple, dict[tuple, dict]] = collections.defaultdict(dict)
        self._since: dict[tuple, str] = {}

    def carry(self, daemon: str, row: dict) -> dict:
        counts = row.get("counts")
        if not isinstance(counts, dict):
            return row
        rule = ("line", row["line"]) if row.get("line") is not None else ("zone", row.get("zone"))
        key = (row.get("stream"), row.get("task"), rule)
        since = row.get("counts_since")
        epochs = self._epochs[key]
        epochs[(daemon, since)] = {(f, c): n for f, per in counts.items() if isinstance(per, dict)
                                   for c, n in per.items() if isinstance(n, (int, float))}
        if since is not None:  # noted from the first epoch on: the first daemon's start is the earliest
            self._since[key] = min(self._since.get(key, since), since)
        if len(epochs) == 1:
            return row  # one daemon so far: its totals are the totals
        total: dict[str, dict] = {f: dict(per) for f, per in counts.items() if isinstance(per, dict)}
        for f in CUMULATIVE:
            if f in total:
                total[f] = {}
        for flat in epochs.values():
            for (f, c), n in flat.items():
                if f in CUMULATIVE:
                    total.setdefault(f, {})[c] = total.get(f, {}).get(c, 0) + n
        return {**row, "counts": total, "counts_since": self._since.get(key, since)}


class Collector:
    def __init__(self, config: PipelineConfig, endpoint: str = "tcp://127.0.0.1:*"):
        """endpoint: where daemons connect (a '*' port: any free one; `self.endpoint` says which)."""
        self.config = config
        self.totals = CollectorTotals(by_daemon=collections.Counter())
        self.counts = Counts()
        self._answered: collections.OrderedDict[tuple, float] = collections.OrderedDict()
        self._last_row: dict[str, float] = {}  # daemon -> time.monotonic() of its last row
        self._media_ts: dict[str, float] = {}  # stream -> media time of its latest row (where its moves are placed)
        # stream -> daemon -> wall time of the first ok row that daemon served for it (failover: when a moved stream
        # was served again)
        self.first_served: dict[str, dict[str, float]] = collections.defaultdict(dict)
        self._lock = threading.Lock()  # the receiving thread and the controller's calls share the books
        self._stack = ExitStack()
        self._sinks = configured_sinks(config)(self._stack)
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PULL)
        self._sock.setsockopt(zmq.RCVHWM, 100_000)
        self._auth = bind_server(self._ctx, self._sock, endpoint, config.security.curve, "cluster collector")
        self.endpoint = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="collector", daemon=True)
        self._thread.start()
        log.info("collector on %s: rows go to %d sink(s)", self.endpoint, len(self._sinks))

    # ------------------------------------------------------------------ rows from daemons
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if not self._sock.poll(POLL_MS):
                    continue
                parts = self._sock.recv_multipart()
            except zmq.ZMQError as e:
                if self._stop.is_set():
                    return
                log.error("collector: receive failed: %s", e)
                continue
            self.receive(parts)

    def receive(self, parts: list[bytes]) -> None:
        """One message: [daemon name, row JSON]. Anything else is counted and dropped (never fatal)."""
        try:
            daemon = parts[0].decode()
            row = json.loads(parts[1])
            if len(parts) != 2 or not isinstance(row, dict):
                raise ValueError("not [daemon, row]")
        except (IndexError, UnicodeDecodeError, ValueError):
            with self._lock:
                self.totals.malformed += 1
            return
        with self._lock:
            self._last_row[daemon] = time.monotonic()
            self._write(daemon, [row])

    def _write(self, daemon: str, rows: list[dict]) -> None:
        """Rows of one daemon (lock held): once each, counts carried, stamped, to every sink."""
        out = []
        now = time.monotonic()
        for row in rows:
            if row.get("type", "result") == "result":
                key = (row.get("stream"), row.get("task"), row.get("chunk"))
                if key in self._answered:
                    self.totals.duplicates += 1
                    continue
                self._answered[key] = now
                if row.get("frame_ts"):
                    self._media_ts[key[0]] = row["frame_ts"][-1]
                if row.get("status") == "ok" and daemon not in self.first_served[key[0]]:
                    self.first_served[key[0]][daemon] = time.time()
            elif row.get("type") == "event":
                row = self.counts.carry(daemon, row)
            out.append(JsonRow({**row, "daemon": daemon} if daemon else row))
        self._forget(now)
        if not out:
            return
        self.totals.rows += len(out)
        self.totals.by_daemon[daemon] += len(out)
        for sink in self._sinks:
            sink.write(out)

    def _forget(self, now: float) -> None:
        a = self._answered
        while a and (len(a) > ANSWERED_MAX or next(iter(a.values())) < now - ANSWERED_WINDOW_S):
            a.popitem(last=False)

    # ------------------------------------------------------------------ the controller's calls
    def settle(self, daemon: str, quiet_s: float = 0.5, timeout_s: float = 5.0) -> None:
        """Wait until `daemon` (dead) has sent nothing for quiet_s: its last rows, still in the network, are in."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                last = self._last_row.get(daemon, 0.0)
            if time.monotonic() - last >= quiet_s:
                return
            time.sleep(0.05)

    def lost(self, daemon: str, chunks: list[SentChunk]) -> int:
        """Rows for what `daemon` was sent and never answered (it died): one error row per chunk and task that has
        none yet. Returns how many were written."""
        now = time.time()
        rows = []
        with self._lock:
            for c in chunks:
                for task, adapter, deadline_ms in c.tasks:
                    if (c.stream, task, c.seq) in self._answered:
                        continue
                    rows.append(lost_row(c, task, adapter, deadline_ms, daemon, now))
            self._write(daemon, rows)
            self.totals.lost += len(rows)
        if rows:
            log.warning("daemon %s lost: %d row(s) written for the chunks it was sent and never answered", daemon,
                        len(rows))
        return len(rows)

    def event(self, row: dict) -> None:
        """A row the controller makes (stream_moved): to the sinks like any other, at the stream's latest media time
        (the controller does not see media)."""
        with self._lock:
            self._write("", [{**row, "ts": self._media_ts.get(row.get("stream"), row.get("ts"))}])

    def snapshot(self) -> dict:
        with self._lock:
            return {"endpoint": self.endpoint, **self.totals.to_json(),
                    "first_served": {s: dict(d) for s, d in self.first_served.items()},
                    "sinks": {s.name: s.stats() for s in self._sinks}}

    def close(self) -> None:
        """Stop reading, then flush the sinks (each within its close timeout)."""
        self._stop.set()
        self._thread.join(5)
        close_server(self._ctx, self._sock, self._auth)
        self._stack.close()


def lost_row(c: SentChunk, task: str, adapter: str, deadline_ms: float, daemon: str, now: float) -> dict:
    """The error row of one task of a chunk a dead daemon never answered (as contracts.results writes rows; times
    in the sender's clock: the daemon that could have said more is gone)."""
    row = {"v": RESULT_VERSION, "type": "result", "stream": c.stream, "chunk": c.seq, "task": task,
           "adapter": adapter, "status": "error", "reason": f"daemon lost: {daemon}",
           "frame_ts": [round(t, 4) for t in c.frame_ts], "captured_at": iso_utc(c.ready_wall),
           "latency_ms": {"queue": 0.0, "compute": 0.0, "total": round((now - c.ready_wall) * 1000, 1)},
           "deadline_ms": round(deadline_ms, 1), "deadline_met": False}
    if c.dropped_before:
        row["dropped_before"] = c.dropped_before
    if c.outage_s > 0:
        row["outage_before_s"] = round(c.outage_s, 3)
    return row
