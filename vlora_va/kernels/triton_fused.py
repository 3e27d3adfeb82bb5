"""The Triton kernel of kernels/fused.py: base GEMM + bias + each image's LoRA in one pass (its docstring holds
the loop and the tiling). Imported on first use, so TRITON_INTERPRET can still be set before; the interpreter's
bf16 ``tl.dot`` is wrong, so bf16 tiles are upcast to fp32 there (as in triton_atmm: backend.interpreted_bf16)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vlora_va.kernels.backend import interpreted_bf16


@triton.jit
def _fused_kernel(x_ptr, w_ptr, bias_ptr, a_ptr, b_ptr, y_ptr, slot_ptr, len_ptr, scale_ptr, M, N, K, T, R,
                  stride_xm, stride_xk, stride_wn, stride_wk, stride_as, stride_ar, stride_ak,
                  stride_bs, stride_bn, stride_br, stride_ym, stride_yn,
                  HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  BLOCK_R: tl.constexpr, UPCAST: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    first = pid_m * BLOCK_M
    last = tl.minimum(first + BLOCK_M, M) - 1
    img_a = first // T  # BLOCK_M <= T: the tile's rows belong to img_a and img_b (the same image or the next)
    img_b = last // T
    slot_a = tl.load(slot_ptr + img_a).to(tl.int64)
    slot_b = tl.load(slot_ptr + img_b).to(tl.int64)
    coef_a = tl.where(tl.load(len_ptr + img_a) > 0, tl.load(scale_ptr + slot_a), 0.0)
    coef_b = tl.where((tl.load(len_ptr + img_b) > 0) & (img_b != img_a), tl.load(scale_ptr + slot_b), 0.0)

    offs_m = (first + tl.arange(0, BLOCK_M)).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    offs_r = tl.arange(0, 2 * BLOCK_R)  # columns < BLOCK_R: img_a's adapter; the rest: img_b's
    first_half = offs_r < BLOCK_R
    r_in = offs_r % BLOCK_R
    r_slot = tl.where(first_half, slot_a, slot_b)
    r_mask = r_in < R
    m_mask = offs_m < M
    n_mask = offs_n < N
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk
    w_ptrs = w_ptr + offs_n[None, :] * stride_wn + offs_k[:, None] * stride_wk  # W^T tile [BK, BN]
    a_ptrs = a_ptr + r_slot[None, :] * stride_as + r_in[None, :] * stride_ar + offs_k[:, None] * stride_ak
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    h = tl.zeros((BLOCK_M, 2 * BLOCK_R), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_mask = offs_k < K - k * BLOCK_K
        xt = tl.load(x_ptrs, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        wt = tl.load(w_ptrs, mask=k_mask[:, None] & n_mask[None, :], other=0.0)
        at = tl.load(a_ptrs, mask=k_mask[:, None] & r_mask[None, :], other=0.0)
        if UPCAST:
            xt = xt.to(tl.float32)
            wt = wt.to(tl.float32)
            at = at.to(tl.float32)
        acc += tl.dot(xt, wt)
        h += tl.dot(xt, at)  # the shrink of both images' adapters, from the x tile already loaded
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk
        a_ptrs += BLOCK_K * stride_ak

    # Each row keeps its own image's half of h, scaled (0 where the image sits out), then the expand.
    row_img = offs_m // T
    own = ((row_img == img_a)[:, None] & first_half[None, :]) | ((row_img == img_b)[:, None] & ~first_half[None, :])
    coef = tl.where(first_half, coef_a, coef_b)
    h = tl.where(own, h * coef[None, :], 0.0)
    b_ptrs = b_ptr + r_slot[:, None] * stride_bs + offs_n[None, :] * stride_bn + r_in[:, None] * stride_br
    bt = tl.load(b_ptrs, mask=r_mask[:, None] & n_mask[None, :], other=0.0)  # B^T tile [2 BR, BN]
    if UPCAST:
        bt = bt.to(tl.float32)
    else:
        h = h.to(bt.dtype)  # a tensor-core dot in the weights' dtype on GPUs; a no-op for fp32
    acc += tl.dot(h, bt)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :] * stride_yn
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def tile_rows(block_m: int, tokens: int) -> int:
    """The tile's row count: at most `tokens` (so a tile spans at most two images), a power of two >= 16."""
    bm = block_m
    while bm > 16 and bm > tokens:
        bm //= 2
    return bm


def launch_fused(y: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, A: torch.Tensor,
                 B: torch.Tensor, slot: torch.Tensor, length: torch.Tensor, scale: torch.Tensor, tokens: int,
                 block_r: int, tiles) -> None:
    """One launch over every row, with `tiles` (a kernels.fused.FusedTiles): the grid depends only on the shapes,
    never on the data (CUDA-graph replayable)."""
    if tokens < 16:
        raise ValueError(f"the fused kernel needs >= 16 tokens per image (a tile spans at most two), got {tokens}")
    M, K = x.shape
    N = weight.shape[0]
    bm = tile_rows(tiles.block_m, tokens)
    grid = (triton.cdiv(M, bm), triton.cdiv(N, tiles.block_n))
    _fused_kernel[grid](x, weight, bias if bias is not None else weight, A, B, y, slot, length, scale,
                        M, N, K, tokens, A.shape[1],
                        x.stride(0), x.stride(1), weight.stride(0), weight.stride(1),
                        A.stride(0), A.stride(1), A.stride(2), B.stride(0), B.stride(1), B.stride(2),
                        y.stride(0), y.stride(1),
                        HAS_BIAS=bias is not None, BLOCK_M=bm, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
                        BLOCK_R=block_r, UPCAST=interpreted_bf16(x.dtype), num_warps=tiles.num_warps,
                        num_stages=tiles.num_stages)
