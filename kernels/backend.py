"""The ATMM backend plug-in point: the interface every implementation of the operator's inner pass follows.

One backend per way of computing it (the plain loop, the dLoRA-style einsum, the tuned CPU strategies, the
Triton kernels), registered by name in ``vlora_va.contracts.plugins.ATMM_BACKENDS`` and chosen in one place,
``kernels.ops.atmm`` (its ``impl`` argument). What a backend does not do is shared there: normalising
scale/ranks, building the ``Segments`` and splitting mixture mode (delora) into two signed passes.

A new backend subclasses ``AtmmBackend`` and registers itself before use::

    ATMM_BACKENDS.register("mine", "my.module:MyBackend")   # or the class itself
    atmm(y, x, A, B, idx, scale, ranks, impl="mine")
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from vlora_va.kernels.segments import Segments


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


def signed(scale: list[float], sign: float) -> list[float]:
    """The per-slot scales with a pass's sign folded in (for backends that take no separate sign)."""
    return scale if sign == 1.0 else [sign * v for v in scale]
