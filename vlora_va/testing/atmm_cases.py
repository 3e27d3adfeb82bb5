"""Shared random ATMM problems for the kernel tests (small: the reference is a per-row Python loop), and a plug-in
backend that computes every path of the operator as its docstring's loop (LoopPathsBackend)."""

import torch

from vlora_va.kernels.backend import FUSED, IMAGES, ROWS, AtmmBackend
from vlora_va.kernels.segments import Segments

# (name, n_in, n_out, ranks per slot, per-element slots, rows per element)
CASES = [
    ("one-adapter", 24, 40, [16], [0, 0, 0], 5),
    ("uneven-runs-mixed-ranks", 32, 48, [4, 16, 64, 8], [2, 2, 0, -1, 1, 1, 1, 3, 0], 7),
    ("per-row-shuffled", 40, 24, [8, 32, 4], [0, 1, 2, 1, -1, 0, 2, 2, 1, 0, -1, -1, 1], 1),
    ("no-adapter-rows-only", 16, 16, [8, 8], [-1, -1, -1], 4),
    ("unused-slots", 20, 36, [4, 64, 16, 8, 32], [3, 3, -1, 3], 6),
    ("odd-dims", 33, 17, [5, 13], [1, 0, 1, 0, -1], 3),
    ("empty-slot-in-batch", 24, 20, [0, 8, 64], [0, 1, 0, 2, 1], 2),  # rank 0: slot cleared / not targeted
]


def make(case, dtype=torch.float32, seed=0):
    """x, y, A [S, R, in] (zero past each rank), B [S, out, R], scale, ranks, per-row idx."""
    _, n_in, n_out, ranks, elem_slots, rows = case
    g = torch.Generator().manual_seed(seed)
    S, R = len(ranks), max(ranks)
    A = torch.zeros(S, R, n_in)
    B = torch.zeros(S, n_out, R)
    for s, r in enumerate(ranks):
        A[s, :r] = torch.randn(r, n_in, generator=g) / n_in ** 0.5
        B[s, :, :r] = torch.randn(n_out, r, generator=g) / r ** 0.5
    idx = torch.tensor(elem_slots, dtype=torch.long).repeat_interleave(rows)
    x = torch.randn(idx.numel(), n_in, generator=g)
    y = torch.randn(idx.numel(), n_out, generator=g)
    scale = [0.5 + 0.25 * s for s in range(S)]
    return x.to(dtype), y.to(dtype), A.to(dtype), B.to(dtype), scale, ranks, idx


def tol(dtype):
    return dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)


def empty_run_segments(n_rows: int, slots=(0, 1, 0)) -> Segments:
    """A layout with a zero-length run in the middle (the kernels must skip it)."""
    cut = n_rows // 2
    return Segments(n_rows, (0, cut, cut), (cut, cut, n_rows), tuple(slots))


class LoopPathsBackend(AtmmBackend):
    """A plug-in ATMM backend declaring all three paths, each the plain loop of its docstring (kernels/backend.py,
    kernels/images.py, kernels/fused.py), recording every call as (path, sign): registered under a name, it shows
    which entries and which engine forwards really ask the registry."""

    paths = frozenset({ROWS, IMAGES, FUSED})
    calls: list[tuple[str, float]] = []

    def apply(self, y, x, A, B, seg, scale, ranks, sign=1.0, *, config=None, device_params=None):
        LoopPathsBackend.calls.append((ROWS, sign))
        for a, start, end in zip(seg.slots, seg.starts, seg.ends):
            r = ranks[a]
            y[start:end] += sign * scale[a] * (x[start:end] @ A[a, :r].T) @ B[a, :, :r].T

    def apply_images(self, y, x, A, B, slot, length, scale, ranks, tokens, sign=1.0, start=None, h=None):
        LoopPathsBackend.calls.append((IMAGES, sign))
        image_loop(y, x, A, B, slot, length, scale, ranks, tokens, sign)

    def linear_images(self, x, weight, bias, A, B, slot, length, scale, ranks, tokens, max_rank, out=None,
                      tiles=None):
        LoopPathsBackend.calls.append((FUSED, 1.0))
        y = out if out is not None else torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype)
        y.copy_(torch.nn.functional.linear(x, weight, bias))
        image_loop(y, x, A, B, slot, length, scale, ranks, tokens, 1.0)
        return y


def image_loop(y, x, A, B, slot, length, scale, ranks, tokens: int, sign: float) -> None:
    """kernels/images.py's loop: image i owns rows i*T .. i*T + T - 1 and adds its slot's LoRA when it takes part."""
    for i in range(slot.shape[0]):
        if int(length[i]) > 0:
            a, rows = int(slot[i]), slice(i * tokens, (i + 1) * tokens)
            r = int(ranks[a])
            y[rows] += sign * float(scale[a]) * (x[rows] @ A[a, :r].T) @ B[a, :, :r].T
