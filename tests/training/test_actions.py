"""The activity-label rule on synthetic person tracks."""

import numpy as np
import pytest

from vlora_va.training.actions import clip_label, person_activities, track


def person(x, y, h=100, score=0.9):
    return {"box": [x, y, x + h * 0.4, y + h], "class": "person", "score": score}


def walk(dx, dy, n=10, grow=1.0, **kw):
    """A person moving dx, dy px per frame whose height is multiplied by `grow` every frame."""
    return [[person(100 + dx * i, 100 + dy * i, h=100 * grow ** i, **kw)] for i in range(n)]


@pytest.mark.parametrize("dx,dy,grow,label", [(10, 0, 1, "walking_right"), (-10, 0, 1, "walking_left"),
                                              (0, 10, 1.03, "walking_toward"), (0, -10, 0.97, "walking_away"),
                                              (0.5, 0, 1, "standing")])
def test_direction_and_standing(dx, dy, grow, label):
    # 10 fps: 10 px/frame on a 100-px person = 1 body height per second; 3%/frame = a scale rate of about 0.3/s
    person_ = person_activities(walk(dx, dy, grow=grow), fps=10)[0]
    assert (person_["label"], person_["sure"]) == (label, True)
    assert clip_label(walk(dx, dy, grow=grow), fps=10)["label"] == label


def test_towards_and_away_follow_the_scale_not_the_vertical_motion():
    # moving down the image while shrinking: the scale says away; the feet disagree, so the label is not sure
    p = person_activities(walk(0, 10, grow=0.97), fps=10)[0]
    assert (p["label"], p["sure"]) == ("walking_away", False)
    assert p["scale_rate"] == pytest.approx(10 * np.log(0.97), abs=0.01)
    # vertical motion with no change of scale: not sure either way
    assert person_activities(walk(0, 10), fps=10)[0]["sure"] is False


def test_the_margin_between_standing_and_walking_is_not_sure():
    # speeds in heights/s: 0.1 standing (sure), 0.18 in the don't-care band, 0.3 walking (sure)
    assert [(p["label"], p["sure"]) for p in (person_activities(walk(v, 0), fps=10)[0] for v in (1.0, 1.8, 3.0))] == [
        ("standing", True), ("walking_right", False), ("walking_right", True)]
    # feet in place but the height changes (turning, bending): standing, not sure
    bending = [[{"box": [100, 300 - 100 * 1.03 ** i, 140, 300], "class": "person", "score": 0.9}] for i in range(10)]
    assert [(p["label"], p["sure"]) for p in person_activities(bending, fps=10)] == [("standing", False)]


def test_diagonal_motion_is_not_sure():
    p = person_activities(walk(10, 9), fps=10)[0]
    assert (p["label"], p["sure"]) == ("walking_right", False)


def test_no_person_low_scores_and_short_tracks():
    assert clip_label([[] for _ in range(10)], 10)["label"] == "no_person"
    assert clip_label(walk(10, 0, score=0.2), 10)["label"] == "no_person"
    short = walk(10, 0, n=4) + [[] for _ in range(6)]
    assert clip_label(short, 10)["label"] == "no_person"


def test_main_subject_is_the_largest_person_and_cycling_wins():
    frames = [[person(100 + 10 * i, 100, h=150), person(500 - 3 * i, 100, h=50)] for i in range(10)]
    assert clip_label(frames, 10)["label"] == "walking_right"
    for i, f in enumerate(frames):
        f.append({"box": [100 + 10 * i, 200, 170 + 10 * i, 260], "class": "bicycle", "score": 0.5})
    assert clip_label(frames, 10)["label"] == "cycling"


def test_tracker_links_by_iou_across_a_gap():
    frames = [[person(100 + 2 * i, 100)] for i in range(5)]
    frames[2] = []
    tracks = track(frames)
    assert len(tracks) == 1 and sorted(tracks[0]) == [0, 1, 3, 4]


def test_every_person_tracked_through_most_of_the_clip_gets_its_activity():
    frames = [[person(100 + 10 * i, 100, h=150), person(500, 100 + 5 * i, h=50 * 1.03 ** i), person(800, 300, h=80)]
              for i in range(10)]
    for f in frames[4:]:
        f.pop()  # the third person is seen in 4 of 10 frames: under 60%, not a labelled person
    people = person_activities(frames, fps=10)
    assert [p["label"] for p in people] == ["walking_right", "walking_toward"]  # largest first
    assert people[0]["box"] == pytest.approx([145, 100, 205, 250])  # the mean box over the clip
    assert abs(people[1]["dx"]) < 0.1 and people[1]["speed"] > 0.8  # 5 px/frame (and growing) on a ~57-px person at 10 fps
    assert clip_label(frames, fps=10)["label"] == "walking_right" and clip_label(frames, fps=10)["tracks"] == 2
