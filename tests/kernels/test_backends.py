"""The ATMM backend plug-in point: atmm() resolves `impl` through ATMM_BACKENDS, runs the mixture-mode passes
for every backend alike, and a backend defined outside the package works once registered; the per-image entries
(atmm_images, lora_linear_images) resolve it the same way, from the backends that declare their path."""

import importlib.util

import pytest
import torch

from vlora_va.contracts.plugins import ATMM_BACKENDS, UnknownPlugin
from vlora_va.kernels import AtmmBackend, atmm, atmm_images, atmm_reference, lora_linear_images
from vlora_va.kernels.backend import FUSED, IMAGES, ROWS
from vlora_va.testing.atmm_cases import CASES, LoopPathsBackend, make, tol


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


def registered(name: str, cls):
    """A fixture's body: `name` registered to cls for one test, removed afterwards."""
    ATMM_BACKENDS.register(name, cls)
    try:
        yield cls
    finally:
        ATMM_BACKENDS.unregister(name)


@pytest.fixture
def loop_backend():
    LoopBackend.signs = []
    yield from registered("loop", LoopBackend)


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


# --- the per-image paths: atmm_images and lora_linear_images ask the registry too ---------------------------------

def test_each_built_in_declares_the_paths_it_computes():
    """The per-image paths (what CUDA graphs replay) are Triton's and the CPU backend's torch forms; the oracle and
    the dLoRA-style einsum compute runs of rows only."""
    want = {"reference": {ROWS}, "einsum": {ROWS}, "cpu": {ROWS, IMAGES, FUSED}, "triton": {ROWS, IMAGES, FUSED}}
    for name, paths in want.items():
        if name == "triton" and importlib.util.find_spec("triton") is None:
            continue
        assert set(ATMM_BACKENDS.load(name).paths) == paths, name


@pytest.fixture
def loop_paths():
    """All three paths as plain loops, recording each call."""
    LoopPathsBackend.calls = []
    yield from registered("loop-paths", LoopPathsBackend)


def images_problem(T=6, slots=(1, 0, 2, 1), sit_out=(False, False, True, False)):
    """Images of T rows, one sitting out, adapters of ranks 4 / 8 / 2 in a stack 8 wide (zero past each rank)."""
    g = torch.Generator().manual_seed(4)
    ranks = torch.tensor([4, 8, 2], dtype=torch.int32)
    A, B = torch.zeros(3, 8, 12), torch.zeros(3, 20, 8)
    for s, r in enumerate(ranks.tolist()):
        A[s, :r], B[s, :, :r] = torch.randn(r, 12, generator=g), torch.randn(20, r, generator=g)
    x = torch.randn(len(slots) * T, 12, generator=g)
    W, bias = torch.randn(20, 12, generator=g), torch.randn(20, generator=g)
    slot = torch.tensor(slots, dtype=torch.int32)
    length = torch.tensor([0 if out else T for out in sit_out], dtype=torch.int32)
    return x, W, bias, A, B, slot, length, torch.tensor([0.5, 2.0, 1.5]), ranks, T


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_atmm_images_runs_the_backend_impl_names(loop_paths, sign):
    x, W, bias, A, B, slot, length, scale, ranks, T = images_problem()
    y = torch.randn(x.shape[0], 20)
    want = y.clone()
    atmm_images(want, x, A, B, slot, length, scale, ranks, T, sign, impl="cpu")  # the torch form
    got = y.clone()
    atmm_images(got, x, A, B, slot, length, scale, ranks, T, sign, impl="loop-paths")
    assert loop_paths.calls == [(IMAGES, sign)]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert (got - y).abs().max() > 0.1  # the LoRA term is far above tolerance: not a no-op


def test_lora_linear_images_runs_the_backend_impl_names(loop_paths):
    x, W, bias, A, B, slot, length, scale, ranks, T = images_problem()
    want = lora_linear_images(x, W, bias, A, B, slot, length, scale, ranks, T, 8, impl="cpu")
    got = lora_linear_images(x, W, bias, A, B, slot, length, scale, ranks, T, 8, impl="loop-paths")
    assert loop_paths.calls == [(FUSED, 1.0)]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_the_per_image_default_is_looked_up_in_the_registry(loop_paths, monkeypatch):
    """CPU tensors (without the Triton interpreter) default to "cpu" on both per-image paths: whatever that name
    is registered to runs them."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    x, W, bias, A, B, slot, length, scale, ranks, T = images_problem()
    original = ATMM_BACKENDS.entries["cpu"]
    ATMM_BACKENDS.register("cpu", LoopPathsBackend)
    try:
        atmm_images(torch.zeros(x.shape[0], 20), x, A, B, slot, length, scale, ranks, T)
        lora_linear_images(x, W, bias, A, B, slot, length, scale, ranks, T, 8)
    finally:
        ATMM_BACKENDS.register("cpu", original)
    assert loop_paths.calls == [(IMAGES, 1.0), (FUSED, 1.0)]


@pytest.mark.parametrize("impl, entry, path", [("einsum", "images", IMAGES), ("reference", "fused", FUSED)])
def test_a_backend_that_does_not_declare_a_path_is_refused_by_name(impl, entry, path):
    x, W, bias, A, B, slot, length, scale, ranks, T = images_problem()
    with pytest.raises(ValueError, match=f"ATMM backend '{impl}' does not compute the '{path}' path"):
        if entry == "images":
            atmm_images(torch.zeros(x.shape[0], 20), x, A, B, slot, length, scale, ranks, T, impl=impl)
        else:
            lora_linear_images(x, W, bias, A, B, slot, length, scale, ranks, T, 8, impl=impl)
