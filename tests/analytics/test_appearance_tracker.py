"""The appearance tracker (analytics/appearance_tracker.py) through StreamTracker and TrackedTask, with real
embeddings: two people's crops from sample_videos/pedestrians.mp4 through the real backbone, as the engine pools them."""

import numpy as np
import pytest
import torch

from vlora_va.analytics.tracked_task import TrackedTask
from vlora_va.analytics.tracking import StreamTracker, TrackIds
from vlora_va.analytics.unique import UniqueObjects
from vlora_va.contracts.config import StreamConfig, TaskConfig
from vlora_va.contracts.results import Detection, DetectionResult, FrameDetections, Latency, ResultRecord
from vlora_va.contracts.scene import LineConfig, TrackingConfig

from tests.conftest import PEDESTRIANS

FPS = 2.0
# Two identities of the hand-made ground truth (adapters/eval/human-v1-tracks.json) at 55.0-57.0 s: id 1, a woman in
# a red jacket, and id 3, a fair-haired woman in a long black coat
CROPS = {
    "red": {55.0: [125, 167, 156, 233], 55.5: [107, 169, 130, 234], 56.0: [85, 171, 108, 240],
            56.5: [57, 174, 79, 241], 57.0: [30, 171, 48, 245]},
    "black": {55.0: [237, 375, 290, 512], 55.5: [215, 382, 268, 527], 56.0: [197, 391, 246, 538],
              56.5: [182, 403, 264, 554], 57.0: [175, 409, 231, 563]},
}


@pytest.fixture(scope="module")
def looks():
    """{person: [embedding per frame]}: the real crops' embeddings, from the tokens entering block 8 of the real
    backbone and the model input's colours (engine/heads/appearance.py), one per frame 55.0-57.0 s."""
    from vlora_va.engine.backbones import load_backbone
    from vlora_va.engine.backends.torch_eager import lower
    from vlora_va.engine.heads.appearance import EMBED_LAYER, appearance_embeddings
    from vlora_va.engine.heads.features import token_grid
    from vlora_va.training.frames import letterboxed_batch, read_frames

    model = load_backbone("dinov2-small")
    frames = [f for f in read_frames(PEDESTRIANS, 55.0, 57.05) if round(f.t * 2) == f.t * 2]
    pixels, lbs = letterboxed_batch(frames, 336)
    with torch.inference_mode():
        grid = token_grid(lower(model, pixels, EMBED_LAYER), 336, 14)
    out = {name: [] for name in CROPS}
    for k, f in enumerate(frames):
        for name, boxes in CROPS.items():
            mb = torch.tensor([lbs[k].box_to_model(boxes[round(f.t, 1)])], dtype=torch.float32)
            out[name].append(appearance_embeddings(grid[k], pixels[k], mb, 336)[0].numpy())
    return out


def box(x: float, y: float = 200.0) -> tuple:
    return (x, y, x + 30.0, y + 80.0)


def frame(t: float, *people) -> DetectionResult:
    """people: (x, embedding or None) per person, y fixed."""
    return DetectionResult((FrameDetections(t, tuple(Detection(box(x), "person", 0.9, None, e) for x, e in people)),))


def ids(result: DetectionResult) -> list:
    return [d.track_id for d in result.frames[0].detections]


def bounce(tracker: StreamTracker, looks, swap_looks: bool = False) -> list[list]:
    """Two people walk towards each other at 60 px/s, meet, and both turn back (the red one came from the left):
    a motion model predicts each walks on, into the other's box. Returns each frame's ids (red first)."""
    out = []
    xs = [(100, 300), (130, 270), (160, 240), (190, 210), (160, 240), (130, 270), (100, 300)]
    for i, (xr, xb) in enumerate(xs):
        r, b = looks["red"][i % 5], looks["black"][i % 5]
        result, _ = tracker.track(frame(i * 0.5, (xr, r), (xb, b)))
        out.append(ids(result))
    return out


def test_a_pair_that_meets_and_turns_back_keeps_its_ids_where_motion_alone_swaps_them(looks):
    with_looks = bounce(StreamTracker(TrackingConfig(), FPS, TrackIds("a")), looks)
    red, black = with_looks[2]
    assert red and black and red != black
    assert all(f == [red, black] for f in with_looks[2:]), with_looks
    geometry = bounce(StreamTracker(TrackingConfig(appearance_weight=0.0), FPS, TrackIds("g")), looks)
    red, black = geometry[2]
    assert geometry[-1] == [black, red], geometry  # the feature removed: swapped


