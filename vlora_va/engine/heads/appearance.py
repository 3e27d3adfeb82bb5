"""Appearance embeddings for tracked detections: the backbone's own patch tokens pooled inside each box.

DeepSORT, StrongSORT and BoT-SORT run a second network on every box crop for re-identification; we already ran a
vision transformer on the whole frame, so each box's embedding is a weighted mean of the tokens it covers.

The loop, per box (x1, y1, x2, y2 in model pixels) and per horizontal band k of `parts` (top to bottom):

    band rows   y in [y1 + (y2 - y1) * k / parts, y1 + (y2 - y1) * (k + 1) / parts)
    weight of patch cell (i, j) = the area of the band inside that cell (cells are patch x patch model pixels)
    band vector = sum over cells of weight * token[i, j] / sum of weights, then L2-normalised
    embedding   = the band vectors concatenated, divided by sqrt(parts)  (so it has unit length)

Why bands: a person's top and bottom halves are told apart by their clothes; one mean over the box blurs a red
jacket over blue jeans into the same vector as blue over red. Two bands raised the next-frame rank-1 match of the
project's hand-made identities from 0.89 to 0.92 (bench/reid_layers.py). Why the layer at the end of the LoRA-free
prefix (block 8 for the shipped adapters) rather than the last one: there the tokens still describe what a patch
looks like; the last layers, trained for detection, describe what it is (rank-1 0.92 at block 8, 0.76 at the end).
And those tokens are the same for every adapter, so a hot-swapped adapter keeps every track's embedding valid.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vlora_va.engine.heads.features import IMAGENET_MEAN, IMAGENET_STD

EMBED_LAYER = 8  # the tokens entering this block (or the adapter's first LoRA block, if earlier) are pooled
PARTS = 2  # horizontal bands per box (see the module docstring)
BINS = 4  # colour histogram bins per channel: 64 colours per band
SAMPLES = 8  # colour samples per band side: 8 x 8 per band
TOKEN_SHARE = 0.5  # of a cosine between two embeddings: the tokens' part; the rest is the colour histograms'
DTYPE = torch.float16  # compact: 2 x 384 + 2 x 64 halves = 1.8 kB per box for dinov2-small


def cell_weights(boxes: torch.Tensor, cells: int, patch: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per box, the length of [x1, x2] (wx [K, cells]) and of [y1, y2] (wy [K, cells]) inside each patch column
    and row: their outer product is the area of the box in each cell."""
    edges = torch.arange(cells + 1, device=boxes.device, dtype=boxes.dtype) * patch
    lo, hi = edges[:-1], edges[1:]
    wx = (torch.minimum(hi, boxes[:, 2:3]) - torch.maximum(lo, boxes[:, 0:1])).clamp(min=0)
    wy = (torch.minimum(hi, boxes[:, 3:4]) - torch.maximum(lo, boxes[:, 1:2])).clamp(min=0)
    return wx, wy


def box_embeddings(grid: torch.Tensor, boxes: torch.Tensor, image_size: int, parts: int = PARTS) -> torch.Tensor:
    """grid [D, gh, gw] one image's tokens; boxes [K, 4] in model pixels of an image_size square -> [K, parts * D]
    unit vectors in DTYPE (the loop in the module docstring). A box with no area inside the image gets zeros."""
    d, gh, gw = grid.shape
    if len(boxes) == 0:
        return torch.zeros(0, parts * d, dtype=DTYPE, device=grid.device)
    boxes = boxes.to(torch.float32)
    tokens = grid.to(torch.float32).reshape(d, gh * gw)
    wx, _ = cell_weights(boxes, gw, image_size / gw)  # the bands share their columns
    out = []
    for k in range(parts):
        band = boxes.clone()
        band[:, 1] = boxes[:, 1] + (boxes[:, 3] - boxes[:, 1]) * k / parts
        band[:, 3] = boxes[:, 1] + (boxes[:, 3] - boxes[:, 1]) * (k + 1) / parts
        _, wy = cell_weights(band, gh, image_size / gh)
        w = (wy[:, :, None] * wx[:, None, :]).reshape(len(boxes), gh * gw)  # [K, cells]
        pooled = w @ tokens.T / w.sum(1, keepdim=True).clamp(min=1e-6)  # [K, D]
        out.append(F.normalize(pooled, dim=1))
    return (torch.cat(out, 1) / parts ** 0.5).to(DTYPE)


def colour_histograms(pixels: torch.Tensor, boxes: torch.Tensor, parts: int = PARTS, bins: int = BINS,
                      samples: int = SAMPLES) -> torch.Tensor:
    """pixels [3, S, S] one normalised model input (ImageNet mean / std); boxes [K, 4] in its pixels -> [K, parts *
    bins**3] unit vectors. The loop, per box and band (as box_embeddings' bands):

        sample points  x = x1 + (x2 - x1) * (i + 0.5) / samples, y = ya + (yb - ya) * (j + 0.5) / samples for i, j
                       in 0..samples-1, each read at pixel (floor(y), floor(x)) clamped into the image
        bin of a pixel = (r * bins // 256) * bins**2 + (g * bins // 256) * bins + (b * bins // 256), r, g, b in 0..255
        band vector    = sqrt(count per bin / samples**2) (Hellinger), L2-normalised
        histogram      = the band vectors concatenated, divided by sqrt(parts)

    A fixed number of samples per band, not every pixel, so all boxes are one gather (a person is 10-30 model
    pixels wide: 8 x 8 samples read most of them)."""
    k, size = len(boxes), pixels.shape[-1]
    boxes = boxes.to(torch.float32).cpu()
    u = (torch.arange(samples, dtype=torch.float32) + 0.5) / samples
    xs = (boxes[:, 0:1] + (boxes[:, 2:3] - boxes[:, 0:1]) * u).floor().clamp(0, size - 1).long()  # [K, samples]
    image = pixels.detach().float().cpu()
    mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1, 1)
    out = []
    for part in range(parts):
        ya = boxes[:, 1:2] + (boxes[:, 3:4] - boxes[:, 1:2]) * part / parts
        yb = boxes[:, 1:2] + (boxes[:, 3:4] - boxes[:, 1:2]) * (part + 1) / parts
        ys = (ya + (yb - ya) * u).floor().clamp(0, size - 1).long()
        picked = image[:, ys[:, :, None], xs[:, None, :]]  # [3, K, samples, samples]
        q = (((picked * std + mean) * 255.0).round().clamp(0, 255).long() * bins) // 256
        index = (q[0] * bins * bins + q[1] * bins + q[2]).reshape(k, -1)
        counts = torch.zeros(k, bins ** 3).scatter_add_(1, index, torch.ones(index.shape))
        out.append(F.normalize(torch.sqrt(counts / samples ** 2), dim=1))
    return torch.cat(out, 1) / parts ** 0.5


def appearance_embeddings(grid: torch.Tensor, pixels: torch.Tensor | None, boxes: torch.Tensor,
                          image_size: int) -> torch.Tensor:
    """[K, E] unit vectors in DTYPE: sqrt(TOKEN_SHARE) * box_embeddings ++ sqrt(1 - TOKEN_SHARE) * colour_histograms
    (tokens alone, at full weight, when the caller has no pixels), so a cosine is TOKEN_SHARE * the tokens' cosine
    + the rest * the colours'."""
    tokens = box_embeddings(grid, boxes, image_size).float()
    if pixels is None:
        return tokens.to(DTYPE)
    colours = colour_histograms(pixels, boxes)
    return torch.cat([TOKEN_SHARE ** 0.5 * tokens, (1 - TOKEN_SHARE) ** 0.5 * colours], 1).to(DTYPE)
