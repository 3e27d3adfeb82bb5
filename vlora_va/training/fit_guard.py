"""The fit's guard: a fitted adapter replaces the one it started from only where it is better on the camera's own
held-out frames, beyond their noise. The same machinery as the precision gate (paired.py):

    references   human boxes on the held-out frames where a person gave them, else the refined labels
                 (refined_labels.py), never the raw teachers alone
    items        one per held-out frame: the start adapter's and the fitted adapter's boxes, each at its own score
                 threshold, matched to the same references (paired.detection_items); the classes pooled per frame, with
                 the vehicle classes counted as one (label_classes.vehicle_agnostic: a car the teachers call a truck is
                 still the car a line counts)
    verdict      kept when the fitted adapter's F1 is higher and the lower end of the bootstrap's 95% interval of the
                 difference is above 0, and no class with at least MIN_CLASS_REFS references loses more than
                 CLASS_TOLERANCE of its F1

Refused, the fit writes nothing servable (fit.py) unless asked to keep it anyway, which its card and FIT.json then
say and `--serve` refuses.
"""

from __future__ import annotations

from dataclasses import dataclass

from vlora_va.training.label_classes import vehicle_agnostic
from vlora_va.training.paired import DetItem, detection_items, f1_at, paired

CLASS_TOLERANCE = 0.02  # a class may lose at most this much F1 (its own, unpaired figure) in a kept fit
MIN_CLASS_REFS = 10  # a class with fewer references on the held-out frames is too thin to judge on its own


@dataclass
class Verdict:
    kept: bool
    reason: str
    start_f1: float
    fitted_f1: float
    delta: float
    ci95: tuple[float, float]
    frames: int
    references: int
    against: str  # "human boxes" or "refined labels"
    per_class: dict

    def as_dict(self) -> dict:
        return {"kept": self.kept, "reason": self.reason, "start_f1": self.start_f1, "fitted_f1": self.fitted_f1,
                "delta": self.delta, "ci95": list(self.ci95), "frames": self.frames, "references": self.references,
                "against": self.against, "per_class": self.per_class}


def pooled_items(preds: dict[str, list[dict]], refs: dict[str, list[dict]], keys: list[str], classes: list[str],
                 threshold: float) -> list[DetItem]:
    """One item per frame key: every class's predictions at or above `threshold`, matched within their class."""
    per_class = [detection_items(preds, refs, keys, c) for c in classes]
    return [DetItem([(s, t) for items in per_class for s, t in items[i].scored if s >= threshold],
                    sum(items[i].refs for items in per_class)) for i in range(len(keys))]


def judge(start: dict[str, list[dict]], fitted: dict[str, list[dict]], refs: dict[str, list[dict]],
          thresholds: tuple[float, float], against: str) -> Verdict:
    """The guard on the held-out frames: `start` and `fitted` map frame key -> predicted boxes (any score; each is
    read at its own threshold), `refs` frame key -> reference boxes (with "ignore" flags)."""
    start, fitted, refs = vehicle_agnostic(start), vehicle_agnostic(fitted), vehicle_agnostic(refs)
    keys = sorted(refs)
    classes = sorted({r["class"] for k in keys for r in refs[k] if not r.get("ignore")})
    n_refs = sum(1 for k in keys for r in refs[k] if not r.get("ignore"))
    if not keys or not classes:
        return Verdict(False, "the held-out frames hold no reference objects to judge on", 0.0, 0.0, 0.0, (0.0, 0.0),
                       len(keys), 0, against, {})
    a = pooled_items(start, refs, keys, classes, thresholds[0])
    b = pooled_items(fitted, refs, keys, classes, thresholds[1])
    cmp = paired(a, b, lambda items: f1_at(items, 0.0))  # each side already read at its own threshold
    per_class = {}
    for c in classes:
        ia = pooled_items(start, refs, keys, [c], thresholds[0])
        ib = pooled_items(fitted, refs, keys, [c], thresholds[1])
        n = sum(it.refs for it in ia)
        per_class[c] = {"refs": n, "start_f1": round(f1_at(ia, 0.0), 4), "fitted_f1": round(f1_at(ib, 0.0), 4)}
    worse = [c for c, r in per_class.items()
             if r["refs"] >= MIN_CLASS_REFS and r["fitted_f1"] < r["start_f1"] - CLASS_TOLERANCE]
    lo, hi = cmp["ci95"]
    if worse:
        kept, reason = False, (f"worse on {', '.join(worse)} by more than {CLASS_TOLERANCE} against the {against} ("
                               + ", ".join(f"{c} {per_class[c]['start_f1']:.3f} -> {per_class[c]['fitted_f1']:.3f}"
                                           for c in worse)
                               + f"; all classes F1 {cmp['reference']:.3f} -> {cmp['variant']:.3f})")
    elif cmp["delta"] <= 0:
        kept, reason = False, (f"not better than the adapter it started from against the {against}: F1 "
                               f"{cmp['reference']:.3f} -> {cmp['variant']:.3f}")
    elif lo <= 0:
        kept, reason = False, (f"better by {cmp['delta']:+.3f} F1 against the {against}, but within the noise of "
                               f"{len(keys)} held-out frames (95% interval [{lo:+.3f}, {hi:+.3f}] reaches 0)")
    else:
        kept, reason = True, (f"better against the {against}: F1 {cmp['reference']:.3f} -> {cmp['variant']:.3f} "
                              f"({cmp['delta']:+.3f}, 95% interval [{lo:+.3f}, {hi:+.3f}], {len(keys)} frames)")
    return Verdict(kept, reason, cmp["reference"], cmp["variant"], cmp["delta"], (lo, hi), len(keys), n_refs, against,
                   per_class)
