"""The ATMM backend plug-in point: atmm() resolves `impl` through ATMM_BACKENDS, runs the mixture-mode passes
for every backend alike, and a backend defined outside the package works once registered."""

import importlib.util

import pytest
import torch

from vlora_va.contracts.plugins import ATMM_BACKENDS, UnknownPlugin
from vlora_va.kernels import AtmmBackend, atmm, atmm_reference
from vlora_va.testing.atmm_cases import CASES, make, tol


class LoopBackend(AtmmBackend):
    """The interface's loop, written out: one GEMM pair per run. Records the sign of every call."""

    signs: list[float] = []

    def apply(self, y, x, A, B, seg, scale, ranks, sign=1.0, *, config=None, device_params=None):
        LoopBackend.signs.append(sign)
        for a, start, end in zip(seg.slots, seg.starts, seg.ends):
            r = ranks[a]
            y[start:end] += sign * scale[a] * (x[start:end] @ A[a, :r].T) @ B[a, :, :r].T


class NotABackend:
    def apply(self, *args, **kwargs):
        raise AssertionError("never called")


@pytest.fixture
def loop_backend():
    """"loop" registered for one test, removed afterwards."""
    LoopBackend.signs = []
    ATMM_BACKENDS.register("loop", LoopBackend)
    try:
        yield LoopBackend
    finally:
        ATMM_BACKENDS.unregister("loop")


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("delora", [None, 0, "last"], ids=["plain", "delora-first", "delora-last"])
def test_a_registered_backend_is_selected_by_name_and_matches_the_reference(loop_backend, case, delora):
    x, y, A, B, scale, ranks, idx = make(case)
    delora = len(ranks) - 1 if delora == "last" else delora
    want = atmm_reference(y.clone(), x, A, B, idx, scale, ranks, delora)
    got = atmm(y.clone(), x, A, B, idx, scale, ranks, delora, impl="loop")
    torch.testing.assert_close(got, want, **tol(torch.float32))
    # really called: once, or twice in mixture mode (add the others' LoRA, subtract the merged one's)
    assert loop_backend.signs == ([1.0] if delora is None else [1.0, -1.0])


def test_the_default_impl_is_looked_up_in_the_registry(loop_backend):
    """CPU tensors default to "cpu": whatever that name is registered to runs."""
    x, y, A, B, scale, ranks, idx = make(CASES[1])
    original = ATMM_BACKENDS.entries["cpu"]
    ATMM_BACKENDS.register("cpu", LoopBackend)
    try:
        got = atmm(y.clone(), x, A, B, idx, scale, ranks)
    finally:
        ATMM_BACKENDS.register("cpu", original)
    assert loop_backend.signs == [1.0]
    torch.testing.assert_close(got, atmm_reference(y.clone(), x, A, B, idx, scale, ranks), **tol(torch.float32))


@pytest.mark.parametrize("delora", [None, 1], ids=["plain", "delora1"])
def test_reference_backend_by_name(delora):
    x, y, A, B, scale, ranks, idx = make(CASES[1])
    want = atmm_reference(y.clone(), x, A, B, idx, scale, ranks, delora)
    got = atmm(y.clone(), x, A, B, idx, scale, ranks, delora, impl="reference")
    torch.testing.assert_close(got, want, **tol(torch.float32))
    assert (got - y).abs().max() > 0.1  # the LoRA term is far above tolerance: not a no-op


def test_unknown_impl_names_the_known_ones():
    x, y, A, B, scale, ranks, idx = make(CASES[0])
    with pytest.raises(UnknownPlugin, match=r"unknown ATMM backend 'gpu' \(known: reference, einsum, cpu, triton"):
        atmm(y, x, A, B, idx, scale, ranks, impl="gpu")


def test_a_registered_non_backend_is_refused():
    x, y, A, B, scale, ranks, idx = make(CASES[0])
    ATMM_BACKENDS.register("bogus", NotABackend)
    try:
        with pytest.raises(TypeError, match="not an AtmmBackend subclass"):
            atmm(y, x, A, B, idx, scale, ranks, impl="bogus")
    finally:
        ATMM_BACKENDS.unregister("bogus")


def test_every_registered_backend_is_an_atmm_backend():
    assert {"reference", "einsum", "cpu", "triton"} <= set(ATMM_BACKENDS.names())
    for name in ATMM_BACKENDS.names():
        if name == "triton" and importlib.util.find_spec("triton") is None:
            continue  # nothing to import it with; its own tests skip too
        cls = ATMM_BACKENDS.load(name)
        assert isinstance(cls, type) and issubclass(cls, AtmmBackend), (name, cls)
