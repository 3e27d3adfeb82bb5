"""Draw detections on a frame (for adapter cards and eyeballing: "do the boxes look right?")."""

from __future__ import annotations

import cv2
import numpy as np

_COLOURS = [(0, 200, 255), (255, 80, 80), (80, 255, 80), (255, 0, 255), (255, 255, 0), (0, 128, 255)]


def annotate(rgb: np.ndarray, detections: list[dict], classes: list[str], refs: list[dict] | None = None) -> np.ndarray:
    """A copy of rgb with predicted boxes (coloured by class, with scores) and optional reference boxes (thin grey)."""
    img = np.ascontiguousarray(rgb.copy())
    for r in refs or []:
        x1, y1, x2, y2 = (int(round(v)) for v in r["box"])
        cv2.rectangle(img, (x1, y1), (x2, y2), (160, 160, 160), 1)
    for d in detections:
        colour = _COLOURS[classes.index(d["class"]) % len(_COLOURS)] if d["class"] in classes else (255, 255, 255)
        x1, y1, x2, y2 = (int(round(v)) for v in d["box"])
        cv2.rectangle(img, (x1, y1), (x2, y2), colour, 2)
        cv2.putText(img, f"{d['class']} {d['score']:.2f}", (x1, max(10, y1 - 4)), cv2.FONT_HERSHEY_SIMPLEX, 0.4, colour, 1,
                    cv2.LINE_AA)
    return img


def save_png(path, rgb: np.ndarray) -> None:
    cv2.imwrite(str(path), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
