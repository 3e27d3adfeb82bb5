"""Tracking metrics (vlora_va.training.track_metrics): worked examples computed by hand, TrackEval 1.3.0's figures
on seeded scenarios, and the frozen identity ground truth read into the metrics' input."""

import pytest

from tests.training.track_scenarios import scenario
from tests.training.trackeval_reference import SEEDS, trackeval_scores
from vlora_va.training.track_metrics import (
    HUMAN_TRACKS_SHA256,
    identity_truth,
    score_tracks,
)

# TrackEval 1.3.0 (numpy 2.4.6, scipy 1.17.1) on track_scenarios.scenario(seed): its MOTChallenge preprocessing with
# the ignore regions as distractors, then CLEAR and Identity at IoU 0.5. Regenerate with trackeval_reference.py.
TRACKEVAL = {  # seed: (matches, fp, fn, id_switches, idtp, idfp, idfn, motp)
    0: (160, 32, 41, 9, 112, 80, 89, 0.8820968289876179),
    1: (182, 21, 33, 14, 119, 84, 96, 0.8910380264687006),
    2: (172, 26, 42, 10, 132, 66, 82, 0.8912221453949488),
    3: (148, 23, 36, 6, 107, 64, 77, 0.8889593177029117),
    4: (159, 27, 39, 7, 121, 65, 77, 0.8985734257746056),
    5: (106, 19, 21, 7, 81, 44, 46, 0.8733595016510592),
    6: (161, 26, 26, 8, 112, 75, 75, 0.8855876783065953),
    7: (146, 28, 28, 14, 88, 86, 86, 0.8860214357880523),
}


def box(x: float, w: float = 20, h: float = 50, y: float = 100) -> list[float]:
    return [x, y, x + w, y + h]


def walk(ident, frames, x0: float = 0, step: float = 30) -> dict:
    """{t: [(ident, box)]}: one person walking right by `step` px a frame, at the listed frame numbers."""
    return {55 + 0.5 * k: [(ident, box(x0 + step * k))] for k in frames}


def merge(*sides: dict) -> dict:
    out: dict = {}
    for side in sides:
        for t, entries in side.items():
            out.setdefault(t, []).extend(entries)
    return out


def test_a_perfect_tracker_scores_one():
    gt = merge(walk("A", range(4)), walk("B", range(4), x0=300))
    pred = merge(walk(7, range(4)), walk(8, range(4), x0=300))  # other labels, same boxes
    s = score_tracks(gt, pred)
    assert (s.matches, s.fp, s.fn, s.id_switches) == (8, 0, 0, 0)
    assert s.mota == 1 and s.idf1 == 1 and s.motp == 1 and (s.gt_ids, s.pred_ids) == (2, 2)


def test_one_id_switch_mid_sequence():
    # A is followed by track x for 4 frames, then by y for 2; B by z throughout. By hand: 12 boxes, all matched,
    # 1 switch: MOTA = 1 - 1/12. Identities: A-x 4 frames, B-z 6: IDTP 10, y's 2 boxes are IDFP, A's last 2 IDFN:
    # IDF1 = 10 / (10 + 1 + 1) = 5/6.
    gt = merge(walk("A", range(6)), walk("B", range(6), x0=300))
    pred = merge(walk("x", range(4)), walk("y", range(4, 6)), walk("z", range(6), x0=300))
    s = score_tracks(gt, pred)
    assert (s.matches, s.fp, s.fn, s.id_switches) == (12, 0, 0, 1)
    assert s.mota == pytest.approx(11 / 12)
    assert (s.idtp, s.idfp, s.idfn) == (10, 2, 2) and s.idf1 == pytest.approx(5 / 6)


def test_a_missed_box_and_a_false_box():
    # 2 people x 5 frames = 10 boxes; A missed in frame 2, a false box in frame 3: MOTA = 1 - (1 + 1) / 10 = 0.8.
    # IDTP = 4 (A) + 5 (B) = 9, IDFP 1, IDFN 1: IDF1 = 9 / 10.
    gt = merge(walk("A", range(5)), walk("B", range(5), x0=300))
    pred = merge(walk(1, [0, 1, 3, 4]), walk(2, range(5), x0=300), {56.5: [(3, box(600))]})
    s = score_tracks(gt, pred)
    assert (s.matches, s.fp, s.fn, s.id_switches) == (9, 1, 1, 0)
    assert s.mota == pytest.approx(0.8)
    assert (s.idtp, s.idfp, s.idfn) == (9, 1, 1) and s.idf1 == pytest.approx(0.9)


def test_a_still_valid_match_is_kept_over_a_better_overlap():
    # Frame 1: track x on A. Frame 2: x still overlaps A (IoU 0.6) and y overlaps it better (0.8): CLEAR keeps x.
    gt = {55.0: [("A", box(0, w=100))], 55.5: [("A", box(0, w=100))]}
    pred = {55.0: [("x", box(0, w=100))], 55.5: [("x", box(0, w=60)), ("y", box(0, w=80))]}
    s = score_tracks(gt, pred)
    assert (s.matches, s.fp, s.id_switches) == (2, 1, 0)
    # Once x no longer overlaps enough (IoU 0.4), y takes over: one switch.
    pred[55.5] = [("x", box(0, w=40)), ("y", box(0, w=80))]
    s = score_tracks(gt, pred)
    assert (s.matches, s.fp, s.id_switches) == (2, 1, 1)


def test_a_switch_is_counted_against_the_last_match_across_a_gap():
    gt = walk("A", range(3))
    assert score_tracks(gt, merge(walk("x", [0]), walk("y", [2]))).id_switches == 1  # x, missed, then y
    assert score_tracks(gt, merge(walk("x", [0]), walk("x", [2]))).id_switches == 0  # x, missed, x again


