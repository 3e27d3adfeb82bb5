"""The ATMM operator and the one-shot ΔW computation: the entry points the engine calls.

The implementation is picked here, one entry per path of the operator (kernels/backend.py): ``atmm`` (runs of
rows), ``atmm_images`` (one run per image: what a CUDA graph replays) and ``lora_linear_images`` (the whole LoRA
linear layer in one pass). Each looks its ``impl`` name up in the ATMM_BACKENDS registry
(``vlora_va.contracts.plugins``; default: Triton on CUDA tensors, the "cpu" backend otherwise) and refuses a
backend that does not declare the path; the backend (a ``kernels.backend.AtmmBackend``) computes it, with the
configuration (tile sizes / strategy) from the tuned table for this device kind, by shape bucket.
"""

from __future__ import annotations

import functools
import os

import torch

from vlora_va.contracts.plugins import ATMM_BACKENDS
from vlora_va.kernels.backend import FUSED, IMAGES, AtmmBackend
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


def atmm_images(y: torch.Tensor, x: torch.Tensor, A: torch.Tensor, B: torch.Tensor, slot: torch.Tensor,
                length: torch.Tensor, scale: torch.Tensor, ranks: torch.Tensor, tokens: int, sign: float = 1.0,
                start: torch.Tensor | None = None, h: torch.Tensor | None = None, impl: str | None = None) -> None:
    """In place on y [n*T, out]: ATMM over one run of T rows per image, the loop in kernels/images.py's docstring,
    by the backend ``impl`` names (one that declares the images path: "triton", "cpu" or a plug-in). x [n*T, in];
    A [S, R, in], B [S, out, R]; slot, length int32 [n] (length is 0 or T); scale float32 [S], ranks int32 [S];
    start int32 [n] = i*T and h, a float32 [n*T, >= R] scratch: optional, kept by a caller that captures graphs."""
    backend = _path_backend(impl, IMAGES, x)
    backend.apply_images(y, x, A, B, slot, length, scale, ranks, tokens, sign, start, h)


def lora_linear_images(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, A: torch.Tensor,
                       B: torch.Tensor, slot: torch.Tensor, length: torch.Tensor, scale: torch.Tensor,
                       ranks: torch.Tensor, tokens: int, max_rank: int, out: torch.Tensor | None = None,
                       tiles=None, impl: str | None = None) -> torch.Tensor:
    """The LoRA linear layer over the per-image layout, the loop in kernels/fused.py's docstring; returns
    y [n*T, out_features] (written into ``out`` when given), by the backend ``impl`` names (one that declares the
    fused path). x [n*T, in]; weight [out, in]; bias [out] or None; A, B, slot, length, scale, ranks as in
    ``atmm_images``; max_rank: the largest rank among the slots (host-side, so a launch reads nothing from the
    device); tiles: a ``kernels.fused.FusedTiles`` for the Triton kernel, None for its default."""
    if x.shape[0] != slot.shape[0] * tokens:
        raise ValueError(f"x has {x.shape[0]} rows, the layout {slot.shape[0]} images of {tokens} tokens")
    backend = _path_backend(impl, FUSED, x)
    return backend.linear_images(x, weight, bias, A, B, slot, length, scale, ranks, tokens, max_rank, out, tiles)


def _path_backend(impl: str | None, path: str, x: torch.Tensor) -> AtmmBackend:
    """The registered backend for a per-image path, refused when it does not declare that path. The default
    is Triton under TRITON_INTERPRET=1 too (unlike ``atmm``'s): the tests run the captured form's kernels on a
    CPU that way."""
    name = impl or ("triton" if x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1" else "cpu")
    backend = _backend(ATMM_BACKENDS.load(name))
    if path not in backend.paths:
        raise ValueError(f"ATMM backend {name!r} does not compute the {path!r} path (it declares "
                         f"{', '.join(sorted(backend.paths))}; see vlora_va.kernels.backend)")
    return backend


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
