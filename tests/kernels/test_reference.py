"""The oracle itself: checked against the formula written out by hand for single rows."""

import torch

from vlora_va.kernels import atmm_reference, delta_weights_reference


def test_reference_matches_hand_written_formula():
    g = torch.Generator().manual_seed(1)
    A, B = torch.randn(2, 4, 3, generator=g), torch.randn(2, 5, 4, generator=g)
    x, y = torch.randn(3, 3, generator=g), torch.randn(3, 5, generator=g)
    idx = torch.tensor([1, -1, 0])
    out = atmm_reference(y.clone(), x, A, B, idx, [2.0, 3.0], ranks=[4, 2])
    torch.testing.assert_close(out[0], y[0] + 3.0 * (x[0] @ A[1, :2].T) @ B[1, :, :2].T)
    torch.testing.assert_close(out[1], y[1])
    torch.testing.assert_close(out[2], y[2] + 2.0 * (x[2] @ A[0].T) @ B[0].T)


def test_reference_delora_term():
    g = torch.Generator().manual_seed(2)
    A, B = torch.randn(2, 4, 3, generator=g), torch.randn(2, 5, 4, generator=g)
    x, y = torch.randn(3, 3, generator=g), torch.randn(3, 5, generator=g)
    out = atmm_reference(y.clone(), x, A, B, torch.tensor([1, -1, 0]), [2.0, 3.0], delora_slot=0)
    d0 = lambda i: 2.0 * (x[i] @ A[0].T) @ B[0].T  # noqa: E731
    torch.testing.assert_close(out[0], y[0] + 3.0 * (x[0] @ A[1].T) @ B[1].T - d0(0))
    torch.testing.assert_close(out[1], y[1] - d0(1))
    torch.testing.assert_close(out[2], y[2])  # the merged adapter's own row: nothing to add


def test_delta_reference_formula():
    A, B = torch.randn(3, 4, 6), torch.randn(3, 5, 4)
    out = delta_weights_reference(A, B, [1.0, 2.0, 0.5], ranks=[4, 2, 3])
    torch.testing.assert_close(out[1], 2.0 * B[1, :, :2] @ A[1, :2])
