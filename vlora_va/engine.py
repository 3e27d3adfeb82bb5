"""The inference engine: one backbone, adapters in LoRA slots (served by ATMM), and their task heads.

`Engine.run(batch)` takes requests that may each want a different adapter, runs ONE backbone forward over
all their frames (every frame carrying its adapter's slot), then each adapter's head on its requests'
features, and returns one output dict per request.

Frames arrive letterboxed to the daemon's `image_size`; an adapter trained at a smaller size (its
head_config `image_size`) gets them resized to that size, so tasks that need detail (small objects) and
tasks that do not share one daemon: one backbone forward per image size present in the batch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .adapters import Adapter
from .heads import ActionHead, DetectionHead, Features
from .lora import enable_premerge, inject_lora, load_adapter, premerge_bytes
from .models import normalise, patch_size
from .requests import Request
from .wire import Letterbox

log = logging.getLogger(__name__)


@dataclass
class Output:
    request: Request
    result: dict  # "frames": [...] for detection; "label"/"score"/"scores" (+ "persons") for action
    batch_images: int


class Engine:
    def __init__(self, backbone: torch.nn.Module, adapters: dict[str, Adapter], image_size: int,
                 max_slots: int = 8, max_rank: int = 64, device: str | torch.device = "cpu",
                 premerge_max_mb: int = 0):
        if len(adapters) > max_slots:
            raise ValueError(f"{len(adapters)} adapters configured but daemon.max_slots is {max_slots}")
        self.device = torch.device(device)
        self.backbone = backbone.to(self.device).eval()
        self.image_size = image_size
        self.patch = patch_size(backbone)
        # Tokens before the patch grid: CLS plus any register tokens.
        self.prefix_tokens = 1 + int(getattr(backbone.config, "num_register_tokens", 0) or 0)
        # An adapter that does not fit this backbone is rejected alone: the others still serve.
        self.rejected = {name: p for name, a in adapters.items() if (p := self._misfit(a, max_rank))}
        for name, problem in self.rejected.items():
            log.error("adapter %s rejected: %s", name, problem)
        adapters = {name: a for name, a in adapters.items() if name not in self.rejected}
        self.adapters = adapters
        self.slots = {name: i for i, name in enumerate(adapters)}
        self.sizes = {name: int(a.head_config.get("image_size", image_size)) for name, a in adapters.items()}
        for name, size in self.sizes.items():
            if size > image_size:
                log.warning("adapter %s was trained at %d px but frames arrive at %d px (daemon.image_size): "
                            "it will see upscaled frames", name, size, image_size)
        modules = sorted({m for a in adapters.values() for m in a.lora})
        self.lora_ctx = None
        if modules:
            self.lora_ctx = inject_lora(self.backbone, modules, num_slots=max(1, len(adapters)), max_rank=max_rank)
            for name, a in adapters.items():
                load_adapter(self.backbone, self.slots[name], a.lora, a.scale)
            self._maybe_premerge(premerge_max_mb)
        for a in adapters.values():
            a.head.to(self.device).eval()

    def _maybe_premerge(self, max_mb: int) -> None:
        # On CPU, per-adapter merged weights beat base GEMM + LoRA GEMMs (bench/atmm.py); on CUDA the
        # Triton kernels serve the LoRA instead.
        mb = premerge_bytes(self.backbone) / 2**20
        if self.device.type == "cpu" and 0 < mb <= max_mb:
            enable_premerge(self.backbone)
            log.info("LoRA: premerged weights for %d slot(s), %.0f MB", len(self.slots), mb)
        else:
            log.info("LoRA: ATMM (premerged weights would take %.0f MB, limit %d MB)", mb, max_mb)

    def _misfit(self, a: Adapter, max_rank: int) -> str | None:
        """Why this adapter cannot run on this backbone, or None."""
        linear = {n: m for n, m in self.backbone.named_modules() if isinstance(m, torch.nn.Linear)}
        for module, (A, B) in a.lora.items():
            layer = linear.get(module)
            if layer is None:
                return f"LoRA targets {module!r}, which is not a linear layer of this backbone (another backbone?)"
            if A.shape[1] != layer.in_features or B.shape[0] != layer.out_features:
                return (f"{module}: LoRA A {tuple(A.shape)} / B {tuple(B.shape)} do not fit the layer "
                        f"({layer.in_features} -> {layer.out_features})")
        if a.lora and a.rank > max_rank:
            return f"rank {a.rank} > daemon.max_rank {max_rank}"
        size = a.head_config.get("image_size", self.image_size)
        if not isinstance(size, int) or size <= 0 or size % self.patch:
            return f"head_config image_size {size!r} is not a positive multiple of the patch size {self.patch}"
        return None

    def pixels(self, frames: list[np.ndarray], size: int | None = None) -> torch.Tensor:
        """uint8 [H, W, 3] frames → normalised float [N, 3, size, size]."""
        # np.stack copies: the received buffers stay untouched
        x = normalise(torch.from_numpy(np.stack(frames)).to(self.device))
        if size is not None and size != x.shape[-1]:  # resizing is linear: same before or after normalising
            x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
        return x

    @torch.inference_mode()
    def features(self, frames: list[np.ndarray], slots: list[int], size: int | None = None) -> Features:
        """Backbone features of the frames at size px, frame i through adapter slot slots[i] (-1 = none)."""
        size = size or frames[0].shape[0]
        # Group frames by slot so each adapter's rows are contiguous for ATMM, then restore the order.
        order = sorted(range(len(frames)), key=lambda i: slots[i])
        if self.lora_ctx is not None:
            self.lora_ctx.set_rows(torch.tensor([slots[i] for i in order], dtype=torch.long))
        hidden = self.backbone(pixel_values=self.pixels([frames[i] for i in order], size)).last_hidden_state
        inverse = torch.empty(len(order), dtype=torch.long)
        inverse[torch.tensor(order)] = torch.arange(len(order))
        return Features.from_hidden(hidden[inverse.to(hidden.device)], size, self.patch, self.prefix_tokens)

    @torch.inference_mode()
    def run(self, batch: list[Request]) -> list[Output]:
        results: list[dict | None] = [None] * len(batch)
        by_size: dict[int, list[int]] = {}
        for i, r in enumerate(batch):
            by_size.setdefault(self.sizes[r.adapter], []).append(i)
        for size, members in by_size.items():
            self._run_size(batch, members, size, results)
        images = sum(r.num_images for r in batch)
        return [Output(r, res, images) for r, res in zip(batch, results)]

    def _run_size(self, batch: list[Request], members: list[int], size: int, results: list) -> None:
        """One backbone forward for the requests `members` (all at this image size), then their heads."""
        frames, slots, spans = [], [], {}
        for i in members:
            r = batch[i]
            spans[i] = (len(frames), len(frames) + r.num_images)
            frames.extend(r.frames)
            slots.extend([self.slots[r.adapter]] * r.num_images)
        feats = self.features(frames, slots, size)
        by_adapter: dict[str, list[int]] = {}
        for i in members:
            by_adapter.setdefault(batch[i].adapter, []).append(i)
        for name, idxs in by_adapter.items():
            head = self.adapters[name].head
            if isinstance(head, DetectionHead):
                self._detect(head, batch, idxs, spans, feats, results, size)
            else:
                self._classify(head, batch, idxs, spans, feats, results, size)

    def _detect(self, head: DetectionHead, batch, idxs, spans, feats: Features, results, size: int) -> None:
        rows = torch.tensor([j for i in idxs for j in range(*spans[i])], device=self.device)
        lbs = [_rescaled(batch[i].letterbox, size / batch[i].frames[0].shape[0])
               for i in idxs for _ in range(batch[i].num_images)]
        sizes = [batch[i].orig_size for i in idxs for _ in range(batch[i].num_images)]
        dets = head.decode(head(feats.select(rows)), lbs, sizes)
        k = 0
        for i in idxs:
            r = batch[i]
            results[i] = {"frames": [{"ts": round(ts, 4), "detections": d}
                                     for ts, d in zip(r.frame_ts, dets[k:k + r.num_images])]}
            k += r.num_images

    def _classify(self, head: ActionHead, batch, idxs, spans, feats: Features, results, size: int) -> None:
        # Clips of equal length go through the head together.
        by_len: dict[int, list[int]] = {}
        for i in idxs:
            by_len.setdefault(batch[i].num_images, []).append(i)
        for clip_len, group in by_len.items():
            rows = torch.tensor([j for i in group for j in range(*spans[i])], device=self.device)
            # A clip's frames share one letterbox: persons are placed through it, as detections are.
            lbs = [_rescaled(batch[i].letterbox, size / batch[i].frames[0].shape[0]) for i in group]
            sizes = [batch[i].orig_size for i in group]
            for i, res in zip(group, head.decode(head(feats.select(rows), clip_len), lbs, sizes)):
                results[i] = res


def _rescaled(lb: Letterbox, factor: float) -> Letterbox:
    """The letterbox of a frame that was resized by factor after letterboxing."""
    return lb if factor == 1.0 else Letterbox(lb.scale * factor, lb.pad_x * factor, lb.pad_y * factor)
