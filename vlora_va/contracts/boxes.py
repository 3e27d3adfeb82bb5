"""Box overlap and greedy suppression: the one IoU and the one NMS every layer uses.

Boxes are x1, y1, x2, y2 in continuous pixels (no +1). Ingest hosts have numpy and no torch, and the engine needs
both on its device tensors without a host step, so each function is written once with operators and the few
array functions numpy and torch name alike (`xp`: numpy by default, or the torch module).
"""

from __future__ import annotations

import numpy as np


def intersection(a, b, xp=np):
    """[len(a), len(b)] intersection areas. As a loop: for each i, j:
    max(0, min(a[i, 2], b[j, 2]) - max(a[i, 0], b[j, 0])) * max(0, min(a[i, 3], b[j, 3]) - max(a[i, 1], b[j, 1]))."""
    w = xp.minimum(a[:, None, 2], b[None, :, 2]) - xp.maximum(a[:, None, 0], b[None, :, 0])
    h = xp.minimum(a[:, None, 3], b[None, :, 3]) - xp.maximum(a[:, None, 1], b[None, :, 1])
    return w.clip(min=0) * h.clip(min=0)


def iou_matrix(a, b, xp=np):
    """[len(a), len(b)] IoU of two sets of boxes ([n, 4] arrays, or with numpy any sequence of boxes, empty too).
    As a loop: for each i, j: inter = intersection(a[i], b[j]); union = area(a[i]) + area(b[j]) - inter (areas
    unclamped); iou = inter / union if union > 0 else 0 (two zero-area boxes overlap by 0)."""
    if xp is np:
        a, b = np.asarray(a).reshape(-1, 4), np.asarray(b).reshape(-1, 4)
    inter = intersection(a, b, xp)
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    union = area_a[:, None] + area_b[None, :] - inter
    return xp.where(union > 0, inter / xp.where(union > 0, union, 1), 0.0)


def pair_iou(a, b) -> float:
    """IoU of two boxes: one cell of iou_matrix (about 13 us a call: loops over many boxes take the matrix)."""
    return float(iou_matrix([a], [b])[0, 0])


def greedy_keep(over):
    """Greedy NMS on boxes in best-first order: a bool mask of the kept ones, given over[i, j] for i < j (upper
    triangular, the caller's rule: e.g. same class and IoU > t): box i, when kept, suppresses box j.
    As a loop: for j in order: keep[j] = not any(keep[i] and over[i, j] for i < j).
    Computed as that loop's fixed point, keep[j] = not any(keep[i] & over[i, j]) (Cluster-NMS): after k steps the
    first k boxes are final, and each step is one matrix step on the array's device, not one host step per box."""
    keep = ~over.any(0)  # the first step from "all kept"
    for _ in range(len(keep)):
        new = ~(over & keep[:, None]).any(0)
        if bool((new == keep).all()):
            break
        keep = new
    return keep
