"""The shipped human-checked evaluation set (adapters/eval/human-v1.json) is the frozen file and parses."""

import hashlib
import json
from collections import Counter
from pathlib import Path

import pytest

from vlora_va.training.evaluate import HUMAN_SET, HUMAN_SET_SHA256, human_clip_frames, load_human_set
from vlora_va.training.spec import Range

ROOT = Path(__file__).resolve().parents[2]
FROZEN = "c929600b84f2835f28d328e0b97aed801e17a64577118976cc9d72759cc215e5"  # as in adapters/eval/README.md
SIZES = {"pedestrians": (768, 576), "bikes": (640, 272)}
ACTIVITIES = {"standing", "walking_left", "walking_right", "walking_toward", "walking_away"}


@pytest.fixture(scope="module")
def data():
    return json.loads(HUMAN_SET.read_text())


def test_the_set_is_the_frozen_file():
    assert HUMAN_SET == ROOT / "adapters" / "eval" / "human-v1.json"
    assert hashlib.sha256(HUMAN_SET.read_bytes()).hexdigest() == FROZEN == HUMAN_SET_SHA256
    readme = (ROOT / "adapters" / "eval" / "README.md").read_text()
    assert FROZEN in readme


def test_counts_categories_and_every_box_inside_its_frame(data):
    cats = {c["id"]: c["name"] for c in data["categories"]}
    assert sorted(cats.values()) == ["car", "person", "truck"]
    images = {i["id"]: i for i in data["images"]}
    assert Counter(i["video"] for i in images.values()) == {"pedestrians": 49, "bikes": 5}
    ped_t = sorted(i["t"] for i in images.values() if i["video"] == "pedestrians")
    assert ped_t == [55 + 0.5 * k for k in range(49)]  # the held-out 0.5-s grid, 55.0 ... 79.0
    assert len({(i["video"], i["t"]) for i in images.values()}) == len(images)
    counted, ignored = Counter(), Counter()
    for a in data["annotations"]:
        img = images[a["image_id"]]
        assert a["category_id"] in cats and (img["width"], img["height"]) == SIZES[img["video"]]
        x, y, w, h = a["bbox"]
        assert w > 0 and h > 0 and x >= 0 and y >= 0 and x + w <= img["width"] and y + h <= img["height"]
        assert a["ignore"] == a["iscrowd"] in (0, 1)
        (ignored if a["ignore"] else counted)[cats[a["category_id"]]] += 1
    assert counted == {"person": 340, "car": 56, "truck": 49}
    assert ignored == {"person": 32, "car": 6, "truck": 1}
    assert ignored["person"] / (ignored["person"] + counted["person"]) <= 0.10  # the rule's cap


def test_activity_clips_parse_and_follow_the_rules(data):
    clips = data["activity_clips"]
    assert [c["start"] for c in clips] == [float(t) for t in range(55, 79)]
    labels = Counter()
    for c in clips:
        assert c["end"] == c["start"] + 1
        assert c["frame_ts"] == pytest.approx([c["start"] + d for d in (0, 0.3, 0.6, 0.9)])
        for p in c["persons"]:
            x1, y1, x2, y2 = p["box"]
            assert 0 <= x1 < x2 <= 768 and 0 <= y1 < y2 <= 576 and len(p["frame_boxes"]) == 4
            if p["ignore"]:
                assert p["activity"] is None
            else:
                assert p["activity"] in ACTIVITIES
                assert sum(b is not None for b in p["frame_boxes"]) >= 3  # visible in 3 of the 4 frames
            labels[p["activity"] or "ignore"] += 1
    assert labels == {"walking_right": 56, "walking_left": 54, "walking_away": 15, "standing": 12,
                      "walking_toward": 5, "ignore": 40}


def test_loader_selects_frames_and_clips_by_range():
    hs = load_human_set()
    assert hs.sha256 == FROZEN and hs.describe()["frozen"]
    video = ROOT / "sample_videos" / "pedestrians.mp4"
    assert hs.frame_keys(Range(video, 55, 79.5)) == [f"pedestrians@{55 + 0.5 * k:.3f}" for k in range(49)]
    assert hs.frame_keys(Range(video, 60, 61)) == ["pedestrians@60.000", "pedestrians@60.500"]
    assert hs.frame_keys(Range(ROOT / "sample_videos" / "bikes.mp4", 0, None)) == [
        f"bikes@{t:.3f}" for t in (1, 5, 6, 7, 8)]
    assert [c["start"] for c in hs.clips_in(Range(video, 60, 62.5))] == [60.0, 61.0]
    assert hs.clips_in(Range(video, 0, 50)) == []
    van = next(b for b in hs.boxes["pedestrians@55.000"] if b["class"] == "truck")
    assert van == {"box": [652.0, 45.0, 723.0, 99.0], "class": "truck", "ignore": False}
    labelled = [p for c in hs.clips for p in c["persons"] if not p.get("ignore")]
    assert len(labelled) == 142 and all(set(p) == {"box", "label"} for p in labelled)


def test_clip_frames_are_the_ones_the_set_was_labelled_on():
    hs = load_human_set()
    video = ROOT / "sample_videos" / "pedestrians.mp4"
    clips, frames = human_clip_frames(hs, Range(video, 55, 56), clip_len=4)
    assert [c["start"] for c in clips] == [55.0]
    assert [f.t for f in frames[0]] == [55.0, 55.3, 55.6, 55.9]


def test_the_traffic_set_is_frozen_and_names_only_vehicles_inside_its_frames():
    """The second camera's set (adapters/eval/human-traffic-a.json): 12 frames of traffic-a's last 3 s, every 0.25 s,
    57 vehicles and 13 don't-care regions (cars mostly outside the frame), every box inside its 640 x 360 frame."""
    from vlora_va.training.evaluate import TRAFFIC_SET, TRAFFIC_SET_SHA256

    assert hashlib.sha256(TRAFFIC_SET.read_bytes()).hexdigest() == TRAFFIC_SET_SHA256
    assert TRAFFIC_SET_SHA256 in (ROOT / "adapters" / "eval" / "README.md").read_text()
    hs = load_human_set(TRAFFIC_SET)
    times = sorted(t for _, t in hs.times.values())
    assert len(times) == 12 and times[0] > 8.5 - 0.05 and times[-1] < 11.47
    assert all(0.24 < b - a < 0.26 for a, b in zip(times, times[1:]))
    boxes = [b for v in hs.boxes.values() for b in v]
    assert sum(not b["ignore"] for b in boxes) == 57 and sum(b["ignore"] for b in boxes) == 13
    assert {b["class"] for b in boxes} == {"car"}
    assert all(0 <= b["box"][0] < b["box"][2] <= 640 and 0 <= b["box"][1] < b["box"][3] <= 360 for b in boxes)
