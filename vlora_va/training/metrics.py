"""Accuracy metrics: detection F1 at IoU 0.5 and AP50 per class; action top-1 and confusion matrix, per
clip and per person.

Matching is per image and class, greedy by score: a prediction is a true positive when it overlaps an
unmatched reference box with IoU >= 0.5 (the COCO/VOC rule). Reference boxes may be flagged "ignore"
(too uncertain or too small to count): a prediction matching one is neither a TP nor an FP, and an
unmatched one is not an FN.

Per-person activity: in each clip, predicted persons (best first) are matched greedily to the nearest
unmatched reference person whose mean box centre is within half its box height of the prediction's
centre. Persons are small (the mean box of someone walking for a second), so a centre rule is steadier
than IoU. Top-1 counts a reference person as right only when it was found and given its activity:
a missed person is a wrong answer.

Against the human-checked set (adapters/eval/README.md) the same detection rule is reported with recall by
reference box height (`HEIGHT_BUCKETS`, original-frame pixels), and persons are matched by box IoU
(`person_activity_iou_report`): its person boxes are drawn by hand, so overlap is meaningful, and persons
whose activity could not be judged are "ignore" references (a prediction on one counts neither way).
"""

from __future__ import annotations

import math

import numpy as np

from vlora_va.contracts.boxes import iou_matrix


def match_image(preds: list[dict], refs: list[dict], iou: float = 0.5) -> tuple[list[tuple[float, int]], int]:
    """One class, one image: ([(score, 1 TP / 0 FP)] for counted predictions, number of counted refs)."""
    scored, counted, _ = _match(preds, refs, iou)
    return scored, len(counted)


def _boxes(items: list[dict]) -> np.ndarray:
    """[n, 4] float32 boxes: the precision these reports have always been computed at (a tie at the IoU threshold
    must not move between versions)."""
    return np.asarray([x["box"] for x in items], np.float32).reshape(-1, 4)


def _match(preds: list[dict], refs: list[dict], iou: float) -> tuple[list[tuple[float, int]], list[dict], list[bool]]:
    """`match_image`'s greedy rule, also returning the counted refs and which of them were matched."""
    preds = sorted(preds, key=lambda p: -p["score"])
    counted = [r for r in refs if not r.get("ignore")]
    ignored = [r for r in refs if r.get("ignore")]
    used = [False] * len(counted)
    out = []
    iou_c = iou_matrix(_boxes(preds), _boxes(counted))
    iou_i = iou_matrix(_boxes(preds), _boxes(ignored))
    for i, p in enumerate(preds):
        best, j = -1.0, -1
        for k in range(len(counted)):
            if not used[k] and iou_c[i, k] >= iou and iou_c[i, k] > best:
                best, j = float(iou_c[i, k]), k
        if j >= 0:
            used[j] = True
            out.append((p["score"], 1))
        elif len(ignored) and float(iou_i[i].max()) >= iou:
            continue  # matched an ignored reference: does not count
        else:
            out.append((p["score"], 0))
    return out, counted, used


def average_precision(scored: list[tuple[float, int]], n_ref: int) -> float:
    """Area under the interpolated precision-recall curve (VOC/COCO all-point)."""
    if n_ref == 0:
        return float("nan")
    if not scored:
        return 0.0
    s = sorted(scored, key=lambda x: -x[0])
    tp = np.cumsum([t for _, t in s])
    fp = np.cumsum([1 - t for _, t in s])
    recall = tp / n_ref
    precision = tp / np.maximum(tp + fp, 1e-9)
    mrec = np.concatenate([[0.0], recall, [recall[-1]]])
    mpre = np.concatenate([[1.0], precision, [0.0]])
    mpre = np.maximum.accumulate(mpre[::-1])[::-1]
    idx = np.where(mrec[1:] != mrec[:-1])[0]
    return float(np.sum((mrec[idx + 1] - mrec[idx]) * mpre[idx + 1]))


