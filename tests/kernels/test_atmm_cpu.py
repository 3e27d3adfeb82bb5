"""Every CPU strategy (and the auto-dispatch through the tuned table) against the reference loop."""

import pytest
import torch

from vlora_va.kernels import Segments, atmm, atmm_reference
from vlora_va.kernels.cpu import STRATEGIES
from vlora_va.testing.atmm_cases import CASES, empty_run_segments, make, tol

DTYPES = [torch.float32, torch.float16]
CONFIGS = [None, *STRATEGIES]  # None: looked up in the table


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("config", CONFIGS, ids=str)
@pytest.mark.parametrize("delora", [None, 0], ids=["plain", "delora0"])
def test_cpu_matches_reference(case, dtype, config, delora):
    x, y, A, B, scale, ranks, idx = make(case, dtype)
    want = atmm_reference(y.clone(), x, A, B, idx, scale, ranks, delora)
    got = atmm(y.clone(), x, A, B, idx, scale, ranks, delora, impl="cpu", config=config)
    torch.testing.assert_close(got.float(), want.float(), **tol(dtype))


@pytest.mark.parametrize("config", list(STRATEGIES))
def test_prebuilt_segments_and_empty_runs(config):
    x, y, A, B, scale, ranks, _ = make(CASES[1])
    seg = empty_run_segments(x.shape[0])
    idx = torch.full((x.shape[0],), -1)
    for s, a, b in zip(seg.slots, seg.starts, seg.ends):
        idx[a:b] = s
    want = atmm_reference(y.clone(), x, A, B, idx, scale, ranks)
    got = atmm(y.clone(), x, A, B, seg, scale, ranks, config=config)
    torch.testing.assert_close(got, want, **tol(torch.float32))


def test_zero_rows_and_no_adapter_rows_untouched():
    x, y, A, B, scale, ranks, _ = make(CASES[0])
    idx = torch.full((x.shape[0],), -1)
    assert torch.equal(atmm(y.clone(), x, A, B, idx, scale, ranks), y)
    e = torch.empty(0, x.shape[1])
    assert atmm(torch.empty(0, y.shape[1]), e, A, B, torch.empty(0, dtype=torch.long), scale, ranks).numel() == 0


def test_ranks_default_to_stack_rank_and_tensor_args():
    x, y, A, B, scale, _, idx = make(CASES[0])
    want = atmm_reference(y.clone(), x, A, B, idx, scale)
    got = atmm(y.clone(), x, A, B, idx, torch.tensor(scale), None)
    torch.testing.assert_close(got, want)


def test_segments_layout():
    seg = Segments.from_elements([2, 2, -1, 0, 2, -1], 3)
    assert (seg.starts, seg.ends, seg.slots) == ((0, 9, 12), (6, 12, 15), (2, 0, 2))
    assert not seg.is_grouped and seg.used_slots == (2, 0)
    d = seg.delora(2)
    assert (d.starts, d.ends, d.slots) == ((6, 15), (12, 18), (2, 2))
    w = seg.without(2)
    assert (w.starts, w.ends, w.slots) == ((9,), (12,), (0,))
