"""Exposure correction: an underexposed frame is brightened by a tone curve before any model sees it.

A camera at dusk or at night delivers frames whose mid-tones sit far below the daylight footage the adapters
learnt from. The model then misses people and takes noise for them: on the held-out low-light view of
`pedestrians.mp4` the shipped `detect` adapter's person precision fell to 0.85 (0.98 in daylight).
A gamma curve that brings the frame's median luma back to TARGET restores most of it, costs a histogram and a
lookup table, and changes nothing for a frame that is not dark.

    m = median luma of the frame (of 1)
    if BLACK_BELOW <= m < DARK_BELOW:
        g = clip(log(TARGET) / log(m), MIN_GAMMA, 1)
        for every pixel channel value v in 0..255: out = round(255 * (v / 255) ** g)
    else: the frame is returned as it is (the same array)

Every path that turns a frame into model input applies it through `letterbox` (ingest, training, evaluation,
calibration), so an adapter is trained and served on the same pixels. Event snapshots keep the camera's own image;
the dashboard's live view shows what the model saw (it crops the letterboxed frame).
"""

from __future__ import annotations

import math

import cv2
import numpy as np

# The median luma of the footage the shipped adapters learnt from (pedestrians.mp4: 0.42-0.44 in every frame).
TARGET = 0.42
# Underexposed: a median luma below 46 of 255. No daylight frame of the sample footage is that dark (the darkest,
# a shaded street in bikes.mp4, is 0.19); the low-light view is 0.12.
DARK_BELOW = 0.18
# Black rather than dark (a covered lens, a switched-off light): nothing to recover, and a steep curve would only
# turn sensor noise into texture.
BLACK_BELOW = 0.03
# The steepest curve: a frame with median 0.084 reaches TARGET; darker ones are brightened as far as this allows.
MIN_GAMMA = 0.35

# Part of cached training features' identity (training/features.py): change it when the curve or its bounds change,
# so no adapter trains on features of pixels serving no longer sends.
VERSION = 1


def median_luma(image: np.ndarray) -> float:
    """The median of an RGB uint8 image's luma (BT.601), of 1: the smallest level at which half the pixels are."""
    grey = cv2.cvtColor(np.ascontiguousarray(image), cv2.COLOR_RGB2GRAY)
    counts = np.bincount(grey.ravel(), minlength=256)
    return float(np.searchsorted(np.cumsum(counts), (grey.size + 1) // 2)) / 255.0


def exposure_gamma(image: np.ndarray) -> float:
    """The gamma `correct_exposure` applies to this image: 1.0 where it is not underexposed."""
    m = median_luma(image)
    if not BLACK_BELOW <= m < DARK_BELOW:
        return 1.0
    return min(1.0, max(MIN_GAMMA, math.log(TARGET) / math.log(m)))


def tone_table(gamma: float, gain: float = 1.0) -> np.ndarray:
    """The 256-entry lookup table of the curve out = round(255 * gain * (v / 255) ** gamma), clipped to 8 bits as a
    sensor's output would be (training/views.py darkens and brightens its camera views with it too)."""
    levels = np.arange(256) / 255.0
    return np.clip(np.round(255 * gain * levels ** gamma), 0, 255).astype(np.uint8)


def correct_exposure(image: np.ndarray) -> np.ndarray:
    """The image brightened to TARGET if it is underexposed (a new array), else the image itself."""
    gamma = exposure_gamma(image)
    return image if gamma == 1.0 else cv2.LUT(image, tone_table(gamma))
