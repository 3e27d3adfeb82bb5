import copy
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from vlora_va.engine.adapters import (
    AdapterError,
    fit_module_names,
    fit_target_modules,
    load_adapter_dir,
    save_adapter_dir,
)
from vlora_va.engine.backbones import canonical_name, legacy_name, linear_names, renamed_for


@pytest.fixture
def adapter_copy(tiny_adapters, tmp_path):
    dst = tmp_path / "a"
    shutil.copytree(tiny_adapters["detect"], dst)
    return dst


def test_loads_lora_pairs_scale_and_head(adapter_copy):
    a = load_adapter_dir("detect", adapter_copy, 32)
    assert a.task == "detection" and a.rank == 4 and a.scale == 1.0 and not a.trained
    assert sorted(a.lora) == [f"encoder.layer.{i}.attention.{m}" for i in range(2) for m in ("q_proj", "v_proj")]
    A, B = a.lora["encoder.layer.0.attention.q_proj"]
    assert A.shape == (4, 32) and B.shape == (32, 4)


def _edit_json(path, **changes):
    d = json.loads(path.read_text())
    d.update(changes)
    path.write_text(json.dumps(d))


@pytest.mark.parametrize("breakage, message", [
    (lambda p: shutil.rmtree(p), "does not exist"),
    (lambda p: (p / "adapter_config.json").unlink(), "adapter_config.json: missing"),
    (lambda p: (p / "adapter_config.json").write_text("{not json"), "unreadable JSON"),
    (lambda p: _edit_json(p / "adapter_config.json", peft_type="PREFIX_TUNING"), "is not LORA"),
    (lambda p: _edit_json(p / "adapter_config.json", r=2), "rank 4 > r=2"),
    (lambda p: (p / "adapter_model.safetensors").write_bytes(b"\x80\x04garbage pickle"), "not a valid safetensors file"),
    (lambda p: save_file({k: v for k, v in load_file(str(p / "adapter_model.safetensors")).items() if "lora_B" not in k},
                         str(p / "adapter_model.safetensors")), "has lora_A but not its pair"),
    (lambda p: save_file({**load_file(str(p / "adapter_model.safetensors")), "extra.weight": torch.zeros(1)},
                         str(p / "adapter_model.safetensors")), "unexpected tensor 'extra.weight'"),
    (lambda p: _edit_json(p / "head_config.json", task="segmentation"), "unknown task 'segmentation'"),
    (lambda p: _edit_json(p / "head_config.json", version=99), "expected format 'vlora-va-head' version 1"),
    (lambda p: (p / "head.safetensors").unlink(), "head.safetensors: missing"),
    (lambda p: _edit_json(p / "head_config.json", classes=["a", "b", "c"]), "does not fit the head"),
])
def test_broken_adapter_dirs_give_clear_errors(adapter_copy, breakage, message):
    breakage(adapter_copy)
    with pytest.raises(AdapterError, match=message):
        load_adapter_dir("detect", adapter_copy, 32)


# --- module names under transformers < 5.18 (legacy) and >= 5.18 (canonical) --------------------------------

@pytest.fixture(scope="module")
def both_namings(tiny_backbone_dir):
    """The tiny backbone as transformers >= 5.18 builds it, and as < 5.18 does (same weights)."""
    from vlora_va.engine.backbones import load_backbone
    from vlora_va.testing.tiny import as_naming

    return {n: as_naming(load_backbone(str(tiny_backbone_dir)), n) for n in ("canonical", "legacy")}


def _legacy_file(adapter_dir):
    """Rewrite an adapter's tensors under legacy names, as plain peft on transformers 5.17 saves them."""
    f = adapter_dir / "adapter_model.safetensors"
    save_file({legacy_name(k): v for k, v in load_file(str(f)).items()}, str(f))


def _merged_output(backbone, adapter):
    """The backbone's output with the adapter's LoRA folded in by hand (W + scale·B·A), on a fixed input."""
    model = copy.deepcopy(backbone)
    with torch.no_grad():
        for name, (a, b) in fit_module_names(adapter.lora, linear_names(model)).items():
            model.get_submodule(name).weight += adapter.scale * (b @ a)
        x = torch.randn(2, 3, 56, 56, generator=torch.Generator().manual_seed(0))
        return model(pixel_values=x).last_hidden_state