def test_a_track_lost_and_seen_again_within_the_window_keeps_its_id_and_not_after(looks):
    def run(gap_s: float, window_s: float) -> tuple[str, str, StreamTracker]:
        tracker = StreamTracker(TrackingConfig(reid_window_s=window_s), FPS, TrackIds("r"))
        first = None
        for i in range(4):  # seen at x = 100.. walking right, then gone
            result, _ = tracker.track(frame(i * 0.5, (100 + 20 * i, looks["red"][i])))
            first = ids(result)[0] or first
        back = None
        for i in range(3):  # back elsewhere after gap_s (longer than lost_after_s: the track had ended)
            t = 1.5 + gap_s + i * 0.5
            result, tracked = tracker.track(frame(t, (600 - 20 * i, looks["red"][4])))
            back = ids(result)[0] or back
        return first, back, tracker

    first, back, tracker = run(gap_s=10.0, window_s=30.0)
    assert first is not None and back == first and first in tracker.reentered
    first, back, tracker = run(gap_s=10.0, window_s=5.0)
    assert back is not None and back != first and not tracker.reentered
    # someone else coming back is not revived as the red one
    tracker = StreamTracker(TrackingConfig(), FPS, TrackIds("o"))
    seen = [ids(tracker.track(frame(i * 0.5, (100 + 20 * i, looks["red"][i])))[0])[0] for i in range(4)]
    later = [ids(tracker.track(frame(12.0 + i * 0.5, (600 - 20 * i, looks["black"][i])))[0])[0] for i in range(3)]
    assert later[-1] is not None and later[-1] not in seen


def test_two_people_who_leave_together_come_back_with_their_own_ids(looks):
    """Lost in the same frame, their gallery entries are alike in everything but the person: reviving one must take
    that one out of the gallery and leave the other, however equal their other fields."""
    tracker = StreamTracker(TrackingConfig(), FPS, TrackIds("t"))
    first = None
    for i in range(4):  # both walk right, then both leave in the same frame
        people = (100 + 20 * i, looks["red"][i]), (400 + 20 * i, looks["black"][i])
        first = ids(tracker.track(frame(i * 0.5, *people))[0])
    back = []
    for i in range(3):  # after 10 s the black one comes back first, then both are seen
        people = [(600 - 20 * i, looks["black"][4])] + ([(50 + 20 * i, looks["red"][4])] if i else [])
        back = ids(tracker.track(frame(11.5 + i * 0.5, *people))[0])
    assert None not in first and back == [first[1], first[0]], (first, back)


def crossing(tracker: StreamTracker, looks) -> list[list]:
    """Red walks right from x 140 and black left from x 260, 20 px per frame; where they meet the detector sees one
    box for both (its embedding a mix of the two), then they walk on apart. Returns each frame's ids (left box
    first)."""
    out = []
    for i in range(3):
        people = (140 + 20 * i, looks["red"][i]), (260 - 20 * i, looks["black"][i])
        out.append(ids(tracker.track(frame(i * 0.5, *people))[0]))
    mixed = looks["red"][3].astype(np.float32) + looks["black"][3].astype(np.float32)
    out.append(ids(tracker.track(frame(1.5, (200, mixed / np.linalg.norm(mixed))))[0]))
    for i in (4, 5):
        people = (260 - 20 * i, looks["black"][i % 5]), (140 + 20 * i, looks["red"][i % 5])
        out.append(ids(tracker.track(frame(i * 0.5, *people))[0]))
    return out


def test_one_box_left_of_a_crossing_pair_asserts_neither_identity(looks, monkeypatch):
    from vlora_va.analytics import appearance_tracker

    seen = crossing(StreamTracker(TrackingConfig(), FPS, TrackIds("x")), looks)
    red, black = seen[2]
    assert red and black and red != black
    assert seen[3] == [None], seen  # the merged box: either person, so neither id (and no new track)
    assert seen[4:] == [[black, red], [black, red]], seen  # apart again, each keeps its own
    monkeypatch.setattr(appearance_tracker, "AMBIGUOUS_MARGIN", -1e9)  # the step removed: the box is guessed
    guessed = crossing(StreamTracker(TrackingConfig(), FPS, TrackIds("y")), looks)
    assert guessed[3][0] in guessed[2], guessed


def test_a_sure_box_does_not_take_the_track_whose_own_weak_box_lies_under_it():
    """Two standing people; the left one turns half away (its box scores 0.3) and the right one steps towards it.
    The sure box is nearer the left track than the right; matched first, as ByteTrack does, it takes the left track
    and leaves the weak box nobody. Matched together, each track keeps its own box."""
    from vlora_va.analytics.appearance_tracker import AppearanceSettings, AppearanceTracker

    tracker = AppearanceTracker(AppearanceSettings(fps=FPS))
    for i in range(3):
        left, right = tracker.update(np.array([box(160.0), box(240.0)]), np.array([0.9, 0.9]), None, i * 0.5).ids
    got = tracker.update(np.array([box(160.0), box(190.0)]), np.array([0.3, 0.9]), None, 1.5).ids
    assert left > 0 and right > 0 and got == [left, right], (left, right, got)


def record(result: DetectionResult, chunk: int = 0) -> ResultRecord:
    return ResultRecord(stream="cam", chunk=chunk, task="detect", adapter="detect", status="ok",
                        frame_ts=tuple(f.ts for f in result.frames), latency=Latency(), deadline_ms=2000.0,
                        deadline_met=True, result=result)


