"""Shared random ATMM problems for the kernel tests (small: the reference is a per-row Python loop)."""

import torch

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
