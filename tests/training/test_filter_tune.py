"""`vlora-va filter tune` (vlora_va/training/filter_tune.py): thresholds measured against the unfiltered results, the
knee of those within max_loss chosen, with ingest's own filter deciding which chunks reuse which."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from tests.pipeline_helpers import BIKES, tiny_pipeline, write
from vlora_va.contracts.config import load_config
from vlora_va.testing.messages import make_seeing_detector
from vlora_va.training.filter_tune import (
    Candidate,
    Plans,
    action_loss,
    detection_loss,
    knee,
    person_loss,
    reuse_plan,
    tune,
)


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


def person(x: float, activity: str, score: float = 0.9) -> dict:
    return {"box": [x, 0.0, x + 10.0, 20.0], "score": score, "activity": activity}


def test_person_loss_is_one_minus_per_person_top1_against_each_chunks_own_persons():
    persons = [[person(0, "walking_left")], [person(0, "walking_left")],
               [person(1, "standing"), person(60, "walking_right")]]  # chunk 2: she stopped, and someone came
    assert person_loss(persons, [0, 1, 2], 0.3) == 0.0  # nothing reused
    assert person_loss(persons, [0, 0, 2], 0.3) == 0.0  # chunk 1 reuses an identical chunk
    # chunk 2 reuses chunk 0: she is found at her place but walking, the newcomer is missed; 2 of 4 persons right
    assert person_loss(persons, [0, 0, 0], 0.3) == pytest.approx(0.5)
    # per person, not per clip: a person the reused result adds is no error (as the human set's top-1 counts)
    assert person_loss([[person(0, "walking_left"), person(60, "standing")], [person(0, "walking_left")]],
                       [0, 0], 0.3) == 0.0
    # a person elsewhere is not the same person, even doing the same thing
    assert person_loss([[person(0, "standing")], [person(30, "standing")]], [0, 0], 0.3) == pytest.approx(0.5)
    # below the head's threshold: nobody there
    assert person_loss([[person(0, "standing", 0.9)], [person(0, "walking_left", 0.1)]], [0, 0], 0.3) == 0.0


def test_plans_run_ingests_filter_at_every_threshold_at_once():
    still = np.full((64, 64, 3), 100, np.uint8)
    bright = np.full((64, 64, 3), 110, np.uint8)
    chunks = [[still], [still], [bright], [bright], [still]]
    plans = Plans((5.0, 50.0), 100)
    for images in chunks:
        plans.add(images)
    assert plans.plans == {5.0: reuse_plan(chunks, 5.0, 100), 50.0: reuse_plan(chunks, 50.0, 100)}
    assert plans.plans[5.0] == [0, 0, 2, 2, 4]
    # the feature each chunk was judged by: none for the first, then the difference to the frames last sent
    assert plans.differences[5.0] == [None, 0.0, pytest.approx(10.0, abs=0.6), 0.0, pytest.approx(10.0, abs=0.6)]
    assert plans.differences[50.0][4] == 0.0  # at 50 nothing after chunk 0 was sent: still is compared with still


def test_reuse_plan_is_ingests_filter():
    still = np.full((64, 64, 3), 100, np.uint8)
    bright = np.full((64, 64, 3), 110, np.uint8)
    assert reuse_plan([[still], [still], [bright], [bright]], 5.0, 100) == [0, 0, 2, 2]
    assert reuse_plan([[still], [still], [bright], [bright]], 50.0, 100) == [0, 0, 0, 0]
    assert reuse_plan([[still]] * 5, 5.0, 2) == [0, 0, 2, 2, 4]  # refreshed every 2 chunks


def test_the_choice_is_the_smallest_threshold_filtering_about_as_much_as_any_within_the_loss():
    c = [Candidate(1.0, 0.0, 0.40), Candidate(2.0, 0.0, 0.85), Candidate(3.0, 0.001, 0.86),
         Candidate(8.0, 0.015, 0.88), Candidate(12.0, 0.05, 0.89)]
    # 8 passes and filters most, but only 0.03 more than 2: the knee is 2 (3 is within KNEE of 8's share, 2 is not)
    assert knee(tuple(c), 0.02).threshold == 3.0
    assert knee(tuple(c), 0.0).threshold == 2.0  # 3 and 8 fail: of 1 and 2, 2 filters most
    assert knee(tuple(c[:1]), 0.02).threshold == 1.0
    assert knee((Candidate(1.0, 0.5, 0.1),), 0.02) is None  # none within the loss


def test_tune_measures_each_threshold_and_picks_the_knee_within_the_loss(tmp_path, tiny_backbone_dir):
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
    # more footage of the camera (`--also`): its chunks are scored too, each video through a filter of its own
    more = tune(cfg, "street", "det", 0.0, 4.0, max_loss=0.02, refresh_chunks=100, thresholds=(0.0, 255.0),
                also=((str(BIKES), 0.0, 2.0),))
    assert more.chunks == 8 + 4
    assert {c.threshold: c for c in more.candidates}[255.0].reused_share == pytest.approx((7 + 3) / 12, abs=1e-3)


def test_the_cli_names_an_unknown_stream_or_task(tmp_path, tiny_backbone_dir, tiny_adapters):
    path = write(tmp_path / "p.yaml", tiny_pipeline(tmp_path, tiny_backbone_dir, tiny_adapters, [{"id": "cam"}]))
    run = [sys.executable, "-m", "vlora_va.cli", "filter", "tune", str(path)]
    proc = subprocess.run([*run, "--stream", "nope", "--task", "det"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no stream 'nope'" in proc.stderr
    proc = subprocess.run([*run, "--stream", "cam", "--task", "nope"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "stream cam has no task 'nope' (tasks: det)" in proc.stderr
    proc = subprocess.run([*run, "--stream", "cam", "--task", "det", "--also", "nope.mp4"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "--also nope.mp4: no such video file 'nope.mp4'" in proc.stderr
    proc = subprocess.run([*run, "--stream", "cam", "--task", "det", "--also", f"{BIKES}@zero-60"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "the range must be START-END in seconds" in proc.stderr
    assert BIKES.is_file()
