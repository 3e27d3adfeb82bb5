"""`vlora-va adapters fit`: the frame sampler (diversity, no leakage near human-checked frames) and the whole
command end to end on the tiny backbone with the real fused teachers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from vlora_va.training.frame_picking import LEAK_MARGIN_S, away_from, pick_diverse
from vlora_va.training.frames import TrainingFrame

ROOT = Path(__file__).resolve().parents[2]
VIDEO = ROOT / "sample_videos" / "pedestrians.mp4"


def synthetic(n_still: int, n_moving: int) -> list[TrainingFrame]:
    """n_still identical grey frames, then n_moving frames with a white square moving across."""
    frames = []
    for i in range(n_still + n_moving):
        rgb = np.full((72, 128, 3), 90, np.uint8)
        if i >= n_still:
            x = 4 * (i - n_still) % 110
            rgb[20:50, x:x + 16] = 255
        frames.append(TrainingFrame("syn", round(i * 0.25, 3), rgb))
    return frames


def test_pick_diverse_spends_its_picks_where_the_picture_changes():
    frames = synthetic(40, 40)  # 10 s still, then 10 s of motion
    picked = pick_diverse(frames, 12, min_gap_s=0.5)
    assert 10 <= len(picked) <= 12 and picked[0] is frames[0]
    moving = [f for f in picked if f.t >= 10.0]
    assert len(moving) >= 9, [f.t for f in picked]  # a fixed stride would put half in the still part
    assert all(b.t - a.t >= 0.5 - 1e-6 for a, b in zip(picked, picked[1:]))
    assert [f.t for f in pick_diverse(frames, 12)] == [f.t for f in picked]  # deterministic
    with pytest.raises(ValueError, match="n: expected at least 1"):
        pick_diverse(frames, 0)


def test_no_frame_within_a_second_of_a_human_checked_frame():
    frames = [TrainingFrame("v", round(t, 3), np.zeros((2, 2, 3), np.uint8)) for t in np.arange(0, 20, 0.25)]
    marks = [5.0, 12.5]
    kept = away_from(frames, marks)
    assert all(min(abs(f.t - m) for m in marks) > LEAK_MARGIN_S for f in kept)
    assert len(frames) - len(kept) == 2 * 9  # 4.0 to 6.0 and 11.5 to 13.5: exactly 1 s away is dropped too
    assert away_from(frames, []) == frames


def test_fit_cut_keeps_training_away_from_the_shipped_human_frames():
    """pedestrians.mp4 40-70 s: the project's human-checked frames start at 55 s, inside the training part."""
    from vlora_va.training.fit import FitOptions, cut
    from vlora_va.training.frame_picking import shipped_human_times

    marks = shipped_human_times("pedestrians")
    assert len(marks) == 49 and min(marks) == pytest.approx(55.0)
    parts = cut(FitOptions(str(VIDEO), Path("unused"), start=40, end=70, frames=40, sample_fps=2))
    trained = parts.train + parts.val
    assert trained and parts.dropped_near_human > 0
    assert all(min(abs(f.t - m) for m in marks) > LEAK_MARGIN_S for f in trained)
    assert not parts.val  # 61-64 s: every candidate is within 1 s of a human-checked frame (fit keeps the
    # general adapter's threshold then, and says so)
    assert max(f.t for f in parts.train) < min(f.t for f in parts.held_out)  # the held-out part is the last one
    assert min(f.t for f in parts.held_out) >= 40 + 0.8 * (parts.duration) - 0.5


@pytest.mark.slow
def test_fit_end_to_end_on_the_tiny_backbone(tmp_path, tiny_backbone_dir, tiny_adapters, teachers):
    """Fit, then --serve into a running daemon (real control socket): the camera's task runs on the new weights."""
    from tests.serving.test_daemon import RunningDaemon, chunk_parts, config
    from vlora_va.cli import main
    from vlora_va.engine.adapters import content_sha256, load_adapter_dir, read_lora
    from vlora_va.serving.control import control_endpoint

    d = RunningDaemon(config(tmp_path / "d", tiny_backbone_dir, {"detect": tiny_adapters["detect"]}, max_slots=4))
    out = tmp_path / "cam1-detect"
    rc = main(["adapters", "fit", str(VIDEO), "--out", str(out), "--start", "20", "--end", "32", "--frames", "8",
               "--epochs", "1", "--tiles", "1", "--threads", "1", "--backbone", str(tiny_backbone_dir),
               "--from", str(tiny_adapters["detect"]), "--serve", "cam1-detect",
               "--control", control_endpoint("", d.cfg.daemon.endpoint)])
    assert rc == 0
    d.send(chunk_parts("cam1", 0, [("t", "cam1-detect")]))
    (row,) = d.finish()
    assert row["status"] == "ok" and row["provenance"]["adapter_sha256"] == content_sha256(out)[:16]
    report = json.loads((out / "FIT.json").read_text())
    assert report["frames"]["train"] <= 8 and report["steps"] >= 1
    assert set(report["held_out"]) == {"general", "fitted"}
    for entry in report["held_out"].values():
        assert set(entry["teachers"]) == {"person", "car"} and entry["teachers"]["person"]["refs"] > 0
    assert all(20 <= t < 20 + 0.7 * 12 + 0.5 for t in report["parts"]["train"])
    assert report["cpu_seconds"] > 0 and report["cpu"]
    # a servable adapter: loads like any other, its LoRA moved away from the one it started from
    adapter = load_adapter_dir("cam1", out, 32)
    assert adapter.task == "detection" and adapter.head_config["classes"] == ["person", "car"]
    _, _, _, before = read_lora(Path(tiny_adapters["detect"]))
    _, _, _, after = read_lora(out)
    assert any(not np.allclose(before[k][1].numpy(), after[k][1].numpy()) for k in before)
    assert "Per-camera detection adapter" in (out / "README.md").read_text()


