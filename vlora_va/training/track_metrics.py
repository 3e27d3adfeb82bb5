"""Tracking metrics against identity ground truth: CLEAR-MOT (MOTA, ID switches, FP, FN, MOTP) and IDF1.

Our own implementation (motmetrics 1.4 breaks on numpy 2) of the definitions as TrackEval computes them, so the
figures are comparable with published ones; tests/training/test_track_metrics.py checks it against worked
examples and against TrackEval 1.3.0's numbers.

Input: ground truth {time: [(gt_id, box)]} and predictions {time: [(track_id, box)]}, boxes [x1, y1, x2, y2] in
the same pixels. The scored frames are the ground truth's times (keys are compared to the millisecond); predictions
at other times are not scored, and a scored frame without predictions misses all its boxes.

- CLEAR-MOT (Bernardin & Stiefelhagen 2008). Per frame, ground truth and predictions are matched one-to-one with
  IoU >= 0.5 by the Hungarian algorithm; a pair matched in the previous frame that is still IoU-valid is kept
  (TrackEval: a bonus of 1000 on those pairs, then the highest total IoU). A matched ground-truth identity whose
  track differs from the last track it was matched to, however long ago, is an ID switch.
  MOTA = 1 - (FN + FP + IDSW) / ground-truth boxes; MOTP = mean IoU of the matches.
- IDF1 (Ristani et al. 2016). Ground-truth and predicted identities are matched one-to-one for the whole sequence,
  maximising IDTP = the number of frames in which a matched pair overlaps with IoU >= 0.5; every other box is an
  IDFN (ground truth) or IDFP (prediction). IDF1 = IDTP / (IDTP + (IDFP + IDFN) / 2).
- Ignore regions ({time: [box]}, e.g. a person mostly hidden): before scoring, a prediction that the Hungarian
  match with IoU >= 0.5 gives to an ignore region rather than to a ground-truth box, or that lies mostly (>= 50% of
  its area) inside an ignore region without matching a ground-truth box, is removed: it is neither a false
  positive nor a match (TrackEval's MOTChallenge preprocessing does the first for its distractor boxes).

`identity_truth()` reads the frozen identity ground truth of pedestrians.mp4 (adapters/eval/human-v1-tracks.json)
into this input format, with its ignore regions and declared lines.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import linear_sum_assignment

from vlora_va.contracts.boxes import intersection, iou_matrix

ROOT = Path(__file__).resolve().parents[2]
HUMAN_TRACKS = ROOT / "adapters" / "eval" / "human-v1-tracks.json"
HUMAN_TRACKS_SHA256 = "96c57b364bf990500d6c3e1e6a34edab6e573e3676cb50219ba9ab08de9cd7f1"  # frozen 2026-11-26

IOU_THRESHOLD = 0.5
IGNORE_INSIDE = 0.5  # a prediction at least this much inside an ignore region is on it
CONTINUE_BONUS = 1000.0  # TrackEval's weight for keeping last frame's pairs: beats any sum of IoUs <= 1 per pair
EPS = np.finfo(float).eps

Box = Sequence[float]
Frames = Mapping[float, Sequence[tuple[Hashable, Box]]]


@dataclass(frozen=True)
class TrackScores:
    """CLEAR-MOT and identity figures for one sequence (counts are boxes unless named ids)."""

    frames: int
    gt_boxes: int
    pred_boxes: int  # scored predictions, after removing those on ignore regions
    ignored: int  # predictions removed on ignore regions
    gt_ids: int
    pred_ids: int
    matches: int
    fp: int
    fn: int
    id_switches: int
    iou_sum: float
    idtp: int
    idfp: int
    idfn: int

    @property
    def mota(self) -> float:
        return (self.matches - self.fp - self.id_switches) / max(1, self.gt_boxes)

    @property
    def motp(self) -> float:
        return self.iou_sum / max(1, self.matches)

    @property
    def idf1(self) -> float:
        return self.idtp / max(1.0, self.idtp + 0.5 * self.idfp + 0.5 * self.idfn)

    @property
    def idp(self) -> float:
        return self.idtp / max(1, self.idtp + self.idfp)

    @property
    def idr(self) -> float:
        return self.idtp / max(1, self.idtp + self.idfn)

    def to_dict(self) -> dict:
        out = asdict(self)
        del out["iou_sum"]
        out.update(mota=self.mota, motp=self.motp, idf1=self.idf1, idp=self.idp, idr=self.idr)
        return out


def _time_key(t: float) -> int:
    """Times compared to the millisecond: a tracker's 55.000000001 is the ground truth's 55.0."""
    return round(float(t) * 1000)


def _frame(entries: Sequence[tuple[Hashable, Box]], what: str, t: float) -> tuple[list[Hashable], np.ndarray]:
    """Ids and an [N, 4] box array, or a ValueError naming the side, the time and the problem."""
    ids, boxes = [], []
    for entry in entries:
        try:
            ident, box = entry
            box = [float(v) for v in box]
        except (TypeError, ValueError) as e:
            raise ValueError(f"{what} at t={t}: expected (id, [x1, y1, x2, y2]), got {entry!r}") from e
        if len(box) != 4 or not all(math.isfinite(v) for v in box) or box[2] <= box[0] or box[3] <= box[1]:
            raise ValueError(f"{what} at t={t}: box {box} of id {ident!r} is not [x1, y1, x2, y2] with x2 > x1, y2 > y1")
        if ident in ids:
            raise ValueError(f"{what} at t={t}: id {ident!r} appears twice in one frame")
        ids.append(ident)
        boxes.append(box)
    return ids, np.asarray(boxes, float).reshape(-1, 4)


def _ignore_boxes(boxes: Sequence[Box], t: float) -> np.ndarray:
    return _frame([(i, b) for i, b in enumerate(boxes)], "ignore regions", t)[1]


def keep_off_ignore(gt: np.ndarray, pred: np.ndarray, ignore: np.ndarray,
                    threshold: float = IOU_THRESHOLD, inside: float = IGNORE_INSIDE) -> np.ndarray:
    """Mask of the predictions to score: False for those matched to, or mostly inside, an ignore region."""
    if not len(ignore) or not len(pred):
        return np.ones(len(pred), bool)
    targets = np.concatenate([gt, ignore])
    iou = iou_matrix(pred, targets)
    rows, cols = linear_sum_assignment(-np.where(iou >= threshold - EPS, iou, 0.0))
    matched = np.zeros(len(pred), bool)
    on_gt = np.zeros(len(pred), bool)
    for r, c in zip(rows, cols):
        if iou[r, c] >= threshold - EPS:
            matched[r], on_gt[r] = True, c < len(gt)
    area = (pred[:, 2] - pred[:, 0]) * (pred[:, 3] - pred[:, 1])
    mostly_inside = (intersection(pred, ignore) / area[:, None]).max(axis=1) >= inside
    # Matched to a ground-truth box: scored; matched to a region: dropped; matched to nothing: dropped if inside one.
    return on_gt | (~matched & ~mostly_inside)


def score_tracks(gt: Frames, pred: Frames, ignore: Mapping[float, Sequence[Box]] | None = None,
                 threshold: float = IOU_THRESHOLD, ignore_inside: float = IGNORE_INSIDE) -> TrackScores:
    """CLEAR-MOT and IDF1 of `pred` against `gt` over the ground truth's frames (see the module docstring).

    ignore_inside: the share of a prediction's area inside an ignore region that puts it on the region; above 1
    turns that rule off (only predictions matched to a region are removed, as in TrackEval's MOTChallenge)."""
    preds_at = {_time_key(t): (t, v) for t, v in pred.items()}
    ignore_at = {_time_key(t): v for t, v in (ignore or {}).items()}
    gt_index: dict[Hashable, int] = {}
    pred_index: dict[Hashable, int] = {}
    frames = []  # per frame: gt id indices, pred id indices, IoU matrix
    ignored = 0
    for t in sorted(gt):
        gt_ids, gt_boxes = _frame(gt[t], "ground truth", t)
        pred_ids, pred_boxes = _frame(preds_at.get(_time_key(t), (t, []))[1], "predictions", t)
        regions = _ignore_boxes(ignore_at.get(_time_key(t), []), t)
        keep = keep_off_ignore(gt_boxes, pred_boxes, regions, threshold, ignore_inside)
        ignored += int((~keep).sum())
        pred_ids = [p for p, k in zip(pred_ids, keep) if k]
        pred_boxes = pred_boxes[keep]
        g = np.array([gt_index.setdefault(i, len(gt_index)) for i in gt_ids], int)
        p = np.array([pred_index.setdefault(i, len(pred_index)) for i in pred_ids], int)
        frames.append((g, p, iou_matrix(gt_boxes, pred_boxes)))
    clear = _clear(frames, len(gt_index), threshold)
    idtp = _idtp(frames, len(gt_index), len(pred_index), threshold)
    n_gt = sum(len(g) for g, _, _ in frames)
    n_pred = sum(len(p) for _, p, _ in frames)
    return TrackScores(frames=len(frames), gt_boxes=n_gt, pred_boxes=n_pred, ignored=ignored,
                       gt_ids=len(gt_index), pred_ids=len(pred_index), **clear,
                       idtp=idtp, idfp=n_pred - idtp, idfn=n_gt - idtp)


def _clear(frames: list[tuple[np.ndarray, np.ndarray, np.ndarray]], n_gt_ids: int, threshold: float) -> dict:
    """CLEAR-MOT counts, step for step as TrackEval's CLEAR.eval_sequence."""
    last_track = np.full(n_gt_ids, np.nan)  # the last track each gt id was matched to: for ID switches
    prev_frame_track = np.full(n_gt_ids, np.nan)  # its track in the previous frame: for keeping matches
    out = {"matches": 0, "fp": 0, "fn": 0, "id_switches": 0, "iou_sum": 0.0}
    for g, p, iou in frames:
        if not len(g) or not len(p):
            # As TrackEval: a frame without ground truth or without predictions leaves last frame's pairs as
            # they were (so a frame with no output does not break the preference for continuing a track).
            out["fp"] += len(p)
            out["fn"] += len(g)
            continue
        score = CONTINUE_BONUS * (p[None, :] == prev_frame_track[g][:, None]) + iou
        score[iou < threshold - EPS] = 0
        rows, cols = linear_sum_assignment(-score)
        valid = score[rows, cols] > EPS
        rows, cols = rows[valid], cols[valid]
        matched_gt, matched_track = g[rows], p[cols]
        before = last_track[matched_gt]
        out["id_switches"] += int(np.sum(~np.isnan(before) & (before != matched_track)))
        last_track[matched_gt] = matched_track
        prev_frame_track[:] = np.nan
        prev_frame_track[matched_gt] = matched_track
        out["matches"] += len(rows)
        out["fn"] += len(g) - len(rows)
        out["fp"] += len(p) - len(rows)
        out["iou_sum"] += float(iou[rows, cols].sum())
    return out


def _idtp(frames: list[tuple[np.ndarray, np.ndarray, np.ndarray]], n_gt_ids: int, n_pred_ids: int,
          threshold: float) -> int:
    """IDTP of the one-to-one identity matching with the most frames of overlap (IoU >= threshold)."""
    if not n_gt_ids or not n_pred_ids:
        return 0
    overlap = np.zeros((n_gt_ids, n_pred_ids))
    for g, p, iou in frames:
        gi, pi = np.nonzero(iou >= threshold)
        np.add.at(overlap, (g[gi], p[pi]), 1)
    # Maximising IDTP minimises IDFN + IDFP = all boxes - 2 IDTP: TrackEval's cost matrix, without its dummy rows.
    rows, cols = linear_sum_assignment(-overlap)
    return int(overlap[rows, cols].sum())


@dataclass(frozen=True)
class IdentityTruth:
    """The frozen identity ground truth in score_tracks' format, with the declared lines."""

    gt: dict[float, list[tuple[int, list[float]]]]
    ignore: dict[float, list[list[float]]]
    lines: list[dict]
    classes: dict[int, str]  # identity -> class
    sha256: str


def identity_truth(path: str | Path = HUMAN_TRACKS, classes: Sequence[str] | None = ("person",)) -> IdentityTruth:
    """Read human-v1-tracks.json (and the ignore regions of the human-v1.json it links), keeping `classes` (None:
    all). The ignore regions of those classes are all of them, not only those the file attributes to an identity."""
    path = Path(path)
    raw = path.read_bytes()
    doc = json.loads(raw)

    def keep(cls: str) -> bool:
        return classes is None or cls in classes

    gt: dict[float, list] = {t: [] for t in doc["frames"]}
    for ident in doc["identities"]:
        if keep(ident["class"]):
            for t, box in ident["boxes"].items():
                gt[float(t)].append((ident["id"], box))
    source = json.loads((ROOT / doc["info"]["source"]).read_text())
    names = {c["id"]: c["name"] for c in source["categories"]}
    video = Path(doc["info"]["video"]).stem
    times = {i["id"]: i["t"] for i in source["images"] if i["video"] == video and i["t"] in gt}
    ignore: dict[float, list] = {t: [] for t in gt}
    for a in source["annotations"]:
        if a["image_id"] in times and a["ignore"] and keep(names[a["category_id"]]):
            x, y, w, h = a["bbox"]
            ignore[times[a["image_id"]]].append([x, y, x + w, y + h])
    return IdentityTruth(gt=gt, ignore=ignore, lines=doc["lines"],
                         classes={i["id"]: i["class"] for i in doc["identities"] if keep(i["class"])},
                         sha256=hashlib.sha256(raw).hexdigest())
