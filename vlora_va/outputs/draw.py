"""`vlora-va draw`: draw a result row's detections (and the stream's action label and per-person activities)
on the source frame."""

from __future__ import annotations

import json
from pathlib import Path

import av
import cv2
import numpy as np

COLOURS = [(0, 200, 255), (255, 120, 0), (0, 220, 0), (220, 0, 220), (255, 255, 0)]
PERSON_COLOUR = (255, 255, 255)  # BGR: action persons are thin white boxes, the activity written under them


def frame_at(video: str | Path, ts: float) -> np.ndarray:
    """The RGB frame shown at media time ts (the last frame whose pts <= ts), decoding from the start."""
    with av.open(str(video)) as container:
        stream = container.streams.video[0]
        shown = None
        for frame in container.decode(stream):
            t = float(frame.pts * stream.time_base) if frame.pts is not None else 0.0
            if t > ts + 1e-6 and shown is not None:
                break
            shown = frame.to_ndarray(format="rgb24")
    if shown is None:
        raise ValueError(f"{video}: no frame at {ts} s")
    return shown


def read_rows(results: str | Path, stream: str) -> list[dict]:
    with open(results, encoding="utf-8") as f:
        return [r for r in map(json.loads, f) if r.get("stream") == stream and r.get("status", "ok") == "ok"]


def annotate(image: np.ndarray, detections: list[dict], caption: str = "",
             persons: list[dict] | None = None) -> np.ndarray:
    out = cv2.cvtColor(image, cv2.COLOR_RGB2BGR)
    for p in persons or []:  # first, so detections stay on top
        x1, y1, x2, y2 = (int(round(v)) for v in p["box"])
        cv2.rectangle(out, (x1, y1), (x2, y2), PERSON_COLOUR, 1)
        # "walking_left" -> "left": people are ~30 px wide here, long labels would overlap
        cv2.putText(out, p["activity"].removeprefix("walking_"), (x1, y2 + 11),
                    cv2.FONT_HERSHEY_SIMPLEX, 0.38, PERSON_COLOUR, 1, cv2.LINE_AA)
    classes = sorted({d["class"] for d in detections})
    for d in detections:
        x1, y1, x2, y2 = (int(round(v)) for v in d["box"])
        colour = COLOURS[classes.index(d["class"]) % len(COLOURS)]
        cv2.rectangle(out, (x1, y1), (x2, y2), colour, 2)
        cv2.putText(out, f"{d['class']} {d['score']:.2f}", (x1, max(12, y1 - 4)), cv2.FONT_HERSHEY_SIMPLEX, 0.45,
                    colour, 1, cv2.LINE_AA)
    if caption:
        cv2.putText(out, caption, (8, 22), cv2.FONT_HERSHEY_SIMPLEX, 0.6, (255, 255, 255), 2, cv2.LINE_AA)
    return out


def draw(results: str | Path, video: str | Path, stream: str, ts: float | None, out: str | Path) -> tuple[float, int]:
    """Write out (PNG/JPEG) for the detection frame nearest ts (default: the first with detections).
    Returns (the frame's timestamp, number of boxes). A results file that several runs appended to holds each
    frame once per run: the newest run's row is drawn."""
    rows = read_rows(results, stream)[::-1]  # newest first: min() keeps the first of equals
    frames = [(f["ts"], f["detections"], r) for r in rows if "frames" in r for f in r["frames"]]
    if not frames:
        raise ValueError(f"{results}: no detection results for stream {stream!r}")
    if ts is None:
        t, dets, row = min((f for f in frames if f[1]), key=lambda f: f[0], default=frames[0])
    else:
        t, dets, row = min(frames, key=lambda f: abs(f[0] - ts))
    label = next((r for r in rows if "label" in r and r["chunk"] == row["chunk"]), None)
    caption = f"{stream} t={t:.1f}s" + (f"  {label['task']}: {label['label']} {label['score']:.2f}" if label else "")
    image = annotate(frame_at(video, t), dets, caption, label.get("persons") if label else None)
    if not cv2.imwrite(str(out), image):
        raise ValueError(f"cannot write {out}")
    return t, len(dets)
