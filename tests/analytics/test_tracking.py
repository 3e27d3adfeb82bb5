"""Tracks across chunks (vlora_va/analytics/tracking.py) with the real `trackers` ByteTrack, SORT and OC-SORT, and our
appearance tracker without embeddings (test_appearance_tracker.py has it with them)."""

import numpy as np
import pytest

from vlora_va.analytics.tracking import StreamTracker, TrackIds, one_box_per_object
from vlora_va.contracts.boxes import pair_iou
from vlora_va.contracts.results import Detection, DetectionResult, FrameDetections
from vlora_va.contracts.scene import TrackingConfig

FPS = 2.0  # the default pipeline's tracked rate: every 0.5 s


def walker(t: float, x0: float = 40.0, speed: float = 40.0, y: float = 200.0) -> Detection:
    """A person walking right at speed px/s: box 30 x 80."""
    x = x0 + speed * t
    return Detection((x, y, x + 30, y + 80), "person", 0.8)


def chunk(times, *objects) -> DetectionResult:
    return DetectionResult(tuple(FrameDetections(t, tuple(o(t) for o in objects)) for t in times))


def ids_of(result: DetectionResult) -> list[list[str | None]]:
    return [[d.track_id for d in f.detections] for f in result.frames]


@pytest.mark.parametrize("kind", ["appearance", "bytetrack", "sort", "ocsort"])
def test_one_walker_keeps_one_id_across_chunks(kind):
    """At 20 px/s the boxes of two tracked frames 0.5 s apart overlap by IoU 0.5: enough for every kind (SORT and
    OC-SORT ask for IoU 0.3 before their motion model knows the speed; ByteTrack 0.1)."""
    tracker = StreamTracker(TrackingConfig(tracker=kind, min_hits=2), FPS, TrackIds("run"))
    seen = []
    for c in range(6):
        result, _ = tracker.track(chunk([c, c + 0.5], lambda t: walker(t, speed=20.0)))
        seen += [i for frame in ids_of(result) for i in frame]
    # unconfirmed at first (no id), then one id for good
    confirmed = [i for i in seen if i is not None]
    assert seen[0] is None and len(confirmed) >= len(seen) - 2
    assert set(confirmed) == {"run-1"}


def test_only_confirmed_tracks_carry_an_id():
    tracker = StreamTracker(TrackingConfig(min_hits=3), FPS, TrackIds("r"))
    result, _ = tracker.track(chunk([0.0, 0.5], walker))
    assert ids_of(result) == [[None], [None]]  # matched twice: not yet confirmed
    result, _ = tracker.track(chunk([1.0, 1.5], walker))
    assert ids_of(result) == [["r-1"], ["r-1"]]


def test_a_shed_chunk_in_the_middle_does_not_split_a_track_still_in_view():
    """Chunks 0-2 served, chunk 3 shed (no frames reach the tracker), chunks 4-6 served: the tracker is fed media
    timestamps, so it predicts across the 1-s gap and the walker keeps its id."""
    tracker = StreamTracker(TrackingConfig(), FPS, TrackIds("r"))
    ids = set()
    for c in [0, 1, 2, 4, 5, 6]:
        result, frames = tracker.track(chunk([c, c + 0.5], walker))
        ids |= {i for frame in ids_of(result) for i in frame if i is not None}
        assert not any(f.ended for f in frames)
    assert ids == {"r-1"}


def test_a_track_unseen_longer_than_lost_after_s_ends_and_a_returning_object_is_new():
    tracker = StreamTracker(TrackingConfig(lost_after_s=2.0), FPS, TrackIds("r"))
    for c in range(3):
        tracker.track(chunk([c, c + 0.5], walker))
    assert tracker.active == 1
    ended = []
    for c in range(3, 7):  # the walker is gone for 4 s
        _, frames = tracker.track(chunk([c, c + 0.5]))
        ended += [e for f in frames for e in f.ended]
    assert ended == [("r-1", "person")] and tracker.active == 0


def test_time_going_backwards_ends_every_track():
    tracker = StreamTracker(TrackingConfig(), FPS, TrackIds("r"))
    for c in range(3):
        tracker.track(chunk([c, c + 0.5], walker))
    _, frames = tracker.track(chunk([0.0, 0.5], walker))  # a looping file starts again
    assert frames[0].ended == (("r-1", "person"),)


def test_one_object_one_box_and_one_class():
    """The parked van, found as a truck (0.9) and as a car (0.6) on the same pixels: one box, one track, and the
    track's class stays truck even in frames where the car box is the surer one."""
    van = (500.0, 60.0, 600.0, 140.0)
    frames = []
    for i in range(8):
        car_score = 0.95 if i == 6 else 0.6
        frames.append(FrameDetections(i * 0.5, (Detection(van, "truck", 0.9),
                                                Detection((502, 61, 598, 141), "car", car_score))))
    tracker = StreamTracker(TrackingConfig(), FPS, TrackIds("r"))
    result, _ = tracker.track(DetectionResult(tuple(frames)))
    assert all(len(f.detections) == 1 for f in result.frames)
    assert {d.cls for f in result.frames[2:] for d in f.detections} == {"truck"}
    assert {d.track_id for f in result.frames[2:] for d in f.detections} == {"r-1"}


def test_cross_class_nms_keeps_the_surer_box_and_separate_objects():
    a = Detection((0, 0, 10, 10), "car", 0.6)
    b = Detection((0, 0, 10, 11), "truck", 0.9)
    c = Detection((50, 50, 60, 60), "car", 0.5)
    assert one_box_per_object([a, b, c], 0.7) == [b, c]


def cross_class_reference(dets: list[Detection], iou: float) -> list[Detection]:
    """one_box_per_object as a plain loop: surest first (ties: the earlier), a box stays unless a kept box of
    another class overlaps it by `iou` or more; the kept ones in input order."""
    kept: list[int] = []
    for i in sorted(range(len(dets)), key=lambda i: -dets[i].score):
        if all(dets[k].cls == dets[i].cls or pair_iou(dets[k].box, dets[i].box) < iou for k in kept):
            kept.append(i)
    return [dets[i] for i in sorted(kept)]


@pytest.mark.parametrize("seed", range(5))
def test_cross_class_nms_is_the_plain_loop(seed):
    """Crowds of three classes, with tied scores: exactly the greedy loop."""
    rng = np.random.default_rng(seed)
    dets = []
    for _ in range(40):
        x, y = rng.uniform(0, 60, 2)
        w, h = rng.uniform(5, 25, 2)
        dets.append(Detection((x, y, x + w, y + h), str(rng.choice(["car", "truck", "bus"])),
                              float(rng.choice([0.5, 0.6, rng.uniform(0.3, 1.0)]))))
    for iou in (0.3, 0.7):
        assert one_box_per_object(dets, iou) == cross_class_reference(dets, iou)


def test_ids_are_unique_across_streams_and_runs():
    ids = TrackIds("run1")
    a = StreamTracker(TrackingConfig(min_hits=1), FPS, ids)
    b = StreamTracker(TrackingConfig(min_hits=1), FPS, ids)
    ra, _ = a.track(chunk([0.0, 0.5], walker))
    rb, _ = b.track(chunk([0.0, 0.5], walker))
    assert ids_of(ra)[1] != ids_of(rb)[1]
    other_run = StreamTracker(TrackingConfig(min_hits=1), FPS, TrackIds("run2"))
    rc, _ = other_run.track(chunk([0.0, 0.5], walker))
    assert ids_of(rc)[1][0].startswith("run2-")
