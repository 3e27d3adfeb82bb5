import json
from pathlib import Path

import cv2
import numpy as np
import pytest

from vlora_va.contracts.config import parse_config
from vlora_va.outputs.draw import draw, frame_at

BIKES = Path(__file__).resolve().parents[2] / "sample_videos" / "bikes.mp4"


def test_frame_at_picks_the_frame_shown_at_that_time():
    a, b = frame_at(BIKES, 1.0), frame_at(BIKES, 1.02)  # 25 fps: 1.02 s still shows the 1.00 s frame
    assert a.shape == (272, 640, 3) and np.array_equal(a, b)
    assert not np.array_equal(a, frame_at(BIKES, 2.0))


def test_draws_the_boxes_of_the_nearest_result_frame(tmp_path):
    rows = [
        {"stream": "bikes", "chunk": 1, "task": "detect", "frames": [
            {"ts": 1.0, "detections": []},
            {"ts": 1.5, "detections": [{"box": [100, 50, 200, 150], "class": "person", "score": 0.9}]}]},
        {"stream": "other", "chunk": 1, "task": "detect", "frames": [{"ts": 1.5, "detections": []}]},
    ]
    results = tmp_path / "r.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "f.png"
    t, n = draw(results, BIKES, "bikes", 1.4, out)
    assert (t, n) == (1.5, 1)
    img = cv2.imread(str(out))
    assert img.shape == (272, 640, 3)
    assert tuple(img[100, 100]) == (0, 200, 255)  # the box's left edge, in the first class colour (BGR)
    assert tuple(img[100, 150]) != (0, 200, 255)  # inside the box the picture is untouched


def test_a_file_appended_by_several_runs_draws_the_newest_run(tmp_path):
    def run(box):
        return [{"stream": "bikes", "chunk": 1, "task": "detect", "frames": [
            {"ts": 1.0, "detections": []},
            {"ts": 1.5, "detections": [{"box": box, "class": "person", "score": 0.9}]}]}]

    results = tmp_path / "r.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in run([10, 10, 60, 60]) + run([100, 50, 200, 150])))
    for ts in (1.5, None):  # at a time, and the first frame with detections
        out = tmp_path / "f.png"
        assert draw(results, BIKES, "bikes", ts, out) == (1.5, 1)
        img = cv2.imread(str(out))
        assert tuple(img[100, 100]) == (0, 200, 255)  # the second run's box
        assert tuple(img[30, 10]) != (0, 200, 255)  # not the first run's


def test_draws_each_persons_activity_from_the_action_row_of_the_same_chunk(tmp_path):
    rows = [
        {"stream": "bikes", "chunk": 1, "task": "detect", "frames": [{"ts": 1.5, "detections": []}]},
        {"stream": "bikes", "chunk": 1, "task": "activity", "label": "walking_left", "score": 0.8,
         "persons": [{"box": [300, 60, 340, 140], "score": 0.9, "activity": "walking_left", "activity_score": 0.7}]},
        {"stream": "bikes", "chunk": 2, "task": "activity", "label": "standing", "score": 0.8,
         "persons": [{"box": [500, 60, 540, 140], "score": 0.9, "activity": "standing", "activity_score": 0.7}]},
    ]
    results = tmp_path / "r.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "f.png"
    draw(results, BIKES, "bikes", 1.5, out)
    img = cv2.imread(str(out))
    assert tuple(img[100, 300]) == (255, 255, 255)  # chunk 1's person: white box edge
    assert (img[141:152, 300:340] > 200).all(axis=-1).any()  # its activity written under the box
    assert tuple(img[100, 500]) != (255, 255, 255)  # chunk 2's person is not on this frame


SCENE = """
adapters: {detect: a}
streams:
  - id: bikes
    source: bikes.mp4
    tasks: [{adapter: detect, track: true}]
    lines: [{name: gate, points: [[320, 20], [320, 250]]}]
    zones: [{name: lawn, points: [[420, 180], [620, 180], [620, 260], [420, 260]]}]
"""


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def served(box, track_id=None, v=3):
    det = {"box": box, "class": "person", "score": 0.9, **({"track_id": track_id} if track_id else {})}
    return {"v": v, **({"type": "result"} if v >= 3 else {}), "stream": "bikes", "chunk": 1, "task": "detect",
            "status": "ok", "frames": [{"ts": 1.5, "detections": [det]}]}


