"""Paired comparisons: per-item scores that add up to the metrics' totals, and a bootstrap interval that is
reproducible, zero for identical predictions and covers a known shift."""

import pytest

from vlora_va.training import paired
from vlora_va.training.metrics import detection_report


def test_detection_items_add_up_to_the_report():
    refs = {"a": [{"box": [0, 0, 10, 10], "class": "person"}, {"box": [20, 20, 30, 30], "class": "person"}],
            "b": [{"box": [0, 0, 10, 10], "class": "person"}]}
    preds = {"a": [{"box": [0, 0, 10, 10], "class": "person", "score": 0.9},
                   {"box": [50, 50, 60, 60], "class": "person", "score": 0.4}],
             "b": [{"box": [1, 1, 10, 10], "class": "person", "score": 0.2}]}
    items = paired.detection_items(preds, refs, ["a", "b"], "person")
    rep = detection_report(preds, refs, ["person"], 0.3)["person"]
    assert paired.f1_at(items, 0.3) == pytest.approx(rep["f1"], abs=1e-4)
    assert paired.ap50(items) == pytest.approx(rep["ap50"], abs=1e-4)


def test_bootstrap_is_zero_for_identical_items_and_covers_a_shift():
    ref = [1, 0, 1, 1, 0, 1, 0, 1] * 6
    same = paired.paired(ref, list(ref), paired.clip_top1)
    assert same["delta"] == 0 and same["ci95"] == [0, 0]
    worse = list(ref)
    for i in (0, 2, 3, 5):  # 4 of 48 right answers turn wrong
        worse[i] = 0
    d = paired.paired(ref, worse, paired.clip_top1)
    assert d["delta"] == pytest.approx(-4 / 48, abs=1e-4)
    assert d["ci95"][0] < d["delta"] < d["ci95"][1] <= 0
    assert d == paired.paired(ref, worse, paired.clip_top1)  # one fixed seed: the same interval every time
    with pytest.raises(ValueError):
        paired.paired(ref, worse[:-1], paired.clip_top1)


def test_person_items_count_right_and_counted_persons_per_clip():
    refs = [[{"box": [0, 0, 10, 20], "label": "walking_left"}, {"box": [50, 0, 60, 20], "label": "standing"}]]
    preds = [[{"box": [0, 0, 10, 20], "score": 0.9, "activity": "walking_left"}]]
    assert paired.person_items(preds, refs, ["standing", "walking_left"], 0.5) == [(1, 2)]
    assert paired.persons_top1([(1, 2), (2, 2)]) == 0.75
