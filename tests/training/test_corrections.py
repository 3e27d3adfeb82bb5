"""Hand corrections of a teacher's boxes (training/corrections.py), and how a spec and the labels use them."""

import json
from pathlib import Path

import numpy as np
import pytest

from vlora_va.contracts.boxes import pair_iou
from vlora_va.training.augment import crop_window
from vlora_va.training.corrections import CorrectionsError, Fix, apply_fix, load_corrections
from vlora_va.training.frames import TrainingFrame
from vlora_va.training.spec import SpecError, load_spec

ROOT = Path(__file__).resolve().parents[2]
MERGED = [100.0, 50.0, 160.0, 150.0]  # the teacher's one box over two people side by side
LEFT, RIGHT = [100.0, 50.0, 128.0, 150.0], [130.0, 52.0, 160.0, 150.0]


def frame(view=""):
    rgb = np.zeros((300, 400, 3), np.uint8)
    if view:
        x0, y0, w, h = crop_window(view)
        rgb = rgb[y0:y0 + h, x0:x0 + w]
    return TrainingFrame("cam", 2.5, rgb, view=view)


def label(box, cls="person", score=0.6, ignore=False):
    return {"box": list(box), "class": cls, "score": score, "ignore": ignore}


def boxes(labels, ignore=False):
    return sorted([round(v, 3) for v in lab["box"]] for lab in labels if lab["ignore"] == ignore)


def test_a_merged_box_on_the_frame_becomes_the_hand_drawn_boxes_and_the_rest_stays():
    car, other = label([300, 200, 380, 260], "car"), label([20, 40, 40, 100])
    fix = Fix(remove=(tuple(MERGED),), add=(tuple(LEFT), tuple(RIGHT)), add_ignore=((200, 60, 210, 90),))
    out = apply_fix([label(MERGED), other, car], frame(), fix, "person")
    assert boxes([o for o in out if o["class"] == "person"]) == sorted([LEFT, RIGHT, other["box"]])
    assert boxes(out, ignore=True) == [[200, 60, 210, 90]]
    assert car in out and all(o["score"] == 1.0 and o.get("hand") for o in out if o["box"] in (LEFT, RIGHT))


def test_a_remove_that_names_no_teacher_box_is_an_error_naming_frame_and_box():
    fix = Fix(remove=((10, 10, 30, 60),))
    with pytest.raises(CorrectionsError, match=r"cam@2.500: remove \[10, 10, 30, 60\]: no person box"):
        apply_fix([label(MERGED)], frame(), fix, "person")
    with pytest.raises(CorrectionsError, match="no person box"):  # a car box is not the person box to remove
        apply_fix([label(MERGED, "car")], frame(), Fix(remove=(tuple(MERGED),)), "person")


def test_on_a_crop_the_fix_is_moved_into_it_and_replaces_the_teachers_box_there():
    crop = frame("crop80,40,200x150")  # x 80-280, y 40-190 of the frame
    teacher_on_crop = [label([21, 11, 79, 109]), label([150, 20, 170, 70])]  # the pair again, and someone else
    fix = Fix(remove=(tuple(MERGED),), add=(tuple(LEFT), tuple(RIGHT)))
    out = apply_fix(teacher_on_crop, crop, fix, "person")
    assert boxes(out) == sorted([[20, 10, 48, 110], [50, 12, 80, 110], [150, 20, 170, 70]])


def test_a_hand_box_mostly_outside_a_crop_is_dont_care_and_one_outside_it_is_dropped():
    crop = frame("crop120,0,200x150")
    fix = Fix(add=(tuple(LEFT), (0, 0, 50, 50)))  # LEFT: 8 of 28 px wide inside; the second: not inside at all
    out = apply_fix([], crop, fix, "person")
    assert boxes(out) == [] and boxes(out, ignore=True) == [[0, 50, 8, 150]]


def test_hand_boxes_under_the_sources_min_height_are_dont_care():
    out = apply_fix([], frame(), Fix(add=((10, 10, 20, 25), tuple(LEFT))), "person", min_height=20)
    assert boxes(out, ignore=True) == [[10, 10, 20, 25]] and boxes(out) == [LEFT]


def test_an_unknown_view_has_no_fix():
    with pytest.raises(CorrectionsError, match="no hand fix for a view of kind 'flip'"):
        apply_fix([], TrainingFrame("cam", 2.5, np.zeros((4, 4, 3), np.uint8), view="flip"), Fix(), "person")


def write(tmp_path, frames, **top):
    p = tmp_path / "fix.json"
    p.write_text(json.dumps({"video": "pedestrians", "class": "person", "frames": frames, **top}))
    return p


def test_the_file_loads_by_frame_time_and_video(tmp_path):
    fixes = load_corrections(write(tmp_path, {"2.5": {"remove": [MERGED], "add": [LEFT, RIGHT]}, "3.0": {}}))
    assert fixes.cls == "person" and set(fixes.frames) == {2.5, 3.0}
    assert fixes.fix_for(TrainingFrame("pedestrians", 2.5, np.zeros((1, 1, 3), np.uint8))).add == (tuple(LEFT), tuple(RIGHT))
    assert fixes.fix_for(TrainingFrame("pedestrians", 3.0, np.zeros((1, 1, 3), np.uint8))) == Fix()
    assert fixes.fix_for(TrainingFrame("bikes", 2.5, np.zeros((1, 1, 3), np.uint8))) is None