def class_scored(preds: dict[str, list[dict]], refs: dict[str, list[dict]], cls: str,
                 iou: float = 0.5) -> tuple[list[tuple[float, int]], int]:
    """One class over all images: every counted prediction as (score, 1 TP / 0 FP) by `match_image`'s rule, and
    the number of counted references: the ranking AP50, F1 and recall-at-precision are read from."""
    scored, n_ref = [], 0
    for key, ref in refs.items():
        s, n = match_image([p for p in preds.get(key, []) if p["class"] == cls], [r for r in ref if r["class"] == cls], iou)
        scored += s
        n_ref += n
    return scored, n_ref


def detection_report(preds: dict[str, list[dict]], refs: dict[str, list[dict]], classes: list[str],
                     threshold: float, iou: float = 0.5) -> dict[str, dict]:
    """Per class: precision, recall, F1 at `threshold`, AP50 over all predictions, counts."""
    report = {}
    for c in classes:
        scored, n_ref = class_scored(preds, refs, c, iou)
        tp = sum(t for s, t in scored if s >= threshold)
        fp = sum(1 - t for s, t in scored if s >= threshold)
        p = tp / max(tp + fp, 1)
        r = tp / n_ref if n_ref else float("nan")
        f1 = 2 * p * r / (p + r) if n_ref and p + r > 0 else (0.0 if n_ref else float("nan"))
        report[c] = {"precision": round(p, 4), "recall": round(r, 4), "f1": round(f1, 4),
                     "ap50": round(average_precision(scored, n_ref), 4), "refs": n_ref, "tp": tp, "fp": fp}
    return report


HEIGHT_BUCKETS = ("<40", "40-100", ">100")  # reference box height in original-frame pixels


def height_bucket(box) -> str:
    """"<40" below 40 px, ">100" above 100 px, else "40-100" (both ends included)."""
    h = box[3] - box[1]
    return "<40" if h < 40 else ">100" if h > 100 else "40-100"


def recall_by_height(preds: dict[str, list[dict]], refs: dict[str, list[dict]], cls: str, threshold: float,
                     iou: float = 0.5) -> dict[str, dict]:
    """One class: of the counted reference boxes in each height bucket (`height_bucket`), how many a prediction
    scoring >= threshold matched (the rule of `match_image`). Recall is None for an empty bucket."""
    refs_n = {name: 0 for name in HEIGHT_BUCKETS}
    found = {name: 0 for name in HEIGHT_BUCKETS}
    for key, ref in refs.items():
        shown = [p for p in preds.get(key, []) if p["class"] == cls and p["score"] >= threshold]
        _, counted, used = _match(shown, [r for r in ref if r["class"] == cls], iou)
        for r, hit in zip(counted, used):
            name = height_bucket(r["box"])
            refs_n[name] += 1
            found[name] += int(hit)
    return {n: {"refs": refs_n[n], "found": found[n], "recall": _ratio(found[n], refs_n[n])} for n in refs_n}


def recall_at_precision(scored: list[tuple[float, int]], n_ref: int, min_precision: float) -> dict:
    """The most recall any score threshold reaches while precision stays >= min_precision (a reading of the
    precision-recall curve, as a plain loop over thresholds best score first), and the threshold that gives it.
    None where no threshold reaches that precision or there are no references."""
    best = {"recall": None, "threshold": None}
    tp = fp = 0
    ranked = sorted(scored, key=lambda s: -s[0])
    for k, (score, hit) in enumerate(ranked):
        tp, fp = tp + hit, fp + 1 - hit
        if k + 1 < len(ranked) and ranked[k + 1][0] == score:
            continue  # a threshold keeps every prediction with the same score
        if n_ref and tp / (tp + fp) >= min_precision and (best["recall"] is None or tp / n_ref > best["recall"]):
            best = {"recall": round(tp / n_ref, 4), "threshold": round(score, 4)}
    return best


def human_detection_report(preds: dict[str, list[dict]], refs: dict[str, list[dict]], classes: list[str],
                           threshold: float, iou: float = 0.5) -> dict[str, dict]:
    """`detection_report` plus, per class, recall by reference box height (`HEIGHT_BUCKETS`) at `threshold`, the
    curve's recall at precision >= 0.9 (`recall_at_precision`, any threshold: a reading, not an operating point
    chosen on this data), and for persons how many side-by-side pairs came out as two boxes (`side_by_side_report`)."""
    report = detection_report(preds, refs, classes, threshold, iou)
    for c in classes:
        report[c]["recall_by_height"] = recall_by_height(preds, refs, c, threshold, iou)
        report[c]["recall_at_precision_0.9"] = recall_at_precision(*class_scored(preds, refs, c, iou), 0.9)
    if "person" in classes:
        report["person"]["side_by_side"] = side_by_side_report(preds, refs, "person", threshold, iou)
    return report


