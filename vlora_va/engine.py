"""The inference engine: one backbone, adapters in LoRA slots (served by ATMM), and their task heads.

`Engine.run(batch)` takes requests that may each want a different adapter, runs ONE backbone forward over
all their frames (every frame carrying its adapter's slot), then each adapter's head on its requests'
features, and returns one output dict per request.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from .adapters import Adapter
from .heads import ActionHead, DetectionHead, Features
from .lora import inject_lora, load_adapter
from .models import IMAGENET_MEAN, IMAGENET_STD, patch_size
from .requests import Request

log = logging.getLogger(__name__)


@dataclass
class Output:
    request: Request
    result: dict  # "frames": [...] for detection, "label"/"score"/"scores" for action
    batch_images: int


class Engine:
    def __init__(self, backbone: torch.nn.Module, adapters: dict[str, Adapter], image_size: int,
                 max_slots: int = 8, max_rank: int = 64, device: str | torch.device = "cpu"):
        if len(adapters) > max_slots:
            raise ValueError(f"{len(adapters)} adapters configured but daemon.max_slots is {max_slots}")
        self.device = torch.device(device)
        self.backbone = backbone.to(self.device).eval()
        self.image_size = image_size
        self.patch = patch_size(backbone)
        # Tokens before the patch grid: CLS plus any register tokens.
        self.prefix_tokens = 1 + int(getattr(backbone.config, "num_register_tokens", 0) or 0)
        self.adapters = dict(adapters)
        self.slots = {name: i for i, name in enumerate(adapters)}
        modules = sorted({m for a in adapters.values() for m in a.lora})
        self.lora_ctx = None
        if modules:
            self.lora_ctx = inject_lora(self.backbone, modules, num_slots=max(1, len(adapters)), max_rank=max_rank)
            for name, a in adapters.items():
                load_adapter(self.backbone, self.slots[name], a.lora, a.scale)
        for a in adapters.values():
            a.head.to(self.device).eval()
            if a.task == "detection" and a.head_config.get("image_size", image_size) != image_size:
                log.warning("adapter %s was trained at %s px, the daemon runs at %s px", a.name,
                            a.head_config.get("image_size"), image_size)
        mean = torch.tensor(IMAGENET_MEAN, device=self.device).view(1, 3, 1, 1) * 255
        std = torch.tensor(IMAGENET_STD, device=self.device).view(1, 3, 1, 1) * 255
        self._mean, self._std = mean, std

    def pixels(self, frames: list[np.ndarray]) -> torch.Tensor:
        """uint8 [H, W, 3] frames → normalised float [N, 3, H, W]."""
        x = torch.from_numpy(np.stack(frames)).to(self.device)  # np.stack copies: received buffers stay untouched
        x = x.permute(0, 3, 1, 2).float()
        return (x - self._mean) / self._std

    @torch.inference_mode()
    def features(self, frames: list[np.ndarray], slots: list[int]) -> Features:
        """Backbone features of the frames, frame i through adapter slot slots[i] (-1 = none)."""
        # Group frames by slot so each adapter's rows are contiguous for ATMM, then restore the order.
        order = sorted(range(len(frames)), key=lambda i: slots[i])
        if self.lora_ctx is not None:
            self.lora_ctx.set_rows(torch.tensor([slots[i] for i in order], dtype=torch.long))
        hidden = self.backbone(pixel_values=self.pixels([frames[i] for i in order])).last_hidden_state
        inverse = torch.empty(len(order), dtype=torch.long)
        inverse[torch.tensor(order)] = torch.arange(len(order))
        return Features.from_hidden(hidden[inverse.to(hidden.device)], self.image_size, self.patch, self.prefix_tokens)

    @torch.inference_mode()
    def run(self, batch: list[Request]) -> list[Output]:
        frames, slots, spans = [], [], []
        for r in batch:
            spans.append((len(frames), len(frames) + r.num_images))
            frames.extend(r.frames)
            slots.extend([self.slots[r.adapter]] * r.num_images)
        feats = self.features(frames, slots)
        results: list[dict | None] = [None] * len(batch)
        by_adapter: dict[str, list[int]] = {}
        for i, r in enumerate(batch):
            by_adapter.setdefault(r.adapter, []).append(i)
        for name, idxs in by_adapter.items():
            head = self.adapters[name].head
            if isinstance(head, DetectionHead):
                self._detect(head, batch, idxs, spans, feats, results)
            else:
                self._classify(head, batch, idxs, spans, feats, results)
        return [Output(r, res, len(frames)) for r, res in zip(batch, results)]

    def _detect(self, head: DetectionHead, batch, idxs, spans, feats: Features, results) -> None:
        rows = torch.tensor([j for i in idxs for j in range(*spans[i])], device=self.device)
        lbs = [batch[i].letterbox for i in idxs for _ in range(batch[i].num_images)]
        sizes = [batch[i].orig_size for i in idxs for _ in range(batch[i].num_images)]
        dets = head.decode(head(feats.select(rows)), lbs, sizes)
        k = 0
        for i in idxs:
            r = batch[i]
            results[i] = {"frames": [{"ts": round(ts, 4), "detections": d}
                                     for ts, d in zip(r.frame_ts, dets[k:k + r.num_images])]}
            k += r.num_images

    def _classify(self, head: ActionHead, batch, idxs, spans, feats: Features, results) -> None:
        # Clips of equal length go through the head together.
        by_len: dict[int, list[int]] = {}
        for i in idxs:
            by_len.setdefault(batch[i].num_images, []).append(i)
        for clip_len, group in by_len.items():
            rows = torch.tensor([j for i in group for j in range(*spans[i])], device=self.device)
            for i, res in zip(group, head.decode(head(feats.select(rows), clip_len))):
                results[i] = res
