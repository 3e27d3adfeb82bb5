"""Paired accuracy comparisons: the same adapter, the same held-out frames, two ways of computing it.

A precision (int8, bf16) or a cheaper input (fewer frames per clip, a smaller image) changes an adapter's held-out
accuracy by less than the run-to-run noise of training, so it is measured as a *paired* difference: both variants
score the very same frames or clips, and a bootstrap over those frames / clips (resampled with one fixed seed,
the same resample applied to both variants) gives a 95% interval of the difference. The per-item scores reuse the
rules of metrics.py (greedy IoU matching for boxes, centre / IoU matching for persons), so a variant's totals
equal what `vlora-va eval`'s reports would say for the same predictions.

Items (one per resampling unit):
    detection   per frame: [(score, 1 TP / 0 FP)] of one class's counted predictions, and its counted references
                -> F1 at the adapter's threshold and AP50 of the pooled items
    clip        per clip: 1 when the clip's label is right               -> top-1
    persons     per clip: (persons right, persons counted)               -> per-person top-1 (a miss is wrong)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vlora_va.training.metrics import average_precision, match_image, person_activity_iou_report, person_activity_report

BOOTSTRAP = 2000
SEED = 0


@dataclass
class DetItem:
    scored: list[tuple[float, int]]
    refs: int


def detection_items(preds: dict[str, list[dict]], refs: dict[str, list[dict]], keys: list[str], cls: str) -> list[DetItem]:
    """One item per frame key: the class's predictions matched to its references (metrics.match_image)."""
    out = []
    for k in keys:
        scored, n = match_image([p for p in preds.get(k, []) if p["class"] == cls],
                                [r for r in refs.get(k, []) if r["class"] == cls])
        out.append(DetItem(scored, n))
    return out


def f1_at(items: list[DetItem], threshold: float) -> float:
    tp = sum(t for it in items for s, t in it.scored if s >= threshold)
    fp = sum(1 - t for it in items for s, t in it.scored if s >= threshold)
    refs = sum(it.refs for it in items)
    return 2 * tp / max(2 * tp + fp + (refs - tp), 1)


def ap50(items: list[DetItem]) -> float:
    return average_precision([x for it in items for x in it.scored], sum(it.refs for it in items))


def person_items(preds: list[list[dict]], refs: list[list[dict]], activities: list[str], threshold: float,
                 iou: float | None = None) -> list[tuple[int, int]]:
    """Per clip (right, counted) persons, by metrics.person_activity_report's centre rule, or with `iou` by the
    human set's IoU rule (person_activity_iou_report)."""
    out = []
    for p, r in zip(preds, refs):
        rep = (person_activity_report([p], [r], activities, threshold) if iou is None else
               person_activity_iou_report([p], [r], activities, threshold, iou))
        cm = np.asarray(rep["confusion"])
        out.append((int(np.trace(cm[:, :-1])), int(cm.sum())))
    return out


def persons_top1(items: list[tuple[int, int]]) -> float:
    return sum(r for r, _ in items) / max(sum(n for _, n in items), 1)


def clip_top1(items: list[int]) -> float:
    return sum(items) / max(len(items), 1)


def paired(ref: list, var: list, metric, n: int = BOOTSTRAP, seed: int = SEED) -> dict:
    """metric(variant items) - metric(reference items), with the bootstrap 95% interval of that difference:
    `n` resamples of the item indices (with replacement, numpy default_rng(seed)), the same for both lists."""
    if len(ref) != len(var):
        raise ValueError(f"paired items differ in number: {len(ref)} vs {len(var)}")
    m_ref, m_var = metric(ref), metric(var)
    rng = np.random.default_rng(seed)
    diffs = []
    for _ in range(n):
        idx = rng.integers(0, len(ref), len(ref))
        diffs.append(metric([var[i] for i in idx]) - metric([ref[i] for i in idx]))
    lo, hi = np.percentile(diffs, [2.5, 97.5])
    return {"reference": round(m_ref, 4), "variant": round(m_var, 4), "delta": round(m_var - m_ref, 4),
            "ci95": [round(float(lo), 4), round(float(hi), 4)], "items": len(ref), "resamples": n, "seed": seed}
