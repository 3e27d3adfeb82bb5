"""CPU strategies for ATMM. All compute the same thing (see ``kernels.reference.atmm_reference``):

    for each run j (rows starts[j]:ends[j], slot a = slots[j], rank r = ranks[a]):
        y[rows] += scale[a] * (x[rows] @ A[a, :r].T) @ B[a, :, :r].T

They differ only in how the work is cut into BLAS calls; the tuned table picks one per shape bucket.
Exact ranks are used everywhere (no padding of small-rank adapters to the largest rank). ``CpuBackend`` is the
ATMM backend (``impl="cpu"``, the default for CPU tensors) that picks one and runs it.
"""

from __future__ import annotations

import torch

from vlora_va.kernels import tuning_tables
from vlora_va.kernels.backend import FUSED, IMAGES, ROWS, AtmmBackend, signed
from vlora_va.kernels.fused import lora_linear_images_torch
from vlora_va.kernels.images import atmm_images_torch
from vlora_va.kernels.segments import Segments


def atmm_runs(y, x, A, B, seg: Segments, scale: list[float], ranks: list[int]) -> None:
    """One shrink GEMM + one in-place expand GEMM (addmm_) per run of rows: no gather, no scatter."""
    for s, a, b in zip(seg.slots, seg.starts, seg.ends):
        r = ranks[s]
        if r == 0:
            continue
        h = torch.mm(x[a:b], A[s, :r].t())
        y[a:b].addmm_(h, B[s, :, :r].t(), alpha=scale[s])


def atmm_grouped(y, x, A, B, seg: Segments, scale: list[float], ranks: list[int]) -> None:
    """One GEMM pair per adapter: gather its rows (index_select), scatter-add back (index_add_).
    Fewer, larger GEMMs than ``runs`` when an adapter's rows are scattered over many runs."""
    if seg.is_grouped:  # nothing to gather
        atmm_runs(y, x, A, B, seg, scale, ranks)
        return
    for s, rows in seg.slot_rows(x.device).items():
        r = ranks[s]
        if r == 0:
            continue
        h = torch.mm(x.index_select(0, rows), A[s, :r].t())
        y.index_add_(0, rows, torch.mm(h, B[s, :, :r].t()), alpha=scale[s])


def _fused_mask(seg: Segments, used: list[int], scale: list[float], ranks: list[int], dtype, device):
    """[N, sum(ranks of used)] matrix: scale[a] where row i uses adapter a's rank columns, else 0."""
    col0, c = {}, 0
    for s in used:
        col0[s] = c
        c += ranks[s]
    mask = torch.zeros(seg.n_rows, c, dtype=dtype)
    for s, a, b in zip(seg.slots, seg.starts, seg.ends):
        if s in col0:  # rank-0 (empty) slots have no columns
            mask[a:b, col0[s]:col0[s] + ranks[s]] = scale[s]
    return mask.to(device)


def atmm_fused(y, x, A, B, seg: Segments, scale: list[float], ranks: list[int]) -> None:
    """One shrink GEMM against all used adapters concatenated, a scale/select mask, one expand GEMM.
    Wastes (#adapters - 1)/#adapters of the LoRA FLOPs but makes 2 BLAS calls in total: wins when
    runs are many and short (e.g. one row per request)."""
    used = [s for s in seg.used_slots if ranks[s] > 0]
    if not used:
        return
    key = ("mask", tuple(ranks[s] for s in used), tuple(scale[s] for s in used), x.dtype, str(x.device))
    mask = seg._cache.get(key)
    if mask is None:
        mask = seg._cache[key] = _fused_mask(seg, used, scale, ranks, x.dtype, x.device)
    A_cat = torch.cat([A[s, :ranks[s]] for s in used])          # [Rt, in]
    B_cat = torch.cat([B[s, :, :ranks[s]] for s in used], 1)    # [out, Rt]
    h = torch.mm(x, A_cat.t()).mul_(mask)
    y.addmm_(h, B_cat.t())


