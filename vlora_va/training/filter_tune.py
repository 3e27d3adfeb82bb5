"""`vlora-va filter tune`: the largest frame-filter threshold that keeps a task within its accuracy target.

    the stream's video over a range (training data) ─► chunks as ingest cuts them ─► the task's frames per chunk
    ─► the adapter's result per chunk, unfiltered (merged LoRA, as the daemon's merged mode serves)
    ─► per candidate threshold: ingest's FrameFilter over the same frames ─► which chunks reuse which
    ─► the loss against the unfiltered results ─► the largest threshold within max_loss

The loss is measured against the unfiltered run, not against labels: filtering should change nothing the model
would have said. Detection: 1 - F1 of each chunk's (reused) boxes against its own unfiltered boxes, IoU >= 0.5 and
the same class, at the head's threshold, over every frame. Activity (one label per clip): 1 - the share of chunks
whose label matches. The figures come from the adapter run offline (vlora_va/training/evaluate.py), and the filter
from ingest's own code (vlora_va/ingest/filtering.py), so the threshold means the same in both.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vlora_va.contracts.config import PipelineConfig
from vlora_va.contracts.filtering import FilterConfig
from vlora_va.contracts.geometry import pair_iou
from vlora_va.engine.adapters import load_adapter_dir
from vlora_va.engine.backbones import load_backbone
from vlora_va.ingest.chunker import letterbox, plan_chunk
from vlora_va.ingest.filtering import FrameFilter
from vlora_va.training.evaluate import detection_predictions, features, merged_backbone
from vlora_va.training.frames import Frame, iter_frames

THRESHOLDS = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0)


@dataclass(frozen=True)
class Candidate:
    threshold: float
    loss: float
    reused_share: float


@dataclass(frozen=True)
class TuneReport:
    stream: str
    task: str
    kind: str  # "detection" | "action"
    chunks: int
    max_loss: float
    refresh_chunks: int
    candidates: tuple[Candidate, ...]
    chosen: Candidate | None  # None: no threshold stays within max_loss

    def yaml(self) -> str:
        if self.chosen is None:
            return "# no threshold kept the loss within max_loss: leave this task unfiltered"
        return (f"filter: {{threshold: {self.chosen.threshold:g}, refresh_chunks: {self.refresh_chunks}, "
                f"max_loss: {self.max_loss:g}}}")


def task_chunks(config: PipelineConfig, stream_id: str, task_name: str, start: float, end: float | None):
    """Per chunk of the stream over [start, end): the task's frames (training Frames), cut as ingest cuts them."""
    stream = config.stream(stream_id)
    index = [t.name for t in stream.tasks].index(task_name)
    send, per_task = plan_chunk(stream.frames_per_chunk, stream.tasks)
    mine = [send[p] for p in per_task[index]]
    n = stream.frames_per_chunk
    chunk: list[Frame] = []
    for f in iter_frames(stream.source, start, end, step=1.0 / stream.fps):
        chunk.append(f)
        if len(chunk) == n:
            yield [chunk[i] for i in mine]
            chunk = []


def reuse_plan(thumb_chunks: list[list], threshold: float, refresh: int) -> list[int]:
    """For each chunk, the chunk whose result it gets under this threshold (itself when its frames are sent)."""
    f = FrameFilter(FilterConfig(threshold=threshold, refresh_chunks=refresh))
    out = []
    for seq, images in enumerate(thumb_chunks):
        r = f.decide(seq, images)
        out.append(seq if r < 0 else r)
    return out


def detection_loss(preds: list[list[list[dict]]], plan: list[int], threshold: float) -> float:
    """1 - F1 of the boxes each chunk reports (its source chunk's, frame by frame) against its own."""
    tp = fp = fn = 0
    for seq, src in enumerate(plan):
        for got, want in zip(preds[src], preds[seq]):
            got = [d for d in got if d["score"] >= threshold]
            want = [d for d in want if d["score"] >= threshold]
            matched = _matches(got, want)
            tp, fp, fn = tp + matched, fp + len(got) - matched, fn + len(want) - matched
    return 0.0 if tp + fp + fn == 0 else 1.0 - 2 * tp / (2 * tp + fp + fn)


def _matches(got: list[dict], want: list[dict]) -> int:
    """Greedy one-to-one matches, same class and IoU >= 0.5, highest scores first."""
    def iou(a: dict, b: dict) -> float:  # the same box is the same detection, even a degenerate (zero-area) one
        return 1.0 if a["box"] == b["box"] else pair_iou(a["box"], b["box"])

    free = sorted(want, key=lambda d: -d["score"])
    n = 0
    for d in sorted(got, key=lambda d: -d["score"]):
        best = max((w for w in free if w["class"] == d["class"]), default=None, key=lambda w: iou(d, w))
        if best is not None and iou(d, best) >= 0.5:
            free.remove(best)
            n += 1
    return n


def action_loss(labels: list[str], plan: list[int]) -> float:
    return 1.0 - sum(labels[src] == labels[seq] for seq, src in enumerate(plan)) / max(1, len(plan))


@torch.no_grad()
def tune(config: PipelineConfig, stream_id: str, task_name: str, start: float = 0.0, end: float | None = None,
         max_loss: float = 0.02, refresh_chunks: int = 10, thresholds: tuple[float, ...] = THRESHOLDS) -> TuneReport:
    """Measure every candidate threshold on the stream's video over [start, end) and pick the largest within
    max_loss (the losses are measured, not assumed to grow with the threshold: the largest passing one wins)."""
    stream = config.stream(stream_id)
    task = next(t for t in stream.tasks if t.name == task_name)
    if task.track:
        raise ValueError(f"task {task_name!r} is tracked: tracked tasks are never filtered")
    hidden = load_backbone(config.daemon.backbone).config.hidden_size
    adapter = load_adapter_dir(task.adapter, config.adapters[task.adapter], hidden)
    model = merged_backbone(config.daemon.backbone, adapter)
    chunks = list(task_chunks(config, stream_id, task_name, start, end))
    if not chunks:
        raise ValueError(f"stream {stream_id}: no whole chunk in [{start}, {end}) of {stream.source}")
    size = config.daemon.image_size
    images = [[letterbox(f.rgb, size)[0] for f in c] for c in chunks]  # what ingest's filter compares
    kind = adapter.head_config.get("task", "detection")
    if kind == "action":
        side = int(adapter.head_config.get("image_size", 224))
        labels = []
        for c in chunks:
            feats, lbs = features(model, c, side, keep_pixels=bool(adapter.head.detail))
            result = adapter.head.decode(adapter.head(feats, len(c)), [lbs[0]], [c[0].size], [[f.t for f in c]])[0]
            labels.append(result.to_json()["label"])
        loss_of = lambda plan: action_loss(labels, plan)  # noqa: E731
    else:
        flat = [f for c in chunks for f in c]
        by_key = detection_predictions(adapter, model, flat)
        preds = [[by_key[f.key] for f in c] for c in chunks]
        loss_of = lambda plan: detection_loss(preds, plan, adapter.head.score_threshold)  # noqa: E731
    candidates = []
    for th in sorted(thresholds):
        plan = reuse_plan(images, th, refresh_chunks)
        reused = sum(src != seq for seq, src in enumerate(plan)) / len(plan)
        candidates.append(Candidate(th, round(loss_of(plan), 4), round(reused, 3)))
    passing = [c for c in candidates if c.loss <= max_loss]
    return TuneReport(stream_id, task_name, kind, len(chunks), max_loss, refresh_chunks, tuple(candidates),
                      max(passing, key=lambda c: c.threshold) if passing else None)
