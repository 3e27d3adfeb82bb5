"""The backbone-backend plug-in point: what runs a plan's backbone forward (`daemon.backend`, registered in
contracts.plugins.BACKBONE_BACKENDS; "torch", eager PyTorch, is the one today).

The engine (executor.py) decides what runs: which frames, which adapter slot each, the LoRA mode, the image size and
the shared prefix. A backend only computes it: frames in, `Features` out, in the callers' order. It owns how: the
model's compiled or eager form, its input buffers, captured graphs. A new backend is one file with a
`BackboneBackend` subclass, registered by name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
import torch

from vlora_va.engine.heads.features import Features
from vlora_va.engine.lora import LoRAContext
from vlora_va.engine.modes import LoRAMode


class BackboneBackend(ABC):
    """Runs the backbone (a Hugging Face ViT whose linear layers carry LoRA slots, `lora_ctx`) on `device`."""

    # True: the backend computes in the engine's precision itself (from a float32 torch model it converts), so the
    # engine keeps the torch backbone in float32, swaps no GEMMs for int8 and keeps no premerged torch weights
    owns_precision = False

    def __init__(self, backbone: torch.nn.Module, lora_ctx: LoRAContext | None, device: torch.device,
                 dtype: torch.dtype, max_batch_images: int):
        self.backbone, self.lora_ctx, self.device, self.dtype = backbone, lora_ctx, device, dtype
        self.max_batch_images = max_batch_images
        # Set by the engine, for a backend that caches what it builds from the weights: the base weights' digest,
        # and each occupied slot's adapter digest (adapters.adapter_digest)
        self.identity = ""
        self.digests: dict[int, str] = {}

    @classmethod
    def unavailable(cls, device: torch.device, precision: str) -> str | None:
        """Why this backend cannot run on `device` in `precision` here (None: it can)."""
        return None

    # ---- `daemon.backend: auto` (engine/precision_choice.py). A backend with `auto_precisions` competes there: each
    # of them is a candidate "<registered name>-<precision>", timed on the plain backbone (`plain`) against the
    # torch engine's own precisions (the bare names). fp32 always competes, bf16 where the torch engine's bf16 does
    # (native, its accuracy gate passed), any other only where `auto_gates` says its own gate passed.
    auto_precisions: tuple[str, ...] = ()

    @classmethod
    def auto_problem(cls) -> str | None:
        """Why its candidates cannot run on this machine (None: they can)."""
        return None

    @classmethod
    def auto_key(cls) -> dict:
        """What its speeds depend on beyond the torch engine's speed key (a changed value: measured again)."""
        return {}

    @classmethod
    def auto_gates(cls, caps, backbone: torch.nn.Module, adapters: dict, sizes: dict[str, int]) -> tuple[dict, object]:
        """({precision: why its gate keeps it off these adapters, None: passed} for its precisions beyond fp32 and
        bf16, what `plain` needs to time them); sizes: each adapter's image size."""
        return {}, None

    @classmethod
    def gate_variants(cls, caps) -> list[str]:
        """The accuracy-gate entries its precisions need on this CPU (`vlora-va models calibrate` measures them)."""
        return []

    @classmethod
    def plain(cls, backbone: torch.nn.Module, precision: str, parts: object = None):
        """The plain (LoRA-free) backbone as this backend computes it in `precision`, called as the Hugging Face
        model is (`model(pixel_values=x)`, float32 pixels); parts: what `auto_gates` returned."""
        raise NotImplementedError(f"{cls.__name__} lists auto_precisions but cannot build its plain backbone")

    def slot_changed(self, slot: int) -> None:
        """An adapter was loaded into or removed from `slot` (what a backend compiled for it is stale)."""

    @abstractmethod
    def features(self, frames: list[np.ndarray], slots: list[int], mode: LoRAMode, size: int, prefix: int = 0,
                 keep_pixels: bool = False, keys: list | None = None, mid_layer: int = 0) -> Features:
        """Backbone features of the uint8 [H, W, 3] frames at size px, frame i through adapter slot slots[i]
        (-1: none), the LoRA computed as `mode` says (the base weights already hold what it needs). Blocks
        [0, prefix) run once per distinct frame (they are LoRA-free for every slot involved); keys: each frame's
        identity (contracts.requests.frame_key; None: from the frames' buffers). keep_pixels: the features also
        carry each frame's model input. mid_layer > 0: they also carry `mid`, the patch grid entering that block (or,
        where the backend cannot stop there, entering the block its LoRA-free part ends at): the appearance
        embeddings' tokens, asked for only for blocks no row's LoRA touches yet."""

    def prepare(self, slot: int, size: int, head=None):
        """Start building, on a thread of the backend's own, what serving `slot` at `size` px needs (an adapter
        loaded at run time; head: its head); a concurrent.futures.Future done when it is built (its exception: why it could not be),
        or None when there is nothing to build (this one: eager torch needs nothing)."""
        return None

    def head_forward(self, slot: int, head, size: int):
        """`slot`'s head forward as this backend computes it (called as the head module is), or None: the head runs
        as the torch module it is (this one: always)."""
        return None

    def warmed(self) -> None:
        """The daemon's warm-up is over: from now on, work the backend prepares lazily is a miss worth saying."""

    @abstractmethod
    def pixels(self, frames: list[np.ndarray], size: int | None = None) -> torch.Tensor:
        """uint8 [H, W, 3] frames -> the model input [N, 3, size, size] (normalised, resized)."""
