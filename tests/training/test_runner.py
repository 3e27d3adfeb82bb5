"""A whole detection spec on a tiny random backbone and real frames: seeds, the human-checked set, the cards."""

import json
import statistics
from pathlib import Path

import pytest

from vlora_va.training.cli import main_train
from vlora_va.training.evaluate import load_human_set
from vlora_va.training.pipeline import NMS_CHOICES
from vlora_va.training.runner import best_on_validation

ROOT = Path(__file__).resolve().parents[2]
VIDEO = ROOT / "sample_videos" / "pedestrians.mp4"


def write_spec(tmp_path, backbone, lora_layers="[1]", repeats=2, baselines="[head-only]") -> Path:
    labels = {"images": [{"id": i, "video": "pedestrians", "t": t} for i, t in enumerate((0.0, 1.0, 50.0))],
              "annotations": [{"id": i, "image_id": i, "category_id": 1, "bbox": [300, 200, 40, 110]} for i in range(3)],
              "categories": [{"id": 1, "name": "person"}]}
    (tmp_path / "labels.json").write_text(json.dumps(labels))
    spec = tmp_path / "specs" / "tiny.yaml"
    spec.parent.mkdir()
    spec.write_text(f"""name: tiny
task: detection
output: ../out/tiny
backbone: {backbone}
image_size: 56
cache_dir: ../cache
train: [{{video: {VIDEO}, start: 0, end: 2, step: 1}}]
val: [{{video: {VIDEO}, start: 50, end: 51, step: 1}}]
test: [{{video: {VIDEO}, start: 55, end: 56, step: 0.5}}]
sources: [{{name: person, kind: coco, classes: [person], path: {tmp_path / 'labels.json'}}}]
baselines: {baselines}
lora: {{rank: 4, alpha: 8, layers: {lora_layers}, modules: [q_proj, v_proj]}}
head: {{upsample: 4, width: 16, detail: 32}}  # the detail branch reads the letterboxed frames
train_options: {{epochs: 1, batch: 2, repeats: {repeats}, threads: 1}}
""")
    return spec


