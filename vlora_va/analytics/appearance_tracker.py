"""The `appearance` tracker: ByteTrack's association with each box's appearance added, and re-entry by appearance.

Why our own association step: Roboflow `trackers` (2.6) matches on box geometry only; none of its trackers takes
an appearance input, and its BoT-SORT is the IoU part of BoT-SORT. Its motion model is kept: every track is a
`trackers` ByteTrack tracklet (its Kalman filter and noise tuning), predicted across the media time between frames.

Per frame (media time ts), as StrongSORT and BoT-SORT do on top of ByteTrack:

    predict every live track to ts (Kalman)
    1. sure boxes (score >= high_score) x live tracks:
         similarity = DIoU(predicted box, box) + appearance_weight * (cosine(track embedding, box embedding) - 0.5)
         a pair is allowed only when DIoU >= min_match (near enough) and, with both embeddings, cosine >= min_cosine
         (not plainly someone else); Hungarian assignment on the similarity
    2. weaker boxes x the live tracks still unmatched: DIoU alone (a weak box's embedding is often an occlusion's)
    3. sure boxes still unmatched x lost tracks (confirmed, unseen for more than lost_after_s but at most
         reid_window_s): cosine alone >= reid_cosine and >= the baseline + 0.1, Hungarian; a match revives the
         track with its old id. The baseline is the mean cosine between the different sure boxes of a frame, a
         moving average over frames: how alike everyone looks here (more in the dark)
    4. sure boxes still unmatched and >= activation_score start tentative tracks
    a tentative track gets its id after min_hits frames in a row and dies when it misses one; a confirmed track
    unseen for more than lost_after_s moves to the lost gallery; the gallery forgets tracks after reid_window_s and
    keeps at most gallery_max (the oldest go first)

A track's embedding is a moving average (0.9 old per 0.5 s of media time, renormalised), updated only from sure
boxes that no other box overlaps by more than 0.3 IoU: a crossing pair's boxes mix both people's pixels.

Privacy: embeddings live only here, in memory: one per live or lost track, the lost ones dropped after
reid_window_s. Nothing is written anywhere.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

# A track embedding's moving average keeps EMA of the old one per EMA_STEP_S of media time since its last update, so
# it forgets at the same speed per second at 2 fps as at 10 (0.9 per update at 2 fps, 0.979 at 10)
EMA, EMA_STEP_S = 0.9, 0.5
CLEAN_IOU = 0.3  # a box overlapping another box this much does not update its track's embedding
NEUTRAL_COSINE = 0.5  # cosines above it add to a pair's similarity, below it subtract
# A revival's cosine must also beat the scene's baseline, the mean cosine between two different people seen together,
# by this much: in the dark everyone looks more alike (0.77 against 0.66 on the held-out low-light view), and a fixed
# threshold there revives the wrong people
REID_ABOVE_BASELINE = 0.1
BASELINE_KEEP = 0.95  # the baseline's moving average: this much of the old one per frame that measures it


@dataclass
class AppearanceSettings:
    fps: float  # the tracked frames' nominal rate (the Kalman filter's step unit)
    lost_after_s: float = 2.0
    min_hits: int = 2
    high_score: float = 0.5  # boxes at least this sure take part in stage 1 and may start tracks
    activation_score: float = 0.5
    match: str = "diou"  # the box similarity: iou | giou | diou (`trackers`' own)
    min_match: float = -0.3  # the similarity a match needs (tracking.MIN_MATCH)
    appearance_weight: float = 4.0  # how much a cosine counts against DIoU (0: motion only)
    min_cosine: float = 0.3  # below it two boxes are different objects, however near
    reid_window_s: float = 30.0  # a lost track can be revived by appearance this long (0: never)
    reid_cosine: float = 0.75  # the cosine a revival needs
    gallery_max: int = 256  # lost tracks kept per stream at most


@dataclass
class _Track:
    tracklet: object  # trackers' ByteTrackTracklet: the Kalman state
    last_ts: float
    embedding: np.ndarray | None
    id: int = -1  # -1: tentative
    hits: int = 1  # frames matched in a row (tentative tracks)
    embedding_ts: float = 0.0  # media time of its embedding's last update


@dataclass
class Matches:
    """One frame's outcome: per input box its track id (-1: none, or tentative)."""

    ids: list[int]


