"""LoRA modes: how one forward computes its LoRA, as one object (`LoRAMode`), and a forward's batch as fixed-size device
tensors (`DeviceLayout`, what CUDA graphs replay). The layers that compute each mode are in engine/lora.py.

    premerged   every run of rows through its slot's own W + ΔW (premerged weights; memory per slot)
    unmerged    base W, plus each row's LoRA through ATMM (or the dLoRA-style einsum, impl="einsum")
    merged(s)   W = W0 + ΔW_s holds slot s: rows of s need nothing else (and no other slot may be in the batch)
    mixture(s)  W holds slot s; every other row adds its own LoRA and subtracts s's (deLoRA)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PREMERGED, UNMERGED, MERGED, MIXTURE = "premerged", "unmerged", "merged", "mixture"
MODE_KINDS = (PREMERGED, UNMERGED, MERGED, MIXTURE)
LORA_IMPLS = ("atmm", "einsum")


@dataclass(frozen=True)
class LoRAMode:
    """How one forward computes its LoRA (see the module docstring). `slot`: the adapter the base weights
    hold (merged / mixture only). `impl`: how unmerged / mixture rows get their LoRA."""

    kind: str
    slot: int | None = None
    impl: str = "atmm"

    def __post_init__(self):
        if self.kind not in MODE_KINDS:
            raise ValueError(f"LoRA mode must be one of {MODE_KINDS}, got {self.kind!r}")
        if (self.slot is not None) != (self.kind in (MERGED, MIXTURE)):
            raise ValueError(f"LoRA mode {self.kind} {'needs a' if self.slot is None else 'takes no'} slot")
        if self.impl not in LORA_IMPLS:
            raise ValueError(f"LoRA impl must be one of {LORA_IMPLS}, got {self.impl!r}")

    @property
    def weights_slot(self) -> int | None:
        """The slot the base weights must hold for this mode (None: the pristine weights)."""
        return self.slot

    def __str__(self) -> str:
        name = self.kind if self.slot is None else f"{self.kind}({self.slot})"
        return name if self.impl == "atmm" or self.kind in (PREMERGED, MERGED) else f"{name}/{self.impl}"


class DeviceLayout:
    """One forward's batch as fixed-size int32 tensors on the model's device: `images` images of `tokens` rows
    each, image i with adapter slot slots[i] (-1: padding). What CUDA graphs replay reads these: a batch
    overwrites them in place (`fill`, one host-to-device copy) and nothing is allocated or looked up per layer.
        start[i]                 i * tokens (Triton runs)
        own_slot / own_len       each image's own LoRA (length 0: none; in mixture, none for the merged slot)
        delora_slot / delora_len mixture: every image not of the merged slot subtracts the merged adapter's
        offs[s]                  premerged: rows of slots <= s (images sorted by slot), for a grouped GEMM
    """

    def __init__(self, images: int, tokens: int, num_slots: int, max_rank: int, device: torch.device):
        self.images, self.tokens, self.num_slots = images, tokens, num_slots
        self.buffer = torch.zeros(5 * images + num_slots, dtype=torch.int32, device=device)
        b = self.buffer
        self.start, self.own_slot, self.own_len = b[:images], b[images:2 * images], b[2 * images:3 * images]
        self.delora_slot, self.delora_len = b[3 * images:4 * images], b[4 * images:5 * images]
        self.offs = b[5 * images:]
        self.h = torch.empty(images * tokens, max(max_rank, 1), dtype=torch.float32, device=device)
        self._host = torch.zeros_like(self.buffer, device="cpu")

    def fill(self, slots: list[int], mode: "LoRAMode") -> None:
        n, T = len(slots), self.tokens
        if n > self.images:
            raise ValueError(f"{n} images do not fit a layout of {self.images}")
        if mode.kind == PREMERGED and (any(s < 0 for s in slots) or slots != sorted(slots)):
            raise ValueError("premerged layouts need every image's slot, sorted (rows grouped by slot)")
        merged = mode.slot if mode.kind == MIXTURE else None
        host = [0] * len(self._host)
        k = self.images
        for i in range(k):
            host[i] = i * T
        for i, s in enumerate(slots):
            host[k + i] = max(s, 0)
            host[2 * k + i] = T if s >= 0 and s != merged else 0
            if merged is not None:
                host[3 * k + i] = merged
                host[4 * k + i] = T if s != merged else 0
        for s in range(self.num_slots):
            host[5 * k + s] = T * sum(1 for x in slots if 0 <= x <= s)
        self._host.copy_(torch.tensor(host, dtype=torch.int32))
        self.buffer.copy_(self._host)  # blocking: the next batch rewrites the host buffer (a few hundred bytes)
