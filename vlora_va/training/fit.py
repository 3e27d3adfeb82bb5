"""`vlora-va adapters fit SOURCE --task detect --out DIR`: one camera's own detection adapter, in one command.

  footage (a file, a time range of it, or --minutes of a live stream)
    → time split: train [0, 70%) · validation [70%, 80%) · held out [80%, 100%]
    → diverse training frames (frame_picking.pick_diverse), none within 1 s of a human-checked frame
    → labels from the fused teachers (centernet + nanodet, teachers.detector_teacher("fused"))
    → LoRA + head trained starting from the general adapter (its LoRA and head, same shapes)
    → score threshold and NMS chosen on the validation part
    → the general and the fitted adapter scored on the held-out part: against the teachers' labels, and against
      human boxes where a COCO file is given
    → the adapter directory, with FIT.json and README.md: what it saw, its figures against the general adapter,
      time and CPU
    → with --serve NAME (cli.py): loaded under NAME into the running daemon, as `vlora-va adapters load` does (a
      stream whose task names NAME uses it from its next batch).

Held-out figures are on the camera's last 20 %, which training never saw: the report is an honest estimate for
this camera, not for others.
"""

from __future__ import annotations

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
from vlora_va.training.frames import TrainingFrame

TRAIN_END, VAL_END = 0.7, 0.8  # fractions of the footage's time: train | validation | held out
# Below this many validation frames the score threshold and NMS stay those of the adapter fit started from (chosen
# on its own, larger validation set): on 20 frames of teacher labels the best-F1 threshold swung to 0.075 and cost
# precision on the held-out part (measured on a 54-s camera, 2026-11-28).
MIN_VAL_FRAMES = 50
VAL_FRAMES = 120  # at most this many validation frames are scored (evenly spread)
GENERAL_ADAPTER = Path(__file__).resolve().parents[2] / "adapters" / "detect"


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
    tiles: int = 2  # the teachers also look at 2 x 2 tiles: small people are found
    threads: int = 2
    human: Path | None = None  # COCO boxes (human-v1.json format, or file_name VIDEO@T) for this footage
    teachers_dir: Path | None = None
    cache_dir: Path | None = None
    seed: int = 0
    say: object = print


@dataclass
class FitParts:
    """The footage cut into its three parts, and the human-checked times that training kept away from."""

    video: str
    duration: float
    train: list[TrainingFrame]
    val: list[TrainingFrame]
    held_out: list[TrainingFrame]
    human: dict[str, list[dict]] = field(default_factory=dict)  # --human boxes of this video, by frame key
    human_times: list[float] = field(default_factory=list)
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


