import math

import pytest

from vlora_va.training.metrics import (
    SCORE_THRESHOLDS,
    action_report,
    average_precision,
    best_f1_threshold,
    best_person_threshold,
    detection_report,
    match_image,
    person_activity_report,
)


def box(x, y, w=10, h=20, cls="person", score=1.0, **kw):
    return {"box": [x, y, x + w, y + h], "class": cls, "score": score, **kw}


def test_match_counts_tp_fp_and_skips_ignored_refs():
    refs = [box(0, 0), box(50, 0), box(100, 0, ignore=True)]
    preds = [box(0, 0, score=0.9), box(1, 0, score=0.8), box(100, 0, score=0.7), box(200, 0, score=0.6)]
    scored, n = match_image(preds, refs)
    # first matches ref 0; the duplicate is an FP; the ignored match is dropped; the stray is an FP
    assert scored == [(0.9, 1), (0.8, 0), (0.6, 0)]
    assert n == 2


def test_the_best_threshold_may_lie_below_0_1_down_to_the_decode_floor():
    # two people the model scores only 0.08 and 0.09, noise at 0.06: the best F1 keeps both people and drops the
    # noise, which only 0.075 of the grid does (it began at 0.1, where recall was 0)
    refs = {"a": [box(0, 0), box(50, 0)]}
    preds = {"a": [box(0, 0, score=0.08), box(50, 0, score=0.09), box(200, 0, score=0.06)]}
    assert best_f1_threshold(preds, refs, ["person"]) == 0.075
    assert SCORE_THRESHOLDS[0] == 0.05  # the floor the predictions are decoded at (train.decode_detections)
    people = [[person(0, 0, activity="standing", score=0.09), person(300, 0, activity="standing", score=0.06)]]
    assert best_person_threshold(people, [[person(0, 0, "standing")]], ["standing"]) == 0.075


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


def test_reference_labels_the_model_never_learnt_get_a_row_and_count_as_wrong():
    rep = action_report(["a", "a"], ["a", "cycling"], ["a", "b"])
    assert rep["labels"] == ["a", "b", "cycling"] and rep["confusion"] == [[1, 0, 0], [0, 0, 0], [1, 0, 0]]
    refs = [[person(0, 0, "cycling"), person(100, 0, "standing")]]
    preds = [[person(0, 0, activity="standing"), person(100, 0, activity="standing")]]
    rep = person_activity_report(preds, refs, ["standing"], threshold=0.5)
    assert rep["activities"] == ["standing", "cycling"] and rep["confusion"] == [[1, 0, 0], [1, 0, 0]]
    assert rep["top1"] == 0.5


def person(x, y, label=None, activity=None, score=1.0):
    """A 10x40 person box at (x, y): a reference (label) or a prediction (activity, score)."""
    return {"box": [x, y, x + 10, y + 40], **({"label": label} if label else {"activity": activity, "score": score})}


def test_person_activity_report_counts_misses_as_wrong_exactly():
    acts = ["standing", "walking_left"]
    refs = [[person(0, 0, "walking_left"), person(100, 0, "standing"), person(200, 0, "walking_left")],
            [person(0, 0, "standing")]]
    preds = [[person(5, 10, activity="walking_left", score=0.9),  # 11 px from ref 0's centre (< 20 = half its height)
              person(100, 25, activity="walking_left", score=0.8),  # 25 px from ref 1: too far, a false positive
              person(300, 0, activity="standing", score=0.7)],     # nobody there
             [person(0, 0, activity="walking_left", score=0.2)]]    # below the threshold: not a prediction
    rep = person_activity_report(preds, refs, acts, threshold=0.5)
    assert rep["confusion"] == [[0, 0, 2], [0, 1, 1]]  # rows: reference; last column: missed
    assert (rep["persons"], rep["predicted"]) == (4, 3)
    assert rep["top1"] == 0.25 and rep["top1_found"] == 1.0 and rep["recall"] == 0.25
    assert rep["precision"] == pytest.approx(1 / 3, abs=1e-4)
    rep = person_activity_report(preds, refs, acts, threshold=0.1)
    assert rep["confusion"] == [[0, 1, 1], [0, 1, 1]] and rep["top1_found"] == 0.5