def test_identities_are_matched_globally_not_greedily():
    # A (frames 0-4) is covered by x in 0-2 and y in 3-4; B (frames 5-6) by x. Greedy on the largest overlap would
    # give A-x (3 frames) and leave B unmatched: IDTP 3. The best one-to-one matching is A-y + B-x: IDTP 2 + 2 = 4.
    gt = merge(walk("A", range(5)), walk("B", range(5, 7)))
    pred = merge(walk("x", range(3)), walk("y", range(3, 5)), walk("x", range(5, 7)))
    s = score_tracks(gt, pred)
    assert (s.idtp, s.idfp, s.idfn) == (4, 3, 3) and s.idf1 == pytest.approx(4 / 7)


def test_iou_threshold_is_inclusive():
    gt = {55.0: [("A", [0, 0, 10, 10])]}
    assert score_tracks(gt, {55.0: [("x", [0, 0, 10, 20])]}).matches == 1  # IoU 100/200 = 0.5
    s = score_tracks(gt, {55.0: [("x", [0, 0, 10, 21])]})  # IoU 100/210 < 0.5
    assert (s.matches, s.fp, s.fn, s.mota) == (0, 1, 1, -1)


def test_predictions_on_ignore_regions_are_not_false_positives():
    gt = {55.0: [("A", box(0))]}
    region = box(300, w=40, h=100)
    ignore = {55.0: [region]}
    cases = {
        "matched to the region": ([("x", box(0)), ("y", box(302, w=38, h=95))], 1, 0),
        "inside a region it does not match by IoU": ([("x", box(0)), ("y", box(310, w=15, h=40))], 1, 0),
        "only 30% inside": ([("x", box(0)), ("y", box(334, w=20, h=50))], 0, 1),
    }
    for name, (pred, ignored, fp) in cases.items():
        s = score_tracks(gt, {55.0: pred}, ignore)
        assert (s.ignored, s.fp, s.matches, s.pred_boxes) == (ignored, fp, 1, 2 - ignored), name
    # A prediction that matches a ground-truth box stays a match even when it also overlaps a region.
    s = score_tracks(gt, {55.0: [("x", box(0))]}, {55.0: [box(5)]})
    assert (s.ignored, s.matches, s.fp) == (0, 1, 0)
    # Without the region the same prediction is a false positive.
    assert score_tracks(gt, {55.0: cases["matched to the region"][0]}).fp == 1


def test_scored_frames_are_the_ground_truths():
    gt = walk("A", range(2))
    pred = {55.0000000001: [("x", box(0))], 55.5: [("x", box(30))], 55.3: [("z", box(500))]}
    s = score_tracks(gt, pred)  # 55.3 is between ground-truth frames: not scored
    assert (s.frames, s.matches, s.fp, s.pred_boxes) == (2, 2, 0, 2)
    s = score_tracks(gt, {55.0: [("x", box(0))]})  # no output at 55.5: a miss
    assert (s.matches, s.fn) == (1, 1)


def test_bad_input_names_the_problem():
    with pytest.raises(ValueError, match=r"predictions at t=55.0: box .* x2 > x1"):
        score_tracks({55.0: []}, {55.0: [("x", [10, 0, 5, 10])]})
    with pytest.raises(ValueError, match=r"ground truth at t=55.0: id 'A' appears twice"):
        score_tracks({55.0: [("A", box(0)), ("A", box(50))]}, {})
    with pytest.raises(ValueError, match=r"expected \(id, \[x1, y1, x2, y2\]\)"):
        score_tracks({55.0: [("A", 5)]}, {})


@pytest.mark.parametrize("seed", SEEDS)
def test_matches_trackeval_on_seeded_scenarios(seed):
    gt, pred, ignore = scenario(seed)
    # TrackEval removes only predictions matched to an ignore region: turn our "mostly inside" rule off.
    s = score_tracks(gt, pred, ignore, ignore_inside=2.0)
    matches, fp, fn, idsw, idtp, idfp, idfn, motp = TRACKEVAL[seed]
    assert (s.matches, s.fp, s.fn, s.id_switches, s.idtp, s.idfp, s.idfn) == (matches, fp, fn, idsw, idtp, idfp, idfn)
    assert s.motp == pytest.approx(motp, abs=1e-12)
    assert s.ignored > 0 and s.id_switches > 0 and s.fp > 0  # the scenario exercises what it should


@pytest.mark.parametrize("seed", SEEDS)
def test_matches_trackeval_live(seed):
    pytest.importorskip("trackeval", reason="TrackEval is not a dependency: see trackeval_reference.py")
    gt, pred, ignore = scenario(seed)
    ref = trackeval_scores(gt, pred, ignore)
    ours = score_tracks(gt, pred, ignore, ignore_inside=2.0).to_dict()
    assert {k: ours[k] for k in ref} == pytest.approx(ref, abs=1e-12)


def test_identity_truth_reads_the_frozen_file():
    truth = identity_truth()
    assert truth.sha256 == HUMAN_TRACKS_SHA256
    assert len(truth.gt) == 49 and sum(len(v) for v in truth.gt.values()) == 339  # persons only by default
    assert sum(len(v) for v in truth.ignore.values()) == 27
    assert set(truth.classes.values()) == {"person"} and len(truth.classes) == 9
    assert [line["name"] for line in truth.lines] == ["left", "centre", "right"]
    everything = identity_truth(classes=None)
    assert sum(len(v) for v in everything.gt.values()) == 437
    s = score_tracks(truth.gt, truth.gt, truth.ignore)
    assert (s.mota, s.idf1, s.id_switches, s.gt_ids) == (1, 1, 0, 9)
