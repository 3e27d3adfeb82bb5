"""Video frames for training and evaluation, and the exact model preprocessing used at serving time.

Ingest letterboxes each frame into a square of `image_size` (aspect kept, centred, pad value 114) and the
model sees ImageNet-normalised RGB. Training on anything else would teach the heads a different geometry.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from vlora_va.contracts.geometry import Letterbox
from vlora_va.engine.backends.torch_eager import normalise
from vlora_va.ingest.chunker import letterbox, letterbox_geometry


@dataclass
class TrainingFrame:
    video: str  # file name stem, e.g. "pedestrians"
    t: float  # media time in seconds
    rgb: np.ndarray  # original frame, uint8 [H, W, 3]
    view: str = ""  # "" = the decoded frame; else which augmented view of it this is (augment.py), e.g. a crop

    @property
    def key(self) -> str:
        return f"{self.video}@{self.t:.3f}" + (f"#{self.view}" if self.view else "")

    @property
    def size(self) -> tuple[int, int]:
        return self.rgb.shape[1], self.rgb.shape[0]


def letterbox_params(width: int, height: int, side: int) -> Letterbox:
    """The letterbox ingest applies to a width x height frame (training must see what serving sees)."""
    return letterbox_geometry(width, height, side)[2]


def letterboxed(frames: list[TrainingFrame], side: int, flip: bool = False) -> tuple[torch.Tensor, list[Letterbox]]:
    """uint8 [N, side, side, 3]: the frames letterboxed as ingest does; flip=True mirrors them (augmentation)."""
    boxed = [letterbox(f.rgb, side) for f in frames]
    imgs = np.stack([b[0][:, ::-1] if flip else b[0] for b in boxed])
    return torch.from_numpy(np.ascontiguousarray(imgs)), [b[1] for b in boxed]


def letterboxed_batch(frames: list[TrainingFrame], side: int, flip: bool = False) -> tuple[torch.Tensor, list[Letterbox]]:
    """Letterboxed, normalised batch; flip=True mirrors the letterboxed image (training augmentation)."""
    imgs, lbs = letterboxed(frames, side, flip)
    return normalise(imgs), lbs


def read_frames(path: str | Path, start: float = 0.0, end: float | None = None, step: float | None = None) -> list[TrainingFrame]:
    """Decode frames with start <= t < end, keeping one every `step` seconds (None: every frame)."""
    return list(iter_frames(path, start, end, step))


def iter_frames(path: str | Path, start: float = 0.0, end: float | None = None, step: float | None = None):
    """Generator form of `read_frames` (long ranges need not fit in memory)."""
    import av

    path = Path(path)
    next_t = start
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        for i, frame in enumerate(container.decode(stream)):
            t = float(frame.pts * stream.time_base) if frame.pts is not None else i / float(stream.average_rate)
            if t < start - 1e-6:
                continue
            if end is not None and t >= end - 1e-6:
                break
            if step is not None and t < next_t - 1e-6:
                continue
            yield TrainingFrame(path.stem, round(t, 3), frame.to_ndarray(format="rgb24"))
            while step is not None and next_t <= t + 1e-6:
                next_t += step
