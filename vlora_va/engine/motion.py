"""A person's activity from where their box goes over a clip.

One rule, two users: the teacher's activity labels (training/actions.py: the CenterNet teacher's boxes tracked over
every frame of a 1-s window) and an action head that names each person's activity from its own boxes over the
clip's frames (heads.ActionHead with activity_from="track"). Motion is in box heights per second, so near and far
people compare:

- the feet: the bottom centre of the box (a person turning or bending changes height, not where they stand), from
  the mean over the first third of the track's frames to the mean over its last third (dx right, dy down);
- the scale rate: the least-squares slope of log(box height) over time, per second (> 0: growing, coming closer);
- "standing" below STILL_SPEED, sure only if the scale also holds still (|rate| < STILL_SCALE_RATE: someone
  walking at the camera grows); walking from WALK_SPEED up; between the two a don't-care band, labelled by the
  rules below but not sure;
- mostly sideways (|dx| > DOMINANT |dy|): "walking_left" / "walking_right";
- mostly along the image's vertical: named by the scale, not by dy ("walking_toward" when the box grows), sure when
  the scale changes by at least SCALE_RATE in the direction the feet move (growing while moving down the image);
- diagonal: the larger component names it, not sure.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

STILL_SPEED, WALK_SPEED = 0.12, 0.25  # heights/s: below = standing, at or above = walking, between = don't care
SCALE_RATE = 0.05  # per second: the least change of log(height) that says towards or away
STILL_SCALE_RATE = 0.15  # per second: a standing person whose height changes faster is not sure
DOMINANT = 1.25  # one direction names the motion when it is this many times the other
# A track is a person's when it covers this share of the clip's frames (the teacher's labels and a head's tracks
# alike), so a track's motion is always measured over most of the clip.
TRACK_SHARE = 0.6


@dataclass(frozen=True)
class Motion:
    """One person's motion over a track: feet displacement (heights/s), scale rate (1/s), mean box height (px)."""

    dx: float
    dy: float
    rate: float
    height: float

    @property
    def speed(self) -> float:
        return float(np.hypot(self.dx, self.dy))


def track_motion(boxes: list[list[float]], times: list[float]) -> Motion:
    """The motion of a track: its boxes (x1, y1, x2, y2) at `times` (seconds, increasing)."""
    if len(boxes) != len(times) or not boxes:
        raise ValueError(f"track_motion: {len(boxes)} boxes for {len(times)} times")
    b, t = np.asarray(boxes, dtype=float), np.asarray(times, dtype=float)
    third = max(1, len(b) // 3)
    feet = np.stack([(b[:, 0] + b[:, 2]) / 2, b[:, 3]], 1)
    height = float((b[:, 3] - b[:, 1]).mean())
    dt = t[-third:].mean() - t[:third].mean()
    dx, dy = (feet[-third:].mean(0) - feet[:third].mean(0)) / max(height, 1.0) / max(dt, 1e-6)
    return Motion(float(dx), float(dy), scale_rate(b[:, 3] - b[:, 1], t), height)


def scale_rate(heights, times) -> float:
    """Least-squares slope of log(height) per second (steadier than the first vs the last frame); 0 for one frame."""
    t = np.asarray(times, dtype=float)
    if len(t) < 2:
        return 0.0
    logh = np.log(np.maximum(np.asarray(heights, dtype=float), 1.0))
    t = t - t.mean()
    return float((t * (logh - logh.mean())).sum() / max((t * t).sum(), 1e-9))


def motion_label(m: Motion, still_speed: float = STILL_SPEED) -> tuple[str, bool]:
    """(activity, sure) from a track's motion (the module doc's rule)."""
    dx, dy, rate, speed = m.dx, m.dy, m.rate, m.speed
    if speed < still_speed:
        return "standing", abs(rate) < STILL_SCALE_RATE
    sure = speed >= WALK_SPEED
    if abs(dx) > DOMINANT * abs(dy):
        return ("walking_right" if dx > 0 else "walking_left"), sure
    if abs(dy) > DOMINANT * abs(dx):
        agrees = abs(rate) >= SCALE_RATE and rate * dy > 0
        return ("walking_toward" if rate > 0 else "walking_away"), sure and agrees
    if abs(dx) >= abs(dy):
        return ("walking_right" if dx > 0 else "walking_left"), False
    return ("walking_toward" if dy > 0 else "walking_away"), False
