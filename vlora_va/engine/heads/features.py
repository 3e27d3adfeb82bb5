"""What a backbone forward gives the heads: per image, the CLS token and the patch-token grid (and, for a head with
a detail branch, the normalised model input itself)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Features:
    cls: torch.Tensor  # [B, D]
    grid: torch.Tensor  # [B, D, gh, gw] patch tokens laid out as an image
    pixels: torch.Tensor | None = None  # [B, 3, S, S] the normalised model input (heads with a detail branch)

    @classmethod
    def from_hidden(cls, hidden: torch.Tensor, image_size: int, patch: int, prefix_tokens: int = 1) -> "Features":
        """Split a ViT's last hidden state [B, prefix + gh*gw, D] into CLS and the patch grid."""
        b, _, d = hidden.shape
        side = image_size // patch
        patches = hidden[:, prefix_tokens:prefix_tokens + side * side]
        return cls(hidden[:, 0], patches.transpose(1, 2).reshape(b, d, side, side))

    def select(self, index: torch.Tensor | slice) -> "Features":
        return Features(self.cls[index], self.grid[index], None if self.pixels is None else self.pixels[index])

