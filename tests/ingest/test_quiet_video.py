"""sample_videos/quiet.mp4, the quiet camera that frame filtering and capacity are measured on
(made by sample_videos/make_quiet.py, figures in quiet.json): it decodes at the size, rate and length it claims,
its quiet stretches change no more than the real camera's static background does (noise and light only, no one
moving), and its walk-throughs clearly do. A copy of pedestrians.mp4, or a still image, fails."""

from __future__ import annotations

import json

import av
import numpy as np
import pytest

from tests.conftest import SAMPLES

QUIET = SAMPLES / "quiet.mp4"
FIGURES = json.loads((SAMPLES / "quiet.json").read_text())
LUMA = np.array([0.299, 0.587, 0.114], np.float32)  # as make_quiet.py measures


def block_means(d: np.ndarray, px: int) -> np.ndarray:
    return d.reshape(d.shape[0] // px, px, d.shape[1] // px, px).mean(axis=(1, 3))


def pair_figures() -> tuple[int, tuple[int, int], np.ndarray, np.ndarray]:
    """(frames, (width, height), per consecutive pair: mean |dY|, largest block mean |dY|): noise raises the first
    a little everywhere, a moving person raises the second a lot where they are."""
    px = FIGURES["noise"]["block_px"]
    mads, block_max, prev, n = [], [], None, 0
    with av.open(str(QUIET)) as inp:
        stream = inp.streams.video[0]
        assert stream.average_rate == FIGURES["video"]["fps"]
        size = (stream.codec_context.width, stream.codec_context.height)
        for frame in inp.decode(stream):
            y = frame.to_ndarray(format="rgb24").astype(np.float32) @ LUMA
            if prev is not None:
                d = np.abs(y - prev)
                mads.append(d.mean())
                block_max.append(block_means(d, px).max())
            prev, n = y, n + 1
    return n, size, np.array(mads), np.array(block_max)


@pytest.fixture(scope="module")
def decoded():
    return pair_figures()


def pairs_inside(ranges: list[list[int]], fps: int, frames: int) -> np.ndarray:
    """Mask over consecutive pairs (i-1, i) whose two frames both lie in one of the [start, end) second ranges."""
    inside = np.zeros(frames, bool)
    for start, end in ranges:
        inside[start * fps:end * fps] = True
    return inside[1:] & inside[:-1]


def test_quiet_video_decodes_at_its_size_rate_and_length(decoded):
    frames, size, _, _ = decoded
    video = FIGURES["video"]
    assert size == (768, 576) == (video["width"], video["height"])
    assert frames == video["frames"] == video["fps"] * video["duration_s"] == 1800
    assert QUIET.stat().st_size == video["bytes"] < 15e6  # a small sample file


def test_walkthroughs_once_a_minute_from_real_seconds():
    walks = FIGURES["walkthroughs"]
    assert len(walks) == FIGURES["video"]["duration_s"] // 60
    for minute, w in enumerate(walks):
        (q0, q1), (s0, s1) = w["quiet_s"], w["source_s"]
        assert 60 * minute <= q0 < q1 <= 60 * (minute + 1) and q1 - q0 == s1 - s0 > 0
        assert 0 <= s0 < s1 <= 79.5 and w["pasted_fraction"] > 0.005  # real people were pasted


def test_quiet_stretches_are_quiet_and_walkthroughs_are_not(decoded):
    frames, _, mads, block_max = decoded
    fps, noise = FIGURES["video"]["fps"], FIGURES["noise"]
    walks = [w["quiet_s"] for w in FIGURES["walkthroughs"]]
    quiet = ~pairs_inside([[start - 1, end + 1] for start, end in walks], fps, frames)
    # quiet: as much change as the real camera's static background shows (its noise and light), no more...
    assert mads[quiet].mean() <= 1.2 * noise["consecutive_mad"]
    assert mads[quiet].max() <= 1.2 * noise["consecutive_mad_max"]
    assert block_max[quiet].max() <= 1.5 * noise["block_mad_max"]  # nobody moves anywhere in the frame
    # ...yet not a still image: the measured noise is there
    assert mads[quiet].mean() >= 0.8 * noise["consecutive_mad"]
    # every walk-through: someone moves between every two frames, and the frame changes more than when quiet
    for walk in walks:
        inside = pairs_inside([walk], fps, frames)
        assert block_max[inside].min() >= 2 * noise["block_mad_max"], walk
        assert mads[inside].mean() >= 2 * mads[quiet].mean(), walk
