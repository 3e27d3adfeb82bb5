"""A dLoRA-style unmerged LoRA: every adapter of the batch on every row, selected by a one-hot mask.

The baseline policy `dlora` serves its unmerged batches this way (its paper's formulation); ATMM computes the
same thing without the wasted work. As a plain loop (the same as ``kernels.reference.atmm_reference``)::

    for i in range(N):
        a = idx[i]
        if a >= 0:
            y[i] += scale[a] * (x[i] @ A[a, :ranks[a]].T) @ B[a, :, :ranks[a]].T

Computed as: h[u, i] = x[i] @ A[u].T for every used adapter u and every row i (padded to the largest rank),
h *= onehot[u, i] * scale[u], y += sum over u of h[u] @ B[u].T. ``EinsumBackend`` is it as an ATMM backend
(``impl="einsum"``).
"""

from __future__ import annotations

import torch

from vlora_va.kernels.backend import AtmmBackend, signed
from vlora_va.kernels.segments import Segments


def _onehot(seg: Segments, used: list[int], scale: list[float], dtype, device) -> torch.Tensor:
    """[U, N, 1]: scale[used[u]] where row i uses adapter used[u], else 0 (cached on the Segments)."""
    key = ("onehot", tuple(used), tuple(scale[s] for s in used), dtype, str(device))
    mask = seg._cache.get(key)
    if mask is None:
        mask = torch.zeros(len(used), seg.n_rows, 1, dtype=dtype)
        where = {s: u for u, s in enumerate(used)}
        for s, a, b in zip(seg.slots, seg.starts, seg.ends):
            if s in where:
                mask[where[s], a:b] = scale[s]
        mask = seg._cache[key] = mask.to(device)
    return mask


def atmm_einsum(y: torch.Tensor, x: torch.Tensor, A: torch.Tensor, B: torch.Tensor, seg: Segments,
                scale: list[float], ranks: list[int]) -> None:
    """In place on y [N, out]: the loop in the module docstring, as two einsums over all used adapters."""
    used = [s for s in seg.used_slots if ranks[s] > 0]
    if not used:
        return
    r = max(ranks[s] for s in used)
    index = torch.tensor(used, device=x.device)
    a = A[:, :r].index_select(0, index)                         # [U, r, in]
    b = B[:, :, :r].index_select(0, index)                      # [U, out, r]
    h = torch.einsum("ni,uri->unr", x, a) * _onehot(seg, used, scale, x.dtype, x.device)
    y += torch.einsum("unr,uor->no", h, b)


class EinsumBackend(AtmmBackend):
    """``atmm_einsum`` with the pass's sign folded into the scales (the one-hot mask carries them)."""

    def apply(self, y, x, A, B, seg: Segments, scale: list[float], ranks: list[int], sign: float = 1.0, *,
              config=None, device_params=None) -> None:
        atmm_einsum(y, x, A, B, seg, signed(scale, sign), ranks)
