"""vlora_va.ingest.exposure: underexposed frames brightened by the curve its docstring states, checked against a
plain loop; daylight and black frames untouched; letterbox applies it to the picture, not the padding."""

from __future__ import annotations

import math

import av
import cv2
import numpy as np
import pytest

from tests.conftest import BIKES, PEDESTRIANS
from vlora_va.contracts.geometry import letterbox_geometry
from vlora_va.ingest import exposure as E
from vlora_va.ingest.chunker import PAD_VALUE, letterbox


def frame_at(path, t: float) -> np.ndarray:
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        for f in c.decode(s):
            if float(f.pts * s.time_base) >= t - 1e-3:
                return f.to_ndarray(format="rgb24")
    raise AssertionError(f"{path}: no frame at {t} s")


def darken(rgb: np.ndarray, gain: float, gamma: float) -> np.ndarray:
    """A dusk camera's tone, as the low-light view makes it (gamma, then gain)."""
    return np.clip(np.round(255 * gain * (rgb / 255.0) ** gamma), 0, 255).astype(np.uint8)


def reference_median(rgb: np.ndarray) -> float:
    """The lower median of the BT.601 luma, as 8-bit levels, by sorting."""
    luma = np.round(rgb.astype(np.float64) @ np.array([0.299, 0.587, 0.114])).astype(np.int64).ravel()
    return float(np.sort(luma)[(luma.size - 1) // 2]) / 255.0


def reference_correction(rgb: np.ndarray) -> tuple[np.ndarray, float]:
    """The docstring's loop, pixel value by pixel value."""
    m = reference_median(rgb)
    if not E.BLACK_BELOW <= m < E.DARK_BELOW:
        return rgb, 1.0
    g = min(1.0, max(E.MIN_GAMMA, math.log(E.TARGET) / math.log(m)))
    out = np.empty_like(rgb)
    for v in range(256):
        out[rgb == v] = min(255, max(0, round(255 * (v / 255) ** g)))
    return out, g


@pytest.fixture(scope="module")
def street() -> np.ndarray:
    return frame_at(PEDESTRIANS, 60.0)


def test_the_median_is_the_lower_median_of_the_luma(street):
    dark = darken(street, 0.45, 1.5)
    for img in (street, dark, street[:101, :77]):  # an odd pixel count too
        assert E.median_luma(img) == pytest.approx(reference_median(img), abs=1.5 / 255)  # OpenCV rounds its luma


@pytest.mark.parametrize("gain, gamma", [(0.45, 1.5), (0.3, 1.2), (0.6, 2.0)])
def test_a_dark_frame_is_brightened_by_the_stated_curve_to_the_target(street, gain, gamma):
    dark = darken(street, gain, gamma)
    camera = dark.copy()
    assert E.median_luma(dark) < E.DARK_BELOW
    out = E.correct_exposure(dark)
    expected, g = reference_correction(dark)
    assert g < 1.0 and E.exposure_gamma(dark) == pytest.approx(g, abs=0.01)
    assert np.abs(out.astype(int) - expected.astype(int)).max() <= 1  # the same curve (gamma to the median's level)
    assert E.median_luma(out) == pytest.approx(E.TARGET, abs=0.03)
    np.testing.assert_array_equal(dark, camera)  # a new array: the camera's own frame is kept (snapshots use it)


@pytest.mark.parametrize("path, t", [(PEDESTRIANS, 60.0), (BIKES, 1.2), (BIKES, 6.0)])
def test_a_daylight_frame_is_left_as_it_is(path, t):
    """The sample footage's frames, the darkest (bikes 1.2 s, a shaded street, median 0.19) included."""
    rgb = frame_at(path, t)
    assert E.median_luma(rgb) >= E.DARK_BELOW
    assert E.correct_exposure(rgb) is rgb


def test_a_black_frame_is_not_stretched():
    """A covered lens: sensor noise of a few levels must not become texture."""
    rng = np.random.default_rng(0)
    black = rng.integers(0, 6, (120, 160, 3)).astype(np.uint8)
    assert E.median_luma(black) < E.BLACK_BELOW
    assert E.correct_exposure(black) is black


def test_the_curve_is_never_steeper_than_min_gamma(street):
    very_dark = darken(street, 0.12, 1.5)
    assert E.BLACK_BELOW <= E.median_luma(very_dark) < 0.08
    assert E.exposure_gamma(very_dark) == E.MIN_GAMMA
    assert E.tone_table(E.MIN_GAMMA)[[0, 255]].tolist() == [0, 255]


def test_letterbox_corrects_the_picture_and_measures_it_without_the_padding():
    """A wide dark frame: a third of the square is padding, which must neither be brightened nor counted."""
    wide = darken(frame_at(BIKES, 6.0), 0.45, 1.5)
    size = 224
    out, lb = letterbox(wide, size)
    new_w, new_h, _ = letterbox_geometry(wide.shape[1], wide.shape[0], size)
    y, x = int(lb.pad_y), int(lb.pad_x)
    picture = out[y:y + new_h, x:x + new_w]
    assert (out[:y] == PAD_VALUE).all() and (out[y + new_h:] == PAD_VALUE).all()
    assert E.median_luma(picture) == pytest.approx(E.TARGET, abs=0.03)
    resized = cv2.resize(wide, (new_w, new_h), interpolation=cv2.INTER_AREA)
    np.testing.assert_array_equal(picture, E.correct_exposure(resized))
