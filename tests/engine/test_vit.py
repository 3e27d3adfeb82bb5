"""vit: the backbone in two parts, and LayerScale folded into the linear layers before it."""

from __future__ import annotations

import copy

import torch

from vlora_va.engine.backbones import load_backbone
from vlora_va.engine.backends.torch_eager import lower, upper
from vlora_va.engine.lora import inject_lora, load_adapter
from vlora_va.engine.modes import LoRAMode
from vlora_va.engine.vit import fold_layer_scale, num_blocks
from vlora_va.testing.tiny import TINY_IMAGE


def _pixels(n=3, seed=0):
    return torch.randn(n, 3, TINY_IMAGE, TINY_IMAGE, generator=torch.Generator().manual_seed(seed))


def test_lower_then_upper_is_the_models_own_forward(tiny_backbone_dir):
    model = load_backbone(str(tiny_backbone_dir)).eval()
    x = _pixels()
    with torch.no_grad():
        want = model(pixel_values=x).last_hidden_state
        for split in range(num_blocks(model) + 1):
            assert torch.allclose(upper(model, lower(model, x, split), split), want, atol=1e-6)


def test_folding_layer_scale_keeps_the_forward_and_scales_each_output_layer(tiny_backbone_dir):
    model = load_backbone(str(tiny_backbone_dir)).eval()
    folded_model = copy.deepcopy(model)
    folded = fold_layer_scale(folded_model)
    block = model.encoder.layer[0]
    assert set(folded) == {f"encoder.layer.{i}.{n}" for i in range(2) for n in ("attention.o_proj", "mlp.fc2")}
    lam = block.layer_scale1.lambda1.detach()
    assert not torch.allclose(lam, torch.ones_like(lam))  # the fixture's LayerScale is far from 1
    # Plain loop: row o of W and b times lambda[o].
    o_proj = folded_model.encoder.layer[0].attention.o_proj
    for o in range(lam.numel()):
        assert torch.allclose(o_proj.weight[o], block.attention.o_proj.weight[o] * lam[o])
        assert torch.allclose(o_proj.bias[o], block.attention.o_proj.bias[o] * lam[o])
    assert isinstance(folded_model.encoder.layer[0].layer_scale1, torch.nn.Identity)
    x = _pixels()
    with torch.no_grad():
        assert torch.allclose(folded_model(pixel_values=x).last_hidden_state,
                              model(pixel_values=x).last_hidden_state, atol=1e-5)


def test_a_lora_on_a_folded_layer_computes_the_unfolded_layers_lora(tiny_backbone_dir):
    """W' = diag(l) W and B' = diag(l) B: the folded model with LoRA == the original model with LoRA."""
    model = load_backbone(str(tiny_backbone_dir)).eval()
    g = torch.Generator().manual_seed(3)
    weights = {f"encoder.layer.{i}.{n}": (torch.randn(4, din, generator=g) * 0.2, torch.randn(dout, 4, generator=g) * 0.2)
               for i in range(2) for n, din, dout in (("attention.o_proj", 32, 32), ("mlp.fc2", 128, 32))}
    plain, folded_model = copy.deepcopy(model), copy.deepcopy(model)
    x = _pixels(2, seed=4)
    outs = []
    for m, scales in ((plain, None), (folded_model, fold_layer_scale(folded_model))):
        ctx = inject_lora(m, list(weights), num_slots=2, max_rank=8, out_scales=scales)
        load_adapter(m, 1, weights, 1.5)
        ctx.begin(LoRAMode("unmerged"), [1, 1])
        with torch.no_grad():
            outs.append(m(pixel_values=x).last_hidden_state)
        ctx.clear()
    assert torch.allclose(outs[0], outs[1], atol=1e-5)
    with torch.no_grad():
        assert not torch.allclose(outs[0], model(pixel_values=x).last_hidden_state, atol=1e-3)  # the LoRA counts
