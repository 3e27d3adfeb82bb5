import json

import numpy as np
import pytest

from vlora_va.training.frames import TrainingFrame
from vlora_va.training.teachers import (
    COCO80,
    CenterNetTeacher,
    HaarTeacher,
    HogPeopleTeacher,
    LabelCache,
    Teacher,
    load_clip_manifest,
    load_coco_json,
    save_coco_json,
)


class CountingTeacher(Teacher):
    cache_name = "counting"

    def __init__(self, classes=None):
        self.calls, self.classes, self.score_threshold = 0, classes, 0.3

    def _raw(self, rgb):
        self.calls += 1
        return [{"box": [0, 0, 5, 5], "class": "person", "score": 0.9},
                {"box": [1, 1, 6, 6], "class": "car", "score": 0.5},
                {"box": [2, 2, 7, 7], "class": "car", "score": 0.1}]


def frames(n=3):
    return [TrainingFrame("vid", i * 0.5, np.zeros((8, 8, 3), np.uint8)) for i in range(n)]


def _label_into(root, first, n):
    """One process of several labelling into one cache (seeds trained side by side): save after every frame."""
    cache = LabelCache(root, "shared")
    for i in range(first, first + n):
        cache.put(TrainingFrame("vid", i * 0.1, np.zeros((1, 1, 3), np.uint8)), [{"i": i}])
        cache.save()


def test_processes_labelling_into_one_cache_at_once_lose_nothing(tmp_path):
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    workers = [ctx.Process(target=_label_into, args=(tmp_path, k * 40, 40)) for k in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert [w.exitcode for w in workers] == [0, 0, 0]
    saved = json.loads((tmp_path / "shared" / "vid.json").read_text())
    assert sorted(v[0]["i"] for v in saved.values()) == list(range(120))
    assert not list((tmp_path / "shared").glob("*.tmp"))


def test_an_unreadable_cache_file_is_labelled_again(tmp_path, caplog):
    t = CountingTeacher()
    t.label(frames(2), tmp_path, progress=False)
    (tmp_path / "counting" / "vid.json").write_text("{cut off")
    out = t.label(frames(2), tmp_path, progress=False)
    assert t.calls == 4 and len(out) == 2 and "unreadable" in caplog.text
    assert len(json.loads((tmp_path / "counting" / "vid.json").read_text())) == 2


def test_cache_labels_once_and_class_filter_reads_the_same_cache(tmp_path):
    t = CountingTeacher()
    out = t.label(frames(), tmp_path, progress=False)
    assert t.calls == 3 and len(out["vid@0.500"]) == 2  # score filter
    t2 = CountingTeacher(classes=["car"])
    out2 = t2.label(frames(), tmp_path, progress=False)
    assert t2.calls == 0  # all from disk
    assert [lab["class"] for lab in out2["vid@1.000"]] == ["car"]
    t3 = CountingTeacher()
    t3.label(frames(4), tmp_path, progress=False)
    assert t3.calls == 1  # only the new frame


def test_coco_round_trip_and_manifest(tmp_path):
    labels = {"vid@0.000": [{"box": [1.0, 2.0, 11.0, 22.0], "class": "person", "score": 0.8}], "vid@0.500": []}
    path = save_coco_json(tmp_path / "l.json", labels)
    back = load_coco_json(path)
    assert back == labels
    assert load_coco_json(path, classes=["car"])["vid@0.000"] == []
    data = json.loads(path.read_text())
    data["images"][0] = {"id": data["images"][0]["id"], "video": "vid", "t": 0.0}
    path.write_text(json.dumps(data))
    assert load_coco_json(path)["vid@0.000"][0]["box"] == [1.0, 2.0, 11.0, 22.0]
    m = tmp_path / "clips.jsonl"
    m.write_text('# comment\n{"video": "videos/vid.mp4", "start": 0, "end": 1, "label": "walking_left"}\n')
    assert load_clip_manifest(m) == [{"video": "vid", "start": 0.0, "end": 1.0, "label": "walking_left"}]
    m.write_text('{"video": "vid", "start": 0}\n')
    with pytest.raises(ValueError, match="missing"):
        load_clip_manifest(m)


def test_classical_teachers_run_on_a_blank_frame():
    rgb = np.full((200, 120, 3), 128, np.uint8)
    assert HogPeopleTeacher(upscale=1.0)._raw(rgb) == []
    assert HaarTeacher("haarcascade_frontalface_default.xml", "face")._raw(rgb) == []


def test_centernet_rejects_unknown_classes(tmp_path):
    f = tmp_path / "c.onnx"
    f.write_bytes(b"x")
    with pytest.raises(ValueError, match="unknown COCO"):
        CenterNetTeacher(f, classes=["persn"])
    assert len(COCO80) == 80 and COCO80[0] == "person"


def test_tile_grid_overlaps_by_half_a_tile_and_covers_the_frame():
    from vlora_va.training.teachers import tile_grid

    assert tile_grid(768, 576, 2) == [(0, 0, 512, 384), (256, 0, 768, 384), (0, 192, 512, 576), (256, 192, 768, 576)]
    assert tile_grid(300, 90, 1) == [(0, 0, 300, 90)]


def test_merge_tiled_prefers_the_tiles_split_and_drops_cut_boxes():
    from vlora_va.training.teachers import merge_tiled

    def lab(box, score=0.8, cls="person"):
        return {"box": box, "class": cls, "score": score}

    whole = [lab([100, 100, 160, 220], 0.7),   # one box over two people walking together
             lab([600, 400, 640, 500], 0.6),   # a person no tile saw whole: kept
             lab([300, 50, 400, 120], 0.5, "truck")]
    tiled = [((0, 0, 512, 384), [lab([100, 100, 128, 220], 0.9), lab([132, 102, 160, 218], 0.85),  # the two, split
                                 lab([480, 100, 511, 200], 0.9),   # touches the tile's inner right edge: cut
                                 lab([300, 50, 400, 120], 0.8, "car"),  # a car where the whole frame saw a truck
                                 lab([300, 200, 330, 280], 0.9)]),
             ((256, 0, 768, 384), [lab([301, 201, 330, 281], 0.7),  # the same person seen by both tiles: one kept
                                   lab([300, 50, 400, 120], 0.75, "truck")])]
    got = sorted((tuple(x["box"]), x["class"]) for x in merge_tiled(whole, tiled, (768, 576)))
    assert got == [((100, 100, 128, 220), "person"), ((132, 102, 160, 218), "person"),
                   ((300, 50, 400, 120), "car"), ((300, 50, 400, 120), "truck"), ((300, 200, 330, 280), "person"),
                   ((600, 400, 640, 500), "person")]


def test_tiles_must_be_a_positive_integer(teachers):
    from vlora_va.training.teachers import CenterNetTeacher

    with pytest.raises(ValueError, match="tiles: expected an integer >= 1, got 0"):
        CenterNetTeacher(tiles=0)
    assert CenterNetTeacher(tiles=2).cache_name.endswith("-tiles2")
