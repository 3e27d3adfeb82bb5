"""Every live track's Kalman filter in one set of arrays: `trackers`' ByteTrack motion model, predicted and updated
for all tracks at once.

Why our own: `trackers` keeps one 8 x 8 filter object per track and inverts a 4 x 4 matrix per matched track per
frame; at 50 people that was half of the tracker's time. The model is the same, so the arithmetic can be shared:

    state per track: [x1, y1, x2, y2, vx1, vy1, vx2, vy2] (corners and their velocities, per nominal frame)
    F(dt) = kron([[1, k], [0, 1]], I4), k = dt * fps frames          (constant velocity)
    Q(k)  = kron(0.01 * I2, I4) when |k - 1| <= 0.004 * fps           (one nominal frame: ByteTrack's tuning)
            kron(0.01 * [[k^4/4, k^3/2], [k^3/2, k^2]], I4) otherwise (a gap: white-noise acceleration)
    H = [I4 0], R = 0.1 * I4, P0 = I8

Every matrix is a 2 x 2 block times I4 and P0 = I8, so each track's covariance stays kron(C, I4) with C a symmetric
2 x 2 [[a, b], [b, c]]: three numbers per track instead of 64, and the four coordinates share one gain. A predict is

    for every track: x_pos += k * x_vel;  C = F2 C F2^T + Q2
and an update with box z (xyxy) is, for every matched track (Joseph form, as `trackers` writes it):
    s = a + r;  g = [a / s, b / s];  x_pos += g0 * (z - x_pos);  x_vel += g1 * (z - x_pos_before)
    C = (I - g e0^T) C (I - g e0^T)^T + r g g^T

tests/analytics/test_box_kalman.py checks it against `trackers`' ByteTrackTracklet step by step.
"""

from __future__ import annotations

import numpy as np

MEASUREMENT_NOISE = 0.1  # R = 0.1 * I4 (ByteTrack: trackers' default R of I scaled by 0.1)
PROCESS_NOISE = 0.01  # Q = 0.01 * I8 for one nominal frame (ByteTrack: I scaled by 0.01)
NOMINAL_TOLERANCE_S = 0.004  # a step within 4 ms of one nominal frame counts as one (trackers' band)


class BoxKalman:
    """Rows of constant-velocity box filters. Row order is the caller's (the tracker keeps its live tracks in the
    same order); `keep` and `add` are the only ways rows come and go."""

    def __init__(self, fps: float):
        self.fps = fps
        self.x = np.zeros((0, 8))  # state rows
        self.c = np.zeros((0, 3))  # covariance rows: a (position), b (position-velocity), c (velocity)

    def __len__(self) -> int:
        return len(self.x)

    def boxes(self) -> np.ndarray:
        """[N, 4] the predicted (or updated) boxes, xyxy."""
        return self.x[:, :4]

    def add(self, box) -> None:
        """A new row at the end, starting at box with zero velocity and P0 = I8."""
        row = np.zeros((1, 8))
        row[0, :4] = box
        self.x = np.concatenate([self.x, row])
        self.c = np.concatenate([self.c, [[1.0, 0.0, 1.0]]])

    def keep(self, mask: np.ndarray) -> None:
        """Only the rows where mask is true, in their order."""
        self.x, self.c = self.x[mask], self.c[mask]

    def predict(self, dt: float) -> None:
        """Every row moved on by dt seconds of media time."""
        k = dt * self.fps
        if abs(k - 1.0) <= NOMINAL_TOLERANCE_S * self.fps:
            qa, qb, qc = PROCESS_NOISE, 0.0, PROCESS_NOISE
        else:
            qa, qb, qc = PROCESS_NOISE * k ** 4 / 4, PROCESS_NOISE * k ** 3 / 2, PROCESS_NOISE * k ** 2
        self.x[:, :4] += k * self.x[:, 4:]
        a, b, c = self.c.T
        self.c = np.stack([a + 2 * k * b + k * k * c + qa, b + k * c + qb, c + qc], axis=1)

    def update(self, rows: np.ndarray, boxes: np.ndarray) -> None:
        """The given rows corrected by their measured boxes [len(rows), 4] xyxy."""
        if len(rows) == 0:
            return
        r = MEASUREMENT_NOISE
        a, b, c = self.c[rows].T
        s = a + r
        g0, g1 = a / s, b / s
        innovation = boxes - self.x[rows, :4]
        self.x[rows, :4] += g0[:, None] * innovation
        self.x[rows, 4:] += g1[:, None] * innovation
        # Joseph form: C' = M C M^T + r g g^T with M = [[1 - g0, 0], [-g1, 1]]
        m00, m10 = 1.0 - g0, -g1
        a2 = m00 * m00 * a + r * g0 * g0
        b2 = m00 * (m10 * a + b) + r * g0 * g1
        c2 = m10 * m10 * a + 2 * m10 * b + c + r * g1 * g1
        self.c[rows] = np.stack([a2, b2, c2], axis=1)
