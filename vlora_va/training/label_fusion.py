"""Several teachers' boxes on one frame → one set of pseudo-labels (weighted box fusion).

Two detectors trained on the same classes err differently: one misses a small person the other finds, one puts
a box on a pole the other does not. Fusion keeps what they agree on with more confidence than either alone, and
what only one sees with less:

  for each class, boxes of all teachers, best score first:
    join the first cluster of that class whose fused box overlaps the box at IoU >= `iou` and that holds no
    box of the same teacher yet; else open a new cluster;
  each cluster becomes one label:
    box   = the mean of its boxes, weighted by weight(teacher, class) x score;
    score = sum over its boxes of weight x score / sum over ALL teachers of their weight for that class.

A teacher that did not see the object adds 0 to the score: with two equally weighted teachers, a person both
see at 0.8 scores 0.8, one only one sees at 0.8 scores 0.4. The weights are where accuracy enters (a source's
`weights:` option, e.g. each teacher's F1 per class on labelled footage of the camera): a teacher that is poor on
a class then moves that class's boxes and scores little. The default is equal weights.
"""

from __future__ import annotations

from vlora_va.contracts.boxes import pair_iou


def fuse_boxes(per_teacher: dict[str, list[dict]], weights: dict[str, dict[str, float]] | None = None,
               iou: float = 0.55) -> list[dict]:
    """per_teacher: {teacher name: labels ({"box", "class", "score"})}; weights: {teacher: {class: w}} (missing
    entries weigh 1). Returns fused labels, each with "teachers": the names whose boxes it holds."""
    if not 0 < iou <= 1:
        raise ValueError(f"iou: expected 0 < iou <= 1, got {iou!r}")

    def weight(teacher: str, cls: str) -> float:
        return float((weights or {}).get(teacher, {}).get(cls, 1.0))

    entries = sorted(((lab["score"], name, lab) for name, labs in per_teacher.items() for lab in labs),
                     key=lambda e: -e[0])
    clusters: list[dict] = []
    for score, name, lab in entries:
        if weight(name, lab["class"]) <= 0:
            continue
        for c in clusters:
            if c["class"] == lab["class"] and name not in c["members"] and pair_iou(c["box"], lab["box"]) >= iou:
                break
        else:
            c = {"class": lab["class"], "members": {}, "box": lab["box"]}
            clusters.append(c)
        c["members"][name] = lab
        c["box"] = _weighted_box(c["members"], c["class"], weight)
    out = []
    for c in clusters:
        total = sum(weight(t, c["class"]) for t in per_teacher)
        score = sum(weight(t, c["class"]) * lab["score"] for t, lab in c["members"].items()) / total
        out.append({"box": [round(v, 1) for v in c["box"]], "class": c["class"], "score": round(score, 4),
                    "teachers": sorted(c["members"])})
    return sorted(out, key=lambda lab: -lab["score"])


def _weighted_box(members: dict[str, dict], cls: str, weight) -> list[float]:
    ws = [weight(t, cls) * lab["score"] for t, lab in members.items()]
    total = sum(ws)
    return [sum(w * lab["box"][i] for w, lab in zip(ws, members.values())) / total for i in range(4)]
