"""Split the backbone at layer `split`: frozen lower layers cached once, upper layers trained with LoRA.

LoRA only on layers >= split leaves layers < split untouched, so their output is the same for every
adapter and every epoch: it is computed once per (backbone, image size, split, flip) and cached on disk
(fp16). Training then runs only the upper 12 - split layers. This is also what lets the engine share
the lower layers across tasks at serving time. split = num_layers gives the head-only baseline.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

from vlora_va.engine.backends.torch_eager import lower, middle, upper
from vlora_va.ingest.exposure import VERSION as EXPOSURE_VERSION
from vlora_va.training.frames import TrainingFrame, letterboxed_batch


@torch.no_grad()
def lower_hidden(model: nn.Module, pixels: torch.Tensor, split: int) -> torch.Tensor:
    """Embeddings + layers [0, split): the frozen prefix. [B, tokens, D]."""
    return lower(model, pixels, split)


def upper_hidden(model: nn.Module, hidden: torch.Tensor, split: int) -> torch.Tensor:
    """Layers [split, L) + the final layer norm: the backbone's last hidden state (what heads read)."""
    return upper(model, hidden, split)


@torch.no_grad()
def frozen_layers(model: nn.Module, lower: torch.Tensor, split: int, batch: int = 8) -> torch.Tensor:
    """Blocks [split, L) of cached lower-layer states, without the final norm, as float32 [N, tokens, D]. When
    these layers' LoRA is frozen they never change, so they run once instead of every step; then
    upper_hidden(model, out, L) == upper_hidden(model, lower, split)."""
    return torch.cat([middle(model, lower[i:i + batch].float(), split) for i in range(0, len(lower), batch)])


def full_hidden(model: nn.Module, pixels: torch.Tensor) -> torch.Tensor:
    return upper(model, lower(model, pixels, 0), 0)


class FeatureCache:
    """Lower-layer hidden states per frame key, one fp16 file per (backbone, size, split, flip, frame set)."""

    def __init__(self, root: Path, backbone_name: str, image_size: int, split: int):
        self.root = Path(root) / "features"
        # the exposure rule is part of what the pixels are (ingest/exposure.py); features from before it are not reused
        self.tag = f"{Path(backbone_name).name}-s{image_size}-l{split}-e{EXPOSURE_VERSION}"
        self.image_size, self.split = image_size, split

    def _file(self, frames: list[TrainingFrame], flip: bool) -> Path:
        digest = hashlib.sha256("|".join(f.key for f in frames).encode()).hexdigest()[:16]
        return self.root / self.tag / f"{'flip-' if flip else ''}{digest}.pt"

    def get(self, model: nn.Module, frames: list[TrainingFrame], flip: bool = False, batch: int = 8,
            progress: bool = True) -> torch.Tensor:
        """[N, tokens, D] fp16 lower-layer features of frames, computed (and saved) if missing."""
        f = self._file(frames, flip)
        if f.is_file():
            return torch.load(f, weights_only=True)
        out = []
        for i in tqdm(range(0, len(frames), batch), desc=f"caching {self.tag}{' flip' if flip else ''}",
                      disable=not progress):
            pixels, _ = letterboxed_batch(frames[i:i + batch], self.image_size, flip=flip)
            out.append(lower_hidden(model, pixels, self.split).half())
        feats = torch.cat(out)
        f.parent.mkdir(parents=True, exist_ok=True)
        # the temporary name is this process's own: runs side by side compute the same file, and a shared name let
        # one rename the other's half-written file away (FileNotFoundError in the slower run)
        tmp = f.with_suffix(f".{os.getpid()}.tmp")
        torch.save(feats, tmp)
        tmp.replace(f)
        return feats
