"""The daemon's analytics: what happened on its streams, from the rows it writes and what ingest says.

    accepted requests of tracked tasks ─► expect (ChunkOrder)
    rows ─► untracked tasks: as they are
         └► tracked tasks: held until the chunks before them are answered ─► TrackedTask (track ids, line and
            zone events, snapshots)
    ingest heartbeats + chunks ─► Liveness ─► stream_offline / stream_online (a stream going offline also ends its
                                              tracks, so their zone presences end)

One per daemon; everything runs on the daemon's thread. Event and track ids start with a run id that differs on
every start, so they stay unique across daemon restarts.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from dataclasses import replace
from typing import Any

from vlora_va.analytics.liveness import Liveness
from vlora_va.analytics.order import ChunkOrder
from vlora_va.analytics.snapshots import SnapshotStore
from vlora_va.analytics.tracked_task import Snapshotter, TrackedTask
from vlora_va.analytics.tracking import TrackIds
from vlora_va.common.logs import Throttle
from vlora_va.contracts.config import PipelineConfig
from vlora_va.contracts.events import EventRecord
from vlora_va.contracts.requests import Request
from vlora_va.contracts.results import DetectionResult, ResultRecord

log = logging.getLogger(__name__)

# (record, its shed cause or None, its request or None): what the daemon's rows carry to the sinks
Item = tuple[Any, str | None, Request | None]


def new_run_id() -> str:
    """Six base-36 characters from the clock and the OS's randomness: unique enough across restarts."""
    n = (int(time.time() * 1000) << 16) ^ int.from_bytes(os.urandom(4), "big")
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    for _ in range(6):
        n, r = divmod(n, 36)
        out += digits[r]
    return out


