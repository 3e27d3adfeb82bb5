"""`vlora-va eval ADAPTER --on VIDEO...`: an adapter directory against teacher labels on held-out video.

This path deliberately shares nothing with training but the label rules: it loads the adapter from disk
with `adapters.load_adapter_dir`, folds the LoRA into a fresh backbone (W + scale·B·A, exactly what the
engine's merged mode serves) and runs the whole backbone on letterboxed frames. The reference labels
follow the protocol recorded in the adapter's head_config.json ("label_sources").
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from ..adapters import Adapter, fit_module_names, load_adapter_dir
from ..heads import Features
from ..models import linear_names, load_backbone, patch_size
from .data import activity_clips, detection_labels, frame_lookup, merge_labels
from .features import full_hidden
from .frames import Frame, model_input
from .metrics import action_report, detection_report, person_activity_report
from .spec import Range, Source, Spec


def merged_backbone(backbone: str, adapter: Adapter) -> torch.nn.Module:
    model = load_backbone(backbone)
    with torch.no_grad():
        for name, (a, b) in fit_module_names(adapter.lora, linear_names(model)).items():
            model.get_submodule(name).weight += adapter.scale * (b @ a)
    return model


@torch.no_grad()
def features(model: torch.nn.Module, frames: list[Frame], side: int, batch: int = 8):
    out_cls, out_grid, lbs = [], [], []
    for i in range(0, len(frames), batch):
        pixels, lb = model_input(frames[i:i + batch], side)
        f = Features.from_hidden(full_hidden(model, pixels), side, patch_size(model))
        out_cls.append(f.cls)
        out_grid.append(f.grid)
        lbs += lb
    return Features(torch.cat(out_cls), torch.cat(out_grid)), lbs


def sources_of(adapter: Adapter) -> list[Source]:
    return [Source(**s) for s in adapter.head_config.get("label_sources", [])]


def evaluate_detection_adapter(adapter: Adapter, backbone: str, frames: list[Frame], spec: Spec,
                               threshold: float | None = None, draw: Path | None = None) -> dict:
    side = int(adapter.head_config.get("image_size", 224))
    sources = sources_of(adapter)
    refs = merge_labels(*(detection_labels(s, frames, spec) for s in sources))
    model = merged_backbone(backbone, adapter)
    feats, lbs = features(model, frames, side)
    head = adapter.head
    thr = head.score_threshold if threshold is None else threshold
    head.score_threshold = 0.05  # full ranking for AP; F1 is read at `thr`
    preds = [[d.to_json() for d in image] for image in head.decode(head(feats), lbs, [f.size for f in frames])]
    head.score_threshold = thr
    pred_map = {f.key: p for f, p in zip(frames, preds)}
    if draw is not None and frames:  # the middle frame, predictions at the adapter's threshold over grey teacher boxes
        from .draw import annotate, save_png

        mid = len(frames) // 2
        shown = [p for p in preds[mid] if p["score"] >= thr]
        save_png(draw, annotate(frames[mid].rgb, shown, head.classes, [r for r in refs[frames[mid].key] if not r["ignore"]]))
    return {"per_class": detection_report(pred_map, refs, head.classes, thr), "threshold": thr, "frames": len(frames)}


def evaluate_action_adapter(adapter: Adapter, backbone: str, ranges: list[Range], spec: Spec) -> dict:
    side = int(adapter.head_config.get("image_size", 224))
    clips = [c for s in sources_of(adapter) for c in activity_clips(s, ranges, spec)]
    frames, idx = frame_lookup(clips)
    model = merged_backbone(backbone, adapter)
    feats, lbs = features(model, frames, side)
    head, clip_len = adapter.head, adapter.clip_len
    pred = []
    for c in idx:
        raw = head(feats.select(torch.tensor(c)), clip_len)
        pred += [r.to_json() for r in head.decode(raw, [lbs[c[0]]], [frames[c[0]].size])]
    true = [c.label for c in clips]
    report = action_report([p["label"] for p in pred], true, head.labels)
    if head.persons:
        report["persons"] = person_activity_report([p["persons"] for p in pred], [c.persons for c in clips],
                                                   head.person_labels, head.score_threshold)
    return report


def evaluate_adapter(path: str | Path, ranges: list[Range], backbone: str = "dinov2-small",
                     teachers_dir: Path | None = None, cache_dir: Path | None = None, draw_dir: Path | None = None) -> dict:
    """Accuracy of one adapter directory on the given video ranges, one report per range."""
    hidden = load_backbone(backbone).config.hidden_size
    adapter = load_adapter_dir(Path(path).name, path, hidden)
    spec = Spec(name="eval", task=adapter.task, output=Path(path), backbone=backbone, teachers_dir=teachers_dir,
                cache_dir=cache_dir, clip_len=adapter.clip_len)
    reports = {}
    for r in ranges:
        t0 = time.monotonic()
        where = f"{r.video.name}[{r.start:g}-{'end' if r.end is None else f'{r.end:g}'}]"
        if adapter.task == "detection":
            from .frames import read_frames

            draw = None if draw_dir is None else Path(draw_dir) / f"{r.video.stem}-{r.start:g}.png"
            reports[where] = evaluate_detection_adapter(adapter, backbone, read_frames(r.video, r.start, r.end, r.step),
                                                        spec, draw=draw)
        else:
            reports[where] = evaluate_action_adapter(adapter, backbone, [r], spec)
        reports[where]["seconds"] = round(time.monotonic() - t0, 1)
    return {"adapter": str(path), "task": adapter.task, "reports": reports}
