"""ATMM over a fixed layout of per-image runs: the form a CUDA graph can replay. The layout (each image's
slot and whether it takes part) lives in device tensors that every batch overwrites in place; what is
launched depends only on the number of images (the batch bucket), never on the data. As a plain loop::

    for i in range(n_images):                 # image i owns rows i*T .. i*T + T - 1
        if length[i] > 0:
            a = slot[i]
            rows = slice(i * T, (i + 1) * T)
            y[rows] += sign * scale[a] * (x[rows] @ A[a, :ranks[a]].T) @ B[a, :, :ranks[a]].T

On CUDA (or under TRITON_INTERPRET=1) it runs the Triton kernels with one run per image, with the tiles the
tuned table holds for this layout (`vlora-va tune`: its ``images/`` buckets); elsewhere two
batched GEMMs over each image's adapter (ranks padded with the stacks' zeros, so the result is exact).
"""

from __future__ import annotations

import os

import torch


def atmm_images(y: torch.Tensor, x: torch.Tensor, A: torch.Tensor, B: torch.Tensor, slot: torch.Tensor,
                length: torch.Tensor, scale: torch.Tensor, ranks: torch.Tensor, tokens: int, sign: float = 1.0,
                start: torch.Tensor | None = None, h: torch.Tensor | None = None, impl: str | None = None) -> None:
    """In place on y [n*T, out]: the loop in the module docstring. x [n*T, in]; A [S, R, in], B [S, out, R];
    slot, length int32 [n] (length is 0 or T); scale float32 [S], ranks int32 [S]; start int32 [n] = i*T (Triton
    only); h: optional float32 [n*T, >= R] scratch."""
    n = slot.shape[0]
    impl = impl or ("triton" if x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1" else "torch")
    if impl == "triton":
        from vlora_va.kernels.triton_atmm import launch, lookup_images

        if start is None:
            start = torch.arange(n, dtype=torch.int32, device=x.device) * tokens
        config = lookup_images(x.shape[1], y.shape[1], n, tokens, A.shape[1], x.device)
        launch(y, x, A, B, start, length, slot, scale, ranks, n, tokens, config=config, sign=sign, h=h)
        return
    if impl != "torch":
        raise ValueError(f"unknown impl {impl!r} (expected 'triton' or 'torch')")
    index = slot.long()
    w = (scale.index_select(0, index) * sign * (length > 0)).to(x.dtype)  # [n]: 0 for images that sit out
    xi = x.view(n, tokens, x.shape[1])
    hi = torch.bmm(xi, A.index_select(0, index).transpose(1, 2)) * w[:, None, None]
    y.view(n, tokens, y.shape[1]).baddbmm_(hi, B.index_select(0, index).transpose(1, 2))
