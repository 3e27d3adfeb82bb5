"""`vlora-va adapters fit SOURCE --task detect --out DIR`: one camera's own detection adapter, in one command, kept
only where it is better than the adapter it started from.

  footage (a file, a time range of it, or --minutes of a live stream)
    → refused up front where it is too short (MIN_FOOTAGE_S)
    → time split: train [0, 70%) · validation [70%, 80%) · held out [80%, 100%]; a `--human` frame in the
      training part is a click (its boxes are labels, repeated HUMAN_REPEAT times), one later is for evaluation
      (nothing within 1 s of it is trained on)
    → diverse training frames (frame_picking.pick_diverse), none within 1 s of a human-checked evaluation frame
    → refined labels (refined_labels.py: the teachers' two looks, the vehicle group, motion against the background)
    → refused where the training frames hold fewer than MIN_OBJECTS objects, or the held-out part fewer than
      MIN_HELD_OUT_OBJECTS references
    → LoRA + head trained starting from the adapter it fits from (its LoRA and head, same shapes)
    → score threshold and NMS chosen on the validation part
    → the guard (fit_guard.py) on the held-out part: the start and the fitted adapter against human boxes where given,
      else the refined labels; the fitted one is written only where it is better beyond the noise
    → the adapter directory, with FIT.json and README.md: what it saw, its labels' worth against human boxes, the
      guard's verdict with both scores, time and CPU; or, refused, OUT.refused.json beside it and exit status 3
      (`--keep-anyway` writes the adapter, marked so; `--serve` refuses it)

Held-out figures are on the camera's last 20 %, which training never saw: the report is an honest estimate for
this camera, not for others.
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path

from vlora_va.common.host import cpu_name
from vlora_va.training.frame_picking import (
    LEAK_MARGIN_S,
    away_from,
    candidates,
    pick_diverse,
    shipped_human_times,
)
from vlora_va.training.frames import TrainingFrame, read_frames

TRAIN_END, VAL_END = 0.7, 0.8  # fractions of the footage's time: train | validation | held out
# Below this many validation frames the score threshold and NMS stay those of the adapter fit started from (chosen
# on its own, larger validation set): on 20 frames of teacher labels the best-F1 threshold swung to 0.075 and cost
# precision on the held-out part (measured on a 54-s camera, 2026-11-28).
MIN_VAL_FRAMES = 50
VAL_FRAMES = 120  # at most this many validation frames are scored (evenly spread)
GENERAL_ADAPTER = Path(__file__).resolve().parents[2] / "adapters" / "detect"
# Refused up front. Measured on traffic-a against its human boxes (bench/fit_minimums.py, 2026-12-08): 3 s of footage
# (8 training frames, 14 labelled cars) made an adapter of vehicle F1 0.48, 6 s (17 frames, 36 cars) 0.73, 11.5 s
# (30 frames, 90 cars) 0.85; the guard kept all three, but on 2-3 held-out frames below 11.5 s. Under 6 s and 30
# objects a fit learns too little to be worth serving, and its guard has too little to judge it on.
MIN_FOOTAGE_S = 6.0
MIN_OBJECTS = 30  # labelled objects over the training frames
MIN_HELD_OUT_OBJECTS = 10  # references the guard judges on: fewer, and a bootstrap over them says nothing
HUMAN_REPEAT = 3  # a training frame a person labelled counts this many times (a click weighs more than a teacher)
# Short footage gives few frames: it trains for more epochs, so that every fit takes at least the steps a fit of 5
# minutes takes (120 frames, mirrored, 4 epochs of batches of 8)
MIN_STEPS = 120
FIT_REFUSED = 3  # the exit status of a refused fit (cli.py)


class FitRefused(Exception):
    """The fit cannot or did not make the camera better: nothing servable is written (unless kept anyway)."""

    def __init__(self, message: str, report: dict | None = None):
        super().__init__(message)
        self.report = report


@dataclass
class FitOptions:
    source: str
    out: Path
    start: float = 0.0
    end: float | None = None
    minutes: float | None = None  # live streams: how much to record
    start_from: Path = GENERAL_ADAPTER
    backbone: str = "dinov2-small"
    frames: int = 120  # training frames picked (before flips and camera views)
    sample_fps: float = 4.0  # candidates per second of footage
    eval_step: float = 0.5  # seconds between held-out frames scored
    epochs: int = 4
    camera_views: int = 0  # extra random-camera views per training frame (augment.camera_views)
    tiles: str | int = "auto"  # 2 x 2 tiles for the teachers: "auto" (where objects are small), 1 or 2
    threads: int = 2
    human: Path | None = None  # COCO boxes (human-v1.json format, or file_name VIDEO@T) for this footage
    keep_anyway: bool = False  # write the adapter even where the guard refuses it (marked so)
    teachers_dir: Path | None = None
    cache_dir: Path | None = None
    seed: int = 0
    say: object = print


@dataclass
class FitParts:
    """The footage cut into its three parts, and the human-checked frames: clicks in the training part, evaluation
    frames after it."""

    video: str
    duration: float
    footage: list[TrainingFrame]  # every candidate frame (the background is made from them)
    train: list[TrainingFrame]
    val: list[TrainingFrame]
    held_out: list[TrainingFrame]
    human: dict[str, list[dict]] = field(default_factory=dict)  # --human boxes of this video, by frame key
    clicks: list[TrainingFrame] = field(default_factory=list)  # human-labelled frames of the training part
    judged: list[TrainingFrame] = field(default_factory=list)  # human-labelled frames after it (the guard's)
    human_times: list[float] = field(default_factory=list)  # evaluation times training kept away from
    candidates: int = 0
    dropped_near_human: int = 0


def human_boxes(path: Path | None, video: str) -> dict[str, list[dict]]:
    """{frame key: boxes} of the COCO file for this video (our format with "video" and "t", or file_name VIDEO@T);
    boxes flagged ignore/iscrowd are don't-care."""
    if path is None:
        return {}
    data = json.loads(Path(path).read_text())
    if data.get("images") and "video" in data["images"][0]:
        from vlora_va.training.evaluate import load_human_set

        hs = load_human_set(path)
        return {k: v for k, v in hs.boxes.items() if hs.times[k][0] == video}
    from vlora_va.training.teachers import load_coco_json

    return {k: v for k, v in load_coco_json(path).items() if k.startswith(f"{video}@")}