def test_a_person_the_label_rule_did_not_keep_is_no_false_alarm_with_dont_care():
    refs = [[person(0, 0, "standing")], [person(0, 0, "standing")]]
    # each clip: the labelled person, a person the teacher saw but the rule did not keep, and noise
    preds = [[person(0, 0, activity="standing", score=0.9), person(100, 0, activity="standing", score=0.4),
              person(300, 0, activity="standing", score=0.4)] for _ in refs]
    seen = [[[0, 0, 10, 40], [102, 5, 112, 45]], [[0, 0, 10, 40], [100, 0, 110, 40]]]
    plain = person_activity_report(preds, refs, ["standing"], 0.3)
    assert (plain["predicted"], plain["precision"]) == (6, pytest.approx(1 / 3, abs=1e-4))
    rep = person_activity_report(preds, refs, ["standing"], 0.3, dont_care=seen)
    assert (rep["predicted"], rep["precision"]) == (4, 0.5)  # the noise still counts
    assert {k: rep[k] for k in ("top1", "recall", "confusion")} == {k: plain[k] for k in ("top1", "recall", "confusion")}
    # the threshold: without dont_care the kept-out people (0.4) count as false alarms and it goes above them;
    # with it, only the noise (0.35) is below it
    people = [[person(0, 0, activity="standing", score=0.9), person(100, 0, activity="standing", score=0.4),
               person(300, 0, activity="standing", score=0.35)] for _ in refs]
    assert best_person_threshold(people, refs, ["standing"]) > 0.4
    assert 0.35 < best_person_threshold(people, refs, ["standing"], dont_care=seen) <= 0.4


def test_person_report_without_labelled_persons_is_undefined_not_zero():
    # Clips with nobody in them: top-1 and recall have no meaning, every prediction is a false alarm.
    rep = person_activity_report([[person(0, 0, activity="standing", score=0.9)], []], [[], []], ["standing"], 0.5)
    assert (rep["top1"], rep["top1_found"], rep["recall"]) == (None, None, None)
    assert (rep["persons"], rep["predicted"], rep["precision"]) == (0, 1, 0.0)
    assert person_activity_report([[]], [[]], ["standing"], 0.5)["precision"] is None


def test_person_matching_gives_each_reference_to_one_prediction_best_first():
    refs = [[person(0, 0, "standing"), person(12, 0, "walking_left")]]
    # Both predictions are in reach of both references; the better one takes its nearest, the other gets the rest.
    preds = [[person(11, 0, activity="walking_left", score=0.9), person(1, 0, activity="standing", score=0.6)]]
    rep = person_activity_report(preds, refs, ["standing", "walking_left"], threshold=0.5)
    assert rep["confusion"] == [[1, 0, 0], [0, 1, 0]]


def test_best_person_threshold_separates_people_from_noise():
    refs = [[person(0, 0, "standing")], [person(0, 0, "standing")]]
    preds = [[person(0, 0, activity="standing", score=0.7), person(200, 0, activity="standing", score=0.35)],
             [person(0, 0, activity="standing", score=0.6), person(300, 0, activity="standing", score=0.3)]]
    t = best_person_threshold(preds, refs, ["standing"])
    assert 0.35 < t <= 0.6


# --- human-checked set metrics: recall by box height, per-person activity matched by IoU ----------------------

def test_height_buckets_are_the_reference_box_height_in_pixels():
    from vlora_va.training.metrics import height_bucket

    assert [height_bucket([0, 0, 5, h]) for h in (39.9, 40, 100, 100.1)] == ["<40", "40-100", "40-100", ">100"]


