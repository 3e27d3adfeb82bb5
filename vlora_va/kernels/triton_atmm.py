"""Triton ATMM kernels (CUDA; ``TRITON_INTERPRET=1`` runs them on CPU tensors for tests).

Two kernels, in the style of Punica's SGMV / vLLM's shrink-expand, over runs of rows sharing an adapter:

    shrink:  for each run j, rows i in run j, a = slot[j]:   h[i, :r_a] = x[i] @ A[a, :r_a].T
    expand:  for each run j, rows i in run j, a = slot[j]:   y[i] += sign * scale[a] * h[i, :r_a] @ B[a, :, :r_a].T

Heterogeneous ranks: a program whose rank tile starts past the adapter's rank exits at once (shrink), and the
expand K-loop stops at the adapter's rank, so small-rank adapters do not pay for the largest rank.
Tile configuration (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) is passed in per call; tiles stay >= 16
so the same code compiles for tensor cores on a GPU.

The interpreter computes bf16 ``tl.dot`` wrongly, so bf16 tiles are upcast to fp32 there (UPCAST flag).
``TritonBackend`` is the ATMM backend (``impl="triton"``, the default for CUDA tensors); the registry imports
this module on first use, so ``TRITON_INTERPRET`` can still be set before.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

import torch
import triton
import triton.language as tl

from vlora_va.kernels import triton_fused, tuning_tables
from vlora_va.kernels.backend import FUSED, IMAGES, ROWS, AtmmBackend, interpreted_bf16
from vlora_va.kernels.fused import DEFAULT_TILES, lora_linear_images_torch, rank_block
from vlora_va.kernels.segments import Segments


@dataclass(frozen=True)
class TileConfig:
    block_m: int = 32
    block_n: int = 32
    block_k: int = 32
    num_warps: int = 4
    num_stages: int = 2


@dataclass(frozen=True)
class TritonConfig:
    """One choice for the whole operator: a tile config for each of the two kernels."""
    shrink: TileConfig = TileConfig(32, 16, 64, 4, 2)
    expand: TileConfig = TileConfig(32, 64, 16, 4, 2)

    def to_json(self) -> dict:
        return {"shrink": asdict(self.shrink), "expand": asdict(self.expand)}

    @classmethod
    def from_json(cls, d: dict) -> TritonConfig:
        return cls(TileConfig(**d["shrink"]), TileConfig(**d["expand"]))


DEFAULT_CONFIG = TritonConfig()


@triton.jit
def _segment_tile(seg_start_ptr, seg_len_ptr, seg_slot_ptr, ranks_ptr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """This program's tile of its segment (grid: segment, row tile, column tile): the segment's first row, its row
    count, its adapter slot and rank, and the tile's row, column and inner offsets with its row mask. Both kernels
    start here; each returns early on its own condition."""
    pid_s = tl.program_id(0)
    start = tl.load(seg_start_ptr + pid_s).to(tl.int64)
    length = tl.load(seg_len_ptr + pid_s)
    slot = tl.load(seg_slot_ptr + pid_s).to(tl.int64)
    rank = tl.load(ranks_ptr + slot)
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    return start, length, slot, rank, offs_m, offs_n, offs_k, offs_m < length


@triton.jit
def _shrink_kernel(x_ptr, a_ptr, h_ptr, seg_start_ptr, seg_len_ptr, seg_slot_ptr, ranks_ptr, K,
                   stride_xm, stride_xk, stride_as, stride_ar, stride_ak, stride_hm, stride_hr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr):
    start, length, slot, rank, offs_m, offs_n, offs_k, m_mask = _segment_tile(
        seg_start_ptr, seg_len_ptr, seg_slot_ptr, ranks_ptr, BLOCK_M, BLOCK_N, BLOCK_K)
    if (tl.program_id(1) * BLOCK_M >= length) | (tl.program_id(2) * BLOCK_N >= rank):
        return  # rows past the segment's end, or a rank tile beyond this adapter's rank: no work
    n_mask = offs_n < rank
    x_ptrs = x_ptr + (start + offs_m)[:, None] * stride_xm + offs_k[None, :] * stride_xk
    a_ptrs = a_ptr + slot * stride_as + offs_n[None, :] * stride_ar + offs_k[:, None] * stride_ak  # A^T tile
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_mask = offs_k < K - k * BLOCK_K
        xt = tl.load(x_ptrs, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        at = tl.load(a_ptrs, mask=k_mask[:, None] & n_mask[None, :], other=0.0)
        if UPCAST:
            xt = xt.to(tl.float32)
            at = at.to(tl.float32)
        acc += tl.dot(xt, at)
        x_ptrs += BLOCK_K * stride_xk
        a_ptrs += BLOCK_K * stride_ak
    h_ptrs = h_ptr + (start + offs_m)[:, None] * stride_hm + offs_n[None, :] * stride_hr
    tl.store(h_ptrs, acc, mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def _expand_kernel(h_ptr, b_ptr, y_ptr, seg_start_ptr, seg_len_ptr, seg_slot_ptr, ranks_ptr, scale_ptr, N, sign,
                   stride_hm, stride_hr, stride_bs, stride_bn, stride_br, stride_ym, stride_yn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr):
    start, length, slot, rank, offs_m, offs_n, offs_k, m_mask = _segment_tile(
        seg_start_ptr, seg_len_ptr, seg_slot_ptr, ranks_ptr, BLOCK_M, BLOCK_N, BLOCK_K)
    if tl.program_id(1) * BLOCK_M >= length:
        return
    scale = tl.load(scale_ptr + slot) * sign
    n_mask = offs_n < N
    h_ptrs = h_ptr + (start + offs_m)[:, None] * stride_hm + offs_k[None, :] * stride_hr
    b_ptrs = b_ptr + slot * stride_bs + offs_n[None, :] * stride_bn + offs_k[:, None] * stride_br  # B^T tile
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(rank, BLOCK_K)):  # stops at this adapter's rank
        k_mask = offs_k < rank - k * BLOCK_K
        ht = tl.load(h_ptrs, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        bt = tl.load(b_ptrs, mask=k_mask[:, None] & n_mask[None, :], other=0.0)
        if UPCAST:
            bt = bt.to(tl.float32)
        else:
            ht = ht.to(bt.dtype)  # fp16/bf16 tensor-core dot on GPUs; a no-op for fp32
        acc += tl.dot(ht, bt)
        h_ptrs += BLOCK_K * stride_hr
        b_ptrs += BLOCK_K * stride_br
    y_ptrs = y_ptr + (start + offs_m)[:, None] * stride_ym + offs_n[None, :] * stride_yn
    y_mask = m_mask[:, None] & n_mask[None, :]
    yt = tl.load(y_ptrs, mask=y_mask, other=0.0)
    tl.store(y_ptrs, (yt.to(tl.float32) + scale * acc).to(yt.dtype), mask=y_mask)


def atmm_triton(y: torch.Tensor, x: torch.Tensor, A: torch.Tensor, B: torch.Tensor, seg: Segments,
                scale_t: torch.Tensor, ranks_t: torch.Tensor, config: TritonConfig = DEFAULT_CONFIG,
                sign: float = 1.0) -> None:
    """y[rows of run j] += sign * scale_t[a] * (x[rows] @ A[a, :r].T) @ B[a, :, :r].T, a = seg.slots[j],
    r = ranks_t[a]. y [N, out], x [N, in], A [S, R, in], B [S, out, R]; scale_t float32 [S], ranks_t int32 [S]
    on x's device."""
    if seg.n_runs == 0:
        return
    seg_start, seg_len, seg_slot = seg.device_tensors(x.device)
    launch(y, x, A, B, seg_start, seg_len, seg_slot, scale_t, ranks_t, seg.n_runs, seg.max_run(), config, sign)


