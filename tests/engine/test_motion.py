"""The motion rule shared by the teacher's activity labels and an action head's person tracks."""

import math
import random

import pytest

from vlora_va.engine.motion import Motion, motion_label, scale_rate, track_motion


def plain_track_motion(boxes, times):
    """track_motion as a plain loop: feet (bottom centre) from the mean of the first third of the frames to the mean
    of the last third, in mean box heights per second; the least-squares slope of log(height) over time."""
    n = len(boxes)
    third = max(1, n // 3)
    heights = [b[3] - b[1] for b in boxes]
    height = sum(heights) / n

    def mean(values):
        return sum(values) / len(values)

    first, last = range(third), range(n - third, n)
    dt = mean([times[i] for i in last]) - mean([times[i] for i in first])
    dx = (mean([(boxes[i][0] + boxes[i][2]) / 2 for i in last]) - mean([(boxes[i][0] + boxes[i][2]) / 2 for i in first]))
    dy = mean([boxes[i][3] for i in last]) - mean([boxes[i][3] for i in first])
    tm, lm = mean(times), mean([math.log(h) for h in heights])
    num = sum((t - tm) * (math.log(h) - lm) for t, h in zip(times, heights))
    den = sum((t - tm) ** 2 for t in times)
    return dx / height / dt, dy / height / dt, num / den, height


@pytest.mark.parametrize("seed", range(5))
def test_track_motion_is_the_plain_loop(seed):
    rng = random.Random(seed)
    n = rng.randint(2, 12)
    times = sorted(rng.uniform(0, 1) for _ in range(n))
    boxes = []
    for _ in range(n):
        x, y, w, h = rng.uniform(0, 500), rng.uniform(0, 300), rng.uniform(10, 60), rng.uniform(30, 200)
        boxes.append([x, y, x + w, y + h])
    m = track_motion(boxes, times)
    assert (m.dx, m.dy, m.rate, m.height) == pytest.approx(plain_track_motion(boxes, times), rel=1e-9, abs=1e-9)


def test_a_steady_walker_has_its_speed_whatever_the_frame_spacing():
    # 50 px/s to the right, 100 px tall, growing 10%/s, seen at the daemon's uneven frame times
    times = [0.1, 0.3, 0.6, 0.8]
    boxes = [[100 + 50 * t, 300 - 100 * math.exp(0.1 * t), 140 + 50 * t, 300] for t in times]
    m = track_motion(boxes, times)
    assert m.dy == pytest.approx(0) and m.rate == pytest.approx(0.1)
    assert m.dx == pytest.approx(50 / m.height) and m.speed == pytest.approx(abs(m.dx))
    assert scale_rate([100], [0.0]) == 0.0


def test_track_motion_needs_a_time_per_box():
    with pytest.raises(ValueError, match="3 boxes for 2 times"):
        track_motion([[0, 0, 1, 1]] * 3, [0.0, 0.1])
    with pytest.raises(ValueError, match="0 boxes"):
        track_motion([], [])


@pytest.mark.parametrize("motion,label", [
    (Motion(0.5, 0.0, 0.0, 100), ("walking_right", True)), (Motion(-0.5, 0.1, 0.0, 100), ("walking_left", True)),
    (Motion(0.0, 0.5, 0.2, 100), ("walking_toward", True)), (Motion(0.0, -0.5, -0.2, 100), ("walking_away", True)),
    (Motion(0.0, 0.5, -0.2, 100), ("walking_away", False)),  # the scale and the feet disagree
    (Motion(0.05, 0.0, 0.0, 100), ("standing", True)), (Motion(0.05, 0.0, 0.3, 100), ("standing", False)),
    (Motion(0.18, 0.0, 0.0, 100), ("walking_right", False)),  # the don't-care band
    (Motion(0.4, 0.38, 0.0, 100), ("walking_right", False)),  # diagonal
])
def test_motion_label(motion, label):
    assert motion_label(motion) == label
