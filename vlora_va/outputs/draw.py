"""`vlora-va draw`: draw a result row's detections (with their track ids, and the stream's action label and
per-person activities) on the source frame; with the pipeline config, the stream's lines (an arrow shows each
line's `in` side) and zones; and a marker for each event row of the stream at that moment.

Rows of every version are read: a row without "type" (version 2) is a result row; event rows ("type": "event")
are never taken for results, and their event names are not checked (the list is open: a name this version does
not know is drawn like the others).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import av
import cv2
import numpy as np

COLOURS = [(0, 200, 255), (255, 120, 0), (0, 220, 0), (220, 0, 220), (255, 255, 0)]
PERSON_COLOUR = (255, 255, 255)  # BGR: action persons are thin white boxes, the activity written under them
LINE_COLOUR = (0, 255, 255)  # BGR yellow: lines, their names and `in` arrows
ZONE_COLOUR = (255, 160, 60)  # BGR light blue: zone outlines and names
EVENT_COLOUR = (60, 60, 255)  # BGR red: events, at their track's reference point (the bottom centre of its box)
EVENT_WINDOW_S = 0.5  # events this close in media time to the drawn frame are marked on it
ARROW_PX = 24


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


def read_rows(results: str | Path, stream: str) -> tuple[list[dict], list[dict]]:
    """The stream's served result rows and its event rows, in file order. A row without "type" is a result row
    (files of version 2); a row of another type (a later version's) is neither."""
    served, events = [], []
    with open(results, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                raise ValueError(f"{results}:{n}: not a JSON row ({e})") from None
            if not isinstance(row, dict):
                # a bad file, not a bad argument: ValueError, which `vlora-va draw` reports in one line
                raise ValueError(f"{results}:{n}: a row is a JSON object, got {type(row).__name__}")  # noqa: TRY004
            if row.get("stream") != stream:
                continue
            kind = row.get("type", "result")
            if kind == "result" and row.get("status", "ok") == "ok":
                served.append(row)
            elif kind == "event":
                events.append(row)
    return served, events


def short_track(track_id) -> str:
    """A track id as drawn: its number within the run ("k3x9a-4" -> "4"); ids are unique per frame either way."""
    return str(track_id).rsplit("-", 1)[-1]


def in_side(p1, p2) -> tuple[float, float]:
    """The unit vector from a line towards its `in` side: the walker's right for someone walking from p1 to p2
    on screen (y down), where s = (x2-x1)(cy-y1) - (y2-y1)(cx-x1) is positive (contracts/scene.py)."""
    dx, dy = p2[0] - p1[0], p2[1] - p1[1]
    length = math.hypot(dx, dy) or 1.0
    return -dy / length, dx / length


def _text(out: np.ndarray, text: str, xy, colour, scale: float = 0.45) -> None:
    cv2.putText(out, text, (int(xy[0]), int(xy[1])), cv2.FONT_HERSHEY_SIMPLEX, scale, colour, 1, cv2.LINE_AA)


def draw_scene(out: np.ndarray, lines=(), zones=()) -> None:
    """A stream's zones (outlines) and lines (the segment, its name, an arrow to its `in` side), in place (BGR)."""
    for z in zones:
        pts = np.array([[round(x), round(y)] for x, y in z.points], np.int32)
        cv2.polylines(out, [pts], True, ZONE_COLOUR, 2, cv2.LINE_AA)
        _text(out, z.name, (pts[:, 0].min() + 4, pts[:, 1].min() + 14), ZONE_COLOUR)
    for line in lines:
        p1, p2 = line.points
        cv2.line(out, (round(p1[0]), round(p1[1])), (round(p2[0]), round(p2[1])), LINE_COLOUR, 2, cv2.LINE_AA)
        mx, my = (p1[0] + p2[0]) / 2, (p1[1] + p2[1]) / 2
        nx, ny = in_side(p1, p2)
        tip = (round(mx + nx * ARROW_PX), round(my + ny * ARROW_PX))
        cv2.arrowedLine(out, (round(mx), round(my)), tip, LINE_COLOUR, 2, cv2.LINE_AA, tipLength=0.35)
        (tw, th), _ = cv2.getTextSize("in", cv2.FONT_HERSHEY_SIMPLEX, 0.45, 1)
        cx, cy = tip[0] + nx * (tw / 2 + 5), tip[1] + ny * (th / 2 + 5)  # the label's centre, beyond the tip
        _text(out, "in", (cx - tw / 2, cy + th / 2), LINE_COLOUR)
        _text(out, line.name, (mx - nx * 14 + 4, my - ny * 14), LINE_COLOUR)


def draw_events(out: np.ndarray, events: list[dict]) -> None:
    """Each event at its track's reference point (a dot), and one line of text per event at the bottom left."""
    h = out.shape[0]
    for i, e in enumerate(events):
        box = e.get("box")
        if isinstance(box, list) and len(box) == 4:
            x1, _, x2, y2 = box
            cv2.circle(out, (round((x1 + x2) / 2), round(y2)), 5, EVENT_COLOUR, -1, cv2.LINE_AA)
        words = [str(e.get("event", "event")), e.get("line") or e.get("zone"), e.get("direction") or e.get("phase"),
                 e.get("class"), f"#{short_track(e['track_id'])}" if e.get("track_id") else None]
        _text(out, " ".join(str(w) for w in words if w), (8, h - 10 - 16 * (len(events) - 1 - i)), EVENT_COLOUR)


def annotate(image: np.ndarray, detections: list[dict], caption: str = "", persons: list[dict] | None = None,
             scene=None, events: list[dict] = ()) -> np.ndarray:
    """The frame (RGB in, BGR out) with: the scene's zones and lines (scene: a StreamConfig or None), the persons'
    activities, the detections with their track ids, the events, the caption."""
    out = cv2.cvtColor(image, cv2.COLOR_RGB2BGR)
    if scene is not None:  # first, so what was found stays on top
        draw_scene(out, scene.lines, scene.zones)
    for p in persons or []:  # before detections, so detections stay on top
        x1, y1, x2, y2 = (round(v) for v in p["box"])
        cv2.rectangle(out, (x1, y1), (x2, y2), PERSON_COLOUR, 1)
        # "walking_left" -> "left": people are ~30 px wide here, long labels would overlap
        cv2.putText(out, p["activity"].removeprefix("walking_"), (x1, y2 + 11),
                    cv2.FONT_HERSHEY_SIMPLEX, 0.38, PERSON_COLOUR, 1, cv2.LINE_AA)
    classes = sorted({d["class"] for d in detections})
    for d in detections:
        x1, y1, x2, y2 = (round(v) for v in d["box"])
        colour = COLOURS[classes.index(d["class"]) % len(COLOURS)]
        cv2.rectangle(out, (x1, y1), (x2, y2), colour, 2)
        track = f" #{short_track(d['track_id'])}" if d.get("track_id") else ""
        _text(out, f"{d['class']} {d['score']:.2f}{track}", (x1, max(12, y1 - 4)), colour)
    draw_events(out, list(events))
    if caption:
        cv2.putText(out, caption, (8, 22), cv2.FONT_HERSHEY_SIMPLEX, 0.6, (255, 255, 255), 2, cv2.LINE_AA)
    return out


def draw(results: str | Path, video: str | Path, stream: str, ts: float | None, out: str | Path,
         config=None) -> tuple[float, int]:
    """Write out (PNG/JPEG) for the detection frame nearest ts (default: the first with detections).
    Returns (the frame's timestamp, number of boxes). A results file that several runs appended to holds each
    frame once per run: the newest run's row is drawn. config (a PipelineConfig): draw the stream's lines and
    zones as it declares them."""
    scene = None
    if config is not None:
        scene = next((s for s in config.streams if s.id == stream), None)
        if scene is None:
            raise ValueError(f"stream {stream!r} is not in {config.source_file or 'the pipeline config'} "
                             f"(it has {', '.join(s.id for s in config.streams) or 'no streams'})")
    rows, events = read_rows(results, stream)
    rows.reverse()  # newest first: min() keeps the first of equals
    frames = [(f["ts"], f["detections"], r) for r in rows if "frames" in r for f in r["frames"]]
    if not frames:
        raise ValueError(f"{results}: no detection results for stream {stream!r}")
    if ts is None:
        t, dets, row = min((f for f in frames if f[1]), key=lambda f: f[0], default=frames[0])
    else:
        t, dets, row = min(frames, key=lambda f: abs(f[0] - ts))
    label = next((r for r in rows if "label" in r and r["chunk"] == row["chunk"]), None)
    caption = f"{stream} t={t:.1f}s" + (f"  {label['task']}: {label['label']} {label['score']:.2f}" if label else "")
    near = [e for e in events if isinstance(e.get("ts"), (int, float)) and abs(e["ts"] - t) <= EVENT_WINDOW_S]
    image = annotate(frame_at(video, t), dets, caption, label.get("persons") if label else None, scene, near)
    if not cv2.imwrite(str(out), image):
        raise ValueError(f"cannot write {out}")
    return t, len(dets)