def _time_of(key: str) -> float:
    return float(key.split("@")[1].split("#")[0])


def cut(opts: FitOptions) -> FitParts:
    frames = candidates(opts.source, opts.start, opts.end, opts.sample_fps, opts.minutes)
    if len(frames) < 2 or frames[-1].t - frames[0].t < MIN_FOOTAGE_S:
        span = frames[-1].t - frames[0].t if frames else 0.0
        raise FitRefused(f"{opts.source}: {span:.1f} s of footage in the range; a fit needs at least "
                         f"{MIN_FOOTAGE_S:.0f} s (measured on a traffic camera by bench/fit_minimums.py: 3 s made an "
                         f"adapter of F1 0.48 where 6 s made 0.73 and 11.5 s 0.85)")
    video = frames[0].video
    t0, t1 = frames[0].t, frames[-1].t
    span = t1 - t0
    train_end, val_end = t0 + TRAIN_END * span, t0 + VAL_END * span
    human = human_boxes(opts.human, video)
    in_range = {k: v for k, v in human.items() if t0 - 1e-6 <= _time_of(k) <= t1 + 1e-3}
    click_keys = {k for k in in_range if _time_of(k) < train_end}
    judged_keys = set(in_range) - click_keys
    marks = sorted({_time_of(k) for k in judged_keys} | set(shipped_human_times(video)))
    train_all = [f for f in frames if f.t < train_end]
    train_ok = away_from(train_all, marks)
    val = away_from([f for f in frames if train_end <= f.t < val_end], marks)
    step = max(1, round(opts.eval_step * opts.sample_fps))
    held = [f for f in frames if f.t >= val_end][::step]
    val = val[::max(1, -(-len(val) // VAL_FRAMES))]  # evenly spread, at most VAL_FRAMES
    labelled = _decode_keys(opts.source, click_keys | judged_keys) if not opts.minutes else []
    clicks = [f for f in labelled if f.key in click_keys]
    judged = [f for f in labelled if f.key in judged_keys]
    picked = pick_diverse(away_from(train_ok, [f.t for f in clicks], 0.0) or train_ok, opts.frames,
                          min_gap_s=1.0 / opts.sample_fps)
    return FitParts(video, span, frames, picked, val, held, in_range, clicks, judged, marks, len(frames),
                    len(train_all) - len(train_ok))


def _decode_keys(source: str, keys: set[str]) -> list[TrainingFrame]:
    """The human-labelled frames themselves (their exact times), decoded from the file."""
    if not keys:
        return []
    times = sorted(_time_of(k) for k in keys)
    return [f for f in read_frames(source, times[0] - 1e-3, times[-1] + 1e-3) if f.key in keys]


def _spec(opts: FitOptions, general, recipe: dict, labels_digest: str):
    """A training spec in memory: the general adapter's image size, head, LoRA shape; the refined labels."""
    import re

    from vlora_va.engine.adapters import canonical_module_names, read_lora
    from vlora_va.training.spec import LoraSpec, SourceSpec, Spec, TrainSpec

    rank, scale, _, weights = read_lora(opts.start_from)
    cfg = general.head_config
    names = list(canonical_module_names(weights))  # encoder.layer.N.attention.q_proj, encoder.layer.N.mlp.fc1, ...
    layers = sorted({int(m.group(1)) for n in names if (m := re.search(r"layer\.(\d+)\.", n))})
    modules = sorted({n.rsplit(".", 1)[1] for n in names})
    head = {k: v for k, v in cfg["params"].items() if k not in ("image_size", "score_threshold", "nms_iou")}
    # the labels name the run: a run on other labels (another recipe, other boxes of yours) is another run, never a
    # resumed checkpoint (train.py's fingerprint)
    source = SourceSpec("refined", "fused", list(cfg["classes"]), score_threshold=0.5, ignore_below=0.0,
                        min_height=0, options={"refined": recipe, "labels_sha256": labels_digest})
    return Spec(name=f"fit-{opts.out.name}", task="detection", output=opts.out, backbone=opts.backbone,
                image_size=int(cfg["image_size"]), sources=[source],
                lora=LoraSpec(rank=rank, alpha=scale * rank, layers=layers, modules=modules,
                              init_from=str(opts.start_from)),
                opts=TrainSpec(epochs=opts.epochs, batch=8, lr=5e-4, lora_lr=2.5e-4, flip=True, threads=opts.threads,
                               seed=opts.seed, camera_views=opts.camera_views),
                head=head, cache_dir=opts.cache_dir, teachers_dir=opts.teachers_dir, baselines=())


def _count(labels: dict[str, list[dict]], frames: list[TrainingFrame]) -> int:
    return sum(1 for f in frames for lab in labels.get(f.key, []) if not lab.get("ignore"))


def fit(opts: FitOptions) -> dict:
    """Fit, judge and write the adapter; returns the report (also written as OUT/FIT.json). Raises FitRefused, after
    writing OUT.refused.json beside OUT, where the guard refuses it (and --keep-anyway was not given) or the footage
    cannot make a fit."""
    import torch

    from vlora_va.engine.adapters import load_adapter_dir
    from vlora_va.engine.backbones import load_backbone
    from vlora_va.training import pipeline as P
    from vlora_va.training import train as T
    from vlora_va.training.augment import camera_views
    from vlora_va.training.fit_guard import judge
    from vlora_va.training.refined_labels import RefinedLabeller, RefineOptions
    from vlora_va.training.teachers import DETECTORS, FUSED_DEFAULT

    say = opts.say
    t_start, cpu_start = time.monotonic(), time.process_time()
    torch.set_num_threads(opts.threads)
    stages = {}

    def stage(name: str, t: float) -> None:
        stages[name] = round(time.monotonic() - t, 1)
        say(f"fit: {name} done in {stages[name]:.0f} s (total {time.monotonic() - t_start:.0f} s)")

    t = time.monotonic()
    try:
        parts = cut(opts)
    except FitRefused as e:
        raise _refuse(opts, str(e)) from None
    stage("decode and pick frames", t)
    say(f"fit: {parts.video}: {parts.duration:.0f} s of footage, {len(parts.train)} training frames picked of "
        f"{parts.candidates} candidates ({parts.dropped_near_human} dropped within {LEAK_MARGIN_S:.0f} s of a "
        f"human-checked frame), {len(parts.clicks)} labelled by a person, {len(parts.val)} validation, "
        f"{len(parts.held_out)} held out ({len(parts.judged)} human-checked)")

    backbone = load_backbone(opts.backbone)  # loaded once: its size here, the start model below
    general = load_adapter_dir("general", opts.start_from, backbone.config.hidden_size)
    if general.task != "detection":
        raise ValueError(f"--from {opts.start_from}: a {general.task} adapter; fit starts from a detection adapter")
    classes = list(general.head_config["classes"])

    t = time.monotonic()
    teachers = [DETECTORS[m](None, None, 0.1, folder=opts.teachers_dir) for m in FUSED_DEFAULT]
    labeller = RefinedLabeller(teachers, RefineOptions(classes, tiles=opts.tiles, human=parts.human), parts.footage,
                               cache_dir=(opts.cache_dir / "labels") if opts.cache_dir else None)
    train_frames = parts.train + [f for f in parts.clicks for _ in range(HUMAN_REPEAT)]
    held_frames = parts.held_out + [f for f in parts.judged if f.key not in {h.key for h in parts.held_out}]
    labels = labeller.label(parts.train + parts.clicks + parts.val + held_frames)
    digest = hashlib.sha256(json.dumps([labels[f.key] for f in train_frames], sort_keys=True).encode()).hexdigest()
    spec = _spec(opts, general, labeller.recipe, digest[:16])
    (source,) = spec.sources
    lora = spec.lora
    objects, held_refs = _count(labels, parts.train + parts.clicks), _count(labels, held_frames)
    stage("refined labels", t)
    if objects < MIN_OBJECTS:
        raise _refuse(opts, f"the training frames hold {objects} labelled objects; a fit needs at least {MIN_OBJECTS} "
                            f"(measured on a traffic camera by bench/fit_minimums.py: 14 cars made an adapter of F1 "
                            f"0.48 where 36 made 0.73 and 90 made 0.85)")
    if held_refs < MIN_HELD_OUT_OBJECTS:
        raise _refuse(opts, f"the held-out part holds {held_refs} objects to judge the fit on; the guard needs at "
                            f"least {MIN_HELD_OUT_OBJECTS} (a longer or busier recording)")

    splits = {}
    for name, frames in (("train", train_frames), ("val", parts.val), ("held_out", held_frames)):
        split_labels = {source.name: {f.key: labels[f.key] for f in frames}}
        if name == "train" and opts.camera_views:
            views, carried = camera_views(frames, split_labels, opts.camera_views, opts.seed)
            frames = frames + views
            split_labels[source.name].update(carried[source.name])
        splits[name] = P.Split(frames, split_labels, side=spec.image_size)

    samples = 2 * len(splits["train"].frames)  # each also mirrored
    spec.opts.epochs = max(opts.epochs, -(-MIN_STEPS * spec.opts.batch // max(samples, 1)))
    t = time.monotonic()
    layer = min(lora.layers)
    for name, split in splits.items():
        if split.frames:  # (a validation part can be empty: all of it near human-checked frames)
            P.cache_features(spec, split, layer, flip=name == "train")
    stage("backbone features", t)

    t = time.monotonic()
    start_model = T.build_model(backbone, lora, opts.seed)  # the general adapter's LoRA
    general_head = general.head
    result = P.train_detection(spec, splits["train"], [source], lora, deadline=float("inf"),
                               warm=(start_model, general_head), tag=f"fit-{parts.video}")
    stage("training", t)

    t = time.monotonic()
    if len(parts.val) >= MIN_VAL_FRAMES:
        _, threshold, _ = P.evaluate_detection(spec, result.model, result.head, splits["val"], [source], lora)
    else:  # too few to choose on (short footage, or its validation part near human-checked frames)
        threshold, result.head.nms_iou = general_head.score_threshold, general_head.nms_iou
        say(f"fit: {len(parts.val)} validation frames (fewer than {MIN_VAL_FRAMES}): the score threshold "
            f"{threshold} and NMS {general_head.nms_iou} of {opts.start_from.name} are kept")
    models = {"general": (start_model, general_head, general_head.score_threshold),
              "fitted": (result.model, result.head, threshold)}
    preds = {name: _predictions(spec, splits["held_out"], source, lora, m) for name, m in models.items()}
    judged_keys = [f.key for f in parts.judged]
    against = "human boxes" if judged_keys else "refined labels"
    refs = {k: parts.human[k] for k in judged_keys} if judged_keys else {f.key: labels[f.key] for f in held_frames}
    verdict = judge({k: preds["general"][k] for k in refs}, {k: preds["fitted"][k] for k in refs}, refs,
                    (general_head.score_threshold, threshold), against)
    figures = _held_out_figures(parts, splits["held_out"], labels, preds, models, classes)
    stage("evaluation", t)
    say(f"fit: guard: {'KEPT' if verdict.kept else 'REFUSED'}: {verdict.reason}")

    report = {
        "source": opts.source, "video": parts.video, "range_s": [parts.footage[0].t, parts.footage[-1].t],
        "parts": {"train": [f.t for f in parts.train], "clicks": [f.t for f in parts.clicks],
                  "val_s": [parts.val[0].t, parts.val[-1].t] if parts.val else [],
                  "held_out_s": [held_frames[0].t, held_frames[-1].t] if held_frames else []},
        "frames": {"candidates": parts.candidates, "train": len(parts.train), "clicks": len(parts.clicks),
                   "train_with_views": len(splits["train"].frames), "val": len(parts.val),
                   "held_out": len(held_frames), "judged_human": len(parts.judged),
                   "dropped_near_human": parts.dropped_near_human, "human_times_avoided": len(parts.human_times)},
        "objects": {"train": objects, "held_out": held_refs},
        "teachers": " + ".join(FUSED_DEFAULT), "labels": {"recipe": labeller.recipe,
                                                            **_label_worth(labeller, parts, labels)},
        "started_from": str(opts.start_from), "epochs": spec.opts.epochs, "steps": result.steps,
        "threshold": threshold, "nms_iou": result.head.nms_iou, "held_out": figures,
        "guard": {**verdict.as_dict(), "kept_anyway": bool(opts.keep_anyway and not verdict.kept)},
        "seconds": round(time.monotonic() - t_start, 1), "cpu_seconds": round(time.process_time() - cpu_start, 1),
        "stages_s": stages, "threads": opts.threads, "cpu": cpu_name(), "machine": platform.machine(),
        "date": time.strftime("%Y-%m-%d"),
    }
    if not verdict.kept and not opts.keep_anyway:
        raise _refuse(opts, f"the fitted adapter is not kept: {verdict.reason}", report)
    metrics = {"held_out": figures["fitted"]}
    P.save_detection(spec, opts.out, result, lora, [source], threshold, metrics, card(report))
    (opts.out / "FIT.json").write_text(json.dumps(report, indent=1) + "\n")
    refused_path(opts.out).unlink(missing_ok=True)  # an earlier refusal of this camera's fit no longer holds
    say(f"fit: wrote {opts.out} in {report['seconds']:.0f} s ({report['cpu_seconds']:.0f} CPU-s on {report['cpu']})"
        + (" -- KEPT ANYWAY although the guard refused it: not servable with --serve" if not verdict.kept else ""))
    say(summary(report))
    return report


def refused_path(out: Path) -> Path:
    """Where a refused fit's report goes: beside the adapter directory, never in it (nothing there is servable)."""
    return out.with_name(out.name + ".refused.json")


def _refuse(opts: FitOptions, why: str, report: dict | None = None) -> FitRefused:
    report = {**(report or {"source": opts.source, "date": time.strftime("%Y-%m-%d")}), "refused": why}
    path = refused_path(opts.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")
    opts.say(f"fit: REFUSED: {why} (report: {path})")
    return FitRefused(why, report)


def _predictions(spec, split, source, lora, model) -> dict[str, list[dict]]:
    """{frame key: boxes} of one model on a split, every box the head gives (above the head's own floor)."""
    from vlora_va.training import pipeline as P

    net, head, threshold = model
    _, _, preds = P.evaluate_detection(spec, net, head, split, [source], lora, threshold)
    return {f.key: p for f, p in zip(split.frames, preds)}


def _held_out_figures(parts: FitParts, split, labels, preds, models, classes) -> dict:
    """{model: {"refined": per-class report, "human": per-class report or absent}} on the held-out frames."""
    from vlora_va.training.label_classes import vehicle_agnostic
    from vlora_va.training.metrics import detection_report, human_detection_report

    out = {}
    keys = [f.key for f in split.frames]
    judged = [f.key for f in parts.judged]
    for name, (_, _, threshold) in models.items():
        entry = {"threshold": threshold,
                 "refined": detection_report({k: preds[name][k] for k in keys}, {k: labels[k] for k in keys}, classes,
                                             threshold)}
        if judged:
            p, r = {k: preds[name][k] for k in judged}, {k: parts.human[k] for k in judged}
            entry["human"] = human_detection_report(p, r, classes, threshold)
            vehicles = detection_report(vehicle_agnostic(p), vehicle_agnostic(r), ["vehicle"], threshold)["vehicle"]
            if vehicles.get("refs"):
                entry["human_vehicle"] = vehicles
            entry["human_frames"] = len(judged)
        out[name] = entry
    return out


def _label_worth(labeller, parts: FitParts, labels: dict) -> dict:
    """The refined labels and the raw teachers (fused per class, whole frame, score >= 0.3) against the human boxes on
    every human-labelled frame, vehicle classes as one; {} without human boxes."""
    from vlora_va.training.label_classes import vehicle_agnostic
    from vlora_va.training.metrics import detection_report

    frames = parts.clicks + parts.judged
    if not frames:
        return {}
    refs = vehicle_agnostic({f.key: parts.human[f.key] for f in frames})
    classes = sorted({r["class"] for v in refs.values() for r in v if not r.get("ignore")})
    refined = vehicle_agnostic({f.key: [lab for lab in labeller.teacher_labels(f) if not lab["ignore"]]
                                for f in frames})
    raw = vehicle_agnostic({f.key: labeller.plain_teachers(f) for f in frames})
    pick = ("precision", "recall", "f1", "refs")
    return {"against_human": {
        "frames": len(frames),
        "refined": {c: {k: r[k] for k in pick} for c, r in detection_report(refined, refs, classes, 0.0).items()},
        "teachers": {c: {k: r[k] for k in pick} for c, r in detection_report(raw, refs, classes, 0.0).items()}}}


def _cell(r: dict) -> str:
    return f"{r['f1']:.3f} (P {r['precision']:.2f} R {r['recall']:.2f})" if r and r.get("refs") else "—"


def summary(report: dict) -> str:
    lines = ["| model | class | F1 vs refined labels (held out) | F1 vs human boxes (held out) |", "|---|---|---|---|"]
    for name in ("general", "fitted"):
        entry = report["held_out"][name]
        for cls in entry["refined"]:
            lines.append(f"| {name} | {cls} | {_cell(entry['refined'].get(cls, {}))} | "
                         f"{_cell(entry.get('human', {}).get(cls, {}))} |")
        if "human_vehicle" in entry:
            lines.append(f"| {name} | vehicle (car + truck) | | {_cell(entry['human_vehicle'])} |")
    return "\n".join(lines)


def card(report: dict) -> str:
    f, g = report["frames"], report["guard"]
    worth = report["labels"].get("against_human")
    label_lines = ""
    if worth:
        label_lines = (f"\n## What the labels were worth (against {worth['frames']} human-labelled frames)\n\n"
                       "| labels | class | precision | recall | F1 |\n|---|---|---|---|---|\n"
                       + "\n".join(f"| {name} | {c} | {r['precision']:.2f} | {r['recall']:.2f} | {r['f1']:.3f} |"
                                   for name in ("teachers", "refined") for c, r in worth[name].items()) + "\n")
    status = ("KEPT: " if g["kept"] else "REFUSED by the guard, and KEPT ANYWAY (--keep-anyway): it is not better than "
              "the adapter it started from, and `--serve` will not load it. ") + g["reason"]
    return (f"# Per-camera detection adapter: {report['video']}\n\n"
            f"Made by `vlora-va adapters fit {report['source']}` on {report['date']} ({report['cpu']}, "
            f"{report['threads']} threads): {report['seconds']:.0f} s, {report['cpu_seconds']:.0f} CPU-s.\n\n"
            f"**Guard:** {status}\n\n"
            f"- Started from `{report['started_from']}`; {report['epochs']} epochs, {report['steps']} steps.\n"
            f"- Trained on {f['train']} frames picked for diversity from {f['candidates']} candidates of "
            f"`{report['source']}` (its first 70 %; {f['train_with_views']} with their camera views; each also "
            f"mirrored){', and ' + str(f['clicks']) + ' frames a person labelled' if f['clicks'] else ''}, labelled by "
            f"the refined labels of the teachers {report['teachers']} ({json.dumps(report['labels']['recipe'])}).\n"
            f"- {f['dropped_near_human']} candidate frames within 1 s of a human-checked frame were never trained on.\n"
            + (f"- Score threshold {report['threshold']:.2f} and NMS IoU {report['nms_iou']} chosen on the validation "
               f"part ({f['val']} frames, {report['parts']['val_s']} s).\n" if f["val"] >= MIN_VAL_FRAMES else
               f"- Score threshold {report['threshold']:.2f} and NMS IoU {report['nms_iou']} kept from the adapter it "
               f"started from (the validation part had {f['val']} frames, fewer than {MIN_VAL_FRAMES}).\n")
            + label_lines
            + f"\n## Held out: the last 20 % of the footage ({f['held_out']} frames, "
            f"{report['parts']['held_out_s']} s)\n\n"
            f"{summary(report)}\n\n"
            "Figures against the refined labels measure agreement with the labels the adapter learnt from; figures "
            "against human boxes, where given, measure accuracy. Both are for this camera only.\n")
