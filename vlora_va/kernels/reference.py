"""Plain PyTorch loops: the oracle every ATMM implementation is tested against. Slow on purpose.

``ReferenceBackend`` is the loop as an ATMM backend (``impl="reference"``).
"""

from __future__ import annotations

import torch

from vlora_va.kernels.backend import AtmmBackend, signed
from vlora_va.kernels.segments import NO_ADAPTER, Segments


def as_float_list(v, n: int) -> list[float]:
    """A scalar, list or tensor of per-slot (or per-layer) values as n Python floats."""
    if torch.is_tensor(v):
        v = v.tolist()
    if isinstance(v, (int, float)):
        return [float(v)] * n
    return [float(e) for e in v]


def atmm_reference(y: torch.Tensor, x: torch.Tensor, A: torch.Tensor, B: torch.Tensor, idx: torch.Tensor,
                   scale, ranks=None, delora_slot: int | None = None) -> torch.Tensor:
    """In place on y [N, out], returns y. x [N, in], A [S, R, in], B [S, out, R], idx [N] (-1 = none)::

        for i in range(N):
            a = idx[i]; r = ranks[a]
            if a >= 0 and a != delora_slot:
                y[i] += scale[a] * (x[i] @ A[a, :r].T) @ B[a, :, :r].T
            if delora_slot is not None and a != delora_slot:
                m = delora_slot; r = ranks[m]
                y[i] -= scale[m] * (x[i] @ A[m, :r].T) @ B[m, :, :r].T

    Computed in float32 (float64 for float64 inputs) and added to y in y's dtype.
    """
    S, R = A.shape[0], A.shape[1]
    ranks = [R] * S if ranks is None else [int(r) for r in ranks]
    scale = as_float_list(scale, S)
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    for i, a in enumerate(idx.tolist()):
        delta = torch.zeros(y.shape[1], dtype=acc, device=y.device)
        if a >= 0 and a != delora_slot:
            r = ranks[a]
            delta += scale[a] * (x[i].to(acc) @ A[a, :r].to(acc).T) @ B[a, :, :r].to(acc).T
        if delora_slot is not None and a != delora_slot:
            m = delora_slot
            r = ranks[m]
            delta -= scale[m] * (x[i].to(acc) @ A[m, :r].to(acc).T) @ B[m, :, :r].to(acc).T
        y[i] = (y[i].to(acc) + delta).to(y.dtype)
    return y


class ReferenceBackend(AtmmBackend):
    """The per-row loop of ``atmm_reference`` over the runs of a ``Segments``: the oracle, selectable by name."""

    def apply(self, y, x, A, B, seg: Segments, scale: list[float], ranks: list[int], sign: float = 1.0, *,
              config=None, device_params=None) -> None:
        atmm_reference(y, x, A, B, segments_to_idx(seg, x.device), signed(scale, sign), ranks)


def segments_to_idx(seg: Segments, device) -> torch.Tensor:
    """The per-row slot LongTensor [N] of a layout (-1 for rows in no run)."""
    idx = torch.full((seg.n_rows,), NO_ADAPTER, dtype=torch.long)
    for s, a, b in zip(seg.slots, seg.starts, seg.ends):
        idx[a:b] = s
    return idx.to(device)


def delta_weights_reference(A: torch.Tensor, B: torch.Tensor, scale, ranks=None) -> torch.Tensor:
    """ΔW for L same-shaped layers of one slot. A [L, R, in], B [L, out, R] -> [L, out, in]::

        for l in range(L):
            dW[l] = scale[l] * B[l, :, :ranks[l]] @ A[l, :ranks[l]]
    """
    L, R = A.shape[0], A.shape[1]
    ranks = [R] * L if ranks is None else [int(r) for r in ranks]
    scale = as_float_list(scale, L)
    out = torch.empty(L, B.shape[1], A.shape[2], dtype=A.dtype, device=A.device)
    for l in range(L):
        r = ranks[l]
        out[l] = (scale[l] * B[l, :, :r].float() @ A[l, :r].float()).to(A.dtype)
    return out
