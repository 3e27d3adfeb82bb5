"""LoRALinear / inject_lora / load_adapter on a tiny random Dinov2Model, checked against peft's own
mixed-batch forward (adapter_names=) with the same weights."""

import copy

import pytest
import torch
from torch import nn
from transformers import Dinov2Config, Dinov2Model

from vlora_va.engine import lora
from vlora_va.engine.modes import MERGED, MIXTURE, PREMERGED, UNMERGED, LoRAMode

TARGETS = ["q_proj", "v_proj", "fc2"]


def tiny_model(seed=0) -> Dinov2Model:
    torch.manual_seed(seed)
    cfg = Dinov2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, patch_size=14, image_size=28)
    return Dinov2Model(cfg).eval()


def random_adapter(model, rank, seed, targets=TARGETS):
    """{name: (A [r, in], B [out, r])} for every targeted nn.Linear (names of the un-wrapped model)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for n, m in model.named_modules():
        if isinstance(m, nn.Linear) and n.rsplit(".", 1)[-1] in targets:
            out[n] = (torch.randn(rank, m.in_features, generator=g) * 0.2,
                      torch.randn(m.out_features, rank, generator=g) * 0.2)
    return out


def forward(model, x):
    with torch.no_grad():
        return model(pixel_values=x).last_hidden_state


def unmerged(ctx, rows):
    ctx.begin(LoRAMode(UNMERGED), rows)


@pytest.fixture(scope="module")
def setup():
    base = tiny_model()
    adapters = {"a": (random_adapter(base, 4, 1), 2.0), "b": (random_adapter(base, 16, 2), 0.5)}
    model = copy.deepcopy(base)
    ctx = lora.inject_lora(model, TARGETS, num_slots=4, max_rank=16)
    lora.load_adapter(model, 0, *adapters["a"])
    lora.load_adapter(model, 2, *adapters["b"])
    x = torch.randn(5, 3, 28, 28, generator=torch.Generator().manual_seed(3))
    return base, adapters, model, ctx, x


def peft_model(base, adapters):
    peft = pytest.importorskip("peft")
    pm = None
    for name, (w, scale) in adapters.items():
        r = next(iter(w.values()))[0].shape[0]
        cfg = peft.LoraConfig(r=r, lora_alpha=scale * r, target_modules=TARGETS, init_lora_weights=False)
        if pm is None:
            pm = peft.get_peft_model(copy.deepcopy(base), cfg, adapter_name=name)
        else:
            pm.add_adapter(name, cfg)
        for n, m in pm.named_modules():
            if hasattr(m, "lora_A") and name in m.lora_A:
                a, b = w[n.removeprefix("base_model.model.")]
                m.lora_A[name].weight.data.copy_(a)
                m.lora_B[name].weight.data.copy_(b)
    return pm.eval()


def test_module_names_follow_installed_transformers(setup):
    _, _, model, _, _ = setup
    names = lora.lora_module_names(model)
    assert len(names) == 2 * len(TARGETS)
    assert "encoder.layer.0.attention.q_proj" in names and "encoder.layer.1.mlp.fc2" in names


def test_mixed_batch_matches_peft(setup):
    base, adapters, model, ctx, x = setup
    pm = peft_model(base, adapters)
    names = ["b", "a", "__base__", "b", "a"]
    with torch.no_grad():
        want = pm(pixel_values=x, adapter_names=names).last_hidden_state
    unmerged(ctx, torch.tensor([2, 0, -1, 2, 0]))
    torch.testing.assert_close(forward(model, x), want, atol=1e-4, rtol=1e-4)
    ctx.begin(LoRAMode(UNMERGED, impl="einsum"), [2, 0, -1, 2, 0])
    torch.testing.assert_close(forward(model, x), want, atol=1e-4, rtol=1e-4)
    ctx.clear()
    torch.testing.assert_close(forward(model, x), forward(base, x), atol=1e-5, rtol=1e-5)


def test_mixture_mode_equals_unmerged(setup):
    _, _, model, ctx, x = setup
    slots = [2, 0, -1, 2, 0]
    unmerged(ctx, slots)
    want = forward(model, x)
    lora.merge_slot(model, 0)
    try:
        ctx.begin(LoRAMode(MIXTURE, 0), slots)
        torch.testing.assert_close(forward(model, x), want, atol=1e-4, rtol=1e-4)
        ctx.begin(LoRAMode(MERGED, 0), [0] * 5)  # merged mode: everyone sees W + ΔW_0
        merged = forward(model, x)
        lora.unmerge(model)
        unmerged(ctx, [0] * 5)
        torch.testing.assert_close(forward(model, x), merged, atol=1e-4, rtol=1e-4)
    finally:
        lora.unmerge(model)
        ctx.clear()


def test_every_mode_computes_the_same_features():
    """The same rows give the same features in every mode that can serve them (fp32, 1e-4 max-abs)."""
    base = tiny_model()
    model = copy.deepcopy(base)
    ctx = lora.inject_lora(model, TARGETS, num_slots=3, max_rank=16)
    for slot, (rank, seed, scale) in enumerate([(4, 1, 2.0), (16, 2, 0.5), (8, 3, 1.5)]):
        lora.load_adapter(model, slot, random_adapter(base, rank, seed), scale)
    lora.enable_premerge(model)
    x = torch.randn(6, 3, 28, 28, generator=torch.Generator().manual_seed(7))
    rows = [1, 1, 0, 2, 2, 0]
    unmerged(ctx, rows)
    want = forward(model, x)
    got = {}
    for name, mode in [("premerged", LoRAMode(PREMERGED)), ("einsum", LoRAMode(UNMERGED, impl="einsum"))]:
        ctx.begin(mode, rows)
        got[name] = forward(model, x)
    for slot in range(3):
        lora.switch_weights(model, slot)
        ctx.begin(LoRAMode(MIXTURE, slot), rows)
        got[f"mixture({slot})"] = forward(model, x)
        ctx.begin(LoRAMode(MERGED, slot), [slot] * 6)
        merged = forward(model, x)
        lora.switch_weights(model, None)
        unmerged(ctx, [slot] * 6)
        got[f"merged({slot})"] = (merged - forward(model, x)).abs().max()
    ctx.clear()
    for name, y in got.items():
        if name.startswith("merged"):
            assert y <= 1e-4, name
        else:
            assert (y - want).abs().max() <= 1e-4, name
    assert (want - forward(base, x)).abs().max() > 1e-2  # the adapters do change the features


@pytest.mark.parametrize("mode, rows, weights, match", [
    (LoRAMode(MERGED, 0), [0, 1], 0, "every row must use slot 0"),
    (LoRAMode(MIXTURE, 1), [0, 1], 0, "needs the base weights to hold slot 1"),
    (LoRAMode(UNMERGED), [0, 1], 0, "needs the base weights to hold slot None"),
    (LoRAMode(PREMERGED), [0, 1], None, "without premerged weights"),
    (LoRAMode(MERGED, 5), [5], None, "out of range"),
])
def test_begin_refuses_a_mode_the_weights_cannot_serve(mode, rows, weights, match):
    model = tiny_model()
    ctx = lora.inject_lora(model, TARGETS, num_slots=2, max_rank=16)
    if weights is not None:
        lora.merge_slot(model, weights)
    with pytest.raises(ValueError, match=match):
        ctx.begin(mode, rows)


@pytest.mark.parametrize("kwargs, match", [
    (dict(kind="fused"), "must be one of"),
    (dict(kind=MERGED), "needs a slot"),
    (dict(kind=UNMERGED, slot=1), "takes no slot"),
    (dict(kind=UNMERGED, impl="cuda"), "impl must be one of"),
])
def test_lora_mode_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LoRAMode(**kwargs)


def test_switch_weights_reports_whether_anything_changed(setup):
    _, _, model, ctx, _ = setup
    assert lora.switch_weights(model, None) is False
    assert lora.switch_weights(model, 2) is True and lora.merged_slot(model) == 2
    assert lora.switch_weights(model, 2) is False
    assert lora.switch_weights(model, None) is True and ctx.weights_slot is None


def test_merge_unmerge_cycles_leave_no_drift(setup):
    base, _, model, ctx, x = setup
    w0 = model.encoder.layer[0].attention.q_proj.base.weight.clone()
    for _ in range(5):
        lora.merge_slot(model, 2)
        lora.merge_slot(model, 0)
        lora.unmerge(model)
    assert torch.equal(model.encoder.layer[0].attention.q_proj.base.weight, w0)
    assert lora.merged_slot(model) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_switch_cycles_leave_every_layer_group_exactly_pristine(dtype):
    """A fresh model (not the shared fixture, which other tests switch): after 50 cycles through both slots and
    back, every wrapped layer of every group (q_proj, v_proj, fc2 of both blocks) holds exactly the weights of
    the never-wrapped model, and merging a slot again gives exactly the first merge of it, also in bfloat16,
    where accumulated rounding would show first."""
    base = tiny_model().to(dtype)
    pristine = {n: m.weight.detach().clone() for n, m in base.named_modules()
                if isinstance(m, nn.Linear) and n.rsplit(".", 1)[-1] in TARGETS}
    model = copy.deepcopy(base)
    lora.inject_lora(model, TARGETS, num_slots=4, max_rank=16)
    lora.load_adapter(model, 0, random_adapter(tiny_model(), 4, 1), 2.0)
    lora.load_adapter(model, 2, random_adapter(tiny_model(), 16, 2), 0.5)
    layers = lora._lora_layers(model)
    assert set(layers) == set(pristine) and len(layers) == 2 * len(TARGETS)

    def weights():
        return {n: layer.base.weight.detach().clone() for n, layer in layers.items()}

    lora.merge_slot(model, 2)
    first_merge = weights()
    assert all(not torch.equal(first_merge[n], pristine[n]) for n in layers)  # the merge changed every layer
    for i in range(50):
        lora.merge_slot(model, 0)
        lora.switch_weights(model, 2)
        lora.switch_weights(model, None if i % 2 else 0)
        lora.unmerge(model)
    assert lora.merged_slot(model) is None
    for n, w in weights().items():
        assert w.dtype == dtype and torch.equal(w, pristine[n]), n
    lora.merge_slot(model, 2)
    for n, w in weights().items():
        assert torch.equal(w, first_merge[n]), n


def test_slot_delta_weights(setup):
    _, adapters, model, _, _ = setup
    dw = lora.slot_delta_weights(model, 2)
    w, scale = adapters["b"]
    n = "encoder.layer.1.mlp.fc2"
    torch.testing.assert_close(dw[n], scale * w[n][1] @ w[n][0])
    assert set(dw) == set(lora.lora_module_names(model))


def test_2d_input_rows_are_elements():
    lin = nn.Linear(8, 6)
    holder = nn.Sequential(lin)
    ctx = lora.inject_lora(holder, ["0"], num_slots=2, max_rank=4)
    a, b = torch.randn(3, 8), torch.randn(6, 3)
    lora.load_adapter(holder, 1, {"0": (a, b)}, 1.5)
    x = torch.randn(4, 8)
    unmerged(ctx, torch.tensor([1, -1, 1, 0]))
    with torch.no_grad():
        y = holder(x)
        want = lin(x)
    want[[0, 2]] += 1.5 * x[[0, 2]] @ a.T @ b.T
    torch.testing.assert_close(y, want)


def test_reload_replaces_slot_fully_and_clear_slot():
    model = tiny_model()
    ctx = lora.inject_lora(model, TARGETS, num_slots=2, max_rank=16)
    x = torch.randn(2, 3, 28, 28)
    big = random_adapter(model.__class__(model.config), 16, 5)  # names of an un-wrapped model
    lora.load_adapter(model, 1, big, 1.0)
    small = {n: w for n, w in random_adapter(tiny_model(), 4, 6, ["q_proj"]).items()}
    lora.load_adapter(model, 1, small, 1.0)
    fresh = tiny_model()
    fresh_ctx = lora.inject_lora(fresh, TARGETS, num_slots=2, max_rank=16)
    lora.load_adapter(fresh, 1, small, 1.0)
    unmerged(ctx, [1, 1])
    unmerged(fresh_ctx, [1, 1])
    torch.testing.assert_close(forward(model, x), forward(fresh, x))  # nothing left of the rank-16 adapter
    lora.clear_slot(model, 1)
    ctx.clear()
    plain = forward(model, x)
    unmerged(ctx, [1, 1])
    torch.testing.assert_close(forward(model, x), plain)


@pytest.mark.parametrize("weights,match", [
    ({"encoder.layer.9.attention.q_proj": (torch.zeros(4, 32), torch.zeros(32, 4))}, "unknown LoRA module"),
    ({"encoder.layer.0.attention.q_proj": (torch.zeros(32, 32), torch.zeros(32, 32))}, "rank 32"),
    ({"encoder.layer.0.attention.q_proj": (torch.zeros(4, 31), torch.zeros(32, 4))}, r"q_proj: expected A \[r, 32\]"),
    ({"encoder.layer.0.attention.q_proj": (torch.zeros(4, 32), torch.zeros(32, 5))}, "got A"),
])
def test_load_adapter_validation(weights, match):
    model = tiny_model()
    lora.inject_lora(model, TARGETS, num_slots=2, max_rank=16)
    with pytest.raises(ValueError, match=match):
        lora.load_adapter(model, 0, weights, 1.0)


def test_bad_slots_and_rows():
    model = tiny_model()
    ctx = lora.inject_lora(model, TARGETS, num_slots=2, max_rank=16)
    with pytest.raises(ValueError, match="slot 2"):
        lora.load_adapter(model, 2, {}, 1.0)
    with pytest.raises(ValueError, match="out of range"):
        unmerged(ctx, torch.tensor([0, 3]))
    unmerged(ctx, torch.tensor([0, 1, 1]))
    with pytest.raises(ValueError, match="3 batch elements"):
        forward(model, torch.randn(2, 3, 28, 28))
    with pytest.raises(ValueError, match="no nn.Linear matches"):
        lora.inject_lora(tiny_model(), ["nope"], 2, 4)


def test_premerged_weights_give_the_same_outputs_as_atmm():
    """enable_premerge: each run of rows through W + scale·B·A equals base + ATMM, including rows
    without adapter, after a slot is reloaded and after it is cleared; with a slot merged, mixture serves."""
    base = tiny_model()
    a, b = random_adapter(base, 4, 1), random_adapter(base, 16, 2)
    plain, pre = copy.deepcopy(base), copy.deepcopy(base)
    ctxs = [lora.inject_lora(m, TARGETS, num_slots=3, max_rank=16) for m in (plain, pre)]
    for m in (plain, pre):
        lora.load_adapter(m, 0, a, 2.0)
        lora.load_adapter(m, 1, b, 0.5)
        lora.load_adapter(m, 2, random_adapter(base, 8, 3), 1.5)
    lora.enable_premerge(pre)
    assert lora.premerge_bytes(pre) == 3 * sum(
        mod.base.weight.numel() * 4 for mod in pre.modules() if isinstance(mod, lora.LoRALinear))
    x = torch.randn(6, 3, 28, 28, generator=torch.Generator().manual_seed(4))
    rows = torch.tensor([0, 0, -1, 1, 1, -1])

    def both(layout=rows):
        ctxs[0].begin(LoRAMode(UNMERGED), layout)
        ctxs[1].begin(LoRAMode(PREMERGED), layout)
        return forward(plain, x), forward(pre, x)

    want, got = both()
    assert torch.allclose(got, want, atol=1e-5)
    for layout in ([-1, 0, 1, 2, -1, -1], [0, 0, 2, 2, -1, -1]):  # the batched-GEMM path (slot progressions)
        assert torch.allclose(*both(torch.tensor(layout)), atol=1e-5), layout
    for m in (plain, pre):  # reload slot 1 with another adapter: no stale premerged weights
        lora.load_adapter(m, 1, random_adapter(base, 8, 5), 1.0)
    want2, got2 = both()
    assert torch.allclose(got2, want2, atol=1e-5) and not torch.allclose(got2, want, atol=1e-3)
    for m in (plain, pre):
        lora.clear_slot(m, 1)
    want3, got3 = both()
    assert torch.allclose(got3, want3, atol=1e-5)
    lora.merge_slot(pre, 0)  # the weights hold slot 0: premerged mode is refused, mixture serves the rows
    with pytest.raises(ValueError, match="hold slot None"):
        ctxs[1].begin(LoRAMode(PREMERGED), rows)
    lora.merge_slot(plain, 0)
    for c in ctxs:
        c.begin(LoRAMode(MIXTURE, 0), rows)
    assert torch.allclose(forward(pre, x), forward(plain, x), atol=1e-5)


def test_the_fixed_layout_forwards_ask_the_registered_atmm_backend(monkeypatch):
    """What a CUDA graph captures (a DeviceLayout: unmerged and mixture per image, unmerged fused) computes its LoRA
    through the ATMM backend the registry holds, as eager rows do: a backend registered as the device's default
    ("cpu" here) is called once per wrapped layer and pass, and gives the Segments path's features."""
    from vlora_va.contracts.plugins import ATMM_BACKENDS
    from vlora_va.engine.modes import DeviceLayout
    from vlora_va.kernels.backend import FUSED, IMAGES
    from vlora_va.kernels.fused import FusedTiles
    from vlora_va.testing.atmm_cases import LoopPathsBackend

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    base = tiny_model()
    model = copy.deepcopy(base)
    ctx = lora.inject_lora(model, TARGETS, num_slots=3, max_rank=16)
    for slot, (rank, seed, scale) in enumerate([(4, 1, 2.0), (16, 2, 0.5), (8, 3, 1.5)]):
        lora.load_adapter(model, slot, random_adapter(base, rank, seed), scale)
    layers = len(lora.lora_module_names(model))
    x = torch.randn(4, 3, 28, 28, generator=torch.Generator().manual_seed(5))
    rows = [1, 0, 2, -1]
    layout = DeviceLayout(4, 5, 3, 16, torch.device("cpu"))  # 28 px, patch 14: 4 patches + CLS
    unmerged(ctx, rows)
    want = {"unmerged": forward(model, x)}
    lora.switch_weights(model, 1)
    ctx.begin(LoRAMode(MIXTURE, 1), rows)
    want["mixture"] = forward(model, x)
    lora.switch_weights(model, None)
    original, LoopPathsBackend.calls = ATMM_BACKENDS.entries["cpu"], []
    ATMM_BACKENDS.register("cpu", LoopPathsBackend)
    try:
        ctx.begin(LoRAMode(UNMERGED), rows, layout)
        got = {"unmerged": forward(model, x)}
        unmerged_calls, LoopPathsBackend.calls = LoopPathsBackend.calls, []
        ctx.fused = FusedTiles(16, 16, 16, 4, 2)
        got["fused"] = forward(model, x)
        fused_calls, LoopPathsBackend.calls = LoopPathsBackend.calls, []
        ctx.fused = None
        lora.switch_weights(model, 1)
        ctx.begin(LoRAMode(MIXTURE, 1), rows, layout)
        got["mixture"] = forward(model, x)
    finally:
        ATMM_BACKENDS.register("cpu", original)
        ctx.fused = None
        ctx.clear()
        lora.switch_weights(model, None)
    assert unmerged_calls == [(IMAGES, 1.0)] * layers
    assert fused_calls == [(FUSED, 1.0)] * layers
    assert LoopPathsBackend.calls == [(IMAGES, 1.0), (IMAGES, -1.0)] * layers  # mixture: add own, subtract merged
    for name in got:
        torch.testing.assert_close(got[name], want["mixture" if name == "mixture" else "unmerged"], atol=1e-4,
                                   rtol=1e-4)
    assert (want["unmerged"] - forward(base, x)).abs().max() > 1e-2  # the adapters do change the features
