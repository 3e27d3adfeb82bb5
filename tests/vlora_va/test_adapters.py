import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from vlora_va.adapters import AdapterError, load_adapter_dir


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