def task(tracking: TrackingConfig, lines=()) -> TrackedTask:
    stream = StreamConfig(id="cam", source="x.mp4", fps=2.0, lines=tuple(lines),
                          tasks=(TaskConfig("detect", "detect", 1, 2000.0, track=True),))
    n = iter(range(1, 1000))
    return TrackedTask(stream, stream.tasks[0], tracking, TrackIds("e"), lambda: f"ev-{next(n)}")


@pytest.mark.parametrize("keep", [False, True])
def test_embeddings_reach_a_row_only_when_configured(looks, keep):
    t = task(TrackingConfig(embeddings_in_rows=keep))
    rows = []
    for i in range(4):
        rec, _ = t.row(record(frame(i * 0.5, (100 + 20 * i, looks["red"][i]), (400, None)), i))
        rows.append(rec.to_json())
    dets = [d for r in rows for f in r["frames"] for d in f["detections"]]
    assert any(d.get("track_id") for d in dets)
    with_embedding = [d for d in dets if "embedding" in d]
    if keep:
        assert len(with_embedding) == 4 and len(with_embedding[0]["embedding"]) == len(looks["red"][0])
    else:
        assert not with_embedding and all("embedding" not in str(r) for r in rows)


def test_a_revived_tracks_events_say_reentered_and_it_counts_once(looks):
    t = task(TrackingConfig(), lines=[LineConfig("gate", ((400.0, 0.0), (400.0, 576.0)), cooldown_s=0.0)])
    events = []
    for i in range(4):  # walks right from x 300, crosses x 400 (feet at x + 15)
        _, ev = t.row(record(frame(i * 0.5, (300 + 40 * i, looks["red"][i])), i))
        events += ev
    for i in range(4):  # gone 10 s, back at x 300 and crosses again
        _, ev = t.row(record(frame(12.0 + i * 0.5, (300 + 40 * i, looks["red"][(i + 1) % 5])), 4 + i))
        events += ev
    crossings = [e.to_json() for e in events if e.event == "line_crossed"]
    assert len(crossings) == 2 and crossings[0]["track_id"] == crossings[1]["track_id"]
    assert "reentered" not in crossings[0] and crossings[1]["reentered"] is True
    assert t.unique.counts(now=__import__("time").time()) == {"person": 1}


def test_unique_objects_forget_tracks_unseen_for_the_window():
    u = UniqueObjects(window_s=60.0)
    u.saw("a", "person", 0.0)
    u.saw("b", "person", 30.0)
    u.saw("c", "car", 50.0)
    u.saw("a", "person", 55.0)  # the same track again: still one
    assert u.counts(now=60.0) == {"person": 2, "car": 1}
    assert u.counts(now=100.0) == {"person": 1, "car": 1}  # b last seen 70 s ago
    assert u.counts(now=200.0) == {}


def unit(v: np.ndarray) -> np.ndarray:
    return (v / np.linalg.norm(v)).astype(np.float32)


@pytest.mark.parametrize("alike, revived", [(False, True), (True, False)])
def test_where_everyone_looks_alike_a_revival_needs_more_than_a_fixed_cosine(alike, revived):
    """A person leaves and a box comes back with cosine 0.85 to them. Among people who look different (cosine 0.2
    between them) that is them; where everyone looks alike (0.9 between different people, as in the dark) it is
    nobody in particular, and the returning box gets a new id."""
    from vlora_va.analytics.appearance_tracker import AppearanceSettings, AppearanceTracker

    rng = np.random.default_rng(0)
    common = rng.normal(size=64)
    looks = [unit((3.0 if alike else 0.5) * common + rng.normal(size=64)) for _ in range(4)]
    target = looks[0]
    other = unit(rng.normal(size=64))
    other -= other @ target * target
    back = unit(0.85 * target + np.sqrt(1 - 0.85 ** 2) * unit(other))  # cosine 0.85 with the one who left
    tracker = AppearanceTracker(AppearanceSettings(fps=2.0))
    xs = [100.0, 250.0, 400.0, 550.0]
    for i in range(4):  # four people side by side, then the first one leaves
        tracker.update(np.array([box(x + 10 * i) for x in xs]), np.full(4, 0.9), np.stack(looks), i * 0.5)
    first = tracker.update(np.array([box(x + 40) for x in xs]), np.full(4, 0.9), np.stack(looks), 2.0).ids[0]
    for i in range(6):
        tracker.update(np.array([box(x + 50 + 10 * i) for x in xs[1:]]), np.full(3, 0.9), np.stack(looks[1:]),
                       2.5 + i * 0.5)
    assert (tracker.baseline > 0.8) == alike
    got = tracker.update(np.array([box(x + 110) for x in xs[1:]] + [box(20.0)]), np.full(4, 0.9),
                         np.stack([*looks[1:], back]), 5.5)
    assert (got.ids[-1] == first) == revived, (got.ids, first)
