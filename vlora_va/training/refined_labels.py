"""Labels better than any single teacher's frame, from what a fixed camera gives for free.

The teachers (CenterNet, NanoDet: teachers.py) see one frame at a time through a fixed square input, and their
usual reading (one class at a time, score >= 0.4) fits the camera they were made for. Each step below uses one more
thing the camera says. Every step was measured against the human boxes of both human-checked sets
(bench/label_steps.py, docs/adapters-and-training.md#refined-labels); the steps that did not help there are not here.

    shape     each teacher on the whole frame (stretched to its square input, as before) and on the frame letterboxed
              into that square with its aspect kept: a wide frame squeezed into a square distorts every object, and
              the two looks are fused like four teachers (label_fusion.fuse_boxes)
    scale     2 x 2 tiles only where the objects are small (object_scale measures their height first; under
              SMALL_OBJECTS of the frame): on traffic-a's large cars tiles cut them apart (the fit's labels before
              refinement, with tiles: recall 0.28), and on the surveillance camera's people (about 12% of the frame
              high) they added nothing (person F1 0.959 -> 0.954)
    classes   the vehicle classes fused as one group (label_classes): from above, one car is split between car, truck
              and bus at low scores; the adapter's class is the one the teachers' votes favour
    motion    a fixed camera has a background (the median of frames spread over the footage): a box the teachers
              score between IGNORE_BELOW and KEEP is a label where most of it moves (MOVING of its pixels), else a
              don't-care region. The teachers score cars seen from above at 0.15-0.37, and the parked rock or sign a
              walker's camera sees at 0.2-0.4: motion tells the two apart
    human     boxes a person gave for a frame replace the teachers' there (fit.py: `--human`)

Measured and left out (bench/label_steps.py, 2026-12-08): the mirrored frame as a third look (vehicle F1 +0.009 on
traffic-a, person F1 -0.002 on the surveillance camera, for two more teacher runs a frame), linking boxes over
neighbouring frames to drop one-frame flickers (+0.000 and +0.002: little is left to drop once motion decides the weak
boxes, and it needs the teachers on the neighbours too) and filling one-frame gaps between linked boxes (-0.058 and
-0.034: it adds boxes where an object had passed).

A label is a dict as everywhere in training: {"box", "class", "score", "ignore"}; `ignore` marks a box too weak to be
a label but too strong to call background: training leaves it out (as it always left the teachers' 0.2-0.4 boxes out),
and as a reference it is a don't-care region (neither a hit nor a miss).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np

from vlora_va.training.frames import TrainingFrame
from vlora_va.training.label_classes import TO_ADAPTER, adapter_class, group_of
from vlora_va.training.label_fusion import fuse_boxes
from vlora_va.training.teachers import DetectorTeacher, LabelCache, default_cache_dir, merge_tiled, nms, tile_grid

KEEP = 0.4  # a fused box at or above this is a label (the fit's teacher threshold before refinement)
IGNORE_BELOW = 0.2  # under this a box is background; from it up to KEEP: a label where it moves, else don't care
MOVING = 0.5  # share of a box's pixels that differ from the background for it to count as moving
DIFF = 25  # grey levels a pixel differs from the background by to be foreground
BACKGROUND_FRAMES = 60  # frames spread over the footage whose median is the background
SMALL_OBJECTS = 0.06  # median object height / frame height under which the teachers also look at 2 x 2 tiles
MIN_HEIGHT = 12  # pixels: a smaller box is a don't-care region (as the fit's teacher source had it)
PLAIN_READING = 0.3  # the teachers' usual threshold, for the unrefined labels a report compares with
VIEWS = ("whole", "letterboxed")


@dataclass
class RefineOptions:
    classes: list[str]  # the adapter's classes (e.g. person, car, truck)
    tiles: str | int = "auto"  # "auto": where objects are small (object_scale); 1: never; 2: always
    motion: bool = True
    human: dict[str, list[dict]] = field(default_factory=dict)  # frame key -> a person's boxes (replace the teachers)


class TeacherViews:
    """Each teacher's raw boxes (all classes, score >= 0.1) on a frame seen whole, letterboxed, or in 2 x 2 tiles,
    cached per frame on disk like any teacher's (teachers.LabelCache): a second fit of the same footage labels nothing
    again."""

    def __init__(self, teachers: list[DetectorTeacher], cache_dir: Path | None = None):
        self.teachers = teachers
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
        self._caches: dict[str, LabelCache] = {}

    def raw(self, frame: TrainingFrame, teacher: DetectorTeacher, view: str) -> list[dict]:
        name = f"{teacher.cache_name}-{view}"
        cache = self._caches.setdefault(name, LabelCache(self.cache_dir, name))
        found = cache.get(frame)
        if found is None:
            found = detect_view(frame.rgb, teacher, view)
            cache.put(frame, found)
        return found

    def save(self) -> None:
        for cache in self._caches.values():
            cache.save()


def detect_view(rgb: np.ndarray, teacher: DetectorTeacher, view: str) -> list[dict]:
    """One teacher's boxes (frame pixels) on one view of the frame."""
    h, w = rgb.shape[:2]
    if view == "whole":
        return nms(teacher._detect(rgb), teacher.nms_iou)
    if view == "letterboxed":  # centred in a square of its longer side: the network's square input keeps its shape
        side = max(w, h)
        x0, y0 = (side - w) // 2, (side - h) // 2
        square = np.zeros((side, side, 3), np.uint8)
        square[y0:y0 + h, x0:x0 + w] = rgb
        out = []
        for lab in teacher._detect(square):
            b = lab["box"]
            box = [round(min(max(v - off, 0.0), lim), 1) for v, off, lim in zip(b, (x0, y0, x0, y0), (w, h, w, h))]
            if box[2] - box[0] > 2 and box[3] - box[1] > 2:  # not a box in the padding
                out.append({**lab, "box": box})
        return nms(out, teacher.nms_iou)
    if view == "tiles":
        tiled = []
        for x0, y0, x1, y1 in tile_grid(w, h, 2):
            found = teacher._detect(np.ascontiguousarray(rgb[y0:y1, x0:x1]))
            tiled.append(((x0, y0, x1, y1), [{**lab, "box": [round(v + (x0, y0)[i % 2], 1)
                                                             for i, v in enumerate(lab["box"])]} for lab in found]))
        return merge_tiled(teacher._detect(rgb), tiled, (w, h), teacher.nms_iou)
    raise ValueError(f"teacher view {view!r}: expected whole, letterboxed or tiles")


