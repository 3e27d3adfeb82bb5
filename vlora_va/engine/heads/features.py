"""What a backbone forward gives the heads: per image, the CLS token and the patch-token grid (and, for a head with
a detail branch or a request that wants appearance embeddings, the normalised model input itself; for the latter also
the patch grid where the LoRA-free prefix ends, `mid`, which engine/heads/appearance.py pools)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# The normalisation of `pixels` (and of every model input: backends/torch_eager.normalise): ImageNet's mean and std
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass
class Features:
    cls: torch.Tensor  # [B, D]
    grid: torch.Tensor  # [B, D, gh, gw] patch tokens laid out as an image
    pixels: torch.Tensor | None = None  # [B, 3, S, S] the normalised model input (heads with a detail branch)
    mid: torch.Tensor | None = None  # [B, D, gh, gw] LoRA-free tokens of a middle block (appearance embeddings)

    @classmethod
    def from_hidden(cls, hidden: torch.Tensor, image_size: int, patch: int, prefix_tokens: int = 1) -> "Features":
        """Split a ViT's last hidden state [B, prefix + gh*gw, D] into CLS and the patch grid."""
        return cls(hidden[:, 0], token_grid(hidden, image_size, patch, prefix_tokens))

    def select(self, index: torch.Tensor | slice) -> "Features":
        return Features(self.cls[index], self.grid[index], None if self.pixels is None else self.pixels[index],
                        None if self.mid is None else self.mid[index])


def token_grid(hidden: torch.Tensor, image_size: int, patch: int, prefix_tokens: int = 1) -> torch.Tensor:
    """A ViT hidden state [B, prefix + gh*gw, D] -> its patch tokens laid out as an image [B, D, gh, gw]."""
    b, _, d = hidden.shape
    side = image_size // patch
    return hidden[:, prefix_tokens:prefix_tokens + side * side].transpose(1, 2).reshape(b, d, side, side)

