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


def shuffled_human_set(path: Path, video: str, times: list[float]) -> Path:
    """Boxes for `video` at `times`, each frame given another frame's boxes (labels shuffled across frames): references
    nothing can match, so no fit is better than its start against them."""
    from vlora_va.training.evaluate import load_human_set

    hs = load_human_set(ROOT / "adapters" / "eval" / "human-v1.json")
    ped = sorted((k for k in hs.boxes if k.startswith("pedestrians@")), key=lambda k: hs.times[k][1])
    images, anns = [], []
    for i, t in enumerate(times):
        images.append({"id": i + 1, "file_name": f"{video}@{t:.3f}", "video": video, "t": t})
        for b in hs.boxes[ped[(7 * i + 11) % len(ped)]]:  # another frame's people
            x1, y1, x2, y2 = b["box"]
            anns.append({"id": len(anns) + 1, "image_id": i + 1,
                         "category_id": {"person": 1, "car": 3}.get(b["class"], 8),
                         "bbox": [x1 / 2, y1 / 2, (x2 - x1) / 2, (y2 - y1) / 2], "ignore": int(b["ignore"])})
    path.write_text(json.dumps({"images": images, "annotations": anns,
                                "categories": [{"id": 1, "name": "person"}, {"id": 3, "name": "car"},
                                               {"id": 8, "name": "truck"}]}))
    return path


@pytest.mark.slow
def test_a_fit_that_cannot_beat_its_start_writes_nothing_servable_and_keep_anyway_is_not_served(
        tmp_path, tiny_backbone_dir, tiny_adapters, teachers, capsys):
    """The guard end to end on the tiny backbone: judged against references no model can match (human boxes shuffled
    across frames), the fit is refused: exit status 3, no adapter in OUT, the reason with both scores beside it.
    With --keep-anyway it is written, marked so in FIT.json and its card, and --serve refuses to load it into a running
    daemon (real control socket), whose adapters stay as they were."""
    from tests.serving.test_daemon import RunningDaemon, config
    from vlora_va.cli import main
    from vlora_va.serving.control import control_endpoint
    from vlora_va.training.fit import refused_path

    d = RunningDaemon(config(tmp_path / "d", tiny_backbone_dir, {"detect": tiny_adapters["detect"]}, max_slots=4))
    human = shuffled_human_set(tmp_path / "shuffled.json", "pedestrians", [29.7, 30.2, 30.7, 31.2, 31.7])
    out = tmp_path / "cam1-detect"
    args = ["adapters", "fit", str(VIDEO), "--start", "20", "--end", "32", "--out", str(out), "--frames", "8",
            "--epochs", "1", "--tiles", "1", "--threads", "1", "--backbone", str(tiny_backbone_dir),
            "--from", str(tiny_adapters["detect"]), "--human", str(human)]
    assert main(args) == 3
    assert not (out / "adapter_config.json").exists()  # nothing servable
    refused = json.loads(refused_path(out).read_text())
    guard = refused["guard"]
    assert not guard["kept"] and guard["against"] == "human boxes" and guard["frames"] == 5
    assert "start_f1" in guard and "fitted_f1" in guard
    assert refused["refused"].startswith("the fitted adapter is not kept")

    control = control_endpoint("", d.cfg.daemon.endpoint)
    rc = main([*args, "--keep-anyway", "--serve", "cam1-detect", "--control", control])
    assert rc == 3  # written, but not served
    report = json.loads((out / "FIT.json").read_text())
    assert report["guard"]["kept"] is False and report["guard"]["kept_anyway"] is True
    assert "KEPT ANYWAY" in (out / "README.md").read_text()
    capsys.readouterr()
    assert main(["adapters", "list", "--control", control]) == 0
    assert "cam1-detect" not in capsys.readouterr().out and "detect" in json.dumps(report["started_from"])
    d.finish()
    assert report["frames"]["train"] <= 8 and report["steps"] >= 120  # short footage trains the minimum steps
    assert all(20 <= t < 20 + 0.7 * 12 for t in report["parts"]["train"])
    assert report["cpu_seconds"] > 0 and report["cpu"]


def test_too_little_footage_is_refused_before_any_work(tmp_path):
    from vlora_va.cli import main
    from vlora_va.training.fit import MIN_FOOTAGE_S, refused_path

    out = tmp_path / "o"
    assert main(["adapters", "fit", str(VIDEO), "--out", str(out), "--end", "3"]) == 3
    assert not out.exists()
    assert f"at least {MIN_FOOTAGE_S:.0f} s" in json.loads(refused_path(out).read_text())["refused"]


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