def mean_f1(report: dict[str, dict]) -> float:
    """Mean F1 over the classes of a `detection_report` that have any (classes with no data are left out)."""
    values = [r["f1"] for r in report.values() if not math.isnan(r["f1"])]
    return float(np.mean(values)) if values else float("nan")


def side_by_side_pairs(boxes: list[list[float]]) -> list[tuple[int, int]]:
    """Index pairs (i < j) of boxes that stand side by side: they touch or overlap, or their centres are closer
    than the wider box's width (the human set's rule for two people walking together)."""
    pairs = []
    for i, a in enumerate(boxes):
        for j in range(i + 1, len(boxes)):
            b = boxes[j]
            touch = a[0] <= b[2] and b[0] <= a[2] and a[1] <= b[3] and b[1] <= a[3]
            dist = math.hypot((a[0] + a[2] - b[0] - b[2]) / 2, (a[1] + a[3] - b[1] - b[3]) / 2)
            if touch or dist < max(a[2] - a[0], b[2] - b[0]):
                pairs.append((i, j))
    return pairs


def side_by_side_report(preds: dict[str, list[dict]], refs: dict[str, list[dict]], cls: str, threshold: float,
                        iou: float = 0.5) -> dict:
    """Of the side-by-side pairs of counted `cls` references (`side_by_side_pairs`), how many came out as two
    separate boxes: both persons matched (the rule of `match_image`, each prediction to one reference) by
    predictions scoring >= threshold. `persons_in_pairs` / `found_in_pairs` count the persons of any pair."""
    cases = separate = in_pairs = found = 0
    for key, ref in refs.items():
        shown = [p for p in preds.get(key, []) if p["class"] == cls and p["score"] >= threshold]
        _, counted, used = _match(shown, [r for r in ref if r["class"] == cls], iou)
        pairs = side_by_side_pairs([r["box"] for r in counted])
        cases += len(pairs)
        separate += sum(1 for i, j in pairs if used[i] and used[j])
        members = {k for pair in pairs for k in pair}
        in_pairs += len(members)
        found += sum(1 for k in members if used[k])
    return {"cases": cases, "separate": separate, "rate": _ratio(separate, cases),
            "persons_in_pairs": in_pairs, "found_in_pairs": found, "recall_in_pairs": _ratio(found, in_pairs)}


# The score thresholds calibration tries. It starts at the floor the predictions are decoded at (0.05,
# `train.decode_detections`, `predict_action`): models trained on hand-fixed labels picked 0.1 when the grid
# began there, so their best threshold could lie below it.
SCORE_THRESHOLDS = [round(float(t), 3) for t in np.arange(0.05, 0.8, 0.025)]


def best_f1_threshold(preds: dict[str, list[dict]], refs: dict[str, list[dict]], classes: list[str]) -> float:
    """The score threshold of `SCORE_THRESHOLDS` with the best mean F1 over classes (chosen on validation data,
    never on test)."""
    best, best_t = -1.0, 0.3
    for t in SCORE_THRESHOLDS:
        f1 = mean_f1(detection_report(preds, refs, classes, float(t)))
        if f1 > best:
            best, best_t = f1, float(t)
    return round(best_t, 3)


def _with_unknown(known: list[str], seen) -> list[str]:
    """known, then every label in seen it lacks: a reference the model never learnt still gets a confusion row."""
    return list(known) + sorted(set(seen) - set(known))


def action_report(pred: list[str], true: list[str], labels: list[str]) -> dict:
    """Top-1 accuracy and the confusion matrix (rows: reference label, columns: predicted). `labels` are the
    model's; a reference label outside them is added (it can only be wrong)."""
    labels = _with_unknown(labels, true)
    idx = {lab: i for i, lab in enumerate(labels)}
    cm = np.zeros((len(labels), len(labels)), dtype=int)
    for p, t in zip(pred, true):
        cm[idx[t], idx[p]] += 1
    acc = float(np.trace(cm) / max(cm.sum(), 1))
    return {"top1": round(acc, 4), "clips": int(cm.sum()), "labels": labels, "confusion": cm.tolist()}


