"""Training targets (CenterNet-style) and losses for `heads.DetectionHead` and the person branch of
`heads.ActionHead`.

For each labelled box (mapped into the letterboxed model frame):
- class heatmap: a Gaussian peak at the box centre (sigma from the box size, as in CenterNet), so the
  head's 3x3-peak decoding finds one peak per object;
- box regression: the (left, top, right, bottom) distances from each cell centre to the box sides, on the
  cells near the centre (where the heatmap >= `reg_min`), weighted by the heatmap value; a cell near two
  centres regresses the box whose peak is higher there.
Losses: penalty-reduced focal loss on the heatmap, GIoU on the boxes, both normalised by object count.

For each labelled person of a clip (`actions.person_activities`: an activity and the mean box over the clip):
- person-centre heatmap: the same Gaussian peak at the mean box's centre cell;
- at that cell: the centre's offset in the cell and log width/height in cells (L1);
- the person's activity on that cell and its 4 neighbours (class-weighted cross-entropy), only where the
  label rule was sure of it (`sure`; an unsure person is still a person-centre target);
- "don't care": cells holding the centre of any teacher person box of the clip that is not a labelled
  person (a weak box, or someone seen in under 60% of the clip) get no penalty for a centre score.
With the head's person DetectionHead (`boxes`): the detection targets above, class person, on each clip's two
middle frames from the teacher's boxes in those frames (`middle_frame_targets`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from vlora_va.contracts.geometry import Letterbox
from vlora_va.engine.heads import PERSON_FIELDS, middle_frames
from vlora_va.training.actions import MIRRORED


def to_model_boxes(labels: list[dict], lb: Letterbox, side: int, flip: bool) -> list[tuple[list[float], str]]:
    out = []
    for lab in labels:
        x1, y1, x2, y2 = lb.box_to_model(lab["box"])
        if flip:
            x1, x2 = side - x2, side - x1
        out.append(([x1, y1, x2, y2], lab["class"]))
    return out


def gaussian_sigma(w: float, h: float, stride: float) -> float:
    # ~ CenterNet: radius grows with object size, at least one cell. In cells.
    return max(0.5, 0.15 * math.sqrt(w * h) / stride)


def centre_peak(x1: float, y1: float, x2: float, y2: float, stride: float, xs: torch.Tensor,
                ys: torch.Tensor) -> tuple[int, int, torch.Tensor]:
    """(column, row) of the cell holding the box centre, and a Gaussian over the grid that is exactly 1 there
    (the focal loss's positive); xs, ys = the cell-centre coordinates in cells."""
    grid = xs.shape[1]
    px, py = min(int((x1 + x2) / 2 / stride), grid - 1), min(int((y1 + y2) / 2 / stride), grid - 1)
    sigma = gaussian_sigma(x2 - x1, y2 - y1, stride)
    return px, py, torch.exp(-((xs - (px + 0.5)) ** 2 / (2 * sigma ** 2) + (ys - (py + 0.5)) ** 2 / (2 * sigma ** 2)))


def build_targets(labels: list[dict], lb: Letterbox, side: int, grid: int, classes: list[str], flip: bool = False,
                  reg_min: float = 0.3) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """(heatmap [C, G, G], box [4, G, G] as x1y1x2y2 model px, reg weight [G, G], object count)."""
    stride = side / grid
    heat = torch.zeros(len(classes), grid, grid)
    box = torch.zeros(4, grid, grid)
    weight = torch.zeros(grid, grid)
    area = torch.full((grid, grid), float("inf"))
    ys = (torch.arange(grid, dtype=torch.float32) + 0.5)[:, None].expand(grid, grid)
    xs = (torch.arange(grid, dtype=torch.float32) + 0.5)[None, :].expand(grid, grid)
    n = 0
    for (x1, y1, x2, y2), name in to_model_boxes(labels, lb, side, flip):
        if name not in classes or x2 - x1 < 1 or y2 - y1 < 1:
            continue
        n += 1
        c = classes.index(name)
        _, _, g = centre_peak(x1, y1, x2, y2, stride, xs, ys)
        heat[c] = torch.maximum(heat[c], g)
        # A cell near two centres regresses the box whose Gaussian is higher there (its centre is nearer, for its
        # size); on a tie the smaller box (the harder, rarer one). "Smaller always wins" gave the centre cell of
        # one of two people walking side by side the other's box: two peaks, one box twice, NMS kept one.
        a = (x2 - x1) * (y2 - y1)
        take = (g >= reg_min) & ((g > weight) | ((g == weight) & (a < area)))
        area[take] = a
        weight[take] = g[take]
        for k, v in enumerate((x1, y1, x2, y2)):
            box[k][take] = v
    return heat, box, weight, n


def middle_frame_targets(frame_boxes: list[list[list[float]]], lb: Letterbox, side: int, grid: int,
                         flip: bool = False) -> tuple[torch.Tensor, ...]:
    """Detection targets (class person) for a clip's two middle frames (`heads.middle_frames`), stacked:
    (heat [2, 1, G, G], box [2, 4, G, G], weight [2, G, G], count [2]); frame_boxes = the teacher person boxes
    of each of the clip's frames, in the order the model sees them."""
    picked = middle_frames(1, len(frame_boxes)).tolist()
    per = [build_targets([{"box": b, "class": "person"} for b in frame_boxes[k]], lb, side, grid, ["person"], flip)
           for k in picked]
    return (torch.stack([t[0] for t in per]), torch.stack([t[1] for t in per]), torch.stack([t[2] for t in per]),
            torch.tensor([t[3] for t in per]))


def focal_loss(logits: torch.Tensor, heat: torch.Tensor, alpha: float = 2.0, beta: float = 4.0,
               care: torch.Tensor | None = None) -> torch.Tensor:
    """CenterNet's penalty-reduced focal loss (sum; caller normalises); care = 0 exempts negatives."""
    p = logits.sigmoid().clamp(1e-4, 1 - 1e-4)
    pos = heat.eq(1).float()
    pos_loss = -torch.log(p) * (1 - p) ** alpha * pos
    neg_loss = -torch.log(1 - p) * p ** alpha * (1 - heat) ** beta * (1 - pos)
    if care is not None:
        neg_loss = neg_loss * care
    return pos_loss.sum() + neg_loss.sum()


def giou_loss(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """1 - GIoU per row of x1y1x2y2 boxes [N, 4]."""
    lt = torch.maximum(pred[:, :2], target[:, :2])
    rb = torch.minimum(pred[:, 2:], target[:, 2:])
    inter = (rb - lt).clamp(min=0).prod(1)
    area_p = (pred[:, 2:] - pred[:, :2]).clamp(min=0).prod(1)
    area_t = (target[:, 2:] - target[:, :2]).clamp(min=0).prod(1)
    union = area_p + area_t - inter + 1e-7
    hull = (torch.maximum(pred[:, 2:], target[:, 2:]) - torch.minimum(pred[:, :2], target[:, :2])).prod(1) + 1e-7
    return 1 - (inter / union - (hull - union) / hull)


def detection_loss(raw: tuple[torch.Tensor, torch.Tensor], heat: torch.Tensor, box: torch.Tensor,
                   weight: torch.Tensor, count: torch.Tensor, image_size: int, box_weight: float = 2.0) -> torch.Tensor:
    """raw = head forward output; targets batched ([B, C, G, G], [B, 4, G, G], [B, G, G], [B])."""
    logits, dist = raw
    g = logits.shape[-1]
    stride = image_size / g
    centre = (torch.arange(g, dtype=torch.float32, device=logits.device) + 0.5) * stride
    cy, cx = centre[:, None].expand(g, g), centre[None, :].expand(g, g)
    pred = torch.stack([cx - dist[:, 0], cy - dist[:, 1], cx + dist[:, 2], cy + dist[:, 3]], 1)  # [B, 4, G, G]
    norm = count.sum().clamp(min=1)
    loss = focal_loss(logits, heat) / norm
    m = weight > 0
    if m.any():
        p = pred.permute(0, 2, 3, 1)[m]
        t = box.permute(0, 2, 3, 1)[m]
        loss = loss + box_weight * (giou_loss(p, t) * weight[m]).sum() / weight[m].sum().clamp(min=1)
    return loss


def person_targets(persons: list[dict], seen: list[list[float]], lb: Letterbox, side: int, grid: int,
                   activities: list[str], flip: bool = False) -> tuple[torch.Tensor, ...]:
    """(heat [G, G], reg [4, G, G] = offset x, offset y, log w, log h in cells, centre mask [G, G],
    activity [G, G] (index, -1 = none), care [G, G]) for one clip; flip mirrors it (left and right swap)."""
    stride = side / grid
    heat, reg, mask = torch.zeros(grid, grid), torch.zeros(4, grid, grid), torch.zeros(grid, grid)
    activity = torch.full((grid, grid), -1, dtype=torch.long)
    care = torch.ones(grid, grid)
    ys = (torch.arange(grid, dtype=torch.float32) + 0.5)[:, None].expand(grid, grid)
    xs = (torch.arange(grid, dtype=torch.float32) + 0.5)[None, :].expand(grid, grid)
    for (x1, y1, x2, y2), _ in to_model_boxes([{"box": b, "class": "person"} for b in seen], lb, side, flip):
        care[min(int((y1 + y2) / 2 / stride), grid - 1), min(int((x1 + x2) / 2 / stride), grid - 1)] = 0
    # Largest first, so a smaller (farther) person keeps its own cells where two meet.
    boxes = to_model_boxes([{"box": p["box"], "class": p["label"] if p.get("sure", True) else None} for p in persons],
                           lb, side, flip)
    for (x1, y1, x2, y2), label in sorted(boxes, key=lambda b: b[0][1] - b[0][3]):
        if x2 - x1 < 1 or y2 - y1 < 1:
            continue
        px, py, g = centre_peak(x1, y1, x2, y2, stride, xs, ys)
        heat = torch.maximum(heat, g)
        cx, cy = (x1 + x2) / 2 / stride, (y1 + y2) / 2 / stride
        reg[:, py, px] = torch.tensor([cx - px - 0.5, cy - py - 0.5, math.log((x2 - x1) / stride),
                                       math.log((y2 - y1) / stride)])
        mask[py, px] = 1
        if label is None:  # a person whose activity the rule could not tell: where they are is still a target
            continue
        k = activities.index(MIRRORED.get(label, label) if flip else label)
        for dy, dx in ((0, 0), (-1, 0), (1, 0), (0, -1), (0, 1)):
            if 0 <= py + dy < grid and 0 <= px + dx < grid:
                activity[py + dy, px + dx] = k
    care[heat >= 0.3] = 1  # near a labelled person the target itself says what is right
    return heat, reg, mask, activity, care


def person_loss(maps: torch.Tensor, heat: torch.Tensor, reg: torch.Tensor, mask: torch.Tensor, activity: torch.Tensor,
                care: torch.Tensor, activity_weight: torch.Tensor | None = None) -> torch.Tensor:
    """maps = the action head's person maps [B, PERSON_FIELDS + A, G, G]; targets batched (person_targets)."""
    loss = focal_loss(maps[:, 0], heat, care=care) / mask.sum().clamp(min=1)
    m = mask.bool()
    if m.any():
        loss = loss + F.l1_loss(maps[:, 1:PERSON_FIELDS].permute(0, 2, 3, 1)[m], reg.permute(0, 2, 3, 1)[m])
    a = activity >= 0
    if a.any():
        loss = loss + F.cross_entropy(maps[:, PERSON_FIELDS:].permute(0, 2, 3, 1)[a], activity[a], weight=activity_weight)
    return loss
