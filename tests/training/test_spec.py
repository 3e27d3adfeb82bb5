from pathlib import Path

import pytest

from vlora_va.training.cli import parse_range
from vlora_va.training.spec import SpecError, load_spec

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["detect", "actions", "actions-persons"])
def test_shipped_specs_load(name):
    spec = load_spec(ROOT / "adapters" / "specs" / f"{name}.yaml")
    assert spec.train and spec.test and spec.output == (ROOT / "adapters" / name).resolve()
    train_videos = {(r.video.name, r.start, r.end) for r in spec.train}
    for r in spec.test:  # held-out ranges never overlap training ranges of the same video
        for v, s, e in train_videos:
            if v == r.video.name:
                assert r.start >= e or (r.end is not None and r.end <= s)


def test_spec_errors_name_the_key(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("name: x\ntask: detection\noutput: out\nsources: [{name: a, kind: nope}]\n")
    with pytest.raises(SpecError, match=r"sources\[0\]\.kind"):
        load_spec(p)
    p.write_text("name: x\ntask: detection\noutput: out\nsources: [{name: a, kind: hog}]\ntrain: [{video: missing.mp4}]\n")
    with pytest.raises(SpecError, match=r"train\[0\]\.video"):
        load_spec(p)
    p.write_text("name: x\ntask: detection\noutput: out\nsources: [{name: a, kind: hog}]\nlora: {rnk: 4}\n")
    with pytest.raises(SpecError, match="lora: unknown keys"):
        load_spec(p)


def test_parse_range():
    v = str(ROOT / "sample_videos" / "bikes.mp4")
    r = parse_range(f"{v}:5-10@0.2", 0.5)
    assert (r.start, r.end, r.step) == (5.0, 10.0, 0.2)
    r = parse_range(v, 0.5)
    assert (r.start, r.end, r.step) == (0.0, None, 0.5)


def test_repeats_are_checked(tmp_path):
    p = tmp_path / "s.yaml"
    base = "name: x\noutput: out\nsources: [{name: a, kind: activity}]\ntrain: [{video: %s}]\n" % (
        ROOT / "sample_videos" / "bikes.mp4")
    p.write_text(base + "task: action\ntrain_options: {repeats: 3}\n")
    assert load_spec(p).opts.repeats == 3
    p.write_text(base + "task: action\ntrain_options: {repeats: 0}\n")
    with pytest.raises(SpecError, match="train_options.repeats: expected an integer >= 1, got 0"):
        load_spec(p)
    p.write_text(base + "task: detection\ntrain_options: {repeats: 2}\n")
    assert load_spec(p).opts.repeats == 2  # detection repeats its seeds too
    p.write_text(base + "task: detection\nfusion: true\ntrain_options: {repeats: 2}\n")
    with pytest.raises(SpecError, match="a fusion spec trains one run per fusion step"):
        load_spec(p)


def test_zoom_options_are_checked(tmp_path):
    p = tmp_path / "s.yaml"
    base = "name: x\noutput: out\nsources: [{name: a, kind: activity}]\ntrain: [{video: %s}]\n" % (
        ROOT / "sample_videos" / "bikes.mp4")
    p.write_text(base + "task: detection\ntrain_options: {zoom_in: 2, zoom_scale: [0.5, 0.6]}\n")
    spec = load_spec(p)
    assert (spec.opts.zoom_in, spec.opts.zoom_scale) == (2, [0.5, 0.6])
    for bad, words in (("{zoom_in: -1}", "zoom_in: expected an integer >= 0, got -1"),
                       ("{zoom_scale: [0.7, 0.4]}", "zoom_scale: expected [low, high]"),
                       ("{zoom_scale: [0, 0.5]}", "zoom_scale: expected [low, high]"),
                       ("{zoom_scale: 0.5}", "zoom_scale: expected [low, high]")):
        p.write_text(base + f"task: detection\ntrain_options: {bad}\n")
        with pytest.raises(SpecError, match=words.replace("[", r"\[")):
            load_spec(p)
    p.write_text(base + "task: action\ntrain_options: {zoom_in: 1}\n")
    with pytest.raises(SpecError, match="only detection specs"):
        load_spec(p)
    p.write_text(base.replace("{name: a, kind: activity}", "{name: a, kind: coco, path: x.json}")
                 + "task: detection\ntrain_options: {zoom_in: 1}\n")
    with pytest.raises(SpecError, match="source 'a' is a fixed label file"):
        load_spec(p)


def test_person_boxes_need_an_action_spec_labelled_by_the_teacher(tmp_path):
    p = tmp_path / "s.yaml"
    base = "name: x\noutput: out\ntrain: [{video: %s}]\n" % (ROOT / "sample_videos" / "bikes.mp4")
    head = "head: {spatial: local, persons: true, boxes: 4}\n"
    p.write_text(base + "task: action\nsources: [{name: a, kind: activity}]\n" + head)
    assert load_spec(p).head["boxes"] == 4
    p.write_text(base + "task: action\nsources: [{name: a, kind: activity}, {name: m, kind: manifest, path: c.jsonl}]\n"
                 + head)
    with pytest.raises(SpecError, match="head.boxes: .*source 'm' is not"):
        load_spec(p)
    p.write_text(base + "task: detection\nsources: [{name: a, kind: activity}]\n" + head)
    with pytest.raises(SpecError, match="head.boxes: the person boxes are learnt"):
        load_spec(p)


def test_init_from_must_be_an_adapter_of_the_same_lora_shape(tmp_path):
    import torch
    from safetensors.torch import save_file

    def adapter(path, r, layers):
        path.mkdir()
        (path / "adapter_config.json").write_text('{"peft_type": "LORA", "r": %d, "lora_alpha": %d}' % (r, 2 * r))
        shapes = {"A": (r, 4), "B": (4, r)}
        save_file({f"base_model.model.encoder.layer.{i}.attention.{m}.lora_{ab}.weight": torch.zeros(shape)
                   for i in layers for m in ("q_proj", "v_proj") for ab, shape in shapes.items()},
                  str(path / "adapter_model.safetensors"))

    adapter(tmp_path / "good", 4, [10, 11])
    adapter(tmp_path / "rank2", 2, [10, 11])
    adapter(tmp_path / "upper", 4, [11])
    p = tmp_path / "s.yaml"
    base = ("name: x\ntask: action\noutput: out\nsources: [{name: a, kind: activity}]\ntrain: [{video: %s}]\n"
            % (ROOT / "sample_videos" / "bikes.mp4"))
    lora = "lora: {rank: 4, alpha: 8, layers: [10, 11], modules: [q_proj, v_proj], init_from: %s}\n"
    p.write_text(base + lora % "good")  # relative to the spec file, like output
    assert load_spec(p).lora.init_from == str(tmp_path / "good")
    for where, error in (("rank2", "has r=2, scale 2; this spec has r=4"),
                         ("upper", "no rank-4 LoRA on encoder.layer.10.attention.q_proj"),
                         ("missing", "lora.init_from: .*missing")):
        p.write_text(base + lora % where)
        with pytest.raises(SpecError, match=error):
            load_spec(p)
    p.write_text(base + "lora: {layers: [], init_from: good}\n")
    with pytest.raises(SpecError, match="needs lora.layers"):
        load_spec(p)


def save_detection_adapter(path, classes=("car", "person"), head=None, **params):
    """Save a detection adapter (no LoRA) with `head` or a fresh heads.DetectionHead(`params`); returns the head."""
    from vlora_va.engine.adapters import save_adapter_dir
    from vlora_va.engine.heads import DetectionHead
    from vlora_va.training import train as T

    head = head or DetectionHead(8, list(classes), image_size=56, **params)
    save_adapter_dir(path, lora={}, rank=2, alpha=4, target_modules=["encoder.layer.11.attention.q_proj"],
                     base_model="tiny", head=head, head_config=T.head_config("detection", list(classes), 56, params))
    return head


def test_box_head_from_must_be_a_person_detection_head_of_the_box_heads_shape(tmp_path):
    save_detection_adapter(tmp_path / "good", upsample=4, detail=32)
    save_detection_adapter(tmp_path / "coarse", upsample=2)
    save_detection_adapter(tmp_path / "cars", classes=("car",), upsample=4, detail=32)
    p = tmp_path / "s.yaml"
    base = ("name: x\ntask: action\noutput: out\nimage_size: 56\nsources: [{name: a, kind: activity}]\n"
            "train: [{video: %s}]\n" % (ROOT / "sample_videos" / "bikes.mp4"))
    boxes = "head: {persons: true, spatial: local, boxes: 4, detail: 32}\n"
    p.write_text(base + boxes + "box_head_from: good\n")  # relative to the spec file, like output
    assert load_spec(p).box_head_from == tmp_path / "good"
    for head, where, error in (
            (boxes, "coarse", r"has \(upsample, detail, width, image_size\) \(2, 0, 128, 56\); this spec's box head "
                              r"has \(4, 32, 128, 56\)"),
            (boxes, "cars", "not a detection adapter with a person class"),
            (boxes, "missing", "missing/head_config.json does not exist"),
            ("head: {persons: true, spatial: local}\n", "good", "only an action head with `boxes`")):
        p.write_text(base + head + f"box_head_from: {where}\n")
        with pytest.raises(SpecError, match=error):
            load_spec(p)


def test_freeze_names_loaded_parts_of_an_action_spec(tmp_path):
    save_detection_adapter(tmp_path / "det", upsample=4, detail=32)
    p = tmp_path / "s.yaml"
    base = ("name: x\ntask: %s\noutput: out\nimage_size: 56\nsources: [{name: a, kind: %s}]\n"
            "train: [{video: %s}]\n")
    action = base % ("action", "activity", ROOT / "sample_videos" / "bikes.mp4")
    boxes = "head: {persons: true, spatial: local, boxes: 4, detail: 32}\n"
    p.write_text(action + boxes + "box_head_from: det\ntrain_options: {freeze: [box_head]}\n")
    assert load_spec(p).opts.freeze == ["box_head"]
    for text, error in (
            (action + boxes + "train_options: {freeze: [box_head]}\n", "'box_head' is frozen but not loaded: set "
                                                                       "box_head_from"),
            (action + "train_options: {freeze: [lora]}\n", "'lora' is frozen but not loaded: set lora.init_from"),
            (action + "train_options: {freeze: [head]}\n", r"expected a list of lora, box_head; got \['head'\]"),
            (action + "train_options: {freeze: lora}\n", "expected a list of lora, box_head; got 'lora'"),
            (base % ("detection", "hog", ROOT / "sample_videos" / "bikes.mp4") + "train_options: {freeze: [lora]}\n",
             "only action specs keep loaded parts frozen")):
        p.write_text(text)
        with pytest.raises(SpecError, match=error):
            load_spec(p)


def test_the_box_head_study_spec_fits_the_shipped_detect():
    spec = load_spec(ROOT / "adapters" / "specs" / "actions-persons-detect-head.yaml")
    assert spec.box_head_from == (ROOT / "adapters" / "detect").resolve() and spec.head["detail"] == 32
    assert spec.output == (ROOT / "adapters" / "studies" / "actions-persons-detect-head").resolve()
