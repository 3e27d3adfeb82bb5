"""vlora_va.kernels.einsum: the dLoRA-style one-hot baseline against the reference loop, directly and through atmm()."""

import pytest
import torch

from vlora_va.kernels import Segments, atmm, atmm_reference
from vlora_va.kernels.einsum import atmm_einsum
from vlora_va.testing.atmm_cases import CASES, empty_run_segments, make, tol

DTYPES = [torch.float32, torch.float16]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_atmm_einsum_matches_reference(case, dtype):
    x, y, A, B, scale, ranks, idx = make(case, dtype)
    want = atmm_reference(y.clone(), x, A, B, idx, scale, ranks)
    got = y.clone()
    assert atmm_einsum(got, x, A, B, Segments.from_idx(idx), scale, ranks) is None  # in place
    torch.testing.assert_close(got.float(), want.float(), **tol(dtype))


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("merged", [None, "first", "last"], ids=["plain", "delora-first", "delora-last"])
def test_atmm_impl_einsum_matches_reference(case, dtype, merged):
    x, y, A, B, scale, ranks, idx = make(case, dtype)
    delora = {None: None, "first": 0, "last": len(ranks) - 1}[merged]  # mixture mode: that slot is merged
    want = atmm_reference(y.clone(), x, A, B, idx, scale, ranks, delora)
    got = atmm(y.clone(), x, A, B, idx, scale, ranks, delora, impl="einsum")
    torch.testing.assert_close(got.float(), want.float(), **tol(dtype))


def test_prebuilt_segments_empty_runs_and_a_reused_layout():
    """One Segments serves every layer of a forward: the cached one-hot mask must not leak between calls
    with other scales (the deLoRA pass negates them)."""
    x, y, A, B, scale, ranks, _ = make(CASES[1])
    seg = empty_run_segments(x.shape[0])
    idx = torch.full((x.shape[0],), -1)
    for s, a, b in zip(seg.slots, seg.starts, seg.ends):
        idx[a:b] = s
    for sc, delora in [(scale, None), ([2.0 * v for v in scale], None), (scale, 1), (scale, None)]:
        want = atmm_reference(y.clone(), x, A, B, idx, sc, ranks, delora)
        got = atmm(y.clone(), x, A, B, seg, sc, ranks, delora, impl="einsum")
        torch.testing.assert_close(got, want, **tol(torch.float32))


def test_rows_without_adapters_are_untouched_and_empty_batches_work():
    x, y, A, B, scale, ranks, _ = make(CASES[0])
    idx = torch.full((x.shape[0],), -1)
    assert torch.equal(atmm(y.clone(), x, A, B, idx, scale, ranks, impl="einsum"), y)
    x2, y2, A2, B2, scale2, ranks2, idx2 = make(CASES[-1])  # slot 0 has rank 0
    only_rank0 = torch.zeros_like(idx2)
    assert torch.equal(atmm(y2.clone(), x2, A2, B2, only_rank0, scale2, ranks2, impl="einsum"), y2)
    e = torch.empty(0, x.shape[1])
    out = atmm(torch.empty(0, y.shape[1]), e, A, B, torch.empty(0, dtype=torch.long), scale, ranks, impl="einsum")
    assert out.shape == (0, y.shape[1])


def test_einsum_really_adds_the_lora_term():
    """Guards the comparisons above against a no-op: the LoRA term of these cases is far above tolerance."""
    x, y, A, B, scale, ranks, idx = make(CASES[1])
    got = atmm(y.clone(), x, A, B, idx, scale, ranks, impl="einsum")
    assert (got - y).abs().max() > 0.1
