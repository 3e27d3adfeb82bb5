"""Hand corrections of a teacher's boxes on named training and validation frames.

The teacher's labels stand everywhere except where a person looked at a frame and fixed them, above all two
people walking side by side that the teacher gave one box (or one of them none). On a corrected frame the
listed teacher boxes are dropped and the hand-drawn boxes added. The zoomed-in crops of that frame
(augment.zoom_views) get the same fix, mapped into the crop: the teacher labels each crop itself, and would
otherwise bring a merged box back there.

File (JSON; `adapters/labels/README.md` says how ours was made):

    {"video": "pedestrians", "class": "person",
     "frames": {"12.5": {"remove": [[x1, y1, x2, y2], ...],   # teacher boxes, as the teacher gave them
                         "add": [[...], ...],                 # hand-drawn boxes (labels)
                         "add_ignore": [[...], ...],          # hand-drawn "don't care" regions
                         "note": "..."},
                "13.0": {}}}                                  # looked at, nothing to fix

Boxes are [x1, y1, x2, y2] in original-frame pixels; frame times are seconds (the frame's pts).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from vlora_va.contracts.boxes import pair_iou
from vlora_va.training.augment import crop_window
from vlora_va.training.frames import TrainingFrame

REMOVE_IOU = 0.9  # a "remove" entry names one teacher box of the whole frame, copied from the teacher's output
CROP_MATCH_IOU = 0.4  # on a crop the teacher sees people larger: its box for a fixed person is only near ours
CROP_KEEP_SHARE = 0.5  # a hand box cut by a crop's edge stays a label if this share of it is inside, else "don't care"


class CorrectionsError(ValueError):
    """A corrections file that cannot be used; the message names the file, frame and entry."""


@dataclass(frozen=True)
class Fix:
    remove: tuple[tuple[float, ...], ...] = ()
    add: tuple[tuple[float, ...], ...] = ()
    add_ignore: tuple[tuple[float, ...], ...] = ()


@dataclass(frozen=True)
class Corrections:
    video: str
    cls: str
    frames: dict[float, Fix]  # media time (s) -> the fix of that frame

    def fix_for(self, frame: TrainingFrame) -> Fix | None:
        if frame.video != self.video:
            return None
        return self.frames.get(round(frame.t, 3))


def _box(raw, where: str) -> tuple[float, ...]:
    if not (isinstance(raw, list) and len(raw) == 4 and all(isinstance(v, (int, float)) for v in raw)):
        raise CorrectionsError(f"{where}: expected a box [x1, y1, x2, y2], got {raw!r}")
    x1, y1, x2, y2 = (float(v) for v in raw)
    if not (x2 > x1 and y2 > y1):
        raise CorrectionsError(f"{where}: box {raw!r} has no area (x2 <= x1 or y2 <= y1)")
    return x1, y1, x2, y2


def load_corrections(path: str | Path) -> Corrections:
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CorrectionsError(f"{path}: {e}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("frames"), dict):
        raise CorrectionsError(f"{path}: expected an object with 'video', 'class' and 'frames'")
    for key in ("video", "class"):
        if not isinstance(raw.get(key), str):
            raise CorrectionsError(f"{path}: '{key}' must be a string")
    frames: dict[float, Fix] = {}
    for t, entry in raw["frames"].items():
        try:
            time = round(float(t), 3)
        except ValueError:
            raise CorrectionsError(f"{path}: frame {t!r} is not a time in seconds") from None
        if not isinstance(entry, dict) or set(entry) - {"remove", "add", "add_ignore", "note"}:
            raise CorrectionsError(f"{path}: frame {t}: expected remove / add / add_ignore / note, got {entry!r}")
        frames[time] = Fix(*(tuple(_box(b, f"{path}: frame {t} {part}[{i}]") for i, b in enumerate(entry.get(part, [])))
                             for part in ("remove", "add", "add_ignore")))
    return Corrections(raw["video"], raw["class"], frames)


def _label(box, cls: str, ignore: bool) -> dict:
    return {"box": [float(v) for v in box], "class": cls, "score": 1.0, "ignore": ignore, "hand": True}


def apply_fix(labels: list[dict], frame: TrainingFrame, fix: Fix, cls: str, min_height: float = 0.0) -> list[dict]:
    """`labels` (one source's labels of `frame`, with ignore flags) with the hand fix applied.

    Whole frame: each "remove" box must match one teacher box of `cls` (IoU >= REMOVE_IOU), or the file was
    made against other labels and a CorrectionsError says which. A crop of the frame: teacher boxes of `cls`
    near a removed or added box (IoU >= CROP_MATCH_IOU, in crop pixels) are dropped and the hand boxes added,
    cut to the crop. Hand boxes shorter than `min_height` become "don't care", like the teacher's."""
    window = crop_window(frame.view)
    if frame.view and window is None:
        raise CorrectionsError(f"{frame.key}: no hand fix for a view of kind {frame.view!r}")
    x0, y0, w, h = window or (0, 0, *frame.size)

    def moved(b):
        return [b[0] - x0, b[1] - y0, b[2] - x0, b[3] - y0]

    def cut(b):
        return [min(max(b[0], 0), w), min(max(b[1], 0), h), min(max(b[2], 0), w), min(max(b[3], 0), h)]

    kept = list(labels)
    if window is None:
        for b in fix.remove:
            hits = [lab for lab in kept if lab["class"] == cls and pair_iou(lab["box"], b) >= REMOVE_IOU]
            if not hits:
                raise CorrectionsError(f"{frame.key}: remove {list(b)}: no {cls} box of the teacher there (made "
                                       "against other labels?)")
            kept = [lab for lab in kept if lab is not hits[0]]
    else:
        near = [cut(moved(b)) for b in fix.remove + fix.add + fix.add_ignore]
        kept = [lab for lab in kept
                if lab["class"] != cls or all(pair_iou(lab["box"], b) < CROP_MATCH_IOU for b in near)]
    for boxes, ignore in ((fix.add, False), (fix.add_ignore, True)):
        for b in boxes:
            inside = cut(moved(b))
            area, full = (inside[2] - inside[0]) * (inside[3] - inside[1]), (b[2] - b[0]) * (b[3] - b[1])
            if area <= 0:
                continue
            small = inside[3] - inside[1] < min_height
            kept.append(_label(inside, cls, ignore or small or area < CROP_KEEP_SHARE * full))
    return kept