class TritonBackend(AtmmBackend):
    """Both kernels over the runs, with ``config`` (a ``TritonConfig``) or the tuned table's choice for this
    shape bucket; the sign goes to the expand kernel, so the cached device scales serve both mixture passes.
    The images path is the same kernels with one run per image; the fused path is kernels/triton_fused.py."""

    paths = frozenset({ROWS, IMAGES, FUSED})

    def apply(self, y, x, A, B, seg: Segments, scale: list[float], ranks: list[int], sign: float = 1.0, *,
              config=None, device_params=None) -> None:
        if device_params is None:
            device_params = (torch.tensor(scale, dtype=torch.float32, device=x.device),
                             torch.tensor(ranks, dtype=torch.int32, device=x.device))
        choice = config or lookup(x.shape[1], y.shape[1], seg, ranks, x.device)
        atmm_triton(y, x, A, B, seg, device_params[0], device_params[1], choice, sign)

    def apply_images(self, y, x, A, B, slot, length, scale, ranks, tokens, sign=1.0, start=None, h=None) -> None:
        n = slot.shape[0]
        if start is None:
            start = torch.arange(n, dtype=torch.int32, device=x.device) * tokens
        config = lookup_images(x.shape[1], y.shape[1], n, tokens, A.shape[1], x.device)
        launch(y, x, A, B, start, length, slot, scale, ranks, n, tokens, config=config, sign=sign, h=h)

    def linear_images(self, x, weight, bias, A, B, slot, length, scale, ranks, tokens, max_rank, out=None,
                      tiles=None):
        if tokens < 16:  # a tile spans at most two images and has >= 16 rows: the unfused torch form
            return lora_linear_images_torch(x, weight, bias, A, B, slot, length, scale, ranks, tokens, out)
        y = out if out is not None else torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
        triton_fused.launch_fused(y, x, weight, bias, A, B, slot, length, scale, tokens, rank_block(max_rank),
                                  tiles or DEFAULT_TILES)
        return y


