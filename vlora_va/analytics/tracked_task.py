"""One stream's tracked task: its rows, in chunk order, become rows with track ids plus the events its lines and
zones saw.

    served row ─► StreamTracker (track ids, ended tracks) ─► per frame: SceneRules (lines, zones) ─► hits
    ─► EventRecords (id, counts, snapshot; `reentered` on a track that left and came back)
               └► UniqueObjects (distinct tracks per class over tracking.unique_window_s)
    shed / error row ─► nothing to track: the tracker predicts across the gap at the next served frame
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable

from vlora_va.analytics.rule_parts import Hit, TrackPoint
from vlora_va.analytics.rules import SceneRules
from vlora_va.analytics.tracking import StreamTracker, TrackedFrame, TrackIds
from vlora_va.analytics.unique import UniqueObjects
from vlora_va.contracts.config import StreamConfig, TaskConfig
from vlora_va.contracts.events import EventRecord
from vlora_va.contracts.results import DetectionResult, ResultRecord
from vlora_va.contracts.scene import TrackingConfig

# (event id, media time, box) -> the snapshot's path, or None when there is no frame to draw on
Snapshotter = Callable[[str, float, tuple | None], str | None]


class TrackedTask:
    def __init__(self, stream: StreamConfig, task: TaskConfig, tracking: TrackingConfig, track_ids: TrackIds,
                 event_id: Callable[[], str]):
        self.stream, self.task = stream, task
        fps = stream.fps * task.frames_per_chunk / stream.frames_per_chunk  # the tracked frames' rate
        self.tracker = StreamTracker(tracking, fps, track_ids)
        self.rules = SceneRules(stream.lines, stream.zones)
        self.unique = UniqueObjects(tracking.unique_window_s)
        self.event_id = event_id
        self.since = time.time()  # the rules' counts start now

    def row(self, rec: ResultRecord, snapshot: Snapshotter | None = None) -> tuple[ResultRecord, list[EventRecord]]:
        """A row of this task, in chunk order: with track ids on its confirmed boxes, and the events it made."""
        if rec.status != "ok" or not isinstance(rec.result, DetectionResult):
            return rec, []
        result, frames = self.tracker.track(rec.result)
        events = []
        now = time.time()
        for frame in frames:
            for d in frame.detections:
                if d.track_id is not None:
                    self.unique.saw(d.track_id, d.cls, now)
            events += [self._event(rec, h, snapshot) for h in self._hits(frame)]
        return replace(rec, result=result), events

    def end_all(self, ts: float) -> list[EventRecord]:
        """Every track ends (the stream went offline): its zone presences end too."""
        ended = self.tracker.end_all()
        hits = self.rules.end([tid for tid, _ in ended], ts)
        return [self._event(None, h, None) for h in hits]

    def _hits(self, frame: TrackedFrame) -> list[Hit]:
        hits = self.rules.end([tid for tid, _ in frame.ended], frame.ts) if frame.ended else []
        points = [TrackPoint(d.track_id, d.cls, d.box) for d in frame.detections if d.track_id is not None]
        return hits + self.rules.update(frame.ts, points)

    def _event(self, rec: ResultRecord | None, hit: Hit, snapshot: Snapshotter | None) -> EventRecord:
        captured = self._captured_at(rec, hit.ts)
        event_id = self.event_id()
        return EventRecord(
            id=event_id, event=hit.event, phase=hit.phase, stream=self.stream.id, task=self.task.name,
            chunk=rec.chunk if rec is not None else None, ts=hit.ts, captured_at=captured,
            line=hit.rule if hit.kind == "line" else None, zone=hit.rule if hit.kind == "zone" else None,
            direction=hit.direction, track_id=hit.track_id, cls=hit.cls, box=hit.box, counts=hit.counts,
            counts_since=self.since,
            snapshot=snapshot(event_id, hit.ts, hit.box) if snapshot is not None else None,
            extra={**hit.extra, **({"reentered": True} if hit.track_id in self.tracker.reentered else {})})

    @staticmethod
    def _captured_at(rec: ResultRecord | None, ts: float) -> float:
        """Wall time of the frame at media time ts: the chunk's last frame was captured at rec.captured_at."""
        if rec is None or rec.captured_at is None or not rec.frame_ts:
            return time.time()
        return rec.captured_at - (rec.frame_ts[-1] - ts)
