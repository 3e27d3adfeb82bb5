"""The shipped default adapters load, and `vlora-va eval` runs on a few held-out frames (real backbone)."""

import json
from pathlib import Path

import pytest

from vlora_va.adapters import load_adapter_dir
from vlora_va.training.teachers import DEFAULT_TEACHER_DIR

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("name,task", [("detect", "detection"), ("actions", "action"), ("actions-persons", "action")])
def test_shipped_adapter_loads_and_is_trained(name, task):
    adapter = load_adapter_dir(name, ROOT / "adapters" / name, hidden=384)
    assert adapter.task == task and adapter.trained
    assert (ROOT / "adapters" / name / "README.md").read_text().count("Reproduce") == 1
    assert adapter.head_config["label_sources"]
    if task == "detection":
        assert "person" in adapter.head_config["classes"]
    if name == "actions-persons":  # every person's activity, at the size and clip length its card states
        assert adapter.head.persons and adapter.head_config["image_size"] == 336 and adapter.clip_len == 4


def eval_cli():
    """`vlora-va eval`'s entry point, or a skip where its inputs are missing (a clean clone lacks the teacher)."""
    from vlora_va.models import ModelError, resolve

    try:
        resolve("dinov2-small")
    except ModelError:
        pytest.skip("default backbone not fetched")
    if not (DEFAULT_TEACHER_DIR / "centernet.onnx").is_file():
        pytest.skip("CenterNet teacher (development asset) not present")
    from vlora_va.training.cli import main_eval

    return main_eval


@pytest.mark.slow
def test_eval_cli_on_two_held_out_frames(tmp_path):
    main_eval = eval_cli()
    out = tmp_path / "r.json"
    video = ROOT / "sample_videos" / "pedestrians.mp4"
    assert main_eval([str(ROOT / "adapters" / "detect"), "--on", f"{video}:60-61@0.5", "--json", str(out),
                      "--draw", str(tmp_path)]) == 0
    rep = json.loads(out.read_text())["reports"]
    (where, r), = rep.items()
    assert r["frames"] == 2 and r["per_class"]["person"]["refs"] > 0
    assert (tmp_path / "pedestrians-60.png").is_file()


@pytest.mark.slow
def test_eval_cli_scores_the_action_adapter_per_clip_and_per_person(tmp_path):
    main_eval = eval_cli()
    out = tmp_path / "r.json"
    video = ROOT / "sample_videos" / "pedestrians.mp4"
    assert main_eval([str(ROOT / "adapters" / "actions-persons"), "--on", f"{video}:60-62@1", "--json", str(out)]) == 0
    (r,) = json.loads(out.read_text())["reports"].values()
    assert r["clips"] == 2 and sum(map(sum, r["confusion"])) == 2
    persons = r["persons"]
    assert persons["persons"] > 0 and sum(map(sum, persons["confusion"])) == persons["persons"]
    assert persons["activities"][:2] == ["standing", "walking_away"]