def launch(y: torch.Tensor, x: torch.Tensor, A: torch.Tensor, B: torch.Tensor, run_start: torch.Tensor,
           run_len: torch.Tensor, run_slot: torch.Tensor, scale_t: torch.Tensor, ranks_t: torch.Tensor, n_runs: int,
           max_len: int, config: TritonConfig = DEFAULT_CONFIG, sign: float = 1.0,
           h: torch.Tensor | None = None) -> None:
    """The two kernels over n_runs runs described by device tensors (a run of length 0 does nothing). The grid
    depends only on (n_runs, max_len, shapes), never on the data, so a CUDA graph can replay it with new runs.
    h: an optional float32 [N, >= R] scratch buffer (no allocation per call)."""
    R = A.shape[1]
    if h is None:
        h = torch.empty(x.shape[0], R, dtype=torch.float32, device=x.device)
    upcast = interpreted_bf16(x.dtype)
    c = config.shrink
    grid = (n_runs, triton.cdiv(max_len, c.block_m), triton.cdiv(R, c.block_n))
    _shrink_kernel[grid](x, A, h, run_start, run_len, run_slot, ranks_t, x.shape[1],
                         x.stride(0), x.stride(1), A.stride(0), A.stride(1), A.stride(2), h.stride(0), h.stride(1),
                         BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, UPCAST=upcast,
                         num_warps=c.num_warps, num_stages=c.num_stages)
    c = config.expand
    grid = (n_runs, triton.cdiv(max_len, c.block_m), triton.cdiv(y.shape[1], c.block_n))
    _expand_kernel[grid](h, B, y, run_start, run_len, run_slot, ranks_t, scale_t, y.shape[1], float(sign),
                         h.stride(0), h.stride(1), B.stride(0), B.stride(1), B.stride(2), y.stride(0), y.stride(1),
                         BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, UPCAST=upcast,
                         num_warps=c.num_warps, num_stages=c.num_stages)


def lookup(n_in: int, n_out: int, seg: Segments, ranks: list[int], device) -> TritonConfig:
    """The tuned table's tiles for this shape bucket on this GPU, or the default ones."""
    return _as_config(tuning_tables.lookup(tuning_tables.device_kind(device), n_in, n_out, seg, ranks))


def lookup_images(n_in: int, n_out: int, n_images: int, tokens: int, max_rank: int, device) -> TritonConfig:
    """The tuned tiles for the fixed per-image layout (kernels/images.py) on this GPU, or the default ones."""
    return _images_config(n_in, n_out, n_images, tokens, max_rank, str(device))


@functools.lru_cache(maxsize=1024)  # eager forwards ask once per layer: parse each bucket's entry once
def _images_config(n_in: int, n_out: int, n_images: int, tokens: int, max_rank: int, device: str) -> TritonConfig:
    kind = tuning_tables.device_kind(device)
    return _as_config(tuning_tables.lookup_images(kind, n_in, n_out, n_images, tokens, max_rank))


def _as_config(choice) -> TritonConfig:
    if choice is None or isinstance(choice, str):  # a string: a CPU strategy (Triton under its interpreter on a CPU)
        return DEFAULT_CONFIG
    if isinstance(choice, dict):
        return TritonConfig.from_json(choice)
    return choice