@pytest.mark.parametrize("file_naming", ["canonical", "legacy"])
@pytest.mark.parametrize("backbone_naming", ["canonical", "legacy"])
def test_adapter_names_fit_either_backbone_naming(adapter_copy, both_namings, file_naming, backbone_naming):
    if file_naming == "legacy":
        _legacy_file(adapter_copy)
    a = load_adapter_dir("detect", adapter_copy, 32)
    backbone = both_namings[backbone_naming]
    fitted = fit_module_names(a.lora, linear_names(backbone))
    assert set(fitted) <= set(linear_names(backbone)) and len(fitted) == len(a.lora) == 4
    assert sorted(canonical_name(m) for m in fitted) == [f"encoder.layer.{i}.attention.{m}" for i in range(2)
                                                         for m in ("q_proj", "v_proj")]
    assert all(fitted[renamed_for(m, fitted)] is ab for m, ab in a.lora.items())  # the same tensors, renamed
    if file_naming == backbone_naming:
        assert list(fitted) == list(a.lora)  # names that already match are left alone
    # the same weights and the same LoRA give the same output, whichever naming each side uses
    reference = _merged_output(both_namings["canonical"], load_adapter_dir("detect", adapter_copy, 32))
    assert torch.equal(_merged_output(backbone, a), reference)


def test_module_names_that_fit_neither_naming_are_errors(both_namings):
    ab = (torch.zeros(4, 32), torch.zeros(32, 4))
    names = linear_names(both_namings["legacy"])
    with pytest.raises(AdapterError, match="LoRA targets 'encoder.layer.0.attention.qkv', which is not a linear layer"):
        fit_module_names({"encoder.layer.0.attention.qkv": ab}, names)
    with pytest.raises(AdapterError, match="twice"):
        fit_module_names({"encoder.layer.0.attention.q_proj": ab, "encoder.layer.0.attention.attention.query": ab}, names)


def test_saved_adapters_use_canonical_names_whichever_naming_trained_them(tiny_adapters, tmp_path):
    a = load_adapter_dir("detect", tiny_adapters["detect"], 32)
    head_cfg = {k: v for k, v in a.head_config.items() if k not in ("format", "version")}
    for naming, rename, targets in (("canonical", str, ["q_proj", "v_proj"]), ("legacy", legacy_name, ["query", "value"])):
        save_adapter_dir(tmp_path / naming, lora={rename(m): ab for m, ab in a.lora.items()}, rank=4, alpha=4,
                         target_modules=targets, base_model="tiny", head=a.head, head_config=head_cfg)
    for f in ("adapter_model.safetensors", "adapter_config.json"):
        assert (tmp_path / "legacy" / f).read_bytes() == (tmp_path / "canonical" / f).read_bytes()
    assert json.loads((tmp_path / "legacy" / "adapter_config.json").read_text())["target_modules"] == ["q_proj", "v_proj"]


@pytest.mark.parametrize("targets, canonical, legacy", [
    (["q_proj", "v_proj"], ["q_proj", "v_proj"], ["query", "value"]),
    (["query", "o_proj"], ["q_proj", "o_proj"], ["query", "dense"]),
    (["attention.q_proj"], ["attention.q_proj"], ["attention.attention.query"]),
    (["encoder.layer.1.attention.o_proj", "fc2"], ["encoder.layer.1.attention.o_proj", "fc2"],
     ["encoder.layer.1.attention.output.dense", "fc2"]),
])
def test_peft_target_modules_fit_either_naming(both_namings, targets, canonical, legacy):
    def selected(model, entries):  # the layers peft wraps for these target_modules, by canonical name
        return {canonical_name(n) for n in linear_names(model) if any(n == e or n.endswith("." + e) for e in entries)}

    for naming, want in (("canonical", canonical), ("legacy", legacy)):
        model = both_namings[naming]
        assert fit_target_modules(targets, linear_names(model)) == want
        assert selected(model, want) == selected(both_namings["canonical"], canonical)
    with pytest.raises(AdapterError, match="'qkv' matches no linear layer"):
        fit_target_modules(["q_proj", "qkv"], linear_names(both_namings["legacy"]))


def test_shipped_adapter_fits_dinov2_small_under_both_namings():
    """adapters/detect (canonical names) on the real DINOv2-S module tree of transformers 5.17 and of >= 5.18."""
    from pathlib import Path

    from transformers import Dinov2Model

    from vlora_va.engine.backbones import dinov2_small_config
    from vlora_va.testing.tiny import as_naming

    detect = load_adapter_dir("detect", Path(__file__).resolve().parents[2] / "adapters" / "detect", 384)
    with torch.device("meta"):
        canonical, legacy = (as_naming(Dinov2Model(dinov2_small_config()), n) for n in ("canonical", "legacy"))
    for model in (canonical, legacy):
        fitted = fit_module_names(detect.lora, linear_names(model))
        for name, (a, b) in fitted.items():
            layer = model.get_submodule(name)
            assert (b.shape[0], a.shape[1]) == (layer.out_features, layer.in_features)
    assert all(".attention.attention." in n or ".attention.output.dense" in n or ".mlp." in n
               for n in fit_module_names(detect.lora, linear_names(legacy)))