def cut(opts: FitOptions) -> FitParts:
    frames = candidates(opts.source, opts.start, opts.end, opts.sample_fps, opts.minutes)
    if len(frames) < 10:
        raise ValueError(f"{opts.source}: only {len(frames)} frames in the range; fit needs at least a few seconds")
    video = frames[0].video
    t0, t1 = frames[0].t, frames[-1].t
    span = t1 - t0
    train_end, val_end = t0 + TRAIN_END * span, t0 + VAL_END * span
    human = human_boxes(opts.human, video)
    marks = sorted({float(k.split("@")[1]) for k in human} | set(shipped_human_times(video)))
    train_all = [f for f in frames if f.t < train_end]
    train_ok = away_from(train_all, marks)
    val = away_from([f for f in frames if train_end <= f.t < val_end], marks)
    step = max(1, round(opts.eval_step * opts.sample_fps))
    held = [f for f in frames if f.t >= val_end][::step]
    val = val[::max(1, -(-len(val) // VAL_FRAMES))]  # evenly spread, at most VAL_FRAMES
    return FitParts(video, span, pick_diverse(train_ok, opts.frames), val, held, human, marks, len(frames),
                    len(train_all) - len(train_ok))


def _spec(opts: FitOptions, general):
    """A training spec in memory: the general adapter's image size, head, LoRA shape; the fused teachers."""
    import re

    from vlora_va.engine.adapters import canonical_module_names, read_lora
    from vlora_va.training.spec import LoraSpec, SourceSpec, Spec, TrainSpec

    rank, scale, _, weights = read_lora(opts.start_from)
    cfg = general.head_config
    names = list(canonical_module_names(weights))  # encoder.layer.N.attention.q_proj, encoder.layer.N.mlp.fc1, ...
    layers = sorted({int(m.group(1)) for n in names if (m := re.search(r"layer\.(\d+)\.", n))})
    modules = sorted({n.rsplit(".", 1)[1] for n in names})
    head = {k: v for k, v in cfg["params"].items() if k not in ("image_size", "score_threshold", "nms_iou")}
    source = SourceSpec("fused", "fused", list(cfg["classes"]), score_threshold=0.4, ignore_below=0.2, min_height=12,
                    options={"tiles": opts.tiles})
    return Spec(name=f"fit-{opts.out.name}", task="detection", output=opts.out, backbone=opts.backbone,
                image_size=int(cfg["image_size"]), sources=[source],
                lora=LoraSpec(rank=rank, alpha=scale * rank, layers=layers, modules=modules,
                              init_from=str(opts.start_from)),
                opts=TrainSpec(epochs=opts.epochs, batch=8, lr=5e-4, lora_lr=2.5e-4, flip=True, threads=opts.threads,
                               seed=opts.seed, camera_views=opts.camera_views),
                head=head, cache_dir=opts.cache_dir, teachers_dir=opts.teachers_dir, baselines=())


def fit(opts: FitOptions) -> dict:
    """Fit, evaluate and write the adapter; returns the report (also written as OUT/FIT.json)."""
    import torch

    from vlora_va.engine.adapters import load_adapter_dir
    from vlora_va.engine.backbones import load_backbone
    from vlora_va.training import pipeline as P
    from vlora_va.training import train as T
    from vlora_va.training.augment import camera_views
    from vlora_va.training.data import detection_labels
    from vlora_va.training.teachers import FUSED_DEFAULT

    say = opts.say
    t_start, cpu_start = time.monotonic(), time.process_time()
    torch.set_num_threads(opts.threads)
    stages = {}

    def stage(name: str, t: float) -> None:
        stages[name] = round(time.monotonic() - t, 1)
        say(f"fit: {name} done in {stages[name]:.0f} s (total {time.monotonic() - t_start:.0f} s)")

    t = time.monotonic()
    parts = cut(opts)
    stage("decode and pick frames", t)
    say(f"fit: {parts.video}: {parts.duration:.0f} s of footage, {len(parts.train)} training frames picked of "
        f"{parts.candidates} candidates ({parts.dropped_near_human} dropped within {LEAK_MARGIN_S:.0f} s of a "
        f"human-checked frame), {len(parts.val)} validation, {len(parts.held_out)} held out")

    backbone = load_backbone(opts.backbone)  # loaded once: its size here, the start model below
    general = load_adapter_dir("general", opts.start_from, backbone.config.hidden_size)
    if general.task != "detection":
        raise ValueError(f"--from {opts.start_from}: a {general.task} adapter; fit starts from a detection adapter")
    spec = _spec(opts, general)
    (source,) = spec.sources
    lora = spec.lora

    t = time.monotonic()
    splits = {}
    for name, frames in (("train", parts.train), ("val", parts.val), ("held_out", parts.held_out)):
        labels = {source.name: detection_labels(source, frames, spec)}
        if name == "train" and opts.camera_views:
            views, carried = camera_views(frames, labels, opts.camera_views, opts.seed)
            frames = frames + views
            labels[source.name].update(carried[source.name])
        splits[name] = P.Split(frames, labels, side=spec.image_size)
    stage("teacher labels", t)

    t = time.monotonic()
    layer = min(lora.layers)
    for name, split in splits.items():
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
    figures = _held_out_figures(spec, parts, splits["held_out"], source, lora,
                                {"general": (start_model, general_head, general_head.score_threshold),
                                 "fitted": (result.model, result.head, threshold)})
    stage("evaluation", t)

    report = {
        "source": opts.source, "video": parts.video, "range_s": [parts.train[0].t if parts.train else None,
                                                                 parts.held_out[-1].t if parts.held_out else None],
        "parts": {"train": [f.t for f in parts.train], "val_s": [parts.val[0].t, parts.val[-1].t] if parts.val else [],
                  "held_out_s": [parts.held_out[0].t, parts.held_out[-1].t]},
        "frames": {"candidates": parts.candidates, "train": len(parts.train),
                   "train_with_views": len(splits["train"].frames), "val": len(parts.val),
                   "held_out": len(parts.held_out), "dropped_near_human": parts.dropped_near_human,
                   "human_times_avoided": len(parts.human_times)},
        "teachers": "fused: " + " + ".join(FUSED_DEFAULT) + (f", whole frame + {opts.tiles}x{opts.tiles} tiles" if opts.tiles > 1 else ""),
        "started_from": str(opts.start_from), "epochs": opts.epochs, "steps": result.steps,
        "threshold": threshold, "nms_iou": result.head.nms_iou, "held_out": figures,
        "seconds": round(time.monotonic() - t_start, 1), "cpu_seconds": round(time.process_time() - cpu_start, 1),
        "stages_s": stages, "threads": opts.threads, "cpu": cpu_name(), "machine": platform.machine(),
        "date": time.strftime("%Y-%m-%d"),
    }
    metrics = {"held_out": figures["fitted"]}
    P.save_detection(spec, opts.out, result, lora, [source], threshold, metrics, card(report))
    (opts.out / "FIT.json").write_text(json.dumps(report, indent=1) + "\n")
    say(f"fit: wrote {opts.out} in {report['seconds']:.0f} s ({report['cpu_seconds']:.0f} CPU-s on {report['cpu']})")
    say(summary(report))
    return report


def _held_out_figures(spec, parts: FitParts, split, source, lora, models: dict) -> dict:
    """{model: {"teachers": per-class report, "human": per-class report or absent}} on the held-out frames."""
    from vlora_va.training import pipeline as P
    from vlora_va.training.metrics import human_detection_report

    refs = parts.human
    out = {}
    for name, (model, head, threshold) in models.items():
        report, _, preds = P.evaluate_detection(spec, model, head, split, [source], lora, threshold)
        entry = {"threshold": threshold, "teachers": report}
        pred_map = {f.key: p for f, p in zip(split.frames, preds)}
        keys = [k for k in pred_map if k in refs]
        if keys:
            entry["human"] = human_detection_report({k: pred_map[k] for k in keys}, {k: refs[k] for k in keys},
                                                    list(head.classes), threshold)
            entry["human_frames"] = len(keys)
        out[name] = entry
    return out


def _row(name: str, entry: dict, cls: str) -> str:
    t = entry["teachers"].get(cls, {})
    h = entry.get("human", {}).get(cls, {})
    cell = lambda r: f"{r['f1']:.3f} (P {r['precision']:.2f} R {r['recall']:.2f})" if r and r.get("refs") else "—"  # noqa: E731
    return f"| {name} | {cls} | {cell(t)} | {cell(h)} |"


def summary(report: dict) -> str:
    lines = ["| model | class | F1 vs teachers (held out) | F1 vs human boxes (held out) |", "|---|---|---|---|"]
    for name in ("general", "fitted"):
        entry = report["held_out"][name]
        for cls in entry["teachers"]:
            lines.append(_row(name, entry, cls))
    return "\n".join(lines)


def card(report: dict) -> str:
    f = report["frames"]
    return (f"# Per-camera detection adapter: {report['video']}\n\n"
            f"Made by `vlora-va adapters fit {report['source']}` on {report['date']} ({report['cpu']}, "
            f"{report['threads']} threads): {report['seconds']:.0f} s, {report['cpu_seconds']:.0f} CPU-s.\n\n"
            f"- Started from `{report['started_from']}`; {report['epochs']} epochs, {report['steps']} steps.\n"
            f"- Saw {f['train']} training frames picked for diversity from {f['candidates']} candidates "
            f"({f['train_with_views']} with their camera views; each also mirrored), "
            f"labelled by the {report['teachers']}.\n"
            f"- {f['dropped_near_human']} candidate frames within 1 s of a human-checked frame were never trained on.\n"
            + (f"- Score threshold {report['threshold']:.2f} and NMS IoU {report['nms_iou']} chosen on the validation "
               f"part ({f['val']} frames, {report['parts']['val_s']} s).\n\n" if f["val"] >= MIN_VAL_FRAMES else
               f"- Score threshold {report['threshold']:.2f} and NMS IoU {report['nms_iou']} kept from the adapter it "
               f"started from (the validation part had {f['val']} frames, fewer than {MIN_VAL_FRAMES}).\n\n")
            + f"## Held out: the last 20 % of the footage ({f['held_out']} frames, {report['parts']['held_out_s']} s)\n\n"
            f"{summary(report)}\n\n"
            "Figures against the teachers measure agreement with the labels the adapter learnt from; figures against "
            "human boxes, where given, measure accuracy. Both are for this camera only.\n")
