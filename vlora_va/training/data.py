"""From a spec's sources and video ranges to labelled frames (detection) and labelled clips (action)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vlora_va.ingest.chunker import spread
from vlora_va.training.actions import main_subject, person_activities
from vlora_va.training.corrections import apply_fix, load_corrections
from vlora_va.training.frames import TrainingFrame, iter_frames, read_frames
from vlora_va.training.spec import Range, SourceSpec, Spec
from vlora_va.training.teachers import (
    HaarTeacher,
    HogPeopleTeacher,
    Teacher,
    default_cache_dir,
    detector_teacher,
    load_clip_manifest,
    load_coco_json,
)


def label_cache_dir(spec: Spec) -> Path:
    return spec.cache_dir / "labels" if spec.cache_dir else default_cache_dir()


def make_teacher(source: SourceSpec, spec: Spec) -> Teacher:
    """The detector behind a source, filtering at `ignore_below` (weaker boxes are dropped entirely)."""
    o = source.options
    if source.kind in ("centernet", "nanodet", "fused", "activity"):
        classes = source.classes or None
        if source.kind == "activity":
            classes = ["person", "bicycle", "motorcycle"]
        name = "centernet" if source.kind == "activity" else source.kind
        return detector_teacher(name, spec.teachers_dir, classes, source.ignore_below, int(o.get("tiles", 1)),
                                o.get("weights"), o.get("path"))
    if source.kind == "hog":
        return HogPeopleTeacher(upscale=float(o.get("upscale", 1.5)), score_threshold=source.ignore_below)
    if source.kind == "haar":
        cls = source.classes[0] if source.classes else "person"
        return HaarTeacher(o.get("cascade", "haarcascade_fullbody.xml"), cls, float(o.get("scale_factor", 1.1)),
                           int(o.get("min_neighbors", 3)))
    raise ValueError(f"source {source.name!r}: kind {source.kind!r} has no teacher")


def mark_ignore(labels: list[dict], source: SourceSpec) -> list[dict]:
    """Boxes below the source's score threshold or min height become "don't care" regions."""
    out = []
    for lab in labels:
        h = lab["box"][3] - lab["box"][1]
        out.append({**lab, "ignore": lab["score"] < source.score_threshold or h < source.min_height})
    return out


def frames_of(ranges: list[Range]) -> list[TrainingFrame]:
    return [f for r in ranges for f in read_frames(r.video, r.start, r.end, r.step)]


def detection_labels(source: SourceSpec, frames: list[TrainingFrame], spec: Spec, progress: bool = True) -> dict[str, list[dict]]:
    """{frame key: labels of this source's classes, with ignore flags}."""
    if source.kind == "coco":
        data = load_coco_json(Path(source.options["path"]), source.classes or None)
        return {f.key: mark_ignore(data.get(f.key, []), source) for f in frames}
    teacher = make_teacher(source, spec)
    raw = teacher.label(frames, label_cache_dir(spec), progress=progress)
    if source.kind == "hog" and source.classes:  # HOG finds people; the source may name them (e.g. person_hog)
        raw = {k: [{**lab, "class": source.classes[0]} for lab in v] for k, v in raw.items()}
    labels = {k: mark_ignore(v, source) for k, v in raw.items()}
    if source.options.get("corrections"):  # hand fixes on some frames (and their crops) replace the teacher there
        fixes = load_corrections(source.options["corrections"])
        for f in frames:
            fix = fixes.fix_for(f)
            if fix is not None:
                labels[f.key] = apply_fix(labels[f.key], f, fix, fixes.cls, source.min_height)
    return labels


def merge_labels(*per_source: dict[str, list[dict]]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for labels in per_source:
        for k, v in labels.items():
            out.setdefault(k, []).extend(v)
    return out


@dataclass
class LabelledClip:
    video: str
    start: float
    frames: list[TrainingFrame]  # the clip_len frames the model sees
    label: str  # the main subject's activity (actions.py)
    info: dict
    persons: list[dict] = field(default_factory=list)  # every labelled person: activity + mean box (original px)
    seen: list[list[float]] = field(default_factory=list)  # every teacher person box in the window: don't-care areas
    frame_boxes: list[list[list[float]]] = field(default_factory=list)  # per frame of `frames`: teacher person boxes


def people_there(frame_boxes: list[list[list[float]]]) -> list[list[float]]:
    """A clip's confident teacher person boxes over the frames the model sees: people who are there, whether or not
    the label rule kept them as persons (metrics.person_activity_report's dont_care)."""
    return [b for boxes in frame_boxes for b in boxes]


def pick(n: int, k: int) -> list[int]:
    """k indices of n frames, exactly as a serving task takes its frames from a chunk (streams.chunker.spread);
    fewer frames than k: the last one repeats."""
    return list(spread(n, k)) if n >= k else [min(i, n - 1) for i in range(k)]


def activity_clips(source: SourceSpec, ranges: list[Range], spec: Spec, progress: bool = True) -> list[LabelledClip]:
    """1-s clips every `step` seconds (default 1) of each range, labelled by the tracking rule in actions.py."""
    teacher = make_teacher(source, spec)
    clips = []
    for r in ranges:
        frames = list(iter_frames(r.video, r.start, r.end))  # every frame: the tracker needs them all
        labels = teacher.label(frames, label_cache_dir(spec), progress=progress)
        fps = 1.0 / float(np.median(np.diff([f.t for f in frames])))
        step = r.step or 1.0
        t0 = r.start
        while frames and t0 + 1.0 <= frames[-1].t + 1e-3 + 1 / fps:
            window = [f for f in frames if t0 - 1e-6 <= f.t < t0 + 1.0 - 1e-6]
            if len(window) >= 2:
                boxes = [labels[f.key] for f in window]
                people = person_activities(boxes, fps, min_score=source.score_threshold)
                info = main_subject(people)
                seen = [b["box"] for f in boxes for b in f if b["class"] == "person"]
                picked = pick(len(window), spec.clip_len)
                frame_boxes = [[b["box"] for b in boxes[i]
                                if b["class"] == "person" and b["score"] >= source.score_threshold] for i in picked]
                clips.append(LabelledClip(window[0].video, t0, [window[i] for i in picked], info.pop("label"), info, people,
                                  seen, frame_boxes))
            t0 = round(t0 + step, 6)
        del frames  # only the clips' frames keep their pixels
    return clips


def manifest_clips(source: SourceSpec, ranges: list[Range], spec: Spec) -> list[LabelledClip]:
    """Clips from a JSON-Lines manifest, restricted to the given ranges' videos and times."""
    clips = []
    for c in load_clip_manifest(Path(source.options["path"])):
        for r in ranges:
            if r.video.stem == c["video"] and c["start"] >= r.start and (r.end is None or c["end"] <= r.end):
                frames = read_frames(r.video, c["start"], c["end"])
                clips.append(LabelledClip(c["video"], c["start"], [frames[i] for i in pick(len(frames), spec.clip_len)],
                                  c["label"], {}))
    return clips


def frame_lookup(clips: list[LabelledClip]) -> tuple[list[TrainingFrame], list[list[int]]]:
    """Unique frames of the clips (for feature caching) and each clip's indices into them."""
    index: dict[str, int] = {}
    frames: list[TrainingFrame] = []
    per_clip = []
    for c in clips:
        ids = []
        for f in c.frames:
            if f.key not in index:
                index[f.key] = len(frames)
                frames.append(f)
            ids.append(index[f.key])
        per_clip.append(ids)
    return frames, per_clip

