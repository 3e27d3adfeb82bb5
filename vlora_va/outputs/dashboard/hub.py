"""What the dashboard shows, handed from the daemon's thread to the server's: bounded per-stream history, the
latest frame of each stream, each stream's line and zone totals and the last events of all streams.

The daemon's thread only appends (`rows`: every row written, results and events; `frame`: a served request, with
its frames) under one lock held for microseconds; at most one frame per stream every `frame_s` seconds is copied
(a crop of the letterboxed frame ingest sent: no second decode). Everything slower (JPEG encoding, JSON) happens
on the server's thread, and only while a page is connected.

A point (one row, for the charts) is `[seq, t, task, status, total_ms, deadline_ms]` with status `ok` (in
deadline), `late`, `shed` or `error`; `seq` increases over all streams, so a page that got a snapshot can
drop what it already has from the next update. Event rows take a seq from the same counter: an event is
`{seq, t, ts, stream, event, phase, kind ("line" | "zone" | None), rule, direction, track, class, snapshot}`, and
its `counts` replace its line's or zone's totals on the stream.
"""

from __future__ import annotations

import base64
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from vlora_va.contracts.events import EventRecord
from vlora_va.contracts.requests import Request
from vlora_va.contracts.results import ActivityResult, DetectionResult, PersonActivity, ResultRecord

HISTORY_S = 120.0  # seconds of per-stream history on the charts
MAX_POINTS = 1200  # per stream (about 10 rows/s over HISTORY_S); older points go first
RECENT_ROWS = 8  # recent results listed per stream
JPEG_QUALITY = 75
COUNTED_CHUNKS = 64  # chunks remembered per stream, so a chunk's ingest drops / outage count once
MAX_STREAMS = 64  # streams a page shows (and the hub keeps a frame of): more evict the oldest
RECENT_EVENTS = 20  # events listed, all streams together


@dataclass
class _Frame:
    version: int
    pixels: np.ndarray  # RGB crop of the letterboxed frame (the picture without its padding)
    meta: dict  # chunk, ts, task, boxes in crop pixels, untrained
    encoded: dict | None = None  # the page's form, made on first use on the server's thread


@dataclass
class _Stream:
    id: str
    points: deque = field(default_factory=lambda: deque(maxlen=MAX_POINTS))
    recent: deque = field(default_factory=lambda: deque(maxlen=RECENT_ROWS))
    counts: dict = field(default_factory=lambda: {"ok": 0, "late": 0, "shed": 0, "error": 0})
    ingest_dropped: int = 0
    outages: int = 0  # chunks that came after an outage of the source (a reconnect or a stall)
    outage_s: float = 0.0
    chunks: deque = field(default_factory=lambda: deque(maxlen=COUNTED_CHUNKS))
    last_chunk: int = -1
    activity: dict | None = None
    frame: _Frame | None = None
    frame_taken: float = -1e9  # monotonic
    has_detection: bool = False  # its frames come with detections; activity rows only label them
    line_counts: dict = field(default_factory=dict)  # line name -> {"counts": {"in": {cls: n}, "out": ...}, "since"}
    zone_counts: dict = field(default_factory=dict)  # zone name -> {"counts": {"inside", "entered", "left"}, "since"}
    scene_seq: int = 0  # seq of the last event that changed those totals

    def summary(self) -> dict:
        return {"counts": dict(self.counts), "ingest_dropped": self.ingest_dropped, "outages": self.outages,
                "outage_s": round(self.outage_s, 1), "last_chunk": self.last_chunk, "activity": self.activity,
                "line_counts": dict(self.line_counts), "zone_counts": dict(self.zone_counts)}


def _status(rec: ResultRecord) -> str:
    if rec.status == "ok":
        return "ok" if rec.deadline_met else "late"
    return rec.status


def _describe(rec: ResultRecord) -> str:
    """One line for the recent-results list."""
    if rec.status != "ok":
        return rec.reason or rec.status
    r = rec.result
    if isinstance(r, DetectionResult):
        found: dict[str, int] = {}
        for f in r.frames:
            for d in f.detections:
                found[d.cls] = found.get(d.cls, 0) + 1
        return ", ".join(f"{n} {c}" for c, n in sorted(found.items())) or "nothing found"
    if isinstance(r, ActivityResult):
        people = f", {len(r.persons)} person(s)" if r.persons else ""
        return f"{r.label} {r.score:.2f}{people}"
    return "ok"


