"""Which frames of a camera's footage an adapter fit trains on: diverse ones, and never one near a human-checked
frame.

- `pick_diverse`: footage is mostly the same picture. Training on every frame spends the time on near-copies of
  the empty street; training on a fixed stride misses the seconds when something happens. Frames are picked so
  that an equal amount of *change* lies between consecutive picks (mean absolute difference of small grey
  thumbnails: motion and scene changes both count), with a minimum gap, so a busy minute gets many frames and
  a still one few.
- `away_from`: no frame within `margin` seconds (default 1 s) of a human-checked frame is trained on; those
  frames measure the adapter, and a neighbouring frame is nearly the same picture.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from vlora_va.training.frames import TrainingFrame, iter_frames

THUMB = (64, 36)  # width, height of the thumbnails compared (enough for motion, cheap to diff)
LEAK_MARGIN_S = 1.0


def thumbnail(rgb: np.ndarray) -> np.ndarray:
    import cv2

    return cv2.resize(cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY), THUMB, interpolation=cv2.INTER_AREA).astype(np.float32)


def change_between(frames: list[TrainingFrame]) -> np.ndarray:
    """[n]: the mean absolute grey-level change from each frame's predecessor (0 for the first)."""
    thumbs = [thumbnail(f.rgb) for f in frames]
    return np.array([0.0] + [float(np.abs(b - a).mean()) for a, b in zip(thumbs, thumbs[1:])])


def pick_diverse(frames: list[TrainingFrame], n: int, min_gap_s: float = 0.5) -> list[TrainingFrame]:
    """About `n` frames (never more), in time order, with equal cumulative change between picks and at least
    `min_gap_s` between any two. The first frame is always picked. Deterministic."""
    if n < 1:
        raise ValueError(f"n: expected at least 1 frame to pick, got {n}")
    if len(frames) <= 1:
        return list(frames)
    change = change_between(frames) + 1e-3  # a still scene still advances, slowly: evenly spread picks
    budget = change.sum() / n
    picked, acc, last_t = [frames[0]], 0.0, frames[0].t
    for f, c in zip(frames[1:], change[1:]):
        acc += c
        if acc >= budget and f.t - last_t >= min_gap_s - 1e-6 and len(picked) < n:
            picked.append(f)
            acc, last_t = 0.0, f.t
    return picked


def away_from(frames: list[TrainingFrame], times: list[float], margin_s: float = LEAK_MARGIN_S) -> list[TrainingFrame]:
    """The frames more than `margin_s` seconds from every time in `times` (human-checked frames of this video)."""
    if not times:
        return list(frames)
    marks = np.sort(np.asarray(times, dtype=np.float64))
    out = []
    for f in frames:
        i = np.searchsorted(marks, f.t)
        near = [marks[j] for j in (i - 1, i) if 0 <= j < len(marks)]
        if all(abs(f.t - m) > margin_s + 1e-6 for m in near):
            out.append(f)
    return out


def shipped_human_times(video: str) -> list[float]:
    """The project's own human-checked frame times of this video (adapters/eval/human-v1.json; [] for others)."""
    return list(_shipped_times().get(video, []))


@functools.cache
def _shipped_times() -> dict[str, list[float]]:
    """{video: times} of the shipped set, read once per process (it is frozen: evaluate.HUMAN_SET_SHA256)."""
    from vlora_va.training.evaluate import HUMAN_SET, load_human_set

    if not HUMAN_SET.is_file():
        return {}
    out: dict[str, list[float]] = {}
    for video, t in load_human_set(HUMAN_SET).times.values():
        out.setdefault(video, []).append(t)
    return out


def is_live(source: str) -> bool:
    return "://" in source and not source.startswith("file://")


def candidates(source: str, start: float, end: float | None, fps: float, minutes: float | None = None) -> list[TrainingFrame]:
    """Frames of a file (start <= t < end) or of a live stream (its first `minutes`), `fps` per second."""
    if fps <= 0:
        raise ValueError(f"fps: expected > 0, got {fps}")
    if not is_live(source):
        if not Path(source).is_file():
            raise FileNotFoundError(f"{source}: no such video file")
        return list(iter_frames(source, start, end, 1.0 / fps))
    if not minutes:
        raise ValueError(f"{source} is a live stream: say how much of it to record with --minutes")
    return _record(source, minutes * 60.0, fps)


def _record(url: str, seconds: float, fps: float) -> list[TrainingFrame]:
    """`seconds` of a live stream, `fps` frames per second kept; times count from its first frame."""
    import av
    from tqdm import tqdm

    name = "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in url.split("://", 1)[1]).strip("-")[:60]
    options = {"rtsp_transport": "tcp"} if url.startswith("rtsp") else {}
    out: list[TrainingFrame] = []
    with av.open(url, options=options, timeout=20) as container, \
            tqdm(total=round(seconds), desc=f"recording {url}", unit="s") as bar:
        stream = container.streams.video[0]
        t0 = next_t = None
        for frame in container.decode(stream):
            if frame.pts is None:
                continue
            t = float(frame.pts * stream.time_base)
            t0 = t if t0 is None else t0
            t -= t0
            if t >= seconds:
                break
            bar.n = min(round(t), round(seconds))
            bar.refresh()
            if next_t is None or t >= next_t - 1e-6:
                out.append(TrainingFrame(name, round(t, 3), frame.to_ndarray(format="rgb24")))
                next_t = t + 1.0 / fps
    return out
