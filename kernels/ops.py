"""The ATMM operator and the one-shot ΔW computation: the entry points the engine calls.

Implementation picked in one place: Triton kernels on CUDA tensors, the CPU strategies otherwise; the
configuration (tile sizes / strategy) comes from the tuned table for this device kind, by shape bucket.
"""

from __future__ import annotations

import torch

from vlora_va.kernels import cpu, tuned
from vlora_va.kernels.einsum import atmm_einsum
from vlora_va.kernels.reference import as_float_list, atmm_reference
from vlora_va.kernels.segments import Segments


def atmm(y: torch.Tensor, x: torch.Tensor, A: torch.Tensor, B: torch.Tensor, idx, scale, ranks=None,
         delora_slot: int | None = None, *, impl: str | None = None, config=None, device_params=None) -> torch.Tensor:
    """Batched heterogeneous LoRA, in place on y [N, out]; returns y. As a plain loop::

        for i in range(N):
            a = idx[i]                                    # -1: no adapter
            if a >= 0 and a != delora_slot:           # the merged adapter's own rows need nothing
                y[i] += scale[a] * (x[i] @ A[a, :ranks[a]].T) @ B[a, :, :ranks[a]].T
            if delora_slot is not None and a != delora_slot:   # mixture mode: cancel the merged adapter
                m = delora_slot
                y[i] -= scale[m] * (x[i] @ A[m, :ranks[m]].T) @ B[m, :, :ranks[m]].T

    x [N, in]; A [S, R, in] and B [S, out, R]: slot stacks (PEFT orientation), zero beyond each slot's rank;
    idx: LongTensor [N] or a prebuilt ``Segments``; scale, ranks: per slot (list or tensor; ranks default R).
    impl: "triton" | "cpu" | "einsum" | "reference" (default: triton on CUDA, cpu otherwise; "einsum" is the
    dLoRA-style one-hot baseline, any device). config: a CPU strategy name
    or a ``TritonConfig``; default from the tuned table. device_params: optional cached (scale float32 [S],
    ranks int32 [S]) tensors on the device, for the Triton path.
    """
    S, R = A.shape[0], A.shape[1]
    ranks_l = [R] * S if ranks is None else [int(r) for r in (ranks.tolist() if torch.is_tensor(ranks) else ranks)]
    scale_l = as_float_list(scale, S)
    impl = impl or ("triton" if x.is_cuda else "cpu")
    if impl == "reference":
        idx_t = idx if torch.is_tensor(idx) else _segments_to_idx(idx, x.device)
        return atmm_reference(y, x, A, B, idx_t, scale_l, ranks_l, delora_slot)
    seg = idx if isinstance(idx, Segments) else Segments.from_idx(idx)
    passes = [(seg, 1.0)]
    if delora_slot is not None:
        passes = [(seg.without(delora_slot), 1.0), (seg.delora(delora_slot), -1.0)]
    if impl == "einsum":
        for s, sign in passes:
            atmm_einsum(y, x, A, B, s, scale_l if sign > 0 else [-v for v in scale_l], ranks_l)
        return y
    if impl == "cpu":
        for s, sign in passes:
            sc = scale_l if sign > 0 else [-v for v in scale_l]
            choice = config or tuned.lookup_cpu(x.shape[1], y.shape[1], s, ranks_l)
            cpu.atmm_cpu(y, x, A, B, s, sc, ranks_l, choice)
        return y
    if impl == "triton":
        from vlora_va.kernels.triton_atmm import atmm_triton  # imported lazily: TRITON_INTERPRET must be set before import
        if device_params is None:
            device_params = (torch.tensor(scale_l, dtype=torch.float32, device=x.device),
                             torch.tensor(ranks_l, dtype=torch.int32, device=x.device))
        for s, sign in passes:
            choice = config or tuned.lookup_triton(x.shape[1], y.shape[1], s, ranks_l, x.device)
            atmm_triton(y, x, A, B, s, device_params[0], device_params[1], choice, sign)
        return y
    raise ValueError(f"unknown ATMM impl {impl!r} (expected 'triton', 'cpu', 'einsum' or 'reference')")


def _segments_to_idx(seg: Segments, device) -> torch.Tensor:
    idx = torch.full((seg.n_rows,), -1, dtype=torch.long)
    for s, a, b in zip(seg.slots, seg.starts, seg.ends):
        idx[a:b] = s
    return idx.to(device)


def delta_weights(A: torch.Tensor, B: torch.Tensor, scale, rank: int | None = None,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """ΔW for L same-shaped layers of one adapter slot in one batched GEMM. As a plain loop::

        for l in range(L):
            dW[l] = scale[l] * B[l, :, :rank] @ A[l, :rank]

    A [L, R, in], B [L, out, R] (any strides, e.g. one slot of a [L, S, R, ...] pool); scale: float or [L];
    rank: the largest rank among the L layers (entries past a layer's own rank are zero, so they add
    nothing). Returns [L, out, in] (written into ``out`` when given)."""
    r = A.shape[1] if rank is None else rank
    a, b = A[:, :r], B[:, :, :r]
    if torch.is_tensor(scale) or not isinstance(scale, (int, float)):
        s = torch.as_tensor(scale, dtype=B.dtype, device=B.device).reshape(-1, 1, 1)
        b = b * s  # scale the small factor, not the [out, in] product
    elif scale != 1.0:
        b = b * scale
    return torch.bmm(b, a, out=out)
