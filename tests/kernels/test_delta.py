"""One-shot ΔW for a group of same-shaped layers against the per-layer loop."""

import pytest
import torch

from vlora_va.kernels import delta_weights, delta_weights_reference


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_delta_weights_matches_loop(dtype):
    g = torch.Generator().manual_seed(0)
    L, S, R, n_in, n_out = 5, 3, 16, 24, 40
    ranks = [16, 4, 8, 16, 0]
    A, B = torch.zeros(L, S, R, n_in), torch.zeros(L, S, n_out, R)
    for l, r in enumerate(ranks):
        A[l, 1, :r] = torch.randn(r, n_in, generator=g)
        B[l, 1, :, :r] = torch.randn(n_out, r, generator=g)
    A, B = A.to(dtype), B.to(dtype)
    scale = torch.tensor([0.5, 1.0, 2.0, 0.25, 1.0])
    want = delta_weights_reference(A[:, 1], B[:, 1], scale, ranks)
    got = delta_weights(A[:, 1], B[:, 1], scale, max(ranks))  # a strided slot view of the pool
    tol = {} if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(got.float(), want.float(), **tol)
    torch.testing.assert_close(delta_weights(A[:, 1], B[:, 1], 2.0), 2.0 * delta_weights(A[:, 1], B[:, 1], 1.0))