def object_scale(views: TeacherViews, frames: list[TrainingFrame], sample: int = 12) -> float:
    """The median height of the teachers' confident boxes (score >= KEEP), over the frame's height, on up to `sample`
    frames spread over `frames`; 0 where they found nothing."""
    picked = frames[:: max(1, len(frames) // sample)][:sample]
    heights = [(lab["box"][3] - lab["box"][1]) / f.rgb.shape[0] for f in picked for t in views.teachers
               for lab in views.raw(f, t, "whole") if lab["score"] >= KEEP]
    return float(np.median(heights)) if heights else 0.0


def background(frames: list[TrainingFrame]) -> np.ndarray | None:
    """The camera's background: the per-pixel median grey level of up to BACKGROUND_FRAMES frames spread over the
    footage (None for fewer than 5 frames, or frames of different sizes)."""
    picked = frames[:: max(1, len(frames) // BACKGROUND_FRAMES)][:BACKGROUND_FRAMES]
    if len(picked) < 5 or len({f.rgb.shape for f in picked}) > 1:
        return None
    return np.median(np.stack([cv2.cvtColor(f.rgb, cv2.COLOR_RGB2GRAY) for f in picked]), axis=0).astype(np.float32)


def moving_mask(rgb: np.ndarray, bg: np.ndarray) -> np.ndarray:
    """uint8 [H, W], 1 where the frame differs from the background (small specks opened away, edges dilated)."""
    diff = np.abs(cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY).astype(np.float32) - bg) > DIFF
    mask = cv2.morphologyEx(diff.astype(np.uint8), cv2.MORPH_OPEN, np.ones((3, 3), np.uint8))
    return cv2.dilate(mask, np.ones((5, 5), np.uint8))


def moving_share(mask: np.ndarray, box: list[float]) -> float:
    x1, y1, x2, y2 = (int(round(v)) for v in box)
    part = mask[max(y1, 0):max(y2, y1 + 1), max(x1, 0):max(x2, x1 + 1)]
    return float(part.mean()) if part.size else 0.0


class RefinedLabeller:
    """The recipe above for one camera's frames: `label(frames)` -> {frame key: labels}. `footage`: the camera's
    frames the background is made from (the whole footage given, not only the frames labelled)."""

    def __init__(self, teachers: list[DetectorTeacher], opts: RefineOptions, footage: list[TrainingFrame],
                 cache_dir: Path | None = None):
        self.views = TeacherViews(teachers, cache_dir)
        self.opts = opts
        self.scale = object_scale(self.views, footage)
        self.tiles = (opts.tiles == 2) or (opts.tiles == "auto" and 0 < self.scale < SMALL_OBJECTS)
        self.bg = background(footage) if opts.motion else None

    @property
    def recipe(self) -> dict:
        """What made the labels (a fit's report and its training run's identity)."""
        return {"views": [*VIEWS, *(["tiles"] if self.tiles else [])], "vehicle_group": True,
                "motion": self.bg is not None, "keep": KEEP, "ignore_below": IGNORE_BELOW, "moving": MOVING,
                "object_scale": round(self.scale, 3)}

    def fused(self, frame: TrainingFrame) -> list[dict]:
        """Every look of every teacher at the frame, vehicle classes as one group, fused (score >= 0.1 boxes)."""
        per = {}
        for t in self.views.teachers:
            for view in (*VIEWS, *(["tiles"] if self.tiles else [])):
                labs = [{**lab, "coco": lab["class"], "class": group_of(lab["class"])}
                        for lab in self.views.raw(frame, t, view) if lab["score"] >= 0.1]
                per[f"{t.name}/{view}"] = nms(labs, 0.6)  # one look's car and truck on one vehicle: one box
        return fuse_boxes(per)

    def _adapter_labels(self, frame: TrainingFrame, fused: list[dict]) -> list[dict]:
        """Fused boxes in the adapter's classes, each a label, a don't-care region, or dropped."""
        mask = moving_mask(frame.rgb, self.bg) if self.bg is not None and frame.rgb.shape[:2] == self.bg.shape else None
        out = []
        for lab in fused:
            if lab["score"] < IGNORE_BELOW:
                continue
            cls = adapter_class(self._votes(frame, lab), self.opts.classes)
            if cls is None:
                continue
            moving = mask is not None and moving_share(mask, lab["box"]) >= MOVING
            small = lab["box"][3] - lab["box"][1] < MIN_HEIGHT
            label = (lab["score"] >= KEEP or moving) and not small
            out.append({"box": lab["box"], "class": cls, "score": lab["score"], "ignore": not label,
                        **({"moving": True} if moving else {})})
        return out

    def _votes(self, frame: TrainingFrame, fused_box: dict) -> dict[str, float]:
        """{COCO class: summed score} of the raw boxes behind a fused box (by overlap, within its group)."""
        from vlora_va.contracts.boxes import pair_iou

        votes: dict[str, float] = {}
        for t in self.views.teachers:
            for view in VIEWS:
                for lab in self.views.raw(frame, t, view):
                    if group_of(lab["class"]) == fused_box["class"] and pair_iou(lab["box"], fused_box["box"]) >= 0.55:
                        votes[lab["class"]] = votes.get(lab["class"], 0.0) + lab["score"]
        return votes or {fused_box["class"]: fused_box["score"]}

    def teacher_labels(self, frame: TrainingFrame) -> list[dict]:
        """The refined labels of a frame from the teachers alone (a person's boxes for it left aside)."""
        return self._adapter_labels(frame, self.fused(frame))

    def plain_teachers(self, frame: TrainingFrame) -> list[dict]:
        """What the teachers say without refinement, for comparison: both fused per class on the whole frame, read at
        their usual PLAIN_READING (the fit's labels before 2026-12-08, less its tiles)."""
        per = {t.name: [lab for lab in self.views.raw(frame, t, "whole") if lab["score"] >= 0.1]
               for t in self.views.teachers}
        return [{**lab, "class": TO_ADAPTER.get(lab["class"], lab["class"]), "ignore": False} for lab in fuse_boxes(per)
                if lab["score"] >= PLAIN_READING and TO_ADAPTER.get(lab["class"], lab["class"]) in self.opts.classes]

    def label(self, frames: list[TrainingFrame]) -> dict[str, list[dict]]:
        """{frame key: labels}: a person's boxes where given, else the refined labels."""
        out = {}
        for f in frames:
            if f.key in self.opts.human:
                out[f.key] = [{**h, "score": 1.0, "ignore": bool(h.get("ignore")), "human": True}
                              for h in self.opts.human[f.key] if h["class"] in self.opts.classes or h.get("ignore")]
            elif f.key not in out:
                out[f.key] = self.teacher_labels(f)
        self.views.save()
        return out
