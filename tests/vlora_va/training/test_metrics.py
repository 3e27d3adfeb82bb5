import math

import pytest

from vlora_va.training.metrics import action_report, average_precision, detection_report, match_image


def box(x, y, w=10, h=20, cls="person", score=1.0, **kw):
    return {"box": [x, y, x + w, y + h], "class": cls, "score": score, **kw}


def test_match_counts_tp_fp_and_skips_ignored_refs():
    refs = [box(0, 0), box(50, 0), box(100, 0, ignore=True)]
    preds = [box(0, 0, score=0.9), box(1, 0, score=0.8), box(100, 0, score=0.7), box(200, 0, score=0.6)]
    scored, n = match_image(preds, refs)
    # first matches ref 0; the duplicate is an FP; the ignored match is dropped; the stray is an FP
    assert scored == [(0.9, 1), (0.8, 0), (0.6, 0)]
    assert n == 2


def test_detection_report_exact_f1_and_ap():
    refs = {"a": [box(0, 0), box(50, 0)], "b": [box(0, 0, cls="car")]}
    preds = {"a": [box(0, 0, score=0.9), box(200, 0, score=0.8), box(50, 0, score=0.2)], "b": []}
    rep = detection_report(preds, refs, ["person", "car"], threshold=0.5)
    assert rep["person"]["tp"] == 1 and rep["person"]["fp"] == 1
    assert rep["person"]["f1"] == pytest.approx(0.5)  # P 1/2, R 1/2
    # ranking: TP(0.9) FP(0.8) TP(0.2): AP = 0.5*1 + 0.5*(2/3)
    assert rep["person"]["ap50"] == pytest.approx(0.5 + 0.5 * 2 / 3, abs=1e-4)
    assert rep["car"]["f1"] == 0.0 and rep["car"]["refs"] == 1


def test_average_precision_edge_cases():
    assert math.isnan(average_precision([], 0))
    assert average_precision([], 3) == 0.0
    assert average_precision([(0.9, 1), (0.8, 1)], 2) == pytest.approx(1.0)


def test_action_report_confusion_rows_are_reference():
    rep = action_report(["a", "b", "b"], ["a", "a", "b"], ["a", "b"])
    assert rep["confusion"] == [[1, 1], [0, 1]]
    assert rep["top1"] == pytest.approx(2 / 3, abs=1e-4)