def _bmm_layout(seg: Segments, scale: list[float]):
    """(batch of equal row blocks, slot per block, scale per block) for the padded-bmm strategy, or None.
    Blocks are the runs when they are equal and tile all rows, else the batch elements (elements without
    adapter get scale 0: wasted but harmless work)."""
    L = seg.ends[0] - seg.starts[0] if seg.n_runs else 0
    if seg.n_runs and all(a == j * L and b == a + L for j, (a, b) in enumerate(zip(seg.starts, seg.ends))) \
            and seg.n_runs * L == seg.n_rows:
        return seg.n_runs, list(seg.slots), [scale[s] for s in seg.slots]
    if seg.elem_slots is None:
        return None
    slots = [max(s, 0) for s in seg.elem_slots]
    return len(slots), slots, [scale[s] if s >= 0 else 0.0 for s in seg.elem_slots]


def atmm_bmm(y, x, A, B, seg: Segments, scale: list[float], ranks: list[int]) -> None:
    """Padded batched GEMM: blocks of equal rows (runs or images) as one bmm (shrink) + one in-place
    baddbmm_ (expand), every adapter padded to the batch's largest rank. Two BLAS calls per layer, parallel
    over the batch (no thread barrier per small GEMM); wasteful when ranks differ a lot."""
    used = [s for s in seg.used_slots if ranks[s] > 0]
    layout = _bmm_layout(seg, scale) if used else None
    if layout is None:
        atmm_runs(y, x, A, B, seg, scale, ranks)
        return
    G, slots, sc = layout
    r = max(ranks[s] for s in used)
    idx = torch.tensor(slots, device=x.device)
    Ag = A[:, :r].index_select(0, idx)        # [G, r, in]
    Bg = B[:, :, :r].index_select(0, idx)     # [G, out, r]
    h = torch.bmm(x.view(G, -1, x.shape[1]), Ag.transpose(1, 2))
    h.mul_(torch.tensor(sc, dtype=h.dtype, device=h.device).view(G, 1, 1))
    y.view(G, -1, y.shape[1]).baddbmm_(h, Bg.transpose(1, 2))


STRATEGIES = {"runs": atmm_runs, "grouped": atmm_grouped, "fused": atmm_fused, "bmm": atmm_bmm}
DEFAULT_STRATEGY = "runs"


def default_strategy(seg: Segments) -> str:
    """Rule for shapes the tuned table has not seen (measured on a ViT-S): per-run GEMMs, even when an
    adapter's images are scattered (gather + scatter costs more than a few extra GEMM calls), unless
    runs are tiny (a few rows each), where two GEMMs over all rows win."""
    if seg.n_runs > 8 and seg.n_rows < 16 * seg.n_runs:
        return "fused"
    return "runs"


def atmm_cpu(y, x, A, B, seg: Segments, scale: list[float], ranks: list[int], strategy: str) -> None:
    STRATEGIES[strategy](y, x, A, B, seg, scale, ranks)


class CpuBackend(AtmmBackend):
    """The strategy named by ``config``, else the tuned table's choice for this shape bucket (or the rule-based
    default for a shape the table has not seen). The per-image paths are the torch forms of kernels/images.py
    and kernels/fused.py (batched GEMMs: equal runs need no strategy choice; torch ops, so any device)."""

    paths = frozenset({ROWS, IMAGES, FUSED})

    def apply(self, y, x, A, B, seg: Segments, scale: list[float], ranks: list[int], sign: float = 1.0, *,
              config=None, device_params=None) -> None:
        strategy = config or lookup(x.shape[1], y.shape[1], seg, ranks)
        atmm_cpu(y, x, A, B, seg, signed(scale, sign), ranks, strategy)

    def apply_images(self, y, x, A, B, slot, length, scale, ranks, tokens, sign=1.0, start=None, h=None) -> None:
        atmm_images_torch(y, x, A, B, slot, length, scale, ranks, tokens, sign)

    def linear_images(self, x, weight, bias, A, B, slot, length, scale, ranks, tokens, max_rank, out=None,
                      tiles=None):
        return lora_linear_images_torch(x, weight, bias, A, B, slot, length, scale, ranks, tokens, out)


def lookup(n_in: int, n_out: int, seg: Segments, ranks: list[int]) -> str:
    """The tuned table's strategy for this shape bucket on this CPU, or the rule-based default."""
    choice = tuning_tables.lookup(tuning_tables.device_kind("cpu"), n_in, n_out, seg, ranks)
    return choice if choice in STRATEGIES else default_strategy(seg)