@pytest.fixture(scope="module")
def trained(tiny_backbone, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("runner")
    spec = write_spec(tmp_path, tiny_backbone)
    assert main_train([str(spec)]) == 0
    return tmp_path, spec, json.loads((tmp_path / "out" / "REPORT-tiny.json").read_text())


def test_every_model_is_trained_with_each_seed_and_the_mean_is_theirs(trained):
    _, _, report = trained
    lora, head_only = report["rows"][:2]
    for row in (lora, head_only):
        assert [r["seed"] for r in row["runs"]] == [0, 1]
        scores = [r["val_mean_f1"] for r in row["runs"]]
        assert row["seed"] == row["runs"][scores.index(max(scores))]["seed"]  # the seed best on validation
        assert row["nms_iou"] in NMS_CHOICES and all(r["nms_iou"] in NMS_CHOICES for r in row["runs"])
        for key in ("precision", "recall", "f1", "side_by_side"):
            values = [r["human_person"]["pedestrians.mp4[55-56]"][key] for r in row["runs"]]
            assert row["mean"]["human_person"]["pedestrians.mp4[55-56]"][key] == pytest.approx(
                statistics.mean(values), abs=1e-4)
    assert lora["model"].startswith("LoRA+head") and head_only["model"].startswith("head only")


def test_the_shipped_adapter_is_the_seed_best_on_validation(trained):
    tmp_path, _, report = trained
    lora = report["rows"][0]
    chosen = next(r for r in lora["runs"] if r["seed"] == lora["seed"])
    config = json.loads((tmp_path / "out" / "tiny" / "head_config.json").read_text())
    assert (config["params"]["score_threshold"], config["params"]["nms_iou"]) == (chosen["threshold"], chosen["nms_iou"])


def test_best_on_validation_takes_the_best_mean_f1_and_the_earliest_seed_on_a_tie():
    def run(*f1s):
        return {"val": {c: {"f1": f} for c, f in zip(("person", "car"), f1s)}}

    assert best_on_validation([run(0.9, 0.5), run(0.8, 0.8), run(0.95, 0.6)]) == 1  # means 0.7, 0.8, 0.775
    assert best_on_validation([run(0.8, 0.8), run(0.9, 0.7)]) == 0  # a tie keeps the first seed
    assert best_on_validation([run(float("nan"), float("nan")), run(0.1, float("nan"))]) == 1  # no data is no score


def test_the_human_checked_frames_in_a_test_range_are_scored_against_their_boxes(trained):
    _, _, report = trained
    hs = load_human_set()
    keys = ["pedestrians@55.000", "pedestrians@55.500"]
    persons = sum(1 for k in keys for b in hs.boxes[k] if b["class"] == "person" and not b.get("ignore"))
    human = report["rows"][0]["human"]["pedestrians.mp4[55-56]"]
    assert human["frames"] == 2 and human["per_class"]["person"]["refs"] == persons
    assert set(human["per_class"]["person"]["recall_by_height"]) == {"<40", "40-100", ">100"}
    assert "side_by_side" in human["per_class"]["person"]


def test_the_card_shows_the_human_figures_and_cards_only_rewrites_it(trained):
    tmp_path, spec, _ = trained
    adapter = tmp_path / "out" / "tiny"
    card = (adapter / "README.md").read_text()
    assert "## Accuracy on the human-checked set" in card and "LoRA + head vs head-only, 2 seeds each" in card
    assert "recall ≥ 0.85 at precision ≥ 0.9, at its validation-picked threshold: **not met**" in card  # a tiny model finds nobody
    config = json.loads((adapter / "head_config.json").read_text())
    assert config["params"]["upsample"] == 4 and config["params"]["nms_iou"] in NMS_CHOICES
    (adapter / "README.md").unlink()
    report_file = tmp_path / "out" / "REPORT-tiny.json"
    report = json.loads(report_file.read_text())  # as if trained in another checkout: its paths point elsewhere
    report["adapters"] = ["/elsewhere/tiny"]
    report["cards"][0]["adapter"] = "/elsewhere/tiny"
    report_file.write_text(json.dumps(report))
    assert main_train([str(spec), "--cards-only"]) == 0
    assert (adapter / "README.md").read_text() == card


def test_a_head_only_main_model_is_named_so(tiny_backbone, tmp_path):
    spec = write_spec(tmp_path, tiny_backbone, lora_layers="[]", repeats=1, baselines="false")
    assert main_train([str(spec)]) == 0
    report = json.loads((tmp_path / "out" / "REPORT-tiny.json").read_text())
    assert report["rows"][0]["model"] == "head only (frozen backbone), all sources (person)"
    card = (tmp_path / "out" / "tiny" / "README.md").read_text()
    assert "No LoRA (head only): the frozen backbone\nof `" in card and "LoRA (rank" not in card


def test_cards_only_without_a_report_is_an_error(tiny_backbone, tmp_path, capsys):
    spec = write_spec(tmp_path, tiny_backbone)
    assert main_train([str(spec), "--cards-only"]) == 2
    assert "no report (train the spec first)" in capsys.readouterr().err


def test_one_repeat_alone_is_the_run_the_whole_spec_resumes(tiny_backbone, tmp_path, capsys):
    spec = write_spec(tmp_path, tiny_backbone, baselines="false")
    assert main_train([str(spec), "--repeat", "2", "--out", str(tmp_path / "r")]) == 2
    assert "--repeat 2: the spec has repeats 0..1" in capsys.readouterr().err
    assert main_train([str(spec), "--repeat", "1"]) == 2
    assert "--repeat needs --out DIR" in capsys.readouterr().err
    assert main_train([str(spec), "--repeat", "1", "--out", str(tmp_path / "r1")]) == 0
    alone = json.loads((tmp_path / "r1" / "REPORT-tiny.json").read_text())["rows"][0]
    assert alone["seed"] == 1 and (tmp_path / "r1" / "tiny" / "adapter_model.safetensors").is_file()
    assert not (tmp_path / "out").exists()  # the spec's own output is left alone
    checkpoints = tmp_path / "cache" / "checkpoints" / "detection"
    assert len(list(checkpoints.glob("*.pt"))) == 1
    assert main_train([str(spec)]) == 0
    whole = json.loads((tmp_path / "out" / "REPORT-tiny.json").read_text())["rows"][0]
    # seed 1 was resumed from the repeat's checkpoint, not trained again: one new checkpoint (seed 0), same figures
    assert len(list(checkpoints.glob("*.pt"))) == 2
    again = next(r for r in whole["runs"] if r["seed"] == 1)
    assert (again["train_seconds"], again["threshold"], again["nms_iou"]) == (
        alone["train_seconds"], alone["threshold"], alone["nms_iou"])