class AppearanceTracker:
    def __init__(self, settings: AppearanceSettings):
        import trackers  # the motion model and box similarities come from it

        self.s = settings
        self._motion = {"iou": trackers.IoU, "giou": trackers.GIoU, "diou": trackers.DIoU}[settings.match]()
        self._iou = trackers.IoU()
        self.live: list[_Track] = []
        self.lost: list[_Track] = []  # confirmed tracks unseen for more than lost_after_s, oldest first
        self._ids = itertools.count(1)
        self._last_ts: float | None = None
        self.baseline: float | None = None  # mean cosine between different sure boxes of one frame (moving average)

    @property
    def alive_ids(self) -> set[int]:
        """Ids of the confirmed live tracks (a lost one is no longer alive, even if it may be revived)."""
        return {t.id for t in self.live if t.id >= 0}

    def update(self, boxes: np.ndarray, scores: np.ndarray, embeddings: np.ndarray | None, ts: float) -> Matches:
        """boxes [N, 4] xyxy, scores [N], embeddings [N, E] unit rows (None: none for this frame) at media time ts
        (increasing; the caller resets the tracker when it goes back)."""
        self._predict(ts)
        n = len(boxes)
        emb = None if embeddings is None else np.asarray(embeddings, dtype=np.float32)
        ids = [-1] * n
        high = [i for i in range(n) if scores[i] >= self.s.high_score]
        low = [i for i in range(n) if scores[i] < self.s.high_score]
        clean = self._clean(boxes)
        if emb is not None:
            self._measure_baseline(emb[high])
        # 1. sure boxes x live tracks, motion and appearance
        pairs, free_tracks, free_high = self._assign(self.live, high, boxes, emb, appearance=True)
        for t, i in pairs:
            self._matched(t, boxes[i], ts, emb[i] if emb is not None and clean[i] else None)
            ids[i] = t.id
        # 2. weaker boxes x the tracks left, motion only
        pairs, _, _ = self._assign(free_tracks, low, boxes, emb, appearance=False)
        for t, i in pairs:
            self._matched(t, boxes[i], ts, None)
            ids[i] = t.id
        matched = {id(t) for t in self.live if t.last_ts == ts}
        # 3. sure boxes left x lost tracks, appearance only: re-entry
        if emb is not None and self.lost and free_high:
            for t, i in self._revive(free_high, emb):
                t.tracklet = self._tracklet(boxes[i])
                self._matched(t, boxes[i], ts, emb[i] if clean[i] else None)
                self.lost.remove(t)
                self.live.append(t)
                matched.add(id(t))
                ids[i] = t.id
                free_high.remove(i)
        # tentative tracks that missed this frame die; confirmed ones wait lost_after_s
        self.live = [t for t in self.live if id(t) in matched or t.id >= 0]
        # 4. new tentative tracks
        for i in free_high:
            if scores[i] >= self.s.activation_score:
                self.live.append(_Track(self._tracklet(boxes[i]), ts, emb[i].copy() if emb is not None else None,
                                        id=self._confirm_id() if self.s.min_hits <= 1 else -1, embedding_ts=ts))
                ids[i] = self.live[-1].id
        return Matches(ids)

    def reset(self) -> None:
        """Forget every track and embedding (time went backwards, the stream restarted)."""
        self.live, self.lost, self._last_ts = [], [], None

    # ------------------------------------------------------------------ steps
    def _predict(self, ts: float) -> None:
        """Every live track predicted to ts; tracks unseen too long move to the gallery, which forgets the old."""
        from trackers.utils.predict_timing import PredictTiming

        dt = 0.0 if self._last_ts is None else ts - self._last_ts
        self._last_ts = ts
        if dt > 0:
            timing = PredictTiming(frame_step=dt * self.s.fps, elapsed_seconds=dt, frame_rate=self.s.fps)
            for t in self.live:
                t.tracklet.predict(timing)
        gone = [t for t in self.live if ts - t.last_ts > self.s.lost_after_s]
        if gone:
            self.live = [t for t in self.live if ts - t.last_ts <= self.s.lost_after_s]
            self.lost += [t for t in gone if t.id >= 0 and t.embedding is not None and self.s.reid_window_s > 0]
        self.lost = [t for t in self.lost if ts - t.last_ts <= self.s.reid_window_s][-self.s.gallery_max:]

    def _assign(self, tracks: list[_Track], dets: list[int], boxes: np.ndarray, emb: np.ndarray | None,
                appearance: bool) -> tuple[list[tuple[_Track, int]], list[_Track], list[int]]:
        """Hungarian assignment of dets to tracks: (pairs, tracks left, dets left)."""
        if not tracks or not dets:
            return [], list(tracks), list(dets)
        sim = self._similarity(tracks, dets, boxes, emb, appearance)
        rows, cols = linear_sum_assignment(np.where(np.isfinite(sim), sim, -1e6), maximize=True)
        pairs = [(tracks[r], dets[c]) for r, c in zip(rows, cols) if np.isfinite(sim[r, c])]
        used_t, used_d = {id(t) for t, _ in pairs}, {i for _, i in pairs}
        return pairs, [t for t in tracks if id(t) not in used_t], [i for i in dets if i not in used_d]

    def _similarity(self, tracks: list[_Track], dets: list[int], boxes: np.ndarray, emb: np.ndarray | None,
                    appearance: bool) -> np.ndarray:
        """[tracks, dets]: DIoU (+ the appearance term), -inf where a pair is not allowed."""
        predicted = np.array([t.tracklet.get_state_bbox() for t in tracks], dtype=np.float64)
        sim = self._motion.compute(predicted, boxes[dets].astype(np.float64))
        sim[sim < self.s.min_match] = -np.inf
        if appearance and emb is not None and self.s.appearance_weight > 0:
            have = np.array([t.embedding is not None and t.embedding.shape[0] == emb.shape[1] for t in tracks])
            if have.any():
                te = np.stack([t.embedding if h else np.zeros(emb.shape[1], np.float32) for t, h in zip(tracks, have)])
                cos = te @ emb[dets].T
                sim = np.where(have[:, None], sim + self.s.appearance_weight * (cos - NEUTRAL_COSINE), sim)
                sim[have[:, None] & (cos < self.s.min_cosine)] = -np.inf
        return sim

    def _revive(self, dets: list[int], emb: np.ndarray) -> list[tuple[_Track, int]]:
        """Lost tracks matched to boxes by appearance alone: cosine >= reid_cosine and >= the baseline +
        REID_ABOVE_BASELINE, Hungarian."""
        lost = [t for t in self.lost if t.embedding.shape[0] == emb.shape[1]]
        if not lost:
            return []
        cos = np.stack([t.embedding for t in lost]) @ emb[dets].T  # [lost, dets]
        need = max(self.s.reid_cosine, (self.baseline or 0.0) + REID_ABOVE_BASELINE)
        rows, cols = linear_sum_assignment(cos, maximize=True)
        return [(lost[r], dets[c]) for r, c in zip(rows, cols) if cos[r, c] >= need]

    def _measure_baseline(self, emb: np.ndarray) -> None:
        """Fold this frame's mean cosine between its different sure boxes into the baseline."""
        if len(emb) < 2:
            return
        sim = emb @ emb.T
        mean = float((sim.sum() - np.trace(sim)) / (len(emb) * (len(emb) - 1)))
        self.baseline = mean if self.baseline is None else BASELINE_KEEP * self.baseline + (1 - BASELINE_KEEP) * mean

    def _matched(self, t: _Track, box: np.ndarray, ts: float, embedding: np.ndarray | None) -> None:
        if t.last_ts != ts:
            t.tracklet.update(np.asarray(box, dtype=np.float64))
        t.hits += 1
        t.last_ts = ts
        if t.id < 0 and t.hits >= self.s.min_hits:
            t.id = self._confirm_id()
        if embedding is not None:
            if t.embedding is None or t.embedding.shape != embedding.shape:
                e = embedding.astype(np.float32)
            else:
                keep = EMA ** ((ts - t.embedding_ts) / EMA_STEP_S)
                e = keep * t.embedding + (1 - keep) * embedding
            t.embedding, t.embedding_ts = e / max(float(np.linalg.norm(e)), 1e-6), ts

    def _confirm_id(self) -> int:
        return next(self._ids)

    @staticmethod
    def _tracklet(box: np.ndarray):
        from trackers.core.bytetrack.tracklet import ByteTrackTracklet

        return ByteTrackTracklet(np.asarray(box, dtype=np.float64))

    def _clean(self, boxes: np.ndarray) -> np.ndarray:
        """Per box: no other box overlaps it by more than CLEAN_IOU (its tokens are its own object's)."""
        if len(boxes) < 2:
            return np.ones(len(boxes), bool)
        m = self._iou.compute(boxes.astype(np.float64), boxes.astype(np.float64))
        np.fill_diagonal(m, 0.0)
        return m.max(1) <= CLEAN_IOU

