"""Augmentation for detection training: zoomed-in views of the training frames, and other cameras' views.

Near-camera people are rare in the training footage (9% of the teacher's person boxes in 0–50 s, against 23%
of the human-checked held-out set) and two people walking together stand a few pixels apart. A crop of part
of a frame, letterboxed to the model's input like any frame, shows the same scene zoomed in: people larger
and further apart. The teacher labels each crop itself, seeing the people larger too, so its boxes there are
tighter and split more pairs than on the whole frame; no box is cut or moved by rule.
"""

from __future__ import annotations

import re
import zlib

import numpy as np

from vlora_va.training.frames import TrainingFrame


def zoom_views(frames: list[TrainingFrame], per_frame: int, scale: tuple[float, float] = (0.4, 0.7),
               seed: int = 0) -> list[TrainingFrame]:
    """`per_frame` crops of each frame, each `s` × the frame's width and height (s uniform in `scale`, so the
    aspect ratio and the letterbox stay those of the video) at a uniform random position. Deterministic per
    (frame, seed): the same crops, teacher labels and cached features come back on every run."""
    lo, hi = scale
    if not 0 < lo <= hi <= 1:
        raise ValueError(f"zoom scale: expected 0 < low <= high <= 1, got {scale!r}")
    views = []
    for f in frames:
        rng = np.random.default_rng([zlib.crc32(f.key.encode()), seed])
        h, w = f.rgb.shape[:2]
        for _ in range(per_frame):
            s = float(rng.uniform(lo, hi))
            cw, ch = max(1, round(w * s)), max(1, round(h * s))
            x0, y0 = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
            crop = np.ascontiguousarray(f.rgb[y0:y0 + ch, x0:x0 + cw])
            views.append(TrainingFrame(f.video, f.t, crop, view=f"crop{x0},{y0},{cw}x{ch}"))
    return views


def camera_views(frames: list[TrainingFrame], labels: dict[str, dict[str, list[dict]]], per_frame: int,
                 seed: int = 0) -> tuple[list[TrainingFrame], dict[str, dict[str, list[dict]]]]:
    """`per_frame` views of each frame through a random other camera (views.random_view), and every source's
    labels carried through the view's geometry: the teacher labelled the clean frame, where it sees best; asked
    on a dark, noisy view it would miss people, and the student would learn to miss them too. A box with less
    than views.MIN_VISIBLE of it left inside the view becomes don't-care (a cut-off person is neither a miss nor
    a false alarm). Deterministic per (frame, seed, i). Returns (view frames, {source: {view key: labels}})."""
    from vlora_va.training.views import random_view

    out_frames: list[TrainingFrame] = []
    out_labels: dict[str, dict[str, list[dict]]] = {name: {} for name in labels}
    for f in frames:
        for i in range(per_frame):
            rng = np.random.default_rng([zlib.crc32(f.key.encode()), seed, i])
            view = random_view(rng)
            rgb, _, _ = view.apply(f.rgb, None, seed=int(rng.integers(1 << 31)))
            vf = TrainingFrame(f.video, f.t, rgb, view=f"cam{seed}-{i}")
            out_frames.append(vf)
            for name, per_key in labels.items():
                out_labels[name][vf.key] = _carried(per_key.get(f.key, []), view, f.size)
    return out_frames, out_labels


def _carried(labels: list[dict], view, size: tuple[int, int]) -> list[dict]:
    from vlora_va.training.views import MIN_VISIBLE

    if not labels:
        return []
    boxes, visible = view.map_boxes([lab["box"] for lab in labels], size)
    return [{**lab, "box": [round(float(v), 1) for v in b], "ignore": bool(lab.get("ignore")) or v < MIN_VISIBLE}
            for lab, b, v in zip(labels, boxes.tolist(), visible.tolist()) if v > 0]


def crop_window(view: str) -> tuple[int, int, int, int] | None:
    """(x0, y0, w, h) in the frame of a crop view made by `zoom_views` ("crop{x0},{y0},{w}x{h}"); None: not a crop."""
    m = re.fullmatch(r"crop(\d+),(\d+),(\d+)x(\d+)", view)
    return tuple(int(v) for v in m.groups()) if m else None