@pytest.mark.parametrize("frames, words", [
    ({"2.5": {"add": [[1, 2, 3]]}}, r"frame 2.5 add\[0\]: expected a box"),
    ({"2.5": {"add": [[10, 10, 5, 20]]}}, r"frame 2.5 add\[0\]: box .* has no area"),
    ({"2.5": {"split": []}}, "frame 2.5: expected remove / add / add_ignore / note"),
    ({"soon": {}}, "frame 'soon' is not a time in seconds"),
])
def test_a_bad_file_is_named_with_frame_and_entry(tmp_path, frames, words):
    with pytest.raises(CorrectionsError, match=words):
        load_corrections(write(tmp_path, frames))


def test_a_file_without_frames_or_a_broken_one_is_named(tmp_path):
    p = tmp_path / "fix.json"
    p.write_text('{"video": "pedestrians", "class": "person"}')
    with pytest.raises(CorrectionsError, match="expected an object with 'video', 'class' and 'frames'"):
        load_corrections(p)
    p.write_text("{not json")
    with pytest.raises(CorrectionsError, match="fix.json"):
        load_corrections(p)


def spec_text(corrections, classes="[person]", kind="centernet", task="detection"):
    video = ROOT / "sample_videos" / "pedestrians.mp4"
    return (f"name: x\ntask: {task}\noutput: out\n"
            f"train: [{{video: {video}, start: 0, end: 50}}]\nval: [{{video: {video}, start: 50, end: 55}}]\n"
            f"test: [{{video: {video}, start: 55}}]\n"
            f"sources: [{{name: a, kind: {kind}, classes: {classes}, corrections: {corrections}}}]\n")


def test_a_spec_takes_corrections_on_its_train_and_val_frames_only(tmp_path):
    write(tmp_path, {"2.5": {}, "52.0": {}})
    p = tmp_path / "s.yaml"
    p.write_text(spec_text("fix.json"))
    src = load_spec(p).sources[0]
    assert src.options["corrections"] == str(tmp_path / "fix.json") and len(src.options["corrections_sha256"]) == 64
    write(tmp_path, {"2.5": {}, "60.0": {}})  # a held-out frame: correcting it would tune on the test set
    with pytest.raises(SpecError, match=r"sources\[0\].corrections: frame pedestrians@60 is not in the spec's train"):
        load_spec(p)
    write(tmp_path, {"2.5": {}})
    for text, words in ((spec_text("fix.json", classes="[car]"), "corrects 'person' boxes, which source 'a'"),
                        (spec_text("fix.json", kind="hog"), "only a detection spec's centernet source"),
                        (spec_text("missing.json"), r"sources\[0\].corrections: .*missing.json")):
        p.write_text(text)
        with pytest.raises(SpecError, match=words):
            load_spec(p)


SHIPPED = ROOT / "adapters" / "labels" / "pedestrians-person-fixes.json"


def test_the_shipped_fixes_cover_every_train_and_val_frame_of_their_spec_and_no_held_out_one():
    from vlora_va.training.evaluate import load_human_set

    spec = load_spec(ROOT / "adapters" / "specs" / "detect-hand-fixed.yaml")
    (source,) = [s for s in spec.sources if s.options.get("corrections")]
    assert Path(source.options["corrections"]) == SHIPPED
    fixes = load_corrections(SHIPPED)
    grid = {round(r.start + i * r.step, 3) for r in spec.train + spec.val
            for i in range(round((r.end - r.start) / r.step))}
    assert set(fixes.frames) == grid  # checked by eye, every one (an empty fix: nothing was wrong)
    human = {k.split("@")[1] for k in load_human_set().boxes if k.startswith("pedestrians@")}
    assert not {f"{t:.3f}" for t in fixes.frames} & human
    changed = [f for f in fixes.frames.values() if f != Fix()]
    assert len(changed) > 50 and sum(len(f.add) for f in changed) > 50  # README: the counts


def test_every_shipped_remove_is_a_box_the_teacher_gives(teachers):
    from vlora_va.training.data import detection_labels, frames_of

    spec = load_spec(ROOT / "adapters" / "specs" / "detect-hand-fixed.yaml")
    (source,) = [s for s in spec.sources if s.options.get("corrections")]
    fixes = load_corrections(SHIPPED)
    frames = [f for f in frames_of(spec.train + spec.val) if fixes.fix_for(f).remove]
    labels = detection_labels(source, frames, spec, progress=False)  # a remove the teacher lacks raises
    for f in frames:
        fix = fixes.fix_for(f)
        kept = [lab["box"] for lab in labels[f.key] if not lab.get("hand")]
        assert not any(max(pair_iou(k, b) for k in kept + [[0, 0, 1, 1]]) >= 0.9 for b in fix.remove)
        assert len([lab for lab in labels[f.key] if lab.get("hand")]) == len(fix.add) + len(fix.add_ignore)


def test_an_adapter_names_its_corrections_from_its_own_folder_and_eval_finds_them(tmp_path):
    import torch

    from vlora_va.engine.adapters import Adapter
    from vlora_va.training.evaluate import sources_of
    from vlora_va.training.runner import _record_sources
    from vlora_va.training.spec import SourceSpec

    fixes = write(tmp_path, {"2.5": {}})
    out = tmp_path / "adapters" / "detect"
    out.mkdir(parents=True)
    (out / "head_config.json").write_text("{}")
    _record_sources(out, [SourceSpec("person", "centernet", ["person"], options={"corrections": str(fixes), "tiles": 2})])
    saved = json.loads((out / "head_config.json").read_text())["label_sources"][0]["options"]
    assert saved == {"corrections": "../../fix.json", "tiles": 2}  # no machine path in the adapter
    adapter = Adapter("detect", out, 8, 2.0, {}, torch.nn.Identity(), json.loads((out / "head_config.json").read_text()))
    assert sources_of(adapter)[0].options["corrections"] == str(fixes.resolve())
