"""Tracks across chunks: one multi-object tracker per stream and tracked task.

    a tracked task's rows, in chunk order ─► per frame (media time): one box per object (cross-class NMS)
    ─► the tracker fed the frame's timestamp: `appearance` by default (appearance_tracker.py: motion plus each box's
       embedding, no id for a box either of two tracks could be, and re-entry), or Roboflow `trackers` on geometry
       alone (ByteTrack, SORT, OC-SORT)
    ─► confirmed tracks get a `track_id` "<run id>-<n>", and one class (the score-weighted vote over the track's
       boxes); the boxes leave without their embeddings (unless `embeddings_in_rows`)

Why these choices:
- The tracker is fed media timestamps, not frame counts, so a shed or dropped chunk or an outage is a longer step
  its motion model predicts across; a track not matched for `lost_after_s` (media time) ends. Time that goes
  backwards (a looping file, a restarted source) ends every track and starts afresh.
- Only confirmed tracks (matched in `min_hits` frames in a row) carry a track_id; the others stay in the row
  without one and count nowhere.
- One object, one box: the detection head scores classes independently, so the parked van is found as a truck and
  often also as a car. Before tracking, boxes of different classes that overlap by `class_nms_iou` are one object
  and the surer box stays; the track's class is then the class with the largest score sum over its boxes, so a
  track never flips class from frame to frame.
- track_ids are unique across daemon restarts (the run id prefix) and across streams (one counter per daemon).
- Re-entry (appearance tracker): a track that ended (left the frame, hidden longer than lost_after_s) and is seen
  again within reid_window_s keeps its track_id; it ended for the rules (its zone presences closed) and starts again,
  and every event of it from then on says `reentered`.
"""

from __future__ import annotations

import itertools
import logging
import warnings
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from vlora_va.analytics.appearance_tracker import AppearanceSettings, AppearanceTracker
from vlora_va.contracts.boxes import greedy_keep, iou_matrix
from vlora_va.contracts.results import Detection, DetectionResult, FrameDetections
from vlora_va.contracts.scene import TrackingConfig

log = logging.getLogger(__name__)

TRACKER_CLASSES = {"bytetrack": "ByteTrackTracker", "sort": "SORTTracker", "ocsort": "OCSORTTracker"}


# The similarity a match needs, per measure: IoU in [0, 1]; GIoU and DIoU in [-1, 1], where below 0 the boxes do
# not overlap and -0.3 still admits a box about its own size away from where the track was predicted.
MIN_MATCH = {"iou": 0.1, "giou": -0.3, "diou": -0.3}
GALLERY_MAX = 256  # ended tracks a stream remembers at most (the appearance tracker's lost gallery is bounded alike)


def make_tracker(cfg: TrackingConfig, fps: float):
    """A fresh tracker of the configured kind. `trackers` counts its lost-track buffer in 30-fps frames; with
    timestamps it ends a track after buffer / 30 seconds, so lost_after_s maps to lost_after_s * 30."""
    import supervision  # noqa: F401 - trackers imports it; imported here so a missing install names itself
    import trackers

    if cfg.tracker == "appearance":
        return AppearanceTracker(AppearanceSettings(
            fps=fps, lost_after_s=cfg.lost_after_s, min_hits=cfg.min_hits, high_score=cfg.activation_score,
            activation_score=cfg.activation_score, match=cfg.match, min_match=MIN_MATCH[cfg.match],
            appearance_weight=cfg.appearance_weight, reid_window_s=cfg.reid_window_s))
    cls = getattr(trackers, TRACKER_CLASSES[cfg.tracker])
    similarity = {"iou": trackers.IoU, "giou": trackers.GIoU, "diou": trackers.DIoU}[cfg.match]()
    kw = dict(lost_track_buffer=max(1, round(cfg.lost_after_s * 30)), frame_rate=fps,
              minimum_consecutive_frames=cfg.min_hits, iou=similarity, minimum_iou_threshold=MIN_MATCH[cfg.match])
    if cfg.tracker in ("bytetrack", "sort"):
        kw["track_activation_threshold"] = cfg.activation_score
    if cfg.tracker in ("bytetrack", "ocsort"):
        kw["high_conf_det_threshold"] = cfg.activation_score
    return cls(**kw)


