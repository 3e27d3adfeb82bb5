"""The shipped default adapters load, and `vlora-va eval` runs on a few held-out frames (real backbone)."""

import json
from pathlib import Path

import pytest

from vlora_va.adapters import load_adapter_dir
from vlora_va.training.teachers import DEFAULT_TEACHER_DIR

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("name,task", [("detect", "detection"), ("actions", "action")])
def test_shipped_adapter_loads_and_is_trained(name, task):
    adapter = load_adapter_dir(name, ROOT / "adapters" / name, hidden=384)
    assert adapter.task == task and adapter.trained
    assert (ROOT / "adapters" / name / "README.md").read_text().count("Reproduce") == 1
    assert adapter.head_config["label_sources"]
    if task == "detection":
        assert "person" in adapter.head_config["classes"]


@pytest.mark.slow
def test_eval_cli_on_two_held_out_frames(tmp_path):
    from vlora_va.models import ModelError, resolve

    try:
        resolve("dinov2-small")
    except ModelError:
        pytest.skip("default backbone not fetched")
    if not (DEFAULT_TEACHER_DIR / "centernet.onnx").is_file():
        pytest.skip("CenterNet teacher (development asset) not present")
    from vlora_va.training.cli import main_eval

    out = tmp_path / "r.json"
    video = ROOT / "sample_videos" / "pedestrians.mp4"
    assert main_eval([str(ROOT / "adapters" / "detect"), "--on", f"{video}:60-61@0.5", "--json", str(out),
                      "--draw", str(tmp_path)]) == 0
    rep = json.loads(out.read_text())["reports"]
    (where, r), = rep.items()
    assert r["frames"] == 2 and r["per_class"]["person"]["refs"] > 0
    assert (tmp_path / "pedestrians-60.png").is_file()
