"""The ATMM operator and the one-shot ΔW computation: the entry points the engine calls.

The implementation is picked in one place, ``atmm``: the ``impl`` name (default: Triton kernels on CUDA tensors,
the tuned CPU strategies otherwise) is looked up in the ATMM_BACKENDS registry (``vlora_va.contracts.plugins``)
and the backend (a ``kernels.backend.AtmmBackend``) runs each pass; the configuration (tile sizes / strategy)
comes from the tuned table for this device kind, by shape bucket, inside the backend.
"""

from __future__ import annotations

import functools

import torch

from vlora_va.contracts.plugins import ATMM_BACKENDS
from vlora_va.kernels.backend import AtmmBackend
from vlora_va.kernels.reference import as_float_list
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
    impl: a name in ATMM_BACKENDS: "triton" | "cpu" | "einsum" | "reference" or a registered plug-in (default:
    triton on CUDA, cpu otherwise; "einsum" is the dLoRA-style one-hot baseline, any device); an unknown name
    raises ``UnknownPlugin`` listing the known ones. config: the backend's choice (a CPU strategy name or a
    ``TritonConfig``); default from the tuned table. device_params: optional cached (scale float32 [S],
    ranks int32 [S]) tensors on the device, for the Triton path.
    """
    backend = _backend(ATMM_BACKENDS.load(impl or ("triton" if x.is_cuda else "cpu")))
    S, R = A.shape[0], A.shape[1]
    ranks_l = [R] * S if ranks is None else [int(r) for r in (ranks.tolist() if torch.is_tensor(ranks) else ranks)]
    scale_l = as_float_list(scale, S)
    seg = idx if isinstance(idx, Segments) else Segments.from_idx(idx)
    # Mixture mode as two signed passes, the same for every backend: the other adapters' rows add their own
    # LoRA, then every row not of the merged adapter subtracts the merged adapter's.
    passes = [(seg, 1.0)]
    if delora_slot is not None:
        passes = [(seg.without(delora_slot), 1.0), (seg.delora(delora_slot), -1.0)]
    for s, sign in passes:
        backend.apply(y, x, A, B, s, scale_l, ranks_l, sign, config=config, device_params=device_params)
    return y


@functools.lru_cache(maxsize=None)
def _backend(cls) -> AtmmBackend:
    """The one (stateless) instance of a registered backend class, checked once."""
    if not (isinstance(cls, type) and issubclass(cls, AtmmBackend)):
        raise TypeError(f"ATMM backend {cls!r} is not an AtmmBackend subclass (see vlora_va.kernels.backend)")
    return cls()


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