def test_human_detection_report_adds_recall_by_height_at_the_threshold():
    from vlora_va.training.metrics import human_detection_report

    refs = {"a": [box(0, 0, h=30), box(50, 0, h=60), box(100, 0, h=150), box(200, 0, h=20, ignore=True)],
            "b": [box(0, 0, h=70), box(50, 0, h=30, cls="car")]}
    preds = {"a": [box(0, 0, h=30, score=0.9),    # TP, <40
                   box(100, 0, h=150, score=0.2),  # would be a TP (>100) but scores below the threshold
                   box(200, 0, h=20, score=0.8),   # on the ignore region: counts neither way
                   box(300, 0, score=0.7)],        # nobody there: FP
             "b": [box(0, 0, h=70, score=0.6),     # TP, 40-100
                   box(0, 0, h=70, score=0.55)]}   # duplicate of a matched person: FP
    rep = human_detection_report(preds, refs, ["person", "car"], threshold=0.5)
    p = rep["person"]
    assert (p["refs"], p["tp"], p["fp"]) == (4, 2, 2)
    assert p["precision"] == 0.5 and p["recall"] == 0.5 and p["f1"] == 0.5
    # ranking: TP .9, FP .7, TP .6, FP .55, TP .2 -> AP = 1/4*1 + 1/4*2/3 + 1/4*3/5
    assert p["ap50"] == pytest.approx((1 + 2 / 3 + 3 / 5) / 4, abs=1e-4)
    assert p["recall_by_height"] == {"<40": {"refs": 1, "found": 1, "recall": 1.0},
                                     "40-100": {"refs": 2, "found": 1, "recall": 0.5},
                                     ">100": {"refs": 1, "found": 0, "recall": 0.0}}
    c = rep["car"]
    assert (c["refs"], c["tp"], c["fp"], c["recall"]) == (1, 0, 0, 0.0)
    assert c["recall_by_height"]["<40"] == {"refs": 1, "found": 0, "recall": 0.0}
    assert c["recall_by_height"][">100"] == {"refs": 0, "found": 0, "recall": None}  # empty bucket: undefined


def test_person_activity_iou_report_counts_exactly():
    from vlora_va.training.metrics import person_activity_iou_report

    acts = ["standing", "walking_left", "walking_right"]
    refs = [[person(0, 0, "walking_left"), person(100, 0, "standing"), {"box": [200, 0, 210, 40], "ignore": True}],
            [person(0, 0, "walking_right")]]
    preds = [[person(2, 4, activity="walking_left", score=0.9),   # IoU (8*36)/(400+400-288) = 0.5625: found, right
              person(105, 0, activity="walking_left", score=0.8),  # IoU 5*40/(800-200) = 1/3 < 0.5: a false alarm
              person(201, 0, activity="standing", score=0.7),      # on the ignore person: counts neither way
              person(400, 0, activity="standing", score=0.1)],     # below the person threshold
             [person(0, 0, activity="walking_left", score=0.6)]]   # found, wrong activity
    rep = person_activity_iou_report(preds, refs, acts, threshold=0.5)
    assert rep["confusion"] == [[0, 0, 0, 1], [0, 1, 0, 0], [0, 1, 0, 0]]  # rows: reference; last column: missed
    assert (rep["persons"], rep["ignored_persons"], rep["predicted"]) == (3, 1, 3)
    assert rep["top1"] == pytest.approx(1 / 3, abs=1e-4) and rep["top1_found"] == 0.5
    assert rep["recall"] == pytest.approx(2 / 3, abs=1e-4) and rep["precision"] == pytest.approx(2 / 3, abs=1e-4)
    # per activity (a missed person is wrong) and over left / right / standing, here all three references
    assert rep["per_activity"] == {"standing": {"persons": 1, "right": 0, "recall": 0.0},
                                   "walking_left": {"persons": 1, "right": 1, "recall": 1.0},
                                   "walking_right": {"persons": 1, "right": 0, "recall": 0.0}}
    assert rep["top1_left_right_standing"] == rep["top1"]
    # at a looser IoU the shifted prediction finds the standing person (with the wrong activity)
    loose = person_activity_iou_report(preds, refs, acts, threshold=0.5, iou=0.3)
    assert loose["confusion"][0] == [0, 1, 0, 0] and loose["recall"] == 1.0


def test_person_iou_matching_gives_each_reference_to_the_best_scoring_prediction():
    from vlora_va.training.metrics import person_activity_iou_report

    refs = [[person(0, 0, "standing")]]
    preds = [[person(1, 0, activity="walking_left", score=0.6), person(0, 0, activity="standing", score=0.9)]]
    rep = person_activity_iou_report(preds, refs, ["standing", "walking_left"], threshold=0.5)
    assert rep["confusion"] == [[1, 0, 0], [0, 0, 0]] and rep["predicted"] == 2 and rep["precision"] == 0.5


def test_subset_top1_counts_only_the_named_activities():
    import numpy as np

    from vlora_va.training.metrics import subset_top1

    acts = ["standing", "walking_left", "walking_toward"]
    cm = np.array([[2, 0, 0, 1], [0, 3, 0, 1], [0, 0, 0, 5]])  # last column: missed
    assert subset_top1(acts, cm, ("standing", "walking_left", "walking_right")) == pytest.approx(5 / 7, abs=1e-4)
    assert subset_top1(acts, cm, ("cycling",)) is None


