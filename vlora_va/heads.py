"""Vision task heads: what turns backbone features into detections or an action label.

A head reads `Features` (the CLS token and the patch-token grid of each image) and is saved beside its
adapter as `head_config.json` + `head.safetensors` (see vlora_va/adapters.py). Two kinds:

- `DetectionHead`: dense, anchor-free (FCOS/CenterNet-like) on the patch grid upsampled ×2. Each cell
  predicts per-class centre scores and the distances (left, top, right, bottom) from the cell centre to
  the box sides in model pixels. Decoding keeps 3×3 local maxima above the score threshold, then
  class-wise NMS, then maps boxes back to original-frame pixels through the letterbox.
- `ActionHead`: a clip classifier. Each frame's patch grid is pooled to 4×4 and projected, a temporal
  convolution mixes frames, mean+max over time gives one vector, a linear layer gives label logits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .wire import Letterbox

HEAD_FORMAT = "vlora-va-head"
HEAD_FORMAT_VERSION = 1


@dataclass
class Features:
    cls: torch.Tensor  # [B, D]
    grid: torch.Tensor  # [B, D, gh, gw] patch tokens laid out as an image

    @staticmethod
    def from_hidden(hidden: torch.Tensor, image_size: int, patch: int, prefix_tokens: int = 1) -> "Features":
        """Split a ViT's last hidden state [B, prefix + gh*gw, D] into CLS and the patch grid."""
        b, _, d = hidden.shape
        side = image_size // patch
        patches = hidden[:, prefix_tokens:prefix_tokens + side * side]
        return Features(hidden[:, 0], patches.transpose(1, 2).reshape(b, d, side, side))

    def select(self, index: torch.Tensor | slice) -> "Features":
        return Features(self.cls[index], self.grid[index])


class DetectionHead(nn.Module):
    def __init__(self, hidden: int, classes: list[str], width: int = 128, image_size: int = 224,
                 score_threshold: float = 0.3, nms_iou: float = 0.5, max_detections: int = 100, norm: bool = False,
                 **_: object):
        super().__init__()
        self.classes, self.image_size = list(classes), image_size
        self.score_threshold, self.nms_iou, self.max_detections = score_threshold, nms_iou, max_detections
        # norm=True puts GroupNorm after each conv (as FCOS heads do): ViT tokens have a few very large
        # channels, and without it early training spikes. False keeps the original layout loadable.
        def block(conv: nn.Module) -> list[nn.Module]:
            return [conv, nn.GroupNorm(16, width), nn.GELU()] if norm else [conv, nn.GELU()]

        self.stem = nn.Sequential(*block(nn.Conv2d(hidden, width, 1)), *block(nn.Conv2d(width, width, 3, padding=1)))
        self.refine = nn.Sequential(*block(nn.Conv2d(width, width, 3, padding=1)))
        # 1x1 outputs: the 3x3 refine already mixes neighbours at the ×2 resolution, where 3x3 outputs
        # would triple the head's cost (the head runs at 4× the patch count).
        self.cls_out = nn.Conv2d(width, len(classes), 1)
        self.box_out = nn.Conv2d(width, 4, 1)
        # Start with every cell at ~1% objectness (focal-loss prior): an untrained head detects nothing.
        nn.init.constant_(self.cls_out.bias, -math.log(99.0))

    def forward(self, feats: Features) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (class logits [B, C, H, W], box distances [B, 4, H, W] in model pixels)."""
        x = self.stem(feats.grid)
        x = self.refine(F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False))
        stride = self.image_size / x.shape[-1]
        return self.cls_out(x), F.softplus(self.box_out(x)) * stride

    def cell_centres(self, h: int, w: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        sy, sx = self.image_size / h, self.image_size / w
        ys = (torch.arange(h, device=device, dtype=torch.float32) + 0.5) * sy
        xs = (torch.arange(w, device=device, dtype=torch.float32) + 0.5) * sx
        return ys[:, None].expand(h, w), xs[None, :].expand(h, w)

    @torch.no_grad()
    def decode(self, raw: tuple[torch.Tensor, torch.Tensor], letterboxes: list[Letterbox],
               orig_sizes: list[tuple[int, int]]) -> list[list[dict]]:
        """Per image: [{"box": [x1, y1, x2, y2] original pixels, "class": name, "score": p}], best first."""
        logits, dist = raw
        scores = logits.sigmoid()
        peaks = scores == F.max_pool2d(scores, 3, stride=1, padding=1)
        cy, cx = self.cell_centres(scores.shape[-2], scores.shape[-1], scores.device)
        out = []
        for i in range(scores.shape[0]):
            keep = (peaks[i] & (scores[i] >= self.score_threshold)).nonzero()  # [K, 3] = class, y, x
            cls_idx, yy, xx = keep.unbind(1)
            s = scores[i, cls_idx, yy, xx]
            d = dist[i, :, yy, xx]
            boxes = torch.stack([cx[yy, xx] - d[0], cy[yy, xx] - d[1], cx[yy, xx] + d[2], cy[yy, xx] + d[3]], 1)
            kept = batched_nms(boxes, s, cls_idx, self.nms_iou)[: self.max_detections]
            out.append(_to_original(boxes[kept], s[kept], cls_idx[kept], self.classes, letterboxes[i], orig_sizes[i]))
        return out


def _to_original(boxes: torch.Tensor, scores: torch.Tensor, cls_idx: torch.Tensor, classes: list[str],
                 lb: Letterbox, orig_size: tuple[int, int]) -> list[dict]:
    w, h = orig_size
    b = boxes.clone()
    b[:, 0::2] = ((b[:, 0::2] - lb.pad_x) / lb.scale).clamp(0, w)
    b[:, 1::2] = ((b[:, 1::2] - lb.pad_y) / lb.scale).clamp(0, h)
    return [{"box": [round(v, 1) for v in box], "class": classes[c], "score": round(float(p), 4)}
            for box, p, c in zip(b.tolist(), scores.tolist(), cls_idx.tolist())]


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IoU matrix [len(a), len(b)] of x1y1x2y2 boxes."""
    area_a = (a[:, 2] - a[:, 0]).clamp(min=0) * (a[:, 3] - a[:, 1]).clamp(min=0)
    area_b = (b[:, 2] - b[:, 0]).clamp(min=0) * (b[:, 3] - b[:, 1]).clamp(min=0)
    lt = torch.maximum(a[:, None, :2], b[None, :, :2])
    rb = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    return inter / (area_a[:, None] + area_b[None, :] - inter).clamp(min=1e-9)