def test_event_rows_are_not_results_and_are_marked_whatever_their_name(tmp_path):
    """Event rows (a known and an unknown name, one without frames or status) leave the frame choice alone; the
    crossing is marked at its reference point (the bottom centre of its box); a far event is not marked."""
    rows = [served([100, 50, 200, 150], "k3x9a-4"),
            {"v": 3, "type": "event", "id": "k3x9a-1", "event": "line_crossed", "stream": "bikes", "chunk": 1,
             "line": "gate", "direction": "in", "track_id": "k3x9a-4", "class": "person", "ts": 1.4,
             "box": [100, 50, 200, 150], "counts": {"in": {"person": 1}, "out": {}}, "snapshot": None},
            {"v": 3, "type": "event", "id": "k3x9a-2", "event": "stream_moved", "stream": "bikes", "ts": 1.5},
            {"v": 3, "type": "event", "id": "k3x9a-3", "event": "zone_entered", "phase": "start", "stream": "bikes",
             "zone": "lawn", "ts": 9.0, "box": [500, 50, 540, 120]}]
    results = tmp_path / "r.jsonl"
    write_rows(results, rows)
    for ts in (None, 1.5):
        out = tmp_path / "f.png"
        assert draw(results, BIKES, "bikes", ts, out) == (1.5, 1)
    img = cv2.imread(str(out)).astype(int)
    red = (60, 60, 255)
    assert np.abs(img[148, 150] - red).sum() < 60  # the crossing's dot at (150, 150), over the box's bottom edge
    assert np.abs(img[118, 520] - red).sum() > 60  # the zone event 7.5 s away is not marked
    bottom = img[-60:, :300]  # one line of text per marked event, bottom left
    assert (np.abs(bottom - red).sum(axis=-1) < 60).sum() > 100


def test_track_ids_and_the_streams_lines_and_zones_are_drawn_with_the_config(tmp_path):
    results = tmp_path / "r.jsonl"
    out_plain, out_scene, out_v2 = tmp_path / "plain.png", tmp_path / "scene.png", tmp_path / "v2.png"
    write_rows(results, [served([100, 50, 200, 150], "k3x9a-4")])
    draw(results, BIKES, "bikes", 1.5, out_plain)
    draw(results, BIKES, "bikes", 1.5, out_scene, config=parse_config(SCENE, "p.yaml"))
    write_rows(results, [served([100, 50, 200, 150], v=2)])  # a version 2 row: no type, no track id
    draw(results, BIKES, "bikes", 1.5, out_v2)
    plain, scene, v2 = (cv2.imread(str(p)) for p in (out_plain, out_scene, out_v2))
    yellow, blue = (0, 255, 255), (255, 160, 60)
    label_end = plain[30:47, 190:230]  # right of "person 0.90": the track id "#4"
    assert (label_end != v2[30:47, 190:230]).any() and (v2[30:47, 190:230] == frame_pixels(190, 230)).all()
    assert tuple(scene[200, 320]) == yellow and tuple(plain[200, 320]) != yellow  # the line
    assert tuple(scene[220, 420]) == blue and tuple(plain[220, 420]) != blue  # the zone's left edge
    # The `in` arrow: the line runs top to bottom, so `in` is to the screen's left (someone walking right to left
    # crosses in): yellow left of the line at its middle, none right of it.
    assert (scene[130:141, 300:316] == yellow).all(axis=-1).any()
    assert not (scene[130:141, 325:345] == yellow).all(axis=-1).any()
    with pytest.raises(ValueError, match="stream 'other' is not in p.yaml"):
        draw(results, BIKES, "other", 1.5, out_v2, config=parse_config(SCENE, "p.yaml"))


def frame_pixels(x1, x2):
    return cv2.cvtColor(frame_at(BIKES, 1.5), cv2.COLOR_RGB2BGR)[30:47, x1:x2]


def test_a_broken_row_is_named_by_its_line(tmp_path):
    results = tmp_path / "r.jsonl"
    results.write_text(json.dumps(served([1, 1, 5, 5])) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"r.jsonl:2: not a JSON row"):
        draw(results, BIKES, "bikes", 1.5, tmp_path / "f.png")
