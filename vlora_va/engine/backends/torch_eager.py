"""The "torch" backbone backend: the Hugging Face model run eagerly by PyTorch, with the LoRA of each row as the plan's
mode says (vlora_va/engine/lora.py), and, where the engine uses fixed layouts (a GPU), one captured forward per plan key
(vlora_va/engine/cuda_graphs.py).

The model runs in two parts: the embeddings and blocks [0, split) (`lower`), then blocks [split, L) and the final
norm (`upper`); both parts give exactly the model's own forward (last_hidden_state). Adapters with LoRA on the upper
blocks only leave the lower ones untouched, so those are the same for every adapter: a batch runs them once per
distinct frame for all the tasks that look at it (shared prefix) and forks their output, one copy per request,
before the LoRA turns on; training caches them once per frame (vlora_va/training/features.py). Frames are grouped by
adapter slot (each adapter's rows contiguous, as ATMM wants), run, and put back in the callers' order.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vlora_va.contracts.requests import frame_key
from vlora_va.engine.backbones import patch_size
from vlora_va.engine.backends import BackboneBackend
from vlora_va.engine.cuda_graphs import Graphs
from vlora_va.engine.heads.features import IMAGENET_MEAN, IMAGENET_STD, Features, token_grid
from vlora_va.engine.lora import LoRAContext
from vlora_va.engine.modes import DeviceLayout, LoRAMode
from vlora_va.engine.plan import bucket
from vlora_va.engine.vit import base_model, blocks
from vlora_va.kernels.fused import DEFAULT_TILES


def normalise(images: torch.Tensor) -> torch.Tensor:
    """uint8 [N, H, W, 3] RGB → float [N, 3, H, W] with ImageNet mean/std: the input every backbone here
    expects (serving and training both go through this)."""
    mean = torch.tensor(IMAGENET_MEAN, device=images.device).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD, device=images.device).view(1, 3, 1, 1)
    return (images.permute(0, 3, 1, 2).float() / 255.0 - mean) / std


def model_input(images: torch.Tensor, size: int | None = None) -> torch.Tensor:
    """uint8 [N, H, W, 3] RGB -> the model input [N, 3, size, size]: resized (bilinear, antialiased), then normalised.
    In that order because both are linear (the filter's weights sum to 1), so the values are the same to float
    rounding either way, and this way is half the work: the resize reads the frames in their own channels-last
    layout, and normalising touches the smaller image (8 frames 336 -> 224 px: 13 -> 7 ms on 2 cores)."""
    if size is not None and size != images.shape[1]:
        x = images.permute(0, 3, 1, 2).float()  # channels-last in memory, as the frames are
        x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
        images = x.permute(0, 2, 3, 1)
    return normalise(images)


def _run(block: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    out = block(hidden)
    return out[0] if isinstance(out, tuple) else out  # older transformers return a tuple


def lower(model: nn.Module, pixels: torch.Tensor, split: int) -> torch.Tensor:
    """Embeddings + blocks [0, split): [B, tokens, D]."""
    return middle(model, base_model(model).embeddings(pixels), 0, split)


def middle(model: nn.Module, hidden: torch.Tensor, start: int, stop: int | None = None) -> torch.Tensor:
    """Blocks [start, stop) (stop None: to the last), without the final norm."""
    for block in blocks(model)[start:stop]:
        hidden = _run(block, hidden)
    return hidden


def upper(model: nn.Module, hidden: torch.Tensor, split: int) -> torch.Tensor:
    """Blocks [split, L) + the final norm: the backbone's last hidden state (what heads read)."""
    return base_model(model).layernorm(middle(model, hidden, split))


def forward(model: nn.Module, pixels: torch.Tensor, split: int,
            at_split: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """The whole forward, with `at_split` applied to the hidden state between blocks [0, split) and the rest
    (where a caller forks shared-prefix rows and turns the LoRA on): upper(at_split(lower(pixels)))."""
    return upper(model, at_split(lower(model, pixels, split)), split)


def _inverse(order: list[int]) -> torch.Tensor:
    """The permutation that undoes `order` (position k holds frame order[k])."""
    inverse = torch.empty(len(order), dtype=torch.long)
    inverse[torch.tensor(order)] = torch.arange(len(order))
    return inverse


class TorchBackbone(BackboneBackend):
    def __init__(self, backbone: torch.nn.Module, lora_ctx: LoRAContext | None, device: torch.device,
                 dtype: torch.dtype, max_batch_images: int, fixed_layout: bool = False, precision: str = "fp32"):
        super().__init__(backbone, lora_ctx, device, dtype, max_batch_images)  # the engine applied the precision
        self.patch = patch_size(backbone)
        # Tokens before the patch grid: CLS plus any register tokens.
        self.prefix_tokens = 1 + int(getattr(backbone.config, "num_register_tokens", 0) or 0)
        # LoRA layouts in fixed-size device tensors, batches padded to a power of two (what CUDA graphs replay;
        # on by default on a GPU, where per-layer host work costs more than the LoRA math).
        self.fixed_layout = fixed_layout
        self._layouts: dict[tuple[int, int], DeviceLayout] = {}
        # On a GPU, unmerged layers run as one fused kernel each (kernels/fused.py): on an H200 the backbone's
        # overhead over merged weights fell from +82% / +70% (cuBLAS + ATMM's two kernels) to +48% / +62% at batch
        # 16 / 64 with the default 64-wide stacks (bench/results/gpu/h200-fused).
        if lora_ctx is not None and device.type == "cuda":
            lora_ctx.fused = DEFAULT_TILES
        self.graphs = Graphs(self, enabled=fixed_layout, cuda_graphs=device.type == "cuda",
                             max_bucket=max_batch_images)

    def warmed(self) -> None:
        self.graphs.serving = True

    def pixels(self, frames: list[np.ndarray], size: int | None = None) -> torch.Tensor:
        # np.stack copies: the received buffers stay untouched
        return model_input(torch.from_numpy(np.stack(frames)).to(self.device), size).to(self.dtype)

    @torch.inference_mode()
    def features(self, frames: list[np.ndarray], slots: list[int], mode: LoRAMode, size: int, prefix: int = 0,
                 keep_pixels: bool = False, keys: list | None = None, mid_layer: int = 0) -> Features:
        keys = keys if keys is not None else [frame_key(f) for f in frames]
        # Group frames by slot so each adapter's rows are contiguous for ATMM, then restore the order.
        order = sorted(range(len(frames)), key=lambda i: slots[i])
        distinct: dict[tuple, int] = {}
        source = [distinct.setdefault(keys[i], len(distinct)) for i in order]
        unique = list({keys[i]: frames[i] for i in order}.values())
        n = len(order)
        row_slots = [slots[i] for i in order]
        pixels = self.pixels(unique, size)
        # a captured forward (CUDA graph) for this shape and mode; none when a middle layer is wanted too
        key = None if mid_layer else self.graphs.key(size, n, mode, prefix, forked=len(unique) != n)
        if key is not None:
            tokens = self.prefix_tokens + (size // self.patch) ** 2
            hidden = self.graphs.get(key, mode, tokens).run(pixels, row_slots, mode)
            return self._features(hidden, order, size, pixels if keep_pixels else None, source)

        def lora_on(hidden: torch.Tensor) -> torch.Tensor:
            """Between the LoRA-free prefix and the rest: fork shared rows, pad to the layout, begin the LoRA."""
            if len(unique) != n:
                hidden = hidden[torch.tensor(source, device=hidden.device)]  # fork: one copy per request
            layout = self.layout(n, hidden.shape[1]) if self.lora_ctx is not None and self._layout_serves(mode) else None
            if layout is not None and layout.images > n:  # pad to the bucket: padding rows sit out of every LoRA
                hidden = torch.cat([hidden, hidden.new_zeros(layout.images - n, *hidden.shape[1:])])
            if self.lora_ctx is not None:
                self.lora_ctx.begin(mode, row_slots, layout)
            return hidden

        tapped: list[torch.Tensor] = []
        hook = blocks(self.backbone)[mid_layer - 1].register_forward_hook(
            lambda _m, _i, out: tapped.append(out[0] if isinstance(out, tuple) else out)) if mid_layer else None
        try:
            hidden = forward(self.backbone, pixels, prefix, lora_on)[:n]
        finally:
            if hook is not None:
                hook.remove()
            if self.lora_ctx is not None:
                self.lora_ctx.clear()
        feats = self._features(hidden, order, size, pixels if keep_pixels else None, source)
        if tapped:
            # inside the shared prefix the rows are the distinct frames; after it, one per request (fork, padding)
            mid = tapped[0][torch.tensor(source, device=hidden.device)] if mid_layer <= prefix else tapped[0][:n]
            feats.mid = token_grid(self._in_callers_order(mid, order), size, self.patch, self.prefix_tokens)
        return feats

    def _features(self, hidden: torch.Tensor, order: list[int], size: int, pixels: torch.Tensor | None,
                  source: list[int]) -> Features:
        """Back to the callers' frame order, in float32 (what heads read). pixels[source[k]] is the input of
        the k-th frame in `order`; None: the features carry no pixels (no head of the batch reads them)."""
        feats = Features.from_hidden(self._in_callers_order(hidden, order), size, self.patch, self.prefix_tokens)
        if pixels is not None:
            feats.pixels = pixels[torch.tensor(source)[_inverse(order)].to(pixels.device)]
        return feats

    @staticmethod
    def _in_callers_order(rows: torch.Tensor, order: list[int]) -> torch.Tensor:
        """Rows in slot order (the k-th is frame order[k]) back to the callers' frame order, in float32."""
        return rows[_inverse(order).to(rows.device)].float()

    def _layout_serves(self, mode: LoRAMode) -> bool:
        return self.fixed_layout and mode.impl == "atmm"

    def whole(self, pixels: torch.Tensor) -> torch.Tensor:
        """The model's forward on model inputs, LoRA as the context says (what a captured forward records)."""
        return upper(self.backbone, lower(self.backbone, pixels, 0), 0)

    def layout(self, images: int, tokens: int) -> DeviceLayout:
        """The fixed-size layout for a batch of `images` (rounded up to its bucket), made once per shape."""
        key = (bucket(images), tokens)
        if key not in self._layouts:
            with torch.inference_mode(False):  # ordinary tensors: every batch rewrites them in place
                self._layouts[key] = DeviceLayout(key[0], tokens, self.lora_ctx.num_slots, self.lora_ctx.max_rank,
                                                  self.device)
        return self._layouts[key]