class Analytics:
    def __init__(self, config: PipelineConfig, run_id: str | None = None):
        self.config = config
        self.run_id = run_id or new_run_id()
        self.track_ids = TrackIds(f"{self.run_id}-t")
        self._event_n = itertools.count(1)
        self.tasks: dict[tuple[str, str], TrackedTask] = {}
        self.order: dict[tuple[str, str], ChunkOrder[Item]] = {}
        for s in config.streams:
            for t in s.tracked_tasks:
                self.tasks[s.id, t.name] = TrackedTask(s, t, config.tracking, self.track_ids, self._event_id)
                self.order[s.id, t.name] = ChunkOrder()
        self.liveness = Liveness({s.id: s.offline_after_s for s in config.streams})
        self.failures = 0  # rows the tracker or the rules failed on (logged; the row went out untracked)
        self._log = Throttle(log, "tracking failures")
        self._media_ts: dict[str, float] = {}  # each stream's latest media time (stream events are placed there)
        self.snapshots = SnapshotStore(config.snapshots) if any(s.snapshots for s in config.streams) else None

    def wants_embeddings(self, stream: str, task: str) -> bool:
        """Whether this task's detections should carry appearance embeddings: a tracked task's, with the
        appearance tracker (the others' would be computed for nothing)."""
        return self.config.tracking.tracker == "appearance" and (stream, task) in self.tasks

    def _event_id(self) -> str:
        return f"{self.run_id}-{next(self._event_n)}"

    # ------------------------------------------------------------------ what arrives
    def expect(self, keys: list[tuple[str, str, int]]) -> None:
        """(stream, task, chunk) of accepted requests: a tracked task's later rows wait for theirs."""
        for stream, task, seq in keys:
            order = self.order.get((stream, task))
            if order is not None:
                order.expect(seq)

    def heard(self, stream: str, state: str, frame_age_s: float, received: float) -> None:
        self.liveness.heard(stream, state, frame_age_s, received)

    def frames(self, stream: str, captured_at: float, media_ts: float) -> None:
        """A chunk of the stream arrived; its last frame, at media time media_ts, was captured at captured_at."""
        self.liveness.frames(stream, captured_at)
        self._media_ts[stream] = media_ts

    # ------------------------------------------------------------------ rows
    def rows(self, items: list[Item]) -> list[Item]:
        """The rows to write now, in order: untracked ones as they came, tracked ones once in chunk order with
        their track ids, each followed by the events it made."""
        out: list[Item] = []
        for rec, cause, req in items:
            key = (rec.stream, rec.task)
            if rec.type != "result" or key not in self.tasks:  # events pass as they are
                out.append((rec, cause, req))
                continue
            for ready in self.order[key].done(rec.chunk, (rec, cause, req)):
                out += self._tracked(self.tasks[key], *ready)
        return out

    def _tracked(self, task: TrackedTask, rec: ResultRecord, cause: str | None, req: Request | None) -> list[Item]:
        try:
            rec, events = task.row(rec, self._snapshotter(rec, req))
        except Exception as e:  # noqa: BLE001 - a row the tracker chokes on goes out untracked; serving goes on
            self.failures += 1
            self._log.error(time.monotonic(), "stream %s task %s chunk %d: tracking failed (%s: %s); the row goes "
                            "out without track ids", rec.stream, rec.task, rec.chunk, type(e).__name__, e)
            if isinstance(rec.result, DetectionResult) and not self.config.tracking.embeddings_in_rows:
                rec = replace(rec, result=rec.result.without_embeddings())  # untracked, but never with embeddings
            return [(rec, cause, req)]
        return [(rec, cause, req)] + [(e, None, None) for e in events]

    def _snapshotter(self, rec: ResultRecord, req: Request | None) -> Snapshotter | None:
        if self.snapshots is None or req is None or not req.jpegs:
            return None
        store, quality = self.snapshots, self.config.snapshots.quality

        def snap(event_id: str, ts: float, box) -> str | None:
            jpeg = req.jpegs.get(ts)
            return store.save(event_id, jpeg, box, req.orig_size, quality) if jpeg is not None else None
        return snap

    # ------------------------------------------------------------------ time passing
    def tick(self, now: float) -> list[EventRecord]:
        """Streams that went offline or came back since the last call, as events (and the zone presences a
        stream going offline ends)."""
        out: list[EventRecord] = []
        for stream, online, since in self.liveness.changes(now):
            ts = self._media_ts.get(stream, 0.0)
            out.append(EventRecord(id=self._event_id(), event="stream_online" if online else "stream_offline",
                                   phase="end" if online else "start", stream=stream, ts=ts, captured_at=since))
            if not online:
                for (sid, _), task in self.tasks.items():
                    if sid == stream:
                        out += task.end_all(ts)
        return out

    def release(self, stream: str) -> list[Item]:
        """The stream leaves this daemon (cluster mode moved it elsewhere): its held rows go out now, its tracks end
        (their zone presences end: events) and start afresh should it come back, and its silence is no outage."""
        out: list[Item] = []
        ts = self._media_ts.get(stream, 0.0)
        for (sid, name), task in list(self.tasks.items()):
            if sid != stream:
                continue
            for held in self.order[sid, name].flush():
                out += self._tracked(task, *held)
            out += [(e, None, None) for e in task.end_all(ts)]
            s = self.config.stream(sid)
            self.tasks[sid, name] = TrackedTask(s, task.task, self.config.tracking, self.track_ids, self._event_id)
        self.liveness.forget(stream)
        return out

    def end(self) -> list[EventRecord]:
        """The daemon stops: every track ends, so every zone presence and loitering that started also ends (a
        consumer pairing starts and ends never waits for an end that cannot come; track ids restart anyway)."""
        out: list[EventRecord] = []
        for (sid, _), task in self.tasks.items():
            out += task.end_all(self._media_ts.get(sid, 0.0))
        return out

    def tracks_active(self) -> dict[str, int]:
        """Confirmed tracks per stream now (for the vlora_tracks_active gauge)."""
        out: dict[str, int] = {}
        for (sid, _), task in self.tasks.items():
            out[sid] = out.get(sid, 0) + task.tracker.active
        return out

    def unique_objects(self, now: float) -> dict[str, dict[str, int]]:
        """{stream: {class: distinct tracks seen over tracking.unique_window_s}} (the vlora_unique_objects gauge)."""
        out: dict[str, dict[str, int]] = {}
        for (sid, _), task in self.tasks.items():
            for cls, n in task.unique.counts(now).items():
                out.setdefault(sid, {})[cls] = out.get(sid, {}).get(cls, 0) + n
        return out

    def held(self) -> int:
        """Rows waiting for an earlier chunk's row."""
        return sum(len(o) for o in self.order.values())
