import json
from pathlib import Path

import cv2
import numpy as np

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
