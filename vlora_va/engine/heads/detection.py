"""The detection head: dense, anchor-free (FCOS/CenterNet-like) on the patch grid upsampled ×2 (or ×4, optionally
joined by a small convolution branch on the input image, `detail`). Each cell predicts per-class centre scores and
the distances (left, top, right, bottom) from the cell centre to the box sides in model pixels. Decoding keeps 3×3
local maxima above the score threshold, then class-wise NMS, then maps boxes back to original-frame pixels through
the letterbox. Peak picking and the class-wise NMS it decodes with are here too (on the device; the IoU and the
greedy suppression they use are contracts.boxes').
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from vlora_va.contracts.boxes import greedy_keep, iou_matrix
from vlora_va.contracts.geometry import Letterbox
from vlora_va.contracts.results import Detection, DetectionResult, FrameDetections
from vlora_va.engine.heads.appearance import appearance_embeddings
from vlora_va.engine.heads.base import Clip, Head
from vlora_va.engine.heads.features import Features


class DetectionHead(Head):
    """Dense, anchor-free detection on the patch grid (see the module docstring)."""

    task = "detection"

    def __init__(self, hidden: int, classes: list[str], width: int = 128, image_size: int = 224,
                 score_threshold: float = 0.3, nms_iou: float = 0.5, max_detections: int = 100, norm: bool = False,
                 upsample: int = 2, detail: int = 0, **_: object):
        super().__init__()
        if upsample not in (2, 4):
            raise ValueError(f"detection head: upsample must be 2 or 4, got {upsample!r}")
        if detail and upsample != 4:
            raise ValueError(f"detection head: detail needs upsample 4, got upsample {upsample!r}")
        if not isinstance(detail, int) or detail < 0 or detail % 32:
            raise ValueError(f"detection head: detail must be 0 or a multiple of 32 channels, got {detail!r}")
        self.classes, self.image_size, self.upsample, self.detail = list(classes), image_size, upsample, detail
        self.score_threshold, self.nms_iou, self.max_detections = score_threshold, nms_iou, max_detections
        # norm=True puts GroupNorm after each conv (as FCOS heads do): ViT tokens have a few very large
        # channels, and without it early training spikes. False keeps the original layout loadable.
        def block(conv: nn.Conv2d) -> list[nn.Module]:
            return [conv, nn.GroupNorm(16, conv.out_channels), nn.GELU()] if norm else [conv, nn.GELU()]

        self.stem = nn.Sequential(*block(nn.Conv2d(hidden, width, 1)), *block(nn.Conv2d(width, width, 3, padding=1)))
        self.refine = nn.Sequential(*block(nn.Conv2d(width, width, 3, padding=1)))
        # upsample=4: a second ×2 step at half the width. Two people side by side are often one patch apart;
        # at ×2 their centre peaks fall in neighbouring cells and the 3×3 peak picking keeps only one.
        self.refine_fine = None
        out_width = width
        if upsample == 4:
            out_width = width // 2
            self.refine_fine = nn.Sequential(*block(nn.Conv2d(width + detail, out_width, 3, padding=1)))
        # detail > 0: a small convolution branch on the input image itself, at a quarter of its size, joined
        # to the ×4 grid. A patch token covers 14 model pixels, about the width of two distant people walking
        # together: the tokens alone cannot place two peaks there, the pixels show the gap between them.
        self.detail_branch = None
        if detail:
            self.detail_branch = nn.Sequential(
                *block(nn.Conv2d(3, detail // 2, 3, stride=2, padding=1)),
                *block(nn.Conv2d(detail // 2, detail, 3, stride=2, padding=1)),
                *block(nn.Conv2d(detail, detail, 3, padding=1)))
        # 1x1 outputs: the 3x3 refine already mixes neighbours at the ×2 resolution, where 3x3 outputs
        # would triple the head's cost (the head runs at 4× the patch count).
        self.cls_out = nn.Conv2d(out_width, len(classes), 1)
        self.box_out = nn.Conv2d(out_width, 4, 1)
        # Start with every cell at ~1% objectness (focal-loss prior): an untrained head detects nothing.
        nn.init.constant_(self.cls_out.bias, -math.log(99.0))

    def forward(self, feats: Features) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (class logits [B, C, H, W], box distances [B, 4, H, W] in model pixels)."""
        x = self.stem(feats.grid)
        x = self.refine(F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False))
        if self.refine_fine is not None:
            x = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
            if self.detail_branch is not None:
                x = torch.cat([x, self._detail(feats, x.shape[-2:])], 1)
            x = self.refine_fine(x)
        stride = self.image_size / x.shape[-1]
        return self.cls_out(x), F.softplus(self.box_out(x)) * stride

    def _detail(self, feats: Features, size: torch.Size) -> torch.Tensor:
        """The detail branch on the model input, resampled onto the head's finest grid (both span the image)."""
        if feats.pixels is None:
            raise ValueError("detection head: this head has a detail branch and needs the input image "
                             "(Features.pixels), which the caller did not pass")
        d = self.detail_branch(feats.pixels.to(self.detail_branch[0].weight.dtype))
        return F.interpolate(d, size=size, mode="bilinear", align_corners=False)

    def cell_centres(self, h: int, w: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        sy, sx = self.image_size / h, self.image_size / w
        ys = (torch.arange(h, device=device, dtype=torch.float32) + 0.5) * sy
        xs = (torch.arange(w, device=device, dtype=torch.float32) + 0.5) * sx
        return ys[:, None].expand(h, w), xs[None, :].expand(h, w)

    @torch.no_grad()
    def decode(self, raw: tuple[torch.Tensor, torch.Tensor], letterboxes: list[Letterbox],
               orig_sizes: list[tuple[int, int]]) -> list[list[Detection]]:
        """Per image: its detections (boxes in original pixels), best first. Everything up to the final list
        stays on the features' device, for the whole batch at once (one transfer to the host at the end)."""
        logits, dist = raw
        scores = logits.sigmoid()
        cy, cx = self.cell_centres(scores.shape[-2], scores.shape[-1], scores.device)
        image, cls_idx, yy, xx = local_peaks(scores, self.score_threshold).nonzero().unbind(1)
        s = scores[image, cls_idx, yy, xx]
        d = dist[image, :, yy, xx]  # [K, 4]
        boxes = torch.stack([cx[yy, xx] - d[:, 0], cy[yy, xx] - d[:, 1], cx[yy, xx] + d[:, 2], cy[yy, xx] + d[:, 3]], 1)
        kept = batched_nms(boxes, s, image * len(self.classes) + cls_idx, self.nms_iou)  # per image and class
        kept = kept[_first_per_group(image[kept], self.max_detections)]
        out: list[list[Detection]] = [[] for _ in range(scores.shape[0])]
        for i, b, p, c in zip(image[kept].tolist(), boxes[kept].tolist(), s[kept].tolist(), cls_idx[kept].tolist()):
            out[i].append(Detection(tuple(letterboxes[i].box_to_original(b, orig_sizes[i])), self.classes[c], p))
        return out

    @classmethod
    def from_config(cls, config: dict, hidden: int) -> "DetectionHead":
        return cls(hidden, config["classes"], **dict(config.get("params", {})))

    def serve(self, feats: Features, clips: list[Clip], forward=None) -> list[DetectionResult]:
        """Every frame of every request through the head at once; each request's detections per frame (with
        appearance embeddings for the clips that want them)."""
        lbs = [c.letterbox for c in clips for _ in range(c.frames)]
        sizes = [c.orig_size for c in clips for _ in range(c.frames)]
        dets = self.decode((forward or self)(feats), lbs, sizes)
        out, k = [], 0
        for c in clips:
            frames = dets[k:k + c.frames]
            if c.embed:
                frames = [self._embedded(d, feats, k + j, c.letterbox) for j, d in enumerate(frames)]
            out.append(DetectionResult(tuple(FrameDetections(ts, tuple(d)) for ts, d in zip(c.frame_ts, frames))))
            k += c.frames
        return out

    def _embedded(self, dets: list[Detection], feats: Features, row: int, letterbox: Letterbox) -> list[Detection]:
        """The frame's detections with their appearance embeddings (engine/heads/appearance.py), pooled from the
        tokens the features carry for it (the LoRA-free `mid` ones; the last layer's where there are none)."""
        if not dets:
            return dets
        grid = feats.mid[row] if feats.mid is not None else feats.grid[row]
        pixels = feats.pixels[row] if feats.pixels is not None else None
        model_boxes = torch.tensor([letterbox.box_to_model(d.box) for d in dets], dtype=torch.float32)
        size = pixels.shape[-1] if pixels is not None else self.image_size  # the model frame's side
        vectors = appearance_embeddings(grid, pixels, model_boxes, size).cpu().numpy()
        return [replace(d, embedding=v) for d, v in zip(dets, vectors)]


def _first_per_group(group: torch.Tensor, limit: int) -> torch.Tensor:
    """Positions of the first `limit` entries of each group value, keeping their order (entries come best
    first), as a bool mask."""
    if group.numel() == 0:
        return torch.zeros(0, dtype=torch.bool, device=group.device)
    order = torch.argsort(group, stable=True)
    g = group[order]
    starts = torch.searchsorted(g, g, right=False)  # first position of each entry's group
    rank = torch.empty_like(order)
    rank[order] = torch.arange(len(g), device=g.device) - starts
    return rank < limit


def local_peaks(scores: torch.Tensor, threshold: float) -> torch.Tensor:
    """[B, C, H, W] -> bool mask of the cells that are their 3x3 neighbourhood's maximum and >= threshold
    (CenterNet's NMS-free peak picking: one peak per object centre)."""
    return (scores == F.max_pool2d(scores, 3, stride=1, padding=1)) & (scores >= threshold)


def batched_nms(boxes: torch.Tensor, scores: torch.Tensor, classes: torch.Tensor, iou: float) -> torch.Tensor:
    """Indices kept by class-wise greedy NMS, highest score first (torchvision's nms, without torchvision).
    As a plain loop: walk the boxes best first; keep a box unless a kept box of its class overlaps it by more
    than `iou`. Computed on the boxes' device as the fixed point of keep[j] = no kept i < j suppresses j
    (contracts.boxes.greedy_keep: the same result as the loop, a few matrix steps instead of one host step per box)."""
    order = scores.argsort(descending=True)
    if order.numel() == 0:
        return order
    b, c = boxes[order], classes[order]
    over = ((iou_matrix(b, b, torch) > iou) & (c[:, None] == c[None, :])).triu(1)  # better i would suppress j
    return order[greedy_keep(over)]
