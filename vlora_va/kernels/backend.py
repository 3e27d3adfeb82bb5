"""The ATMM backend plug-in point: the interface every implementation of the operator's inner pass follows.

One backend per way of computing it (the plain loop, the dLoRA-style einsum, the tuned CPU strategies, the
Triton kernels), registered by name in ``vlora_va.contracts.plugins.ATMM_BACKENDS`` and chosen in one place,
``kernels.ops.atmm`` (its ``impl`` argument). What a backend does not do is shared there: normalising
scale/ranks, building the ``Segments`` and splitting mixture mode (delora) into two signed passes.

The operator has three paths, one entry each in ``kernels.ops``, and a backend declares which it computes
(``paths``) so that an entry refuses a backend lacking its path by name instead of the engine choosing around it:

    ROWS    ``atmm``                runs of rows (``Segments``): eager forwards                 ``apply``
    IMAGES  ``atmm_images``         one run per image, the layout in device tensors: what a    ``apply_images``
                                    CUDA graph replays
    FUSED   ``lora_linear_images``  the whole LoRA linear layer (base GEMM + bias + IMAGES)     ``linear_images``

A new backend subclasses ``AtmmBackend`` and registers itself before use::

    ATMM_BACKENDS.register("mine", "my.module:MyBackend")   # or the class itself
    atmm(y, x, A, B, idx, scale, ranks, impl="mine")
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod

import torch

from vlora_va.kernels.segments import Segments

ROWS, IMAGES, FUSED = "rows", "images", "fused"


class AtmmBackend(ABC):
    """One implementation of a signed ATMM pass over a batch laid out as runs of rows. ``apply`` is, as a
    plain loop::

        for j in range(seg.n_runs):                       # rows seg.starts[j] .. seg.ends[j] - 1
            a = seg.slots[j]; r = ranks[a]
            rows = slice(seg.starts[j], seg.ends[j])
            y[rows] += sign * scale[a] * (x[rows] @ A[a, :r].T) @ B[a, :, :r].T

    Rows in no run are left untouched; a run of length 0 or a slot of rank 0 adds nothing.

    Backends are stateless: ``kernels.ops`` makes one instance per class and reuses it for every call.
    """

    # The paths it computes (module docstring). ROWS is ``apply``, which every backend has; IMAGES and FUSED are
    # what the engine's fixed-layout (CUDA-graph) forwards need, declared with ``apply_images`` / ``linear_images``.
    paths: frozenset[str] = frozenset({ROWS})

    @abstractmethod
    def apply(self, y: torch.Tensor, x: torch.Tensor, A: torch.Tensor, B: torch.Tensor, seg: Segments,
              scale: list[float], ranks: list[int], sign: float = 1.0, *, config=None,
              device_params: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """In place on y [N, out]: the loop in the class docstring.

        x [N, in]; A [S, R, in], B [S, out, R] (slot stacks, zero beyond each slot's rank); scale, ranks: one
        Python float / int per slot; sign: +1.0 or -1.0 (mixture mode subtracts the merged adapter).
        config: the backend's own tuned choice (a CPU strategy name, a ``TritonConfig``), None to look it up;
        device_params: optional cached (scale float32 [S], ranks int32 [S]) tensors on x's device. A backend
        ignores the options it has no use for.
        """

    def apply_images(self, y: torch.Tensor, x: torch.Tensor, A: torch.Tensor, B: torch.Tensor, slot: torch.Tensor,
                     length: torch.Tensor, scale: torch.Tensor, ranks: torch.Tensor, tokens: int, sign: float = 1.0,
                     start: torch.Tensor | None = None, h: torch.Tensor | None = None) -> None:
        """IMAGES, in place on y [n*T, out]: the loop in kernels/images.py's docstring, read from device tensors
        (slot, length int32 [n]; scale float32 [S], ranks int32 [S]; start int32 [n] = i*T and h, a float32
        [n*T, >= R] scratch, optional) with launches that depend on the shapes only, never on the data."""
        raise NotImplementedError(f"{type(self).__name__} does not declare the {IMAGES!r} path")

    def linear_images(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, A: torch.Tensor,
                      B: torch.Tensor, slot: torch.Tensor, length: torch.Tensor, scale: torch.Tensor,
                      ranks: torch.Tensor, tokens: int, max_rank: int, out: torch.Tensor | None = None,
                      tiles=None) -> torch.Tensor:
        """FUSED: the loop in kernels/fused.py's docstring; returns y [n*T, out_features] (written into ``out``
        when given). max_rank: the largest rank among the slots, host-side; tiles: the backend's own choice
        (a ``kernels.fused.FusedTiles``), None for its default."""
        raise NotImplementedError(f"{type(self).__name__} does not declare the {FUSED!r} path")


def signed(scale: list[float], sign: float) -> list[float]:
    """The per-slot scales with a pass's sign folded in (for backends that take no separate sign)."""
    return scale if sign == 1.0 else [sign * v for v in scale]


def interpreted_bf16(dtype: torch.dtype) -> bool:
    """Whether a Triton kernel must upcast its bf16 tiles to fp32: under TRITON_INTERPRET=1, whose bf16 ``tl.dot``
    is wrong (on a GPU they stay bf16). Here, not in a Triton module, so each kernel module can ask without
    importing the other's."""
    return dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1"