def one_box_per_object(dets: list[Detection], iou: float) -> list[Detection]:
    """Greedy cross-class NMS: a box overlapping a surer box of another class by `iou` or more is dropped (boxes
    of the same class were already suppressed by the head). Kept boxes stay in their input order."""
    if len(dets) < 2 or len({d.cls for d in dets}) < 2:
        return list(dets)
    order = sorted(range(len(dets)), key=lambda i: -dets[i].score)  # surest first; ties: the earlier one
    boxes = np.array([dets[i].box for i in order], dtype=np.float64)
    cls = np.array([dets[i].cls for i in order])
    # [i, j]: the surer box i, when kept, drops box j of another class that it overlaps by `iou`
    over = np.triu((iou_matrix(boxes, boxes) >= iou) & (cls[:, None] != cls[None, :]), 1)
    keep = np.zeros(len(dets), bool)
    keep[order] = greedy_keep(over)
    return [d for d, k in zip(dets, keep) if k]


class TrackIds:
    """Daemon-wide track ids: "<run id>-<n>", n counting from 1 across all streams."""

    def __init__(self, run_id: str):
        self.run_id = run_id
        self._n = itertools.count(1)

    def next(self) -> str:
        return f"{self.run_id}-{next(self._n)}"


@dataclass
class _Track:
    id: str
    votes: dict[str, float]
    last_ts: float

    @property
    def cls(self) -> str:
        return max(self.votes, key=self.votes.get)


@dataclass(frozen=True)
class TrackedFrame:
    ts: float
    detections: tuple[Detection, ...]  # every box kept; confirmed ones with track_id (and their track's class)
    ended: tuple[tuple[str, str], ...]  # (track_id, class) of the confirmed tracks that ended before this frame