def _match_persons(preds: list[dict], refs: list[dict]) -> list[tuple[int, int]]:
    """(pred index, ref index) pairs, predictions best first, each to the nearest free reference in reach."""
    centre = lambda b: ((b[0] + b[2]) / 2, (b[1] + b[3]) / 2)
    free = set(range(len(refs)))
    pairs = []
    for i in sorted(range(len(preds)), key=lambda i: -preds[i]["score"]):
        px, py = centre(preds[i]["box"])
        best, j = None, -1
        for k in free:
            rx, ry = centre(refs[k]["box"])
            d = float(np.hypot(px - rx, py - ry))
            if d <= 0.5 * (refs[k]["box"][3] - refs[k]["box"][1]) and (best is None or d < best):
                best, j = d, k
        if j >= 0:
            free.discard(j)
            pairs.append((i, j))
    return pairs


def _ratio(part: int, whole: int) -> float | None:
    """None where the ratio is undefined (e.g. top-1 over clips with no labelled person): 0 would claim a failure."""
    return round(part / whole, 4) if whole else None


def fmt_ratio(x: float | None) -> str:
    """A figure to 3 decimals; "n/a" where undefined (None, or NaN as a fresh report has it before JSON)."""
    return "n/a" if x is None or math.isnan(x) else f"{x:.3f}"


def person_activity_report(preds: list[list[dict]], refs: list[list[dict]], activities: list[str],
                           threshold: float, dont_care: list[list[list[float]]] | None = None) -> dict:
    """Per clip lists of predicted persons ({box, score, activity}) and reference persons ({box, label}, and
    `sure`: false for a person whose activity the label rule could not tell: found or not, it counts neither
    way). Confusion rows: reference activity; columns: predicted activity, then "missed". `activities` are the
    model's; a reference activity outside them is added (it can only be wrong). dont_care: per clip, boxes of
    people who are there (data.people_there), references or not: the label rule keeps only the persons it tracked
    through the clip, and a prediction on someone else there who matches no reference is not a false alarm."""
    activities = _with_unknown(activities, (r["label"] for ref in refs for r in ref if r.get("sure", True)))
    idx = {a: i for i, a in enumerate(activities)}
    cm = np.zeros((len(activities), len(activities) + 1), dtype=int)
    predicted = unsure = 0
    for k, (pred, ref) in enumerate(zip(preds, refs)):
        pred = [p for p in pred if p["score"] >= threshold]
        pairs = _match_persons(pred, ref)
        found = {j: pred[i]["activity"] for i, j in pairs}
        predicted += len(pred) - sum(1 for j in found if not ref[j].get("sure", True))
        if dont_care is not None:
            matched, there = {i for i, _ in pairs}, [{"box": b} for b in dont_care[k]]
            predicted -= sum(1 for i, p in enumerate(pred) if i not in matched and _match_persons([p], there))
        for j, r in enumerate(ref):
            if not r.get("sure", True):
                unsure += 1
                continue
            cm[idx[r["label"]], idx[found[j]] if j in found else len(activities)] += 1
    n_ref, n_found = int(cm.sum()), int(cm[:, :-1].sum())
    right = int(np.trace(cm[:, :-1]))
    return {"top1": _ratio(right, n_ref), "top1_found": _ratio(right, n_found),
            "recall": _ratio(n_found, n_ref), "precision": _ratio(n_found, predicted),
            "persons": n_ref, "unsure_persons": unsure, "predicted": predicted, "threshold": threshold,
            "activities": activities, "confusion": cm.tolist()}


