"""A LoRA linear layer in one kernel over the per-image layout: the base GEMM, its bias and each image's LoRA
(shrink and expand) in one pass, so the output is written once and the input read once. As a plain loop::

    for i in range(n_images):                 # image i owns rows i*T .. i*T + T - 1
        rows = slice(i * T, (i + 1) * T)
        y[rows] = x[rows] @ W.T + bias
        if length[i] > 0:
            a = slot[i]
            y[rows] += scale[a] * (x[rows] @ A[a, :ranks[a]].T) @ B[a, :, :ranks[a]].T

Why: on an H100 the unmerged backbone (cuBLAS base GEMM, then ATMM's shrink and expand kernels) cost +65-83%
over merged weights at batch 64 / 16 (bench/results/gpu/h100): the two LoRA kernels re-read x and read and
rewrite y, at ViT-S sizes as much memory traffic as the GEMM itself. Fused, the LoRA adds two small dots per tile.

How a tile of BLOCK_M rows finds its adapters: BLOCK_M <= T, so a tile spans at most two images (a and b). The
K loop multiplies the x tile by W's tile and by one [BLOCK_K, 2 * BLOCK_R] tile that holds A of a's slot in its
first BLOCK_R columns and A of b's slot in the rest; the epilogue keeps, per row, only its own image's half
(scaled, zero where the image sits out) and multiplies it by the matching [2 * BLOCK_R, BLOCK_N] tile of B.
BLOCK_R must cover the largest rank in the stacks; entries past a slot's rank are zero, so they add nothing.

The entry is ``kernels.ops.lora_linear_images``: it asks the registered backend (kernels/backend.py, the fused
path). The "triton" backend launches the kernel (kernels/triton_fused.py), or for images of fewer than 16 tokens
the unfused torch form below; the "cpu" backend runs the torch form (linear + atmm_images_torch, any device).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vlora_va.kernels.images import atmm_images_torch


@dataclass(frozen=True)
class FusedTiles:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


# The fastest of the candidates on an H200 at ViT-S shapes (median over layer shapes and batch 16 / 64, rank tile
# 64: bench/results/gpu/h200-fused/gpu-fused.json); the engine's tiles on CUDA.
DEFAULT_TILES = FusedTiles(128, 128, 32, 8, 3)
# What bench/gpu.py's fused part times on a GPU: GEMM tiles Triton's Hopper matmuls use.
CANDIDATE_TILES = (FusedTiles(64, 64, 32, 4, 3), FusedTiles(128, 64, 32, 4, 3), FusedTiles(64, 128, 32, 4, 3),
                   DEFAULT_TILES, FusedTiles(128, 128, 64, 8, 3), FusedTiles(128, 64, 64, 4, 4))


def rank_block(max_rank: int) -> int:
    """BLOCK_R for adapters of rank <= max_rank: a power of two >= 16 (a tensor-core dot's smallest side)."""
    r = 16
    while r < max_rank:
        r *= 2
    return r


def lora_linear_images_torch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, A: torch.Tensor,
                             B: torch.Tensor, slot: torch.Tensor, length: torch.Tensor, scale: torch.Tensor,
                             ranks: torch.Tensor, tokens: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """The loop in the module docstring, unfused: the base layer, then each image's LoRA (atmm_images_torch).
    Arguments as ``kernels.ops.lora_linear_images``."""
    y = torch.nn.functional.linear(x, weight, bias)
    atmm_images_torch(y, x, A, B, slot, length, scale, ranks, tokens)
    if out is not None:
        out.copy_(y)
        return out
    return y
