"""The identity and line ground truth (adapters/eval/human-v1-tracks.json) is the frozen file and agrees with itself
and with the human-checked boxes it links (adapters/eval/human-v1.json)."""

import hashlib
import itertools
import json
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRACKS = ROOT / "adapters" / "eval" / "human-v1-tracks.json"
HUMAN = ROOT / "adapters" / "eval" / "human-v1.json"
FROZEN = "96c57b364bf990500d6c3e1e6a34edab6e573e3676cb50219ba9ab08de9cd7f1"  # as in adapters/eval/README.md
CLASSES = {1: "person", 3: "car", 8: "truck"}


@pytest.fixture(scope="module")
def tracks():
    return json.loads(TRACKS.read_text())


@pytest.fixture(scope="module")
def human():
    """human-v1 pedestrians annotations by id, with their frame time and [x1, y1, x2, y2] box."""
    data = json.loads(HUMAN.read_text())
    times = {i["id"]: i["t"] for i in data["images"] if i["video"] == "pedestrians"}
    anns = {}
    for a in data["annotations"]:
        if a["image_id"] in times:
            x, y, w, h = a["bbox"]
            anns[a["id"]] = {"t": times[a["image_id"]], "box": [x, y, x + w, y + h],
                             "class": CLASSES[a["category_id"]], "ignore": a["ignore"]}
    return anns


def key(t: float) -> str:
    return f"{t:.1f}"


def test_the_file_is_the_frozen_one_and_names_its_source():
    assert hashlib.sha256(TRACKS.read_bytes()).hexdigest() == FROZEN
    assert FROZEN in (ROOT / "adapters" / "eval" / "README.md").read_text()
    info = json.loads(TRACKS.read_text())["info"]
    assert info["source_sha256"] == hashlib.sha256(HUMAN.read_bytes()).hexdigest()


def test_frames_are_the_human_grid(tracks, human):
    assert tracks["frames"] == [55 + 0.5 * k for k in range(49)]
    assert sorted({a["t"] for a in human.values()}) == tracks["frames"]


def test_every_box_is_a_human_box_and_every_human_box_is_in_one_identity(tracks, human):
    used = Counter()
    for ident in tracks["identities"]:
        assert ident["boxes"].keys() == ident["annotation_ids"].keys()
        for t, box in ident["boxes"].items():
            ann = human[ident["annotation_ids"][t]]
            assert key(ann["t"]) == t and ann["box"] == box, (ident["id"], t)
            assert ann["class"] == ident["class"] and not ann["ignore"]
            used[ident["annotation_ids"][t]] += 1
        for t, ann_id in ident["ignore_regions"].items():
            assert key(human[ann_id]["t"]) == t and human[ann_id]["ignore"] and t not in ident["boxes"]
            used[ann_id] += 1
    assert max(used.values()) == 1  # no box in two identities, nor twice in one
    assert set(used) == set(human)  # every box and ignore region of the range is accounted for
    ids = [i["id"] for i in tracks["identities"]]
    assert len(set(ids)) == len(ids)
    assert Counter(i["class"] for i in tracks["identities"]) == {"person": 9, "truck": 1, "car": 1}


def side(line, foot) -> float:
    """The convention's s: negative on the left of someone walking the line from its first point to its second."""
    (x1, y1), (x2, y2) = line
    return (x2 - x1) * (foot[1] - y1) - (y2 - y1) * (foot[0] - x1)


def path_crossings(line, ident) -> list[tuple[str, list[float]]]:
    """Crossings of the segment by the identity's bottom-centre path, straight between boxes at most 1 s apart."""
    steps = sorted((float(t), ((b[0] + b[2]) / 2, b[3])) for t, b in ident["boxes"].items())
    found = []
    for (t0, p), (t1, q) in itertools.pairwise(steps):
        if t1 - t0 > 1.0 + 1e-9:  # out of the frame in between: no path
            continue
        s0, s1 = side(line, p), side(line, q)
        through = side((p, q), line[0]) * side((p, q), line[1]) <= 0
        if (s0 < 0) != (s1 < 0) and through:
            found.append(("in" if s0 < 0 else "out", [t0, t1]))
    return found


def test_line_counts_match_their_crossings_and_the_foot_paths(tracks):
    assert len(tracks["lines"]) >= 3
    persons = {i["id"]: i for i in tracks["identities"] if i["class"] == "person"}
    for line in tracks["lines"]:
        listed = line["crossings"]
        assert len(listed) >= 5, line["name"]
        assert line["counts"] == {d: sum(c["direction"] == d for c in listed) for d in ("in", "out")}
        from_paths = sorted((i, d, tuple(b)) for i, ident in persons.items()
                            for d, b in path_crossings(line["points"], ident))
        assert sorted((c["identity"], c["direction"], tuple(c["between"])) for c in listed) == from_paths


def test_direction_convention_worked_example():
    centre = [[330, 150], [330, 390]]  # runs down the image: right to left across it is "in"
    assert side(centre, (340, 250)) == -2400 and side(centre, (320, 250)) == 2400
    walker = {"boxes": {"60.0": [330, 200, 350, 250], "60.5": [310, 200, 330, 250]}}  # feet at 340 then 320
    assert path_crossings(centre, walker) == [("in", [60.0, 60.5])]
    below = {"boxes": {"60.0": [330, 350, 350, 400], "60.5": [310, 350, 330, 400]}}  # passes under the segment
    assert path_crossings(centre, below) == []