def _match_persons_iou(preds: list[dict], refs: list[dict], iou: float) -> tuple[list[tuple[int, int]], set[int]]:
    """Predictions best first, each to the free counted reference it overlaps most (IoU >= iou): (pred, ref)
    pairs, and the unmatched predictions that overlap an ignored reference (they count neither way)."""
    counted = [k for k, r in enumerate(refs) if not r.get("ignore")]
    ignored = [k for k, r in enumerate(refs) if r.get("ignore")]
    m = iou_matrix(_boxes(preds), _boxes(refs))
    free, pairs, dropped = set(counted), [], set()
    for i in sorted(range(len(preds)), key=lambda i: -preds[i]["score"]):
        best, j = iou, -1
        for k in free:
            if float(m[i, k]) >= best:
                best, j = float(m[i, k]), k
        if j >= 0:
            free.discard(j)
            pairs.append((i, j))
        elif any(float(m[i, k]) >= iou for k in ignored):
            dropped.add(i)
    return pairs, dropped


LRS = ("walking_left", "walking_right", "standing")  # the activities the accuracy target is over


def per_activity(activities: list[str], cm: np.ndarray) -> dict[str, dict]:
    """Per reference activity (confusion rows; last column = missed): persons, right answers, their recall."""
    return {a: {"persons": int(cm[i].sum()), "right": int(cm[i, i]), "recall": _ratio(int(cm[i, i]), int(cm[i].sum()))}
            for i, a in enumerate(activities) if cm[i].sum()}


def subset_top1(activities: list[str], cm: np.ndarray, subset) -> float | None:
    """Top-1 over the reference persons whose activity is in `subset` (a missed person is wrong)."""
    rows = [i for i, a in enumerate(activities) if a in subset]
    return _ratio(int(sum(cm[i, i] for i in rows)), int(sum(cm[i].sum() for i in rows)))


def person_activity_iou_report(preds: list[list[dict]], refs: list[list[dict]], activities: list[str],
                               threshold: float, iou: float = 0.5) -> dict:
    """Per clip lists of predicted persons ({box, score, activity}) and reference persons ({box, label} or
    {box, ignore: true}), matched by box IoU (`_match_persons_iou`). Same report as `person_activity_report`:
    top-1 counts a missed person as wrong; precision is over predictions that are not on an ignored person."""
    activities = _with_unknown(activities, (r["label"] for ref in refs for r in ref if not r.get("ignore")))
    idx = {a: i for i, a in enumerate(activities)}
    cm = np.zeros((len(activities), len(activities) + 1), dtype=int)
    predicted = ignored = 0
    for pred, ref in zip(preds, refs):
        pred = [p for p in pred if p["score"] >= threshold]
        pairs, dropped = _match_persons_iou(pred, ref, iou)
        predicted += len(pred) - len(dropped)
        ignored += sum(1 for r in ref if r.get("ignore"))
        found = {j: pred[i]["activity"] for i, j in pairs}
        for j, r in enumerate(ref):
            if not r.get("ignore"):
                cm[idx[r["label"]], idx[found[j]] if j in found else len(activities)] += 1
    n_ref, n_found = int(cm.sum()), int(cm[:, :-1].sum())
    right = int(np.trace(cm[:, :-1]))
    return {"top1": _ratio(right, n_ref), "top1_found": _ratio(right, n_found),
            "recall": _ratio(n_found, n_ref), "precision": _ratio(n_found, predicted),
            "per_activity": per_activity(activities, cm), "top1_left_right_standing": subset_top1(activities, cm, LRS),
            "persons": n_ref, "ignored_persons": ignored, "predicted": predicted, "threshold": threshold, "iou": iou,
            "activities": activities, "confusion": cm.tolist()}


def best_person_threshold(preds: list[list[dict]], refs: list[list[dict]], activities: list[str],
                          dont_care: list[list[list[float]]] | None = None) -> float:
    """The person-score threshold of `SCORE_THRESHOLDS` with the best person-finding F1 (chosen on validation data,
    never on test).
    dont_care (person_activity_report): without it, finding a person the label rule did not keep counts against a
    threshold, which then drops real people too."""
    best, best_t = -1.0, 0.3
    for t in SCORE_THRESHOLDS:
        rep = person_activity_report(preds, refs, activities, float(t), dont_care)
        precision, recall = rep["precision"] or 0.0, rep["recall"] or 0.0
        f1 = 2 * precision * recall / max(precision + recall, 1e-9)
        if f1 > best:
            best, best_t = f1, float(t)
    return round(best_t, 3)