def test_fit_refuses_bad_input_before_any_work(tmp_path, capsys):
    from vlora_va.cli import main

    assert main(["adapters", "fit", str(tmp_path / "nope.mp4"), "--out", str(tmp_path / "o")]) == 2
    assert "no such video file" in capsys.readouterr().err
    assert main(["adapters", "fit", "rtsp://127.0.0.1:9/x", "--out", str(tmp_path / "o")]) == 2
    assert "--minutes" in capsys.readouterr().err
    assert main(["adapters", "fit", str(VIDEO), "--out", str(tmp_path / "o"), "--from", str(tmp_path)]) == 2
    assert "not an adapter directory" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_every_spec_training_split_keeps_away_from_human_frames():
    """The spec trainer's guard (pipeline.detection_split): bikes 4-10 s asked for, its human frames at 5-8 s
    and their 1-s surroundings never come back, the order of what remains is kept."""
    from vlora_va.training.frame_picking import shipped_human_times
    from vlora_va.training.pipeline import away_from_human

    frames = [TrainingFrame(v, round(t, 3), np.zeros((2, 2, 3), np.uint8)) for v in ("bikes", "other", "bikes")
              for t in np.arange(4, 10, 0.5)]
    kept = away_from_human(frames)
    marks = shipped_human_times("bikes")
    assert sorted(marks) == [1.0, 5.0, 6.0, 7.0, 8.0]
    assert all(min(abs(f.t - m) for m in marks) > LEAK_MARGIN_S for f in kept if f.video == "bikes")
    assert [f.t for f in kept if f.video == "other"] == [f.t for f in frames if f.video == "other"]
    assert [f.t for f in kept if f.video == "bikes"] == [9.5, 9.5]
    where = [next(i for i, g in enumerate(frames) if g is f) for f in kept]
    assert where == sorted(where)  # the order is the run's identity: kept


def test_an_action_specs_training_clips_keep_their_whole_second_away_from_human_frames(tmp_path):
    """The action trainer's guard (pipeline.action_clipset(train=True)): a clip's label comes from its whole 1-s
    window, so a clip is kept only if every moment of [start, start + 1) is more than 1 s from each human-checked
    frame of bikes.mp4 (1, 5, 6, 7, 8 s). Of clips starting every 0.5 s over 0-10 s that leaves 2.5 and 3.0 s (2.0's
    and 9.0's first frames are exactly 1 s after a human-checked one); the test and val splits keep them all."""
    from vlora_va.training.pipeline import action_clipset
    from vlora_va.training.spec import load_spec

    manifest = tmp_path / "clips.jsonl"
    starts = [t / 2 for t in range(19)]  # 0.0 ... 9.0 s
    manifest.write_text("".join(json.dumps({"video": "bikes", "start": t, "end": t + 1.0, "label": "no_person"}) + "\n"
                                for t in starts))
    spec_file = tmp_path / "s.yaml"
    spec_file.write_text(f"name: x\noutput: out\ntask: action\nclip_len: 2\n"
                         f"train: [{{video: {ROOT / 'sample_videos' / 'bikes.mp4'}, start: 0, end: 10}}]\n"
                         f"sources: [{{name: m, kind: manifest, path: {manifest}}}]\n")
    spec = load_spec(spec_file)
    trained = action_clipset(spec, spec.train, progress=False, train=True)
    assert [t for _, t in trained.starts] == [2.5, 3.0]
    assert [t for _, t in action_clipset(spec, spec.train, progress=False).starts] == starts
