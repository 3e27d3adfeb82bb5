"""analytics/box_kalman.py against its reference, `trackers`' own ByteTrack tracklet (one 8 x 8 Kalman filter per
track), step by step: every row's box, velocity and covariance equal the tracklet's after each predict and update,
at nominal steps, steps inside the 4-ms band, shorter steps and gaps."""

import numpy as np
import pytest
from trackers.core.bytetrack.tracklet import ByteTrackTracklet
from trackers.utils.predict_timing import PredictTiming

from vlora_va.analytics.box_kalman import BoxKalman

FPS = 2.0


def reference_step(tracklet: ByteTrackTracklet, dt: float) -> None:
    tracklet.predict(PredictTiming(frame_step=dt * FPS, elapsed_seconds=dt, frame_rate=FPS))


def covariance(kalman: BoxKalman, row: int) -> np.ndarray:
    """Row's covariance as the full 8 x 8 matrix kron(C, I4)."""
    a, b, c = kalman.c[row]
    return np.kron(np.array([[a, b], [b, c]]), np.eye(4))


@pytest.mark.parametrize("steps", [
    [0.5] * 12,  # the default 2 fps, exactly nominal
    [0.5005, 0.4990, 0.5019, 0.4981] * 3,  # timestamps' jitter, inside the band: ByteTrack's one-frame noise
    [0.1, 0.2, 0.5, 1.5, 3.0, 0.5, 0.25, 7.0, 0.5, 0.5],  # shorter steps and gaps: the white-noise-acceleration model
])
def test_every_row_follows_trackers_bytetrack_filter(steps):
    rng = np.random.default_rng(len(steps))
    starts = rng.uniform(0, 500, (5, 2))
    first = np.concatenate([starts, starts + [30, 80]], axis=1)
    ours, refs = BoxKalman(FPS), [ByteTrackTracklet(b.astype(np.float64)) for b in first]
    for b in first:
        ours.add(b)
    for n, dt in enumerate(steps):
        ours.predict(dt)
        for t in refs:
            reference_step(t, dt)
        # a different subset of rows is measured each step; the others only predict (a missed frame)
        rows = np.flatnonzero(rng.random(len(refs)) < 0.6)
        boxes = first[rows] + rng.normal(0, 4, (len(rows), 4)) + 12 * n
        ours.update(rows, boxes)
        for r, b in zip(rows, boxes):
            refs[r].update(b)
        for r, t in enumerate(refs):
            np.testing.assert_allclose(ours.x[r], t.state_estimator.kf.state[:, 0], rtol=1e-9, atol=1e-9)
            np.testing.assert_allclose(covariance(ours, r), t.state_estimator.kf.state_covariance,
                                       rtol=1e-9, atol=1e-12)
            np.testing.assert_allclose(ours.boxes()[r], t.get_state_bbox(), rtol=1e-9, atol=1e-9)


def test_keep_and_add_keep_each_rows_own_filter():
    kalman = BoxKalman(FPS)
    for x in (0.0, 100.0, 200.0):
        kalman.add([x, 0.0, x + 10, 20.0])
    kalman.predict(0.5)
    kalman.update(np.array([0, 1, 2]), np.array([[5.0, 0, 15, 20], [100, 0, 110, 20], [190, 0, 200, 20]]))
    before = kalman.x[[0, 2]].copy(), kalman.c[[0, 2]].copy()
    kalman.keep(np.array([True, False, True]))
    kalman.add([300.0, 0.0, 310.0, 20.0])
    np.testing.assert_array_equal(kalman.x[:2], before[0])
    np.testing.assert_array_equal(kalman.c[:2], before[1])
    np.testing.assert_array_equal(kalman.x[2], [300, 0, 310, 20, 0, 0, 0, 0])
    np.testing.assert_array_equal(kalman.c[2], [1, 0, 1])
    assert len(kalman) == 3
