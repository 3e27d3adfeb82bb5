"""`vlora-va eval ADAPTER --on VIDEO...`: an adapter directory against teacher labels on held-out video.

This path deliberately shares nothing with training but the label rules: it loads the adapter from disk
with `adapters.load_adapter_dir`, folds the LoRA into a fresh backbone (W + scale·B·A, exactly what the
engine's merged mode serves) and runs the whole backbone on letterboxed frames. The reference labels
follow the protocol recorded in the adapter's head_config.json ("label_sources").

Beside those teacher-relative figures it scores the adapter against the human-checked set
(`adapters/eval/human-v1.json`, made and frozen as adapters/eval/README.md says) wherever the set has frames or
clips inside an evaluated range: detection P/R/F1@0.5 at the adapter's own threshold, AP50 and recall by box
height; per-person activity (matched by box IoU) for action adapters with a persons branch. The CenterNet
teacher can be scored on the same set (`evaluate_teacher_on_human`): the student's ceiling is the teacher only
where the teacher is right.

The teacher files are development assets, not in the repository: where one is missing (a fresh clone) the
teacher-relative figures are skipped, each range's report saying why ("teacher_missing"), and the human-checked
set, which needs no teacher, is still scored.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from vlora_va.engine.adapters import Adapter, fit_module_names, load_adapter_dir
from vlora_va.engine.backbones import linear_names, load_backbone, patch_size
from vlora_va.engine.heads import Features
from vlora_va.training.data import (
    activity_clips,
    detection_labels,
    frame_lookup,
    label_cache_dir,
    make_teacher,
    merge_labels,
    people_there,
    pick,
)
from vlora_va.training.features import full_hidden
from vlora_va.training.frames import TrainingFrame, iter_frames, letterboxed_batch
from vlora_va.training.metrics import (
    action_report,
    detection_report,
    human_detection_report,
    person_activity_iou_report,
    person_activity_report,
)
from vlora_va.training.spec import Range, SourceSpec, Spec
from vlora_va.training.teachers import frame_key

HUMAN_SET = Path(__file__).resolve().parents[2] / "adapters" / "eval" / "human-v1.json"
HUMAN_SET_SHA256 = "c929600b84f2835f28d328e0b97aed801e17a64577118976cc9d72759cc215e5"  # frozen 2026-11-23
# The second camera's human-checked vehicles (../shared/footage/traffic-a.mp4, 8.5-11.3 s): labels only, the footage
# is never shipped (adapters/eval/README.md)
TRAFFIC_SET = HUMAN_SET.with_name("human-traffic-a.json")
TRAFFIC_SET_SHA256 = "91ea9a398f00ec64a601b052abc13a6464e47a543c2b7bbb984b06a043d86061"  # frozen 2026-12-08
HUMAN_CLASSES = ["person", "car", "truck"]
TEACHER_LABEL_THRESHOLD = 0.4  # CenterNet boxes scoring at least this are labels in every shipped spec


def merged_backbone(backbone: str, adapter: Adapter) -> torch.nn.Module:
    model = load_backbone(backbone)
    with torch.no_grad():
        for name, (a, b) in fit_module_names(adapter.lora, linear_names(model)).items():
            model.get_submodule(name).weight += adapter.scale * (b @ a)
    return model


@torch.no_grad()
def features(model: torch.nn.Module, frames: list[TrainingFrame], side: int, batch: int = 8, keep_pixels: bool = False):
    """Features of frames at side px; keep_pixels also keeps the model input (a head's detail branch reads it)."""
    out_cls, out_grid, out_pixels, lbs = [], [], [], []
    for i in range(0, len(frames), batch):
        pixels, lb = letterboxed_batch(frames[i:i + batch], side)
        f = Features.from_hidden(full_hidden(model, pixels), side, patch_size(model))
        out_cls.append(f.cls)
        out_grid.append(f.grid)
        if keep_pixels:
            out_pixels.append(pixels)
        lbs += lb
    return Features(torch.cat(out_cls), torch.cat(out_grid), torch.cat(out_pixels) if keep_pixels else None), lbs


def sources_of(adapter: Adapter) -> list[SourceSpec]:
    """The adapter's label sources; a hand corrections file is named from the adapter's folder (runner._record_sources)."""
    sources = [SourceSpec(**s) for s in adapter.head_config.get("label_sources", [])]
    for s in sources:
        if s.options.get("corrections"):
            s.options = {**s.options, "corrections": str((adapter.path / s.options["corrections"]).resolve())}
    return sources


def detection_predictions(adapter: Adapter, model: torch.nn.Module, frames: list[TrainingFrame]) -> dict[str, list[dict]]:
    """{frame key: every detection scoring >= 0.05} (the full ranking AP needs; F1 is read at a threshold)."""
    side = int(adapter.head_config.get("image_size", 224))
    head = adapter.head
    feats, lbs = features(model, frames, side, keep_pixels=bool(head.detail))
    thr, head.score_threshold = head.score_threshold, 0.05
    try:
        preds = [[d.to_json() for d in image] for image in head.decode(head(feats), lbs, [f.size for f in frames])]
    finally:
        head.score_threshold = thr
    return {f.key: p for f, p in zip(frames, preds)}


def evaluate_detection_adapter(adapter: Adapter, backbone: str, frames: list[TrainingFrame], spec: Spec,
                               threshold: float | None = None, draw: Path | None = None,
                               model: torch.nn.Module | None = None) -> dict:
    sources = sources_of(adapter)
    refs = merge_labels(*(detection_labels(s, frames, spec) for s in sources))
    model = merged_backbone(backbone, adapter) if model is None else model
    head = adapter.head
    thr = head.score_threshold if threshold is None else threshold
    pred_map = detection_predictions(adapter, model, frames)
    preds = [pred_map[f.key] for f in frames]
    if draw is not None and frames:  # the middle frame, predictions at the adapter's threshold over grey teacher boxes
        from vlora_va.training.draw import annotate, save_png

        mid = len(frames) // 2
        shown = [p for p in preds[mid] if p["score"] >= thr]
        save_png(draw, annotate(frames[mid].rgb, shown, head.classes, [r for r in refs[frames[mid].key] if not r["ignore"]]))
    return {"per_class": detection_report(pred_map, refs, head.classes, thr), "threshold": thr, "frames": len(frames)}


def evaluate_action_adapter(adapter: Adapter, backbone: str, ranges: list[Range], spec: Spec,
                            model: torch.nn.Module | None = None) -> dict:
    side = int(adapter.head_config.get("image_size", 224))
    clips = [c for s in sources_of(adapter) for c in activity_clips(s, ranges, spec)]
    frames, idx = frame_lookup(clips)
    model = merged_backbone(backbone, adapter) if model is None else model
    head, clip_len = adapter.head, adapter.clip_len
    feats, lbs = features(model, frames, side, keep_pixels=bool(head.detail))
    pred = []
    for c in idx:
        raw = head(feats.select(torch.tensor(c)), clip_len)
        pred += [r.to_json() for r in head.decode(raw, [lbs[c[0]]], [frames[c[0]].size], [[frames[j].t for j in c]])]
    true = [c.label for c in clips]
    report = action_report([p["label"] for p in pred], true, head.labels)
    if head.persons:
        report["persons"] = person_activity_report([p["persons"] for p in pred], [c.persons for c in clips],
                                                   head.person_labels, head.score_threshold,
                                                   [people_there(c.frame_boxes) for c in clips])
    return report


def teacher_missing(adapter: Adapter, spec: Spec) -> str | None:
    """Why the adapter's teacher-relative labels cannot be made here (its message names the teacher file that is
    not there), or None when every teacher its label sources need is present."""
    for source in sources_of(adapter):
        if source.kind == "coco":  # a label file, no teacher
            continue
        try:
            make_teacher(source, spec)
        except FileNotFoundError as e:
            return str(e)
    return None


def range_name(r: Range) -> str:
    return f"{r.video.name}[{r.start:g}-{'end' if r.end is None else f'{r.end:g}'}]"


def evaluate_adapter(path: str | Path, ranges: list[Range], backbone: str = "dinov2-small",
                     teachers_dir: Path | None = None, cache_dir: Path | None = None, draw_dir: Path | None = None,
                     human: str | Path | None = None) -> dict:
    """Accuracy of one adapter directory on the given video ranges, one report per range; with `human` (a
    human-checked set file), also against that set's frames / clips inside each range (report key "human").
    Where a teacher file is missing, a range's report holds "teacher_missing" (why) instead of the
    teacher-relative figures."""
    hidden = load_backbone(backbone).config.hidden_size
    adapter = load_adapter_dir(Path(path).name, path, hidden)
    spec = Spec(name="eval", task=adapter.task, output=Path(path), backbone=backbone, teachers_dir=teachers_dir,
                cache_dir=cache_dir, clip_len=adapter.clip_len)
    hs = load_human_set(human) if human is not None else None
    missing = teacher_missing(adapter, spec)
    model = merged_backbone(backbone, adapter)
    reports = {}
    for r in ranges:
        t0 = time.monotonic()
        where = range_name(r)
        if missing:  # no teacher labels: only the human-checked set below scores this range
            reports[where] = {"teacher_missing": missing}
        elif adapter.task == "detection":
            from vlora_va.training.frames import read_frames

            draw = None if draw_dir is None else Path(draw_dir) / f"{r.video.stem}-{r.start:g}.png"
            reports[where] = evaluate_detection_adapter(adapter, backbone, read_frames(r.video, r.start, r.end, r.step),
                                                        spec, draw=draw, model=model)
        else:
            reports[where] = evaluate_action_adapter(adapter, backbone, [r], spec, model=model)
        if adapter.task == "detection":
            if hs is not None and hs.frame_keys(r):
                reports[where]["human"] = evaluate_detection_on_human(adapter, model, hs, r)
        elif hs is not None and adapter.head.persons and hs.clips_in(r):
            reports[where]["human"] = evaluate_persons_on_human(adapter, model, hs, r)
        reports[where]["seconds"] = round(time.monotonic() - t0, 1)
    out = {"adapter": str(path), "task": adapter.task, "reports": reports}
    if hs is not None:
        out["human_set"] = hs.describe()
    return out


# --- the human-checked set ------------------------------------------------------------------------------------

@dataclass
class HumanSet:
    """The human-checked evaluation set: boxes per frame and labelled persons per 1-s clip (adapters/eval/)."""

    path: Path
    sha256: str
    boxes: dict[str, list[dict]]  # frame key -> [{"box": x1y1x2y2, "class", "ignore"}]
    times: dict[str, tuple[str, float]]  # frame key -> (video stem, media time)
    clips: list[dict]  # {"video", "start", "end", "persons": [{"box", "label"} or {"box", "ignore": True}]}
    activities: list[str]

    def frame_keys(self, r: Range) -> list[str]:
        """The set's frames inside the range (same video, start <= t < end), in time order."""
        keys = [k for k, (v, t) in self.times.items() if v == r.video.stem and r.holds(t)]
        return sorted(keys, key=lambda k: self.times[k][1])

    def clips_in(self, r: Range) -> list[dict]:
        """The set's clips lying wholly inside the range."""
        return [c for c in self.clips if c["video"] == r.video.stem and r.holds(c["start"])
                and (r.end is None or c["end"] <= r.end + 1e-6)]

    def describe(self) -> dict:
        return {"path": str(self.path), "sha256": self.sha256, "frozen": self.sha256 == HUMAN_SET_SHA256}


def load_human_set(path: str | Path = HUMAN_SET) -> HumanSet:
    """Parse the set's COCO JSON (images named by video + media time; `ignore`/`iscrowd` boxes are don't-care) and
    its `activity_clips` extension."""
    raw = Path(path).read_bytes()
    data = json.loads(raw)
    cats = {c["id"]: c["name"] for c in data["categories"]}
    images = {img["id"]: img for img in data["images"]}
    keys = {i: frame_key(img["video"], float(img["t"])) for i, img in images.items()}
    boxes: dict[str, list[dict]] = {k: [] for k in keys.values()}
    for a in data["annotations"]:
        x, y, w, h = a["bbox"]
        boxes[keys[a["image_id"]]].append({"box": [x, y, x + w, y + h], "class": cats[a["category_id"]],
                                           "ignore": bool(a.get("ignore") or a.get("iscrowd"))})
    clips = [{"video": c["video"], "start": float(c["start"]), "end": float(c["end"]),
              "persons": [{"box": p["box"], "ignore": True} if p["ignore"] else
                          {"box": p["box"], "label": p["activity"]} for p in c["persons"]]}
             for c in data.get("activity_clips", [])]
    return HumanSet(Path(path), hashlib.sha256(raw).hexdigest(), boxes,
                    {keys[i]: (img["video"], float(img["t"])) for i, img in images.items()}, clips,
                    list(data.get("activities", [])))


def human_frames(hs: HumanSet, r: Range) -> list[TrainingFrame]:
    """The decoded frames of the set inside the range (decoded once, kept only where the set has labels)."""
    keys = set(hs.frame_keys(r))
    if not keys:
        return []
    last = max(hs.times[k][1] for k in keys)
    return [f for f in iter_frames(r.video, r.start, last + 1e-3) if f.key in keys]


def human_clip_frames(hs: HumanSet, r: Range, clip_len: int) -> tuple[list[dict], list[list[TrainingFrame]]]:
    """The set's clips inside the range and, per clip, the `clip_len` frames an adapter sees of its 1-s window
    (spread as in training and `vlora-va eval`: data.pick). Only the picked frames stay decoded."""
    clips = sorted(hs.clips_in(r), key=lambda c: c["start"])
    if not clips:
        return [], []
    window: list[list[TrainingFrame]] = [[] for _ in clips]
    for f in iter_frames(r.video, clips[0]["start"], max(c["end"] for c in clips)):
        for i, c in enumerate(clips):
            if c["start"] - 1e-6 <= f.t < c["end"] - 1e-6:
                window[i].append(f)
    picked = [[w[j] for j in pick(len(w), clip_len)] for w in window]
    return clips, picked


def evaluate_detection_on_human(adapter: Adapter, model: torch.nn.Module, hs: HumanSet, r: Range) -> dict:
    """The adapter against the human boxes of the range's frames, at its own (validation-picked) threshold."""
    frames = human_frames(hs, r)
    preds = detection_predictions(adapter, model, frames)
    thr = adapter.head.score_threshold
    refs = {f.key: hs.boxes[f.key] for f in frames}
    return {"per_class": human_detection_report(preds, refs, adapter.head.classes, thr), "threshold": thr,
            "frames": len(frames)}


def evaluate_persons_on_human(adapter: Adapter, model: torch.nn.Module, hs: HumanSet, r: Range) -> dict:
    """Per-person activity of an action adapter with a persons branch on the set's clips inside the range."""
    clips, picked = human_clip_frames(hs, r, adapter.clip_len)
    side = int(adapter.head_config.get("image_size", 224))
    head, preds = adapter.head, []
    for frames in picked:
        feats, lbs = features(model, frames, side, keep_pixels=bool(head.detail))
        result = head.decode(head(feats, adapter.clip_len), [lbs[0]], [frames[0].size], [[f.t for f in frames]])[0]
        preds.append([p.to_json() for p in result.persons or ()])
    return human_persons_report(preds, [c["persons"] for c in clips], head)


def human_persons_report(preds: list[list[dict]], refs: list[list[dict]], head) -> dict:
    """Predicted persons of clips (at the head's threshold) against the human-checked persons of the same clips:
    the IoU-0.5 report, its clip count, and the headline figures at IoU >= 0.3."""
    report = person_activity_iou_report(preds, refs, head.person_labels, head.score_threshold)
    report["clips"] = len(refs)
    # the same at IoU >= 0.3: how much of the gap is where the person box is rather than which activity
    loose = person_activity_iou_report(preds, refs, head.person_labels, head.score_threshold, iou=0.3)
    report["at_iou_0.3"] = {k: loose[k] for k in ("top1", "top1_found", "recall", "precision")}
    return report


def evaluate_teacher_on_human(hs: HumanSet, ranges: list[Range], teachers_dir: Path | None = None,
                              cache_dir: Path | None = None, threshold: float = TEACHER_LABEL_THRESHOLD,
                              tiles: int = 1, persons: bool = True, teacher_name: str = "centernet",
                              weights: dict | None = None) -> dict:
    """The CenterNet teacher against the human boxes, read at the score above which its boxes are labels (its AP50
    ranks every box it gives, score >= 0.1); and, where the set has activity clips, the activity labels the
    teacher's tracking rule (actions.py, the `activity` source of the action specs) gives each person, matched
    to the human persons like an adapter's ("human_persons"): how right the action adapters' training labels are."""
    from vlora_va.training.teachers import detector_teacher

    teacher = detector_teacher(teacher_name, teachers_dir, HUMAN_CLASSES, 0.1, tiles, weights)
    spec = Spec(name="eval", task="detection", output=Path("."), cache_dir=cache_dir, teachers_dir=teachers_dir)
    reports = {}
    for r in ranges:
        frames = human_frames(hs, r)
        clips = hs.clips_in(r) if persons else []
        if not frames and not clips:
            continue
        t0 = time.monotonic()
        rep: dict = {}
        if frames:
            preds = teacher.label(frames, label_cache_dir(spec), progress=False)
            refs = {f.key: hs.boxes[f.key] for f in frames}
            rep["human"] = {"per_class": human_detection_report(preds, refs, HUMAN_CLASSES, threshold),
                            "threshold": threshold, "frames": len(frames)}
        if clips:
            rep["human_persons"] = _teacher_rule_persons(clips, r, spec)
        rep["seconds"] = round(time.monotonic() - t0, 1)
        reports[range_name(r)] = rep
    return {"adapter": f"teacher:{teacher_name} ({teacher.cache_name})", "task": "detection", "reports": reports,
            "human_set": hs.describe()}


def _teacher_rule_persons(clips: list[dict], r: Range, spec: Spec) -> dict:
    """The tracking rule's persons (every person tracked through the 1-s window, its mean box and activity) on
    the set's clips, scored like an adapter's persons (they all have score 1)."""
    from vlora_va.training.actions import PERSON_ACTIVITIES

    source = SourceSpec(name="activity", kind="activity", score_threshold=TEACHER_LABEL_THRESHOLD)
    starts = sorted({c["start"] for c in clips})
    if all(abs((s - starts[0]) - round(s - starts[0])) < 1e-6 for s in starts):  # one decode for a 1-s grid
        ranged = [Range(r.video, starts[0], max(c["end"] for c in clips), 1.0)]
    else:
        ranged = [Range(r.video, s, s + 1.0, 1.0) for s in starts]
    made = {(c.video, round(c.start, 3)): c for c in activity_clips(source, ranged, spec, progress=False)}
    preds = [[{"box": p["box"], "score": 1.0, "activity": p["label"]}
              for p in made[(c["video"], round(c["start"], 3))].persons] for c in clips]
    report = person_activity_iou_report(preds, [c["persons"] for c in clips], PERSON_ACTIVITIES, 0.5)
    report["clips"] = len(clips)
    return report
