"""Weighted box fusion of teachers' labels, exactly as label_fusion's docstring states it."""

from __future__ import annotations

import pytest

from vlora_va.training.label_fusion import fuse_boxes


def lab(box, score, cls="person"):
    return {"box": box, "class": cls, "score": score}


def test_agreement_keeps_the_score_and_a_lone_box_halves():
    got = fuse_boxes({"a": [lab([0, 0, 10, 20], 0.8), lab([50, 50, 60, 70], 0.8)],
                      "b": [lab([1, 0, 11, 20], 0.8)]})
    assert [(g["score"], g["teachers"]) for g in got] == [(0.8, ["a", "b"]), (0.4, ["a"])]
    assert got[0]["box"] == [0.5, 0.0, 10.5, 20.0]  # equal weights x equal scores: the plain mean


def test_box_is_weighted_by_weight_times_score():
    got = fuse_boxes({"a": [lab([0, 0, 10, 10], 0.9)], "b": [lab([2, 0, 12, 10], 0.3)]}, {"b": {"person": 0.5}})
    (g,) = got
    wa, wb = 1.0 * 0.9, 0.5 * 0.3
    assert g["box"][0] == pytest.approx(round((0 * wa + 2 * wb) / (wa + wb), 1))
    assert g["score"] == pytest.approx(round((0.9 + 0.5 * 0.3) / 1.5, 4))


def test_one_teacher_never_fills_a_cluster_twice_and_classes_never_mix():
    got = fuse_boxes({"a": [lab([0, 0, 10, 10], 0.9), lab([0, 0, 10, 10], 0.5), lab([0, 0, 10, 10], 0.7, "car")],
                      "b": []})
    assert sorted((g["class"], g["score"]) for g in got) == [("car", 0.35), ("person", 0.25), ("person", 0.45)]


def test_boxes_below_the_iou_stay_apart():
    got = fuse_boxes({"a": [lab([0, 0, 10, 10], 0.9)], "b": [lab([6, 0, 16, 10], 0.9)]}, iou=0.55)
    assert len(got) == 2
    assert len(fuse_boxes({"a": [lab([0, 0, 10, 10], 0.9)], "b": [lab([6, 0, 16, 10], 0.9)]}, iou=0.2)) == 1


def test_a_zero_weight_teacher_is_left_out():
    got = fuse_boxes({"a": [lab([0, 0, 10, 10], 0.6)], "b": [lab([0, 0, 10, 10], 0.9)]}, {"b": {"person": 0}})
    assert [(g["score"], g["teachers"]) for g in got] == [(0.6, ["a"])]


def test_bad_iou():
    with pytest.raises(ValueError, match="iou"):
        fuse_boxes({}, iou=0)