def test_persons_the_label_rule_was_not_sure_of_count_neither_way():
    acts = ["standing", "walking_left"]
    refs = [[{"box": [0, 0, 10, 40], "label": "walking_left"},
             {"box": [100, 0, 110, 40], "label": "standing", "sure": False}]]
    preds = [[{"box": [0, 0, 10, 40], "score": 0.9, "activity": "walking_left"},
              {"box": [100, 0, 110, 40], "score": 0.9, "activity": "walking_left"}]]  # on the unsure person
    rep = person_activity_report(preds, refs, acts, threshold=0.5)
    assert rep["confusion"] == [[0, 0, 0], [0, 1, 0]] and rep["unsure_persons"] == 1
    assert (rep["persons"], rep["predicted"], rep["precision"], rep["top1"]) == (1, 1, 1.0, 1.0)
    # missing the unsure person costs nothing either
    rep = person_activity_report([preds[0][:1]], refs, acts, threshold=0.5)
    assert (rep["recall"], rep["precision"]) == (1.0, 1.0)


def test_side_by_side_pairs_follow_the_rule_as_a_plain_loop():
    from vlora_va.training.metrics import side_by_side_pairs

    boxes = [[0, 0, 20, 60],      # 0
             [20, 0, 40, 60],     # 1: touches 0
             [55, 0, 75, 60],     # 2: centre 35 px from 1's, boxes apart; the wider box is 20 px: not a pair
             [100, 0, 130, 60],   # 3
             [135, 10, 160, 70]]  # 4: apart from 3, centres 34.0 px apart: over the wider box's 30 px
    assert side_by_side_pairs(boxes) == [(0, 1)]
    boxes[4] = [132, 10, 157, 70]  # centres (115, 30) and (144.5, 40): 31.1 px apart, still over 30
    assert side_by_side_pairs(boxes) == [(0, 1)]
    boxes[4] = [128, 0, 153, 60]  # 25.5 px apart, under 30: a pair
    assert side_by_side_pairs(boxes) == [(0, 1), (3, 4)]


def test_side_by_side_report_counts_a_pair_only_when_both_are_found():
    from vlora_va.training.metrics import side_by_side_report

    refs = {"a": [box(0, 0), box(10, 0), box(200, 0)], "b": [box(0, 0), box(8, 0), box(8, 30, ignore=True)]}
    preds = {"a": [box(0, 0, score=0.9), box(10, 0, score=0.8), box(200, 0, score=0.8)],
             "b": [box(4, 0, score=0.9)]}  # one box between the two: matches neither at IoU 0.5
    rep = side_by_side_report(preds, refs, "person", threshold=0.5)
    assert (rep["cases"], rep["separate"], rep["rate"]) == (2, 1, 0.5)
    assert (rep["persons_in_pairs"], rep["found_in_pairs"]) == (4, 2)
    assert side_by_side_report(preds, refs, "person", threshold=0.85)["separate"] == 0  # 0.8 falls below


def test_recall_at_precision_reads_the_curve_threshold_by_threshold():
    from vlora_va.training.metrics import recall_at_precision

    # ranked: TP .9, TP .8, FP .7, TP .6, FP .5, TP .4; 5 references
    scored = [(0.5, 0), (0.9, 1), (0.4, 1), (0.8, 1), (0.7, 0), (0.6, 1)]
    # precision by threshold: .9 -> 1/1, .8 -> 2/2, .7 -> 2/3, .6 -> 3/4, .5 -> 3/5, .4 -> 4/6
    assert recall_at_precision(scored, 5, 0.9) == {"recall": 0.4, "threshold": 0.8}
    assert recall_at_precision(scored, 5, 0.75) == {"recall": 0.6, "threshold": 0.6}
    assert recall_at_precision(scored, 5, 0.6) == {"recall": 0.8, "threshold": 0.4}
    # two predictions with one score are one threshold: the FP at .8 comes with the TP
    assert recall_at_precision([(0.9, 1), (0.8, 1), (0.8, 0)], 2, 0.9) == {"recall": 0.5, "threshold": 0.9}
    assert recall_at_precision([(0.9, 0)], 1, 0.9) == {"recall": None, "threshold": None}
    assert recall_at_precision([], 0, 0.9) == {"recall": None, "threshold": None}
