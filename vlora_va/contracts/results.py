"""The result record: one row per request (one task on one chunk), whatever happened to it.

The heads produce the typed payloads (`DetectionResult`, `ActivityResult`); the daemon wraps each request's
outcome in a `ResultRecord`; every sink writes `record.to_json()` (one JSON Lines row). Every row carries
`status`: "ok" (served), "shed" (not computed: it could not meet its deadline, or overload degraded it) or
"error" (it could not be served), with `reason` for the last two. Only "ok" rows can have met their deadline.

Example rows (JSON Lines, one object per line)::

    {"v":3,"type":"result","stream":"pedestrians","chunk":0,"task":"detect","adapter":"detect","status":"ok","frame_ts":[0.5],
     "frames":[{"ts":0.5,"detections":[{"box":[282.4,215.2,318.0,301.0],"class":"person","score":0.6679}]}],
     "latency_ms":{"queue":50.5,"compute":895.7,"total":951.2},"deadline_ms":2000.0,"deadline_met":true,
     "batch_images":10,"mode":"premerged"}
    {"v":3,"type":"result","stream":"pedestrians","chunk":1,"task":"activity","adapter":"actions","status":"shed",
     "reason":"cannot meet its deadline: needs ~820 ms, 310 ms left","frame_ts":[...],
     "latency_ms":{"queue":0.0,"compute":0.0,"total":2690.0},"deadline_ms":3000.0,"deadline_met":false}
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Union

import numpy as np

# 3: every row has "type" ("result" | "event", contracts/events.py); detections of tracked tasks have "track_id"
RESULT_VERSION = 3
STATUSES = ("ok", "shed", "error")


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 1)


@dataclass(frozen=True)
class Detection:
    box: tuple[float, float, float, float]  # x1, y1, x2, y2 in original-frame pixels
    cls: str
    score: float
    track_id: str | None = None  # tracked tasks: the confirmed track this box belongs to (vlora_va/analytics/)
    # tracked tasks: the box's appearance embedding (engine/heads/appearance.py; float16 unit vector). The tracker
    # drops it from the row it hands on unless `tracking.embeddings_in_rows` says to keep it.
    embedding: np.ndarray | None = field(default=None, compare=False, repr=False)

    def to_json(self) -> dict:
        out = {"box": [round(v, 1) for v in self.box], "class": self.cls, "score": round(self.score, 4)}
        if self.track_id is not None:
            out["track_id"] = self.track_id
        if self.embedding is not None:
            out["embedding"] = [round(float(v), 4) for v in self.embedding]
        return out


@dataclass(frozen=True)
class FrameDetections:
    ts: float  # media time of the frame
    detections: tuple[Detection, ...]

    def to_json(self) -> dict:
        return {"ts": round(self.ts, 4), "detections": [d.to_json() for d in self.detections]}


@dataclass(frozen=True)
class DetectionResult:
    frames: tuple[FrameDetections, ...]

    def without_embeddings(self) -> "DetectionResult":
        """The same detections without their appearance embeddings (what leaves the daemon by default)."""
        return DetectionResult(tuple(FrameDetections(f.ts, tuple(
            Detection(d.box, d.cls, d.score, d.track_id) for d in f.detections)) for f in self.frames))

    def to_json(self) -> dict:
        return {"frames": [f.to_json() for f in self.frames]}


@dataclass(frozen=True)
class PersonActivity:
    box: tuple[float, float, float, float]  # where the person was over the clip (mean box), original pixels
    score: float  # how sure the head is that a person is there
    activity: str
    activity_score: float  # the learnt activity maps' probability of `activity`
    # what named the activity: "maps" (the learnt activity maps) or "track" (the person's boxes over the clip, by
    # the motion rule of vlora_va/engine/motion.py; activity_score then says how far the maps agree)
    activity_from: str = "maps"

    def to_json(self) -> dict:
        return {"box": [round(v, 1) for v in self.box], "score": round(self.score, 4), "activity": self.activity,
                "activity_score": round(self.activity_score, 4), "activity_from": self.activity_from}


@dataclass(frozen=True)
class ActivityResult:
    label: str  # the clip's main subject's activity (or no_person)
    score: float
    scores: dict[str, float]
    persons: tuple[PersonActivity, ...] | None = None  # adapters with a per-person branch

    def to_json(self) -> dict:
        out = {"label": self.label, "score": round(self.score, 4),
               "scores": {k: round(v, 4) for k, v in self.scores.items()}}
        if self.persons is not None:
            out["persons"] = [p.to_json() for p in self.persons]
        return out


Payload = Union[DetectionResult, ActivityResult]


@dataclass(frozen=True)
class Latency:
    queue_s: float = 0.0  # received -> batch start
    compute_s: float = 0.0  # the batch's engine time
    total_s: float = 0.0  # chunk ready at the source -> the row handed to the sinks (the real-time figure)
    handoff_s: float | None = None  # result ready -> handed to the sinks (analytics, ordering): set at the hand-off

    def to_json(self) -> dict:
        out = {"queue": _ms(self.queue_s), "compute": _ms(self.compute_s), "total": _ms(self.total_s)}
        if self.handoff_s is not None:
            out["handoff"] = _ms(self.handoff_s)
        return out


@dataclass(frozen=True)
class ResultRecord:
    stream: str
    chunk: int
    task: str
    adapter: str
    status: str  # one of STATUSES
    frame_ts: tuple[float, ...]
    latency: Latency
    deadline_ms: float
    deadline_met: bool
    reason: str | None = None  # why a request was shed or failed
    result: Payload | None = None  # ok rows
    batch_images: int | None = None  # ok rows: images in the batch that served it
    mode: str | None = None  # ok rows: the LoRA mode of that batch
    untrained: bool = False  # the adapter's head was never trained: the result claims nothing
    dropped_before: int = 0  # chunks of this stream ingest dropped just before this one
    outage_before_s: float = 0.0  # media seconds the stream's source missed just before this chunk (an outage)
    captured_at: float | None = None  # wall time (daemon clock) the chunk's last frame was captured
    provenance: dict | None = None  # what produced it: adapter sha256 / version, backbone, pipeline config hash
    extra: dict = field(default_factory=dict)  # e.g. {"frames_used": 4} when overload thinned a clip

    type = "result"  # every row has a type; event rows (contracts/events.py) say "event"

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"result status must be one of {STATUSES}, got {self.status!r}")
        if self.status != "ok" and (self.deadline_met or not self.reason):
            raise ValueError(f"a {self.status} row needs a reason and never meets its deadline")

    @classmethod
    def served(cls, req, payload: Payload, *, compute_start: float, compute_end: float, batch_images: int, mode: str,
               trained: bool = True, extra: dict | None = None, provenance: dict | None = None) -> "ResultRecord":
        """The row of a request the engine served (times in the daemon's clock)."""
        return cls(
            stream=req.stream, chunk=req.seq, task=req.task, adapter=req.adapter, status="ok",
            frame_ts=tuple(req.frame_ts), result=payload,
            latency=Latency(compute_start - req.received, compute_end - compute_start, compute_end - req.ready),
            deadline_ms=req.deadline_ms, deadline_met=compute_end <= req.deadline, batch_images=batch_images,
            mode=mode, untrained=not trained, dropped_before=req.dropped_before,
            outage_before_s=req.outage_before_s, captured_at=req.ready, provenance=provenance,
            extra={**({"degraded": req.degraded} if req.degraded else {}),
                   **({"best_effort": True} if req.best_effort else {}), **(extra or {})})

    @classmethod
    def not_served(cls, req, status: str, reason: str, now: float, provenance: dict | None = None) -> "ResultRecord":
        """The row of a request that was shed or failed: it says why, and never counts as in deadline."""
        if status not in ("shed", "error"):
            raise ValueError(f"not_served rows are shed or error, got {status!r}")
        return cls(
            stream=req.stream, chunk=req.seq, task=req.task, adapter=req.adapter, status=status, reason=reason,
            frame_ts=tuple(req.frame_ts), latency=Latency(0.0, 0.0, now - req.ready), deadline_ms=req.deadline_ms,
            deadline_met=False, dropped_before=req.dropped_before, outage_before_s=req.outage_before_s,
            captured_at=req.ready, provenance=provenance)

    def handed(self, now: float) -> "ResultRecord":
        """This row as it is handed to the sinks at `now` (daemon clock): its total latency runs to now, and its
        deadline is judged now, where the row leaves for a local sink (docs/results.md#deadline_met). A row without
        a capture time (a test's own) is returned as it is."""
        if self.captured_at is None:
            return self
        total = now - self.captured_at
        latency = Latency(self.latency.queue_s, self.latency.compute_s, max(total, self.latency.total_s),
                          max(0.0, total - self.latency.total_s))
        met = self.deadline_met and total * 1000.0 <= self.deadline_ms
        return replace(self, latency=latency, deadline_met=met)

    def to_json(self) -> dict:
        row = {"v": RESULT_VERSION, "type": "result", "stream": self.stream, "chunk": self.chunk, "task": self.task,
               "adapter": self.adapter, "status": self.status}
        if self.reason:
            row["reason"] = self.reason
        row["frame_ts"] = [round(t, 4) for t in self.frame_ts]
        if self.captured_at is not None:
            row["captured_at"] = iso_utc(self.captured_at)
        if self.untrained:
            row["untrained"] = True
        if self.result is not None:
            row.update(self.result.to_json())
        row["latency_ms"] = self.latency.to_json()
        row["deadline_ms"] = round(self.deadline_ms, 1)
        row["deadline_met"] = self.deadline_met
        if self.batch_images is not None:
            row["batch_images"] = self.batch_images
        if self.mode:
            row["mode"] = self.mode
        if self.dropped_before:
            row["dropped_before"] = self.dropped_before
        if self.outage_before_s > 0:
            row["outage_before_s"] = round(self.outage_before_s, 3)
        if self.provenance:
            row["provenance"] = self.provenance
        row.update(self.extra)
        return row


def iso_utc(t: float) -> str | None:
    """2026-11-23T10:15:30.123Z: ISO 8601, UTC, milliseconds; None for a time no calendar date holds."""
    try:
        return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    except (ValueError, OverflowError, OSError):
        return None


# ---------------------------------------------------------------- reading rows back
def is_result(row: dict) -> bool:
    """Whether a row read back is a result row (not an event row, contracts/events.py). Rows of version 2 files
    have no "type": they are all results."""
    return row.get("type", "result") == "result"


class JsonlFollower:
    """A JSON Lines results file read as it grows (a consumer's tail -f): `new_lines()` returns the complete
    lines appended since the last call; a line still being written waits for its newline. A file that does not
    exist yet reads as empty."""

    def __init__(self, path):
        self.path, self._pos, self._partial = path, 0, ""

    def new_lines(self) -> list[str]:
        try:
            with open(self.path) as f:
                f.seek(self._pos)
                text = f.read()
                self._pos = f.tell()
        except FileNotFoundError:
            return []
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        return [line for line in lines if line]
