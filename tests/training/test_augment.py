"""Zoomed-in crops for detection training (augment.zoom_views) and their names (augment.crop_window)."""

import numpy as np
import pytest

from vlora_va.training.augment import crop_window, zoom_views
from vlora_va.training.frames import TrainingFrame


def frame(t=1.0):
    rng = np.random.default_rng(int(t * 10))
    return TrainingFrame("cam", t, rng.integers(0, 255, (120, 160, 3), dtype=np.uint8))


def test_crops_are_regions_of_the_frame_at_its_aspect_within_the_scale():
    f = frame()
    views = zoom_views([f], 5, scale=(0.4, 0.7))
    assert len(views) == 5
    for v in views:
        x0, y0, w, h = crop_window(v.view)
        assert v.rgb.shape == (h, w, 3) and np.array_equal(v.rgb, f.rgb[y0:y0 + h, x0:x0 + w])
        assert 0.4 * 160 - 1 <= w <= 0.7 * 160 + 1 and 0.4 * 120 - 1 <= h <= 0.7 * 120 + 1
        assert abs(w / h - 160 / 120) < 0.05  # the video's aspect: the letterbox stays the same shape
        assert (v.video, v.t) == (f.video, f.t) and v.key == f"cam@1.000#{v.view}" and v.key != f.key
    assert crop_window(f.view) is None and crop_window("flip") is None  # the decoded frame, another kind of view


def test_crops_are_the_same_on_every_call_and_differ_by_frame_and_seed():
    a, b = zoom_views([frame(1.0), frame(2.0)], 2), zoom_views([frame(1.0), frame(2.0)], 2)
    assert [v.key for v in a] == [v.key for v in b]  # teacher labels and cached features are found again
    assert len({v.view for v in a}) == 4
    assert [v.key for v in zoom_views([frame(1.0)], 2, seed=1)] != [v.key for v in a[:2]]


@pytest.mark.parametrize("scale", [(0.0, 0.5), (0.7, 0.4), (0.5, 1.5)])
def test_a_bad_scale_is_named(scale):
    with pytest.raises(ValueError, match="zoom scale"):
        zoom_views([frame()], 1, scale=scale)
