"""`vlora-va filter tune` (vlora_va/training/filter_tune.py): thresholds measured against the unfiltered results, the
largest within max_loss chosen, with ingest's own filter deciding which chunks reuse which."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from tests.pipeline_helpers import BIKES, tiny_pipeline, write
from vlora_va.contracts.config import load_config
from vlora_va.testing.messages import make_seeing_detector
from vlora_va.training.filter_tune import action_loss, detection_loss, reuse_plan, tune


def box(x: float, cls: str = "person", score: float = 0.9) -> dict:
    return {"box": [x, 0.0, x + 10.0, 10.0], "class": cls, "score": score}


def test_detection_loss_is_one_minus_f1_of_reused_boxes_against_each_chunks_own():
    preds = [[[box(0)]], [[box(0)]], [[box(50)]]]  # chunk 2: the person moved
    assert detection_loss(preds, [0, 1, 2], 0.5) == 0.0  # nothing reused
    assert detection_loss(preds, [0, 0, 2], 0.5) == 0.0  # chunk 1 reuses an identical chunk
    # chunk 2 reuses chunk 0: one false positive and one miss there, two right elsewhere: F1 = 4 / 6
    assert detection_loss(preds, [0, 0, 0], 0.5) == pytest.approx(1 - 4 / 6)
    low = [[[box(0, score=0.3)]], [[box(50, score=0.3)]]]
    assert detection_loss(low, [0, 0], 0.5) == 0.0  # below the head's threshold: not a detection


def test_action_loss_is_the_share_of_chunks_whose_label_changes():
    assert action_loss(["walk", "walk", "stand", "stand"], [0, 0, 0, 3]) == pytest.approx(0.25)


def test_reuse_plan_is_ingests_filter():
    still = np.full((64, 64, 3), 100, np.uint8)
    bright = np.full((64, 64, 3), 110, np.uint8)
    assert reuse_plan([[still], [still], [bright], [bright]], 5.0, 100) == [0, 0, 2, 2]
    assert reuse_plan([[still], [still], [bright], [bright]], 50.0, 100) == [0, 0, 0, 0]
    assert reuse_plan([[still]] * 5, 5.0, 2) == [0, 0, 2, 2, 4]  # refreshed every 2 chunks


def test_tune_measures_each_threshold_and_picks_the_largest_within_the_loss(tmp_path, tiny_backbone_dir):
    seeing = make_seeing_detector(tmp_path / "seeing")
    streams = [{"id": "street", "fps": 4, "chunk_seconds": 0.5,
                "tasks": [{"name": "det", "adapter": "seeing", "frames_per_chunk": 1, "deadline_ms": 1000}]}]
    cfg = load_config(write(tmp_path / "p.yaml", tiny_pipeline(tmp_path, tiny_backbone_dir, {"seeing": seeing},
                                                               streams)))
    report = tune(cfg, "street", "det", 0.0, 4.0, max_loss=0.02, refresh_chunks=100, thresholds=(0.0, 3.0, 255.0))
    assert report.kind == "detection" and report.chunks == 8
    by = {c.threshold: c for c in report.candidates}
    assert (by[0.0].loss, by[0.0].reused_share) == (0.0, 0.0)  # nothing filtered changes nothing
    assert by[255.0].reused_share == pytest.approx(7 / 8)  # everything but the first chunk reuses it
    assert by[255.0].loss > 0.02  # the cyclist moves: reusing chunk 0's boxes is wrong
    assert report.chosen.loss <= 0.02 and report.chosen.threshold < 255.0
    assert report.yaml().startswith(f"filter: {{threshold: {report.chosen.threshold:g}")


def test_the_cli_names_an_unknown_stream_or_task(tmp_path, tiny_backbone_dir, tiny_adapters):
    path = write(tmp_path / "p.yaml", tiny_pipeline(tmp_path, tiny_backbone_dir, tiny_adapters, [{"id": "cam"}]))
    run = [sys.executable, "-m", "vlora_va.cli", "filter", "tune", str(path)]
    proc = subprocess.run([*run, "--stream", "nope", "--task", "det"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no stream 'nope'" in proc.stderr
    proc = subprocess.run([*run, "--stream", "cam", "--task", "nope"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "stream cam has no task 'nope' (tasks: det)" in proc.stderr
    assert BIKES.is_file()