def batched_nms(boxes: torch.Tensor, scores: torch.Tensor, classes: torch.Tensor, iou: float) -> torch.Tensor:
    """Indices kept by class-wise greedy NMS, highest score first (torchvision's nms, without torchvision)."""
    order = scores.argsort(descending=True)
    if order.numel() == 0:
        return order
    # Offsetting boxes per class keeps classes from suppressing each other in one IoU matrix.
    offset = classes.to(boxes.dtype)[:, None] * (boxes.max() + 1)
    ious = box_iou(boxes + offset, boxes + offset)[order][:, order]
    keep: list[int] = []
    suppressed = torch.zeros(order.numel(), dtype=torch.bool)
    for i in range(order.numel()):
        if suppressed[i]:
            continue
        keep.append(i)
        suppressed |= ious[i] > iou
    return order[torch.tensor(keep, dtype=torch.long)]


class ActionHead(nn.Module):
    """Clip classifier over the patch-token grids of clip_len frames.

    spatial="pooled": each frame's grid is averaged to pool x pool cells, then a temporal convolution.
    spatial="local": a 3-D convolution over (time, rows, cols) of the full grid, then max and mean over
    the clip: a person one patch wide moving a patch or two per second shows up as features shifting to
    a neighbouring patch, which pooled cells average away; the max finds the strongest mover.
    motion=True also feeds frame-to-frame feature differences (direction of travel lives in them).
    """

    def __init__(self, hidden: int, labels: list[str], width: int = 64, pool: int = 4, motion: bool = False,
                 spatial: str = "pooled", **_: object):
        super().__init__()
        if spatial not in ("pooled", "local"):
            raise ValueError(f"action head: spatial must be 'pooled' or 'local', got {spatial!r}")
        self.labels, self.pool, self.motion, self.spatial = list(labels), pool, motion, spatial
        self.project = nn.Sequential(nn.Conv2d(hidden, width, 1), nn.GELU())
        channels = width * (2 if motion else 1)
        if spatial == "local":
            self.temporal = nn.Conv3d(channels, 2 * width, kernel_size=3, padding=1)
            self.classify = nn.Linear(4 * width, len(labels))
        else:
            self.temporal = nn.Conv1d(channels * pool * pool, 256, kernel_size=3, padding=1)
            self.classify = nn.Linear(512, len(labels))

    def forward(self, feats: Features, clip_len: int) -> torch.Tensor:
        """feats holds B*clip_len frames, clip-major; returns label logits [B, L]."""
        grid = feats.grid if self.spatial == "local" else F.adaptive_avg_pool2d(feats.grid, self.pool)
        x = self.project(grid)                                          # [B*T, C, h, w]
        x = x.reshape(-1, clip_len, *x.shape[1:]).transpose(1, 2)       # [B, C, T, h, w]
        if self.motion:
            x = torch.cat([x, F.pad(x[:, :, 1:] - x[:, :, :-1], (0, 0, 0, 0, 1, 0))], dim=1)
        if self.spatial == "local":
            x = F.gelu(self.temporal(x)).flatten(2)                      # [B, 2w, T*h*w]
        else:
            x = F.gelu(self.temporal(x.transpose(1, 2).flatten(2).transpose(1, 2)))  # [B, 256, T]
        return self.classify(torch.cat([x.mean(-1), x.amax(-1)], dim=1))

    @torch.no_grad()
    def decode(self, logits: torch.Tensor) -> list[dict]:
        probs = logits.softmax(-1)
        best = probs.argmax(-1)
        return [{"label": self.labels[int(k)], "score": round(float(p[k]), 4),
                 "scores": {lab: round(float(v), 4) for lab, v in zip(self.labels, p.tolist())}}
                for k, p in zip(best, probs)]


HEAD_TYPES = {"detection": DetectionHead, "action": ActionHead}


def build_head(config: dict, hidden: int) -> nn.Module:
    kind = config.get("task")
    if kind not in HEAD_TYPES:
        raise ValueError(f"head_config.json: unknown task {kind!r} (known: {', '.join(HEAD_TYPES)})")
    params = dict(config.get("params", {}))
    if kind == "detection":
        return DetectionHead(hidden, config["classes"], **params)
    return ActionHead(hidden, config["labels"], **params)
