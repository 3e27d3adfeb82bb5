"""The `appearance` tracker: boxes matched to tracks on motion and each box's appearance, and re-entry by appearance.

Why our own association step: Roboflow `trackers` (2.6) matches on box geometry only; none of its trackers takes
an appearance input, and its BoT-SORT is the IoU part of BoT-SORT. Its motion model is kept: ByteTrack's Kalman
filter and noise tuning, predicted across the media time between frames, run for every track at once (box_kalman.py,
tested against `trackers`' own tracklet; one filter object per track was half of the tracker's time at 50 people).

Per frame (media time ts):

    predict every live track to ts (Kalman)
    1. every box x live tracks, in one Hungarian assignment:
         similarity = DIoU(predicted box, box) + appearance_weight * (cosine(track embedding, box embedding) - 0.5)
         a pair is allowed only when DIoU >= min_match (near enough) and, with both embeddings, cosine >= min_cosine
         (not plainly someone else). Sure boxes (score >= high_score) and weaker ones compete together: ByteTrack
         matches the sure boxes first, and a sure box then takes the track whose own weaker box lies right under it
         (two people crossing: the one behind scores low), leaving that box nobody
    2. a matched box that a second track could as well be (that track unmatched, seen within AMBIGUOUS_SEEN_S, its
         similarity to the box within AMBIGUOUS_MARGIN of the winner's, the two tracks' predicted boxes overlapping
         by AMBIGUOUS_OVERLAP) is given to neither and starts nothing: when one box is left of a crossing pair, the
         visible one is as likely to be either, and a guessed identity is an ID switch
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

from vlora_va.analytics.box_kalman import BoxKalman

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
# Step 2, an ambiguous box. Chosen on the identity ground truth and its three views (bench/tracking.py): from margin
# 0.4 to 0.6, overlap 0 to 0.3 and 0.5 to 1 s, ID switches at 10 fps stay 1 to 5 on each (7 to 10 without the step)
AMBIGUOUS_MARGIN = 0.5  # the runner-up's similarity at most this far below the winner's
AMBIGUOUS_OVERLAP = 0.2  # IoU of the two tracks' predicted boxes: they are where one box can hold both
AMBIGUOUS_SEEN_S = 1.0  # the runner-up was seen this recently: a track long unseen is not competing for the box


@dataclass
class AppearanceSettings:
    fps: float  # the tracked frames' nominal rate (the Kalman filter's step unit)
    lost_after_s: float = 2.0
    min_hits: int = 2
    high_score: float = 0.5  # boxes at least this sure update embeddings, revive and may start tracks
    activation_score: float = 0.5
    match: str = "diou"  # the box similarity: iou | giou | diou (`trackers`' own)
    min_match: float = -0.3  # the similarity a match needs (tracking.MIN_MATCH)
    appearance_weight: float = 4.0  # how much a cosine counts against DIoU (0: motion only)
    min_cosine: float = 0.3  # below it two boxes are different objects, however near
    reid_window_s: float = 30.0  # a lost track can be revived by appearance this long (0: never)
    reid_cosine: float = 0.75  # the cosine a revival needs
    gallery_max: int = 256  # lost tracks kept per stream at most


@dataclass(eq=False)  # a track is itself: two tracks with equal fields are still two (lost.remove)
class _Track:
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
        import trackers  # the box similarities come from it

        self.s = settings
        self._motion = {"iou": trackers.IoU, "giou": trackers.GIoU, "diou": trackers.DIoU}[settings.match]()
        self._iou = trackers.IoU()
        self.live: list[_Track] = []
        self.kalman = BoxKalman(settings.fps)  # row i is live[i]'s motion
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
        boxes = np.asarray(boxes, dtype=np.float64)
        n = len(boxes)
        emb = None if embeddings is None else np.asarray(embeddings, dtype=np.float32)
        ids = [-1] * n
        sure = np.asarray(scores) >= self.s.high_score
        high, low = np.flatnonzero(sure).tolist(), np.flatnonzero(~sure).tolist()
        clean = self._clean(boxes)
        if emb is not None:
            self._measure_baseline(emb[high])
        # 1. every box x live tracks, motion and appearance; 2. a box either of two tracks could be goes to neither
        pairs, withheld = self._associate(high + low, boxes, emb, ts)
        used = withheld | {i for _, i in pairs}
        free_high = [i for i in high if i not in used]
        self._take(pairs, boxes, emb, sure, clean, ts, ids)
        matched = {r for r, _ in pairs}
        # 3. sure boxes left x lost tracks, appearance only: re-entry; the revived track's motion starts afresh
        if emb is not None and self.lost and free_high:
            revived = []
            for t, i in self._revive(free_high, emb):
                self.lost.remove(t)
                revived.append((len(self.live), i))
                self._add(t, boxes[i])  # a fresh filter at the box, then updated by it (as a new `trackers` tracklet)
            self._take(revived, boxes, emb, sure, clean, ts, ids)
            matched |= {r for r, _ in revived}
            free_high = [i for i in free_high if i not in {j for _, j in revived}]
        # tentative tracks that missed this frame die; confirmed ones wait lost_after_s
        self._keep(np.array([r in matched or t.id >= 0 for r, t in enumerate(self.live)], dtype=bool))
        # 4. new tentative tracks
        for i in free_high:
            if scores[i] >= self.s.activation_score:
                self._add(_Track(ts, emb[i].copy() if emb is not None else None,
                                 id=self._confirm_id() if self.s.min_hits <= 1 else -1, embedding_ts=ts), boxes[i])
                ids[i] = self.live[-1].id
        return Matches(ids)

    def reset(self) -> None:
        """Forget every track and embedding (time went backwards, the stream restarted)."""
        self.live, self.lost, self._last_ts = [], [], None
        self.kalman = BoxKalman(self.s.fps)

    # ------------------------------------------------------------------ steps
    def _predict(self, ts: float) -> None:
        """Every live track predicted to ts; tracks unseen too long move to the gallery, which forgets the old."""
        dt = 0.0 if self._last_ts is None else ts - self._last_ts
        self._last_ts = ts
        if dt > 0:
            self.kalman.predict(dt)
        stay = np.array([ts - t.last_ts <= self.s.lost_after_s for t in self.live], dtype=bool)
        if not stay.all():
            gone = [t for t, s in zip(self.live, stay) if not s]
            self._keep(stay)
            self.lost += [t for t in gone if t.id >= 0 and t.embedding is not None and self.s.reid_window_s > 0]
        self.lost = [t for t in self.lost if ts - t.last_ts <= self.s.reid_window_s][-self.s.gallery_max:]

    def _add(self, track: _Track, box: np.ndarray) -> None:
        self.live.append(track)
        self.kalman.add(box)

    def _keep(self, mask: np.ndarray) -> None:
        """Only the live tracks where mask is true, with their motion rows."""
        self.live = [t for t, k in zip(self.live, mask) if k]
        self.kalman.keep(mask)

    def _take(self, pairs: list[tuple[int, int]], boxes: np.ndarray, emb: np.ndarray | None, sure: np.ndarray,
              clean: np.ndarray, ts: float, ids: list[int]) -> None:
        """Live rows matched to boxes at ts: their filters corrected, their hits counted (a tentative one may get its
        id), their embeddings moved by sure boxes only (a weak box's embedding is often an occlusion's), and each box
        given its track's id."""
        self.kalman.update(np.array([r for r, _ in pairs], dtype=np.int64), boxes[[i for _, i in pairs]])
        self._matched([self.live[r] for r, _ in pairs], ts)
        self._absorb([(self.live[r], i) for r, i in pairs if sure[i]], emb, clean, ts)
        for r, i in pairs:
            ids[i] = self.live[r].id

    def _associate(self, dets: list[int], boxes: np.ndarray, emb: np.ndarray | None,
                   ts: float) -> tuple[list[tuple[int, int]], set[int]]:
        """Steps 1 and 2: (pairs (live row, det), the dets withheld as ambiguous)."""
        rows = list(range(len(self.live)))
        if not rows or not dets:
            return [], set()
        sim = self._similarity(rows, dets, boxes, emb)
        picked, cols = linear_sum_assignment(np.where(np.isfinite(sim), sim, -1e6), maximize=True)
        won = [(r, c) for r, c in zip(picked, cols) if np.isfinite(sim[r, c])]
        # runners-up: confirmed, unmatched now, seen within AMBIGUOUS_SEEN_S
        taken = {r for r, _ in won}
        rivals = np.array([r for r in rows if r not in taken and self.live[r].id >= 0
                           and ts - self.live[r].last_ts <= AMBIGUOUS_SEEN_S], dtype=np.int64)
        ambiguous = set()
        if len(rivals) and won:
            winners = np.array([r for r, _ in won])
            pred = self.kalman.boxes()
            near = self._iou.compute(pred[winners], pred[rivals]) >= AMBIGUOUS_OVERLAP  # [won, rivals]
            for k, (r, c) in enumerate(won):
                close = sim[rivals, c] >= sim[r, c] - AMBIGUOUS_MARGIN  # -inf (not allowed) is never close
                if (close & near[k]).any():
                    ambiguous.add(c)
        return [(rows[r], dets[c]) for r, c in won if c not in ambiguous], {dets[c] for c in ambiguous}

    def _similarity(self, rows: list[int], dets: list[int], boxes: np.ndarray, emb: np.ndarray | None) -> np.ndarray:
        """[rows, dets]: DIoU + the appearance term, -inf where a pair is not allowed."""
        sim = self._motion.compute(self.kalman.boxes()[rows], boxes[dets])
        sim[sim < self.s.min_match] = -np.inf
        if emb is not None and self.s.appearance_weight > 0:
            tracks = [self.live[r] for r in rows]
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

    def _matched(self, tracks: list[_Track], ts: float) -> None:
        """Tracks seen at ts (their motion rows already updated): a tentative one gets its id after min_hits."""
        for t in tracks:
            t.hits += 1
            t.last_ts = ts
            if t.id < 0 and t.hits >= self.s.min_hits:
                t.id = self._confirm_id()

    @staticmethod
    def _absorb(pairs: list[tuple[_Track, int]], emb: np.ndarray | None, clean: np.ndarray, ts: float) -> None:
        """Each track's embedding moved towards its box's, all at once: the moving average, renormalised. Only boxes
        no other box overlaps (clean) count; a track without an embedding (or one of another width) takes the box's."""
        if emb is None:
            return
        blend = []
        for t, i in pairs:
            if not clean[i]:
                continue
            if t.embedding is None or t.embedding.shape[0] != emb.shape[1]:
                t.embedding, t.embedding_ts = emb[i].copy(), ts
            else:
                blend.append((t, i))
        if not blend:
            return
        keep = (EMA ** ((ts - np.array([t.embedding_ts for t, _ in blend])) / EMA_STEP_S)).astype(np.float32)[:, None]
        e = keep * np.stack([t.embedding for t, _ in blend]) + (1 - keep) * emb[[i for _, i in blend]]
        e /= np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-6)
        for (t, _), row in zip(blend, e):
            t.embedding, t.embedding_ts = row, ts

    def _confirm_id(self) -> int:
        return next(self._ids)

    def _clean(self, boxes: np.ndarray) -> np.ndarray:
        """Per box: no other box overlaps it by more than CLEAN_IOU (its tokens are its own object's)."""
        if len(boxes) < 2:
            return np.ones(len(boxes), bool)
        m = self._iou.compute(boxes.astype(np.float64), boxes.astype(np.float64))
        np.fill_diagonal(m, 0.0)
        return m.max(1) <= CLEAN_IOU

