"""The activity-label rule on synthetic person tracks."""

import pytest

from vlora_va.training.actions import clip_label, person_activities, track


def person(x, y, h=100, score=0.9):
    return {"box": [x, y, x + h * 0.4, y + h], "class": "person", "score": score}


def walk(dx, dy, n=10, **kw):
    return [[person(100 + dx * i, 100 + dy * i, **kw)] for i in range(n)]


@pytest.mark.parametrize("dx,dy,label", [(10, 0, "walking_right"), (-10, 0, "walking_left"), (0, 10, "walking_toward"),
                                         (0, -10, "walking_away"), (0.5, 0, "standing")])
def test_direction_and_standing(dx, dy, label):
    # 10 fps: 10 px/frame on a 100-px person = 1 body height per second
    assert clip_label(walk(dx, dy), fps=10)["label"] == label


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
    frames = [[person(100 + 10 * i, 100, h=150), person(500, 100 + 5 * i, h=50), person(800, 300, h=80)] for i in range(10)]
    for f in frames[4:]:
        f.pop()  # the third person is seen in 4 of 10 frames: under 60%, not a labelled person
    people = person_activities(frames, fps=10)
    assert [p["label"] for p in people] == ["walking_right", "walking_toward"]  # largest first
    assert people[0]["box"] == pytest.approx([145, 100, 205, 250])  # the mean box over the clip
    assert people[1]["speed"] == pytest.approx(1.0, abs=0.01)  # 5 px/frame on a 50-px person at 10 fps
    assert clip_label(frames, fps=10)["label"] == "walking_right" and clip_label(frames, fps=10)["tracks"] == 2