class StreamTracker:
    """The tracker of one stream's tracked task. `track(result)` takes a served row's detections (chunks in order)
    and returns them with track ids; `expire(ts)` says media time passed without frames (a shed chunk)."""

    def __init__(self, cfg: TrackingConfig, fps: float, ids: TrackIds):
        self.cfg, self.fps, self.ids = cfg, fps, ids
        self._tracker = make_tracker(cfg, fps)
        self._tracks: dict[int, _Track] = {}  # the tracker's own id -> ours
        # tracks that ended, by the tracker's id, while the tracker may still bring them back (re-entry, or a track
        # expire() ended that the tracker kept): they come back with their track_id
        self._ended: dict[int, _Track] = {}
        self.reentered: set[str] = set()  # track_ids that ended and came back (their events say so)
        self._last_ts: float | None = None

    @property
    def active(self) -> int:
        return len(self._tracks)

    def track(self, result: DetectionResult) -> tuple[DetectionResult, list[TrackedFrame]]:
        """The result with confirmed boxes carrying track ids, and per frame what the rules need."""
        frames = [self._frame(f) for f in result.frames]
        return DetectionResult(tuple(FrameDetections(f.ts, f.detections) for f in frames)), frames

    def end_all(self) -> list[tuple[str, str]]:
        """End every track and forget them, embeddings included (time went backwards, or the stream restarted)."""
        ended = [(t.id, t.cls) for t in self._tracks.values()]
        self._tracks.clear()
        self._ended.clear()
        self.reentered.clear()
        self._tracker = make_tracker(self.cfg, self.fps)
        self._last_ts = None
        return ended

    def expire(self, ts: float) -> list[tuple[str, str]]:
        """End the tracks not seen for lost_after_s by media time ts (no frame arrived: shed chunks, an outage)."""
        return self._pop([k for k, t in self._tracks.items() if ts - t.last_ts > self.cfg.lost_after_s])

    def _pop(self, keys) -> list[tuple[str, str]]:
        out = []
        for k in keys:
            t = self._ended[k] = self._tracks.pop(k)
            out.append((t.id, t.cls))
        return out

    def _frame(self, frame: FrameDetections) -> TrackedFrame:
        ended: list[tuple[str, str]] = []
        if self._last_ts is not None and frame.ts <= self._last_ts:
            ended += self.end_all()  # a looping file or a restarted source: its media time starts again
        self._last_ts = frame.ts
        # tracks unseen for lost_after_s end before this frame is matched, whether or not frames came in between: a
        # track the appearance tracker revives on it has ended for the rules and comes back (reentered)
        ended += self.expire(frame.ts)
        dets = [d for d in frame.detections if d.score >= self.cfg.min_score]
        dets = one_box_per_object(dets, self.cfg.class_nms_iou)
        tracked_ids = self._update(dets, frame.ts)
        keep = self.cfg.embeddings_in_rows
        out = []
        for d, tid in zip(dets, tracked_ids):
            if tid < 0:
                out.append(Detection(d.box, d.cls, d.score, None, d.embedding if keep else None))
                continue
            t = self._tracks.get(tid)
            if t is None and tid in self._ended:  # it ended and is back: same track_id
                t = self._tracks[tid] = self._ended.pop(tid)
                self.reentered.add(t.id)
            if t is None:
                t = self._tracks[tid] = _Track(self.ids.next(), defaultdict(float), frame.ts)
            t.votes[d.cls] += d.score
            t.last_ts = frame.ts
            out.append(Detection(d.box, t.cls, d.score, t.id, d.embedding if keep else None))
        # tracks the tracker let go of (lost longer than lost_after_s) end now
        alive = self._alive()
        ended += self._pop([k for k in self._tracks if k not in alive])
        self._forget(frame.ts)
        untracked = [Detection(d.box, d.cls, d.score, None, d.embedding if keep else None)
                     for d in frame.detections if d.score < self.cfg.min_score]
        return TrackedFrame(frame.ts, tuple(out) + tuple(untracked), tuple(ended))

    def _alive(self) -> set[int]:
        if isinstance(self._tracker, AppearanceTracker):
            return self._tracker.alive_ids
        return {int(t.tracker_id) for t in self._tracker.tracks if t.tracker_id >= 0}

    def _forget(self, ts: float) -> None:
        """Drop ended tracks past any return: unseen longer than reid_window_s (and lost_after_s), and the oldest
        past GALLERY_MAX."""
        horizon = max(self.cfg.reid_window_s, self.cfg.lost_after_s)
        stale = [k for k, t in self._ended.items() if ts - t.last_ts > horizon]
        stale += [k for k in self._ended if k not in stale][:max(0, len(self._ended) - len(stale) - GALLERY_MAX)]
        for k in stale:
            self.reentered.discard(self._ended.pop(k).id)

    def _update(self, dets: list[Detection], ts: float) -> list[int]:
        """The tracker's id for each detection (-1: not a confirmed track), in the order of dets."""
        n = len(dets)
        boxes = np.array([d.box for d in dets], dtype=np.float32).reshape(n, 4)
        scores = np.array([d.score for d in dets], dtype=np.float32)
        if isinstance(self._tracker, AppearanceTracker):
            # appearance only when every box has an embedding (an engine that made none: geometry alone)
            emb = np.stack([d.embedding for d in dets]) if n and all(d.embedding is not None for d in dets) else None
            return self._tracker.update(boxes, scores, emb, ts).ids
        import supervision as sv

        sd = sv.Detections(xyxy=boxes, confidence=scores, data={"index": np.arange(n)})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # duplicate-timestamp notices: handled above
            res = self._tracker.update(sd, timestamp=ts)
        ids = [-1] * n
        if len(res):
            for i, tid in zip(res.data["index"], res.tracker_id):
                ids[int(i)] = int(tid)
        return ids
