"""ATMM over a fixed layout of per-image runs: the form a CUDA graph can replay. The layout (each image's
slot and whether it takes part) lives in device tensors that every batch overwrites in place; what is
launched depends only on the number of images (the batch bucket), never on the data. As a plain loop::

    for i in range(n_images):                 # image i owns rows i*T .. i*T + T - 1
        if length[i] > 0:
            a = slot[i]
            rows = slice(i * T, (i + 1) * T)
            y[rows] += sign * scale[a] * (x[rows] @ A[a, :ranks[a]].T) @ B[a, :, :ranks[a]].T

The entry is ``kernels.ops.atmm_images``: it asks the registered backend (kernels/backend.py, the images path).
The "triton" backend launches its kernels with one run per image and the tiles the tuned table holds for this
layout (`vlora-va tune`: its ``images/`` buckets); the "cpu" backend runs ``atmm_images_torch`` below (torch ops,
any device).
"""

from __future__ import annotations

import torch


def atmm_images_torch(y: torch.Tensor, x: torch.Tensor, A: torch.Tensor, B: torch.Tensor, slot: torch.Tensor,
                      length: torch.Tensor, scale: torch.Tensor, ranks: torch.Tensor, tokens: int,
                      sign: float = 1.0) -> None:
    """The loop in the module docstring as two batched GEMMs over each image's adapter (ranks padded with the
    stacks' zeros, so the result is exact; ranks is unused for that reason). Arguments as
    ``kernels.ops.atmm_images``."""
    n = slot.shape[0]
    index = slot.long()
    w = (scale.index_select(0, index) * sign * (length > 0)).to(x.dtype)  # [n]: 0 for images that sit out
    xi = x.view(n, tokens, x.shape[1])
    hi = torch.bmm(xi, A.index_select(0, index).transpose(1, 2)) * w[:, None, None]
    y.view(n, tokens, y.shape[1]).baddbmm_(hi, B.index_select(0, index).transpose(1, 2))