def _totals(counts: dict) -> dict:
    """A copy of an event's running totals, two levels deep (by direction, by class): the dict is the rule's, and
    the server's thread reads the copy while the daemon's may change the original."""
    return {k: dict(v) for k, v in counts.items() if isinstance(v, dict)}


def _crop_box(box, scale: float) -> list[float]:
    return [round(v * scale, 1) for v in box]


def person_label(p: PersonActivity, scale: float) -> dict:
    """A person's box on the dashboard's frame: its activity, and the score behind it: the activity maps'
    probability where they named it, the person score where the person's track did (the maps' probability of a
    track's call would read as doubt it does not carry)."""
    if p.activity_from == "track":
        return {"box": _crop_box(p.box, scale), "label": f"{p.activity} (track)", "score": round(p.score, 2)}
    return {"box": _crop_box(p.box, scale), "label": p.activity, "score": round(p.activity_score, 2)}


class Hub:
    def __init__(self, stream_ids=(), frame_s: float = 1.0):
        self.frame_s = frame_s
        self._lock = threading.Lock()
        self._seq = 0
        self._frame_version = 0
        self._streams: dict[str, _Stream] = {}
        self._order: list[str] = []
        self._events: deque = deque(maxlen=RECENT_EVENTS)
        for sid in stream_ids:
            self._stream(sid)

    def _stream(self, sid: str) -> _Stream:
        st = self._streams.get(sid)
        if st is None:
            if len(self._order) >= MAX_STREAMS:  # bounded whatever stream ids senders invent: the oldest goes
                del self._streams[self._order.pop(0)]
            st = self._streams[sid] = _Stream(sid)
            self._order.append(sid)
        return st

    # ------------------------------------------------------------------ daemon thread
    def rows(self, records: list[ResultRecord | EventRecord]) -> None:
        """Every row the daemon writes: result rows (ok, shed, error) make the history, counts and recent results;
        event rows the event list and the line and zone totals."""
        now = time.time()
        with self._lock:
            for rec in records:
                if getattr(rec, "type", "result") == "event":
                    self._event(rec, now)
                    continue
                st = self._stream(rec.stream)
                self._seq += 1
                status = _status(rec)
                t = rec.captured_at + rec.latency.total_s if rec.captured_at is not None else now
                total_ms = round(rec.latency.total_s * 1000.0, 1)
                st.points.append([self._seq, round(t, 3), rec.task, status, total_ms, round(rec.deadline_ms, 1)])
                st.counts[status] += 1
                st.recent.append({"seq": self._seq, "chunk": rec.chunk, "task": rec.task, "status": status,
                                  "ms": total_ms, "text": _describe(rec)})
                st.last_chunk = max(st.last_chunk, rec.chunk)
                if rec.chunk not in st.chunks:  # per-chunk facts are on every row of the chunk: count once
                    st.chunks.append(rec.chunk)
                    st.ingest_dropped += rec.dropped_before
                    if rec.outage_before_s > 0:
                        st.outages += 1
                        st.outage_s += rec.outage_before_s
                if status in ("ok", "late") and isinstance(rec.result, ActivityResult):
                    st.activity = {"label": rec.result.label, "score": round(rec.result.score, 3),
                                   "chunk": rec.chunk, "task": rec.task, "untrained": rec.untrained}

    def _event(self, rec: EventRecord, now: float) -> None:
        """One event row (any event name: the list is open), under the lock."""
        st = self._stream(rec.stream)
        self._seq += 1
        kind = "line" if rec.line is not None else "zone" if rec.zone is not None else None
        self._events.append({"seq": self._seq, "t": round(rec.captured_at if rec.captured_at is not None else now, 3),
                             "ts": round(rec.ts, 3), "stream": rec.stream, "event": rec.event, "phase": rec.phase,
                             "kind": kind, "rule": rec.line if kind == "line" else rec.zone,
                             "direction": rec.direction, "track": rec.track_id, "class": rec.cls,
                             "snapshot": rec.snapshot})
        if kind is not None and isinstance(rec.counts, dict):
            held = st.line_counts if kind == "line" else st.zone_counts
            held[rec.line if kind == "line" else rec.zone] = {"counts": _totals(rec.counts), "since": rec.counts_since}
            st.scene_seq = self._seq

    def frame(self, req: Request, rec: ResultRecord) -> None:
        """A served request (RowWriter.observe_served): keep one of its frames, with what was found on it, at a reduced
        rate."""
        if rec.result is None or not req.frames:
            return
        detection = isinstance(rec.result, DetectionResult)
        now = time.monotonic()
        with self._lock:
            st = self._stream(req.stream)
            st.has_detection |= detection
            if (not detection and st.has_detection) or now - st.frame_taken < self.frame_s:
                return
            st.frame_taken = now
        lb = req.letterbox
        w, h = req.orig_size
        x0, y0 = int(lb.pad_x), int(lb.pad_y)
        cw, ch = max(1, round(w * lb.scale)), max(1, round(h * lb.scale))
        i = len(req.frames) - 1  # the last frame (the newest picture of the chunk)
        pixels = np.ascontiguousarray(req.frames[i][y0:y0 + ch, x0:x0 + cw])  # a copy: the buffer is not ours
        boxes = []
        if detection:
            for d in rec.result.frames[i].detections if i < len(rec.result.frames) else ():
                box = {"box": _crop_box(d.box, lb.scale), "label": d.cls, "score": round(d.score, 2)}
                if getattr(d, "track_id", None) is not None:  # a confirmed track of a tracked task
                    box["track"] = d.track_id
                boxes.append(box)
        elif getattr(rec.result, "persons", None):  # a plug-in head's result may have neither boxes nor persons
            boxes += [person_label(p, lb.scale) for p in rec.result.persons]
        meta = {"chunk": req.seq, "ts": round(req.frame_ts[i], 3), "task": req.task, "boxes": boxes,
                "untrained": rec.untrained, "width": int(pixels.shape[1]), "height": int(pixels.shape[0]),
                "scale": lb.scale}  # crop pixels per original-frame pixel: lines and zones are in original pixels
        with self._lock:
            self._frame_version += 1
            st.frame = _Frame(self._frame_version, pixels, meta)

    # ------------------------------------------------------------------ server thread
    @property
    def seq(self) -> int:
        return self._seq

    def streams(self) -> list[str]:
        with self._lock:
            return list(self._order)

    def snapshot(self, since_t: float) -> tuple[int, int, dict]:
        """(point seq, frame version, {stream: everything held}) with points newer than since_t."""
        with self._lock:
            out = {}
            for sid in self._order:
                st = self._streams[sid]
                out[sid] = {**st.summary(), "points": [p for p in st.points if p[1] >= since_t],
                            "recent": list(st.recent), "frame": st.frame}
            return self._seq, self._frame_version, out

    def changes(self, after_seq: int, after_frame: int) -> tuple[int, int, dict]:
        """(point seq, frame version, {stream: what changed}) since a previous snapshot / changes call."""
        with self._lock:
            out = {}
            for sid in self._order:
                st = self._streams[sid]
                points = [p for p in _newer(st.points, after_seq)]
                frame = st.frame if st.frame is not None and st.frame.version > after_frame else None
                if points or frame is not None or st.scene_seq > after_seq or after_seq == 0:
                    out[sid] = {**st.summary(), "points": points,
                                "recent": [r for r in st.recent if r["seq"] > after_seq], "frame": frame}
            return self._seq, self._frame_version, out

    def events(self, after_seq: int, upto_seq: int) -> list[dict]:
        """The events held (the last RECENT_EVENTS) with after_seq < seq <= upto_seq, oldest first: with the seq of
        a snapshot / changes call, exactly the events that call covers."""
        with self._lock:
            return [e for e in self._events if after_seq < e["seq"] <= upto_seq]


def _newer(points: deque, after_seq: int):
    """Points with seq > after_seq, read from the newest end (updates want only the last few)."""
    out = []
    for p in reversed(points):
        if p[0] <= after_seq:
            break
        out.append(p)
    out.reverse()
    return out


def encode(frame: _Frame | None) -> dict | None:
    """A frame in the page's form (JPEG as a data URL + what is drawn on it); cached on the frame."""
    if frame is None:
        return None
    if frame.encoded is None:
        import cv2

        ok, buf = cv2.imencode(".jpg", np.ascontiguousarray(frame.pixels[..., ::-1]),
                               [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
        if not ok:
            return None
        frame.encoded = {**frame.meta, "version": frame.version,
                         "jpeg": "data:image/jpeg;base64," + base64.b64encode(buf.tobytes()).decode()}
    return frame.encoded
