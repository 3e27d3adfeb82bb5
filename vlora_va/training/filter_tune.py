"""`vlora-va filter tune`: the frame-filter threshold that filters a camera's quiet footage and keeps a task within
its accuracy target.

    the stream's video over a range (training data), and other footage of the same camera (`--also`: its quiet
    hours) ─► chunks as ingest cuts them ─► the task's frames per chunk
    ─► the adapter's result per chunk, unfiltered (merged LoRA, as the daemon's merged mode serves)
    ─► per candidate threshold: ingest's FrameFilter over the same frames ─► which chunks reuse which
    ─► the loss against the unfiltered results, and the share filtered
    ─► of the thresholds within max_loss, the smallest that filters (nearly) as much as any of them

Why the smallest and not the largest: above the camera's noise a larger threshold filters little more of the
footage it was tuned on; what it adds is chunks where something small did change (a far walker, one leaving the
view), which the footage may not have shown. So the choice is the knee: the smallest threshold within KNEE of the
most any passing threshold filters. Footage with no quiet stretch filters nothing at any threshold and gives the
smallest candidate: tune with the camera's quiet footage (`also`).

The loss is measured against the unfiltered run, not against labels: filtering should change nothing the model
would have said. Detection: 1 - F1 of each chunk's (reused) boxes against its own unfiltered boxes, IoU >= 0.5 and
the same class, at the head's threshold, over every frame. Activity (one label per clip): 1 - the share of chunks
whose label matches. Activity with a persons branch (`actions-persons`): per person, 1 - the share of the persons
each chunk's own result finds that the reused result gives with the same activity (IoU >= 0.5), the rule the
human-checked set scores it by; per clip, a short range allows no change at all (24 clips: one is 0.04).
The figures come from the adapter run offline (vlora_va/training/evaluate.py), and the filter from ingest's own
code (vlora_va/ingest/filtering.py), so the threshold means the same in both.

The pieces are public so a benchmark can run the model once and score many thresholds and ranges from the same
results (bench/filter_accuracy.py): `TaskModel` (a chunk's unfiltered result), `Plans` (ingest's filter at several
thresholds, chunk by chunk), `loss` and `tune_report` (the candidates and the choice).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from vlora_va.contracts.boxes import iou_matrix
from vlora_va.contracts.config import PipelineConfig
from vlora_va.contracts.filtering import FilterConfig
from vlora_va.engine.adapters import load_adapter_dir
from vlora_va.engine.backbones import load_backbone
from vlora_va.ingest.chunker import letterbox, plan_chunk
from vlora_va.ingest.filtering import FrameFilter
from vlora_va.training.evaluate import detection_predictions, features, merged_backbone
from vlora_va.training.frames import TrainingFrame, iter_frames

# In the filter's unit (vlora_va/ingest/filtering.py: the most-changed block's mean grey difference): sensor noise
# is about 0.5-2 on the sample cameras, a person a second apart 8 or more.
THRESHOLDS = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0)
KNEE = 0.02  # a larger threshold is chosen only where it filters this much more of the footage
MATCH_IOU = 0.5  # a reused box / person is the same one when it overlaps the chunk's own by this much


@dataclass(frozen=True)
class Candidate:
    threshold: float
    loss: float
    reused_share: float


@dataclass(frozen=True)
class TuneReport:
    stream: str
    task: str
    kind: str  # "detection" | "action" | "persons" (an action head with a persons branch: loss per person)
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


def stream_chunks(config: PipelineConfig, stream_id: str, start: float, end: float | None):
    """Per chunk of the stream over [start, end): {task name: the task's frames (training Frames)}, cut as ingest
    cuts them (one decode serves every task of the stream)."""
    stream = config.stream(stream_id)
    send, per_task = plan_chunk(stream.frames_per_chunk, stream.tasks)
    picks = {t.name: [send[p] for p in positions] for t, positions in zip(stream.tasks, per_task)}
    n = stream.frames_per_chunk
    chunk: list[TrainingFrame] = []
    for f in iter_frames(stream.source, start, end, step=1.0 / stream.fps):
        chunk.append(f)
        if len(chunk) == n:
            yield {name: [chunk[i] for i in idx] for name, idx in picks.items()}
            chunk = []


def task_chunks(config: PipelineConfig, stream_id: str, task_name: str, start: float, end: float | None):
    """Per chunk of the stream over [start, end): the task's frames (training Frames), cut as ingest cuts them."""
    if task_name not in {t.name for t in config.stream(stream_id).tasks}:
        raise ValueError(f"stream {stream_id} has no task {task_name!r}")
    for chunk in stream_chunks(config, stream_id, start, end):
        yield chunk[task_name]


class Plans:
    """Ingest's filter at several thresholds at once, fed one chunk's images at a time (no frame is kept): per
    threshold, the chunk whose result each chunk gets (itself when its frames are sent) and the difference feature
    the filter saw (None where it had nothing to compare with). The filter only looks back, so the first n entries
    are what a run over the first n chunks alone would give."""

    def __init__(self, thresholds, refresh: int):
        self._filters = {th: FrameFilter(FilterConfig(threshold=th, refresh_chunks=refresh)) for th in thresholds}
        self.plans: dict[float, list[int]] = {th: [] for th in self._filters}
        self.differences: dict[float, list[float | None]] = {th: [] for th in self._filters}
        self.chunks = 0

    def add(self, images: list[np.ndarray]) -> None:
        for th, f in self._filters.items():
            r = f.decide(self.chunks, images)
            self.plans[th].append(self.chunks if r < 0 else r)
            self.differences[th].append(f.last_difference)
        self.chunks += 1


def reuse_plan(thumb_chunks: list[list], threshold: float, refresh: int) -> list[int]:
    """For each chunk, the chunk whose result it gets under this threshold (itself when its frames are sent)."""
    plans = Plans((threshold,), refresh)
    for images in thumb_chunks:
        plans.add(images)
    return plans.plans[threshold]


def reused_share(plan: list[int]) -> float:
    return sum(src != seq for seq, src in enumerate(plan)) / max(1, len(plan))


def detection_loss(preds: list[list[list[dict]]], plan: list[int], threshold: float) -> float:
    """1 - F1 of the boxes each chunk reports (its source chunk's, frame by frame) against its own."""
    tp = fp = fn = 0
    for seq, src in enumerate(plan):
        for got, want in zip(preds[src], preds[seq]):
            got = [d for d in got if d["score"] >= threshold]
            want = [d for d in want if d["score"] >= threshold]
            matched = len(_pairs(got, want))
            tp, fp, fn = tp + matched, fp + len(got) - matched, fn + len(want) - matched
    return 0.0 if tp + fp + fn == 0 else 1.0 - 2 * tp / (2 * tp + fp + fn)


def _pairs(got: list[dict], want: list[dict], same_class: bool = True) -> list[tuple[dict, dict]]:
    """Greedy one-to-one matches at IoU >= MATCH_IOU, highest scores first; of the same class unless told not."""
    got = sorted(got, key=lambda d: -d["score"])
    want = sorted(want, key=lambda d: -d["score"])
    overlap = iou_matrix([d["box"] for d in got], [w["box"] for w in want])
    for i, d in enumerate(got):  # the same box is the same detection, even a degenerate (zero-area) one
        for k, w in enumerate(want):
            if d["box"] == w["box"]:
                overlap[i, k] = 1.0
    free = list(range(len(want)))
    pairs = []
    for i, d in enumerate(got):
        best = max((k for k in free if not same_class or want[k]["class"] == d["class"]), default=None,
                   key=lambda k: overlap[i, k])
        if best is not None and overlap[i, best] >= MATCH_IOU:
            free.remove(best)
            pairs.append((d, want[best]))
    return pairs


def action_loss(labels: list[str], plan: list[int]) -> float:
    return 1.0 - sum(labels[src] == labels[seq] for seq, src in enumerate(plan)) / max(1, len(plan))


def person_loss(persons: list[list[dict]], plan: list[int], threshold: float) -> float:
    """1 - per-person top-1 against the unfiltered run: of the persons each chunk's own result finds (score >=
    threshold), the share that the result it gets (its source chunk's) has at the same place (IoU >= 0.5, one to
    one, best scores first) with the same activity. As in the human-checked set's per-person top-1, a person the
    reused result lacks is wrong and one it adds counts nowhere."""
    right = total = 0
    for seq, src in enumerate(plan):
        want = [p for p in persons[seq] if p["score"] >= threshold]
        got = [p for p in persons[src] if p["score"] >= threshold]
        total += len(want)
        right += sum(g["activity"] == w["activity"] for g, w in _pairs(got, want, same_class=False))
    return 0.0 if total == 0 else 1.0 - right / total


def loss(kind: str, results: list, plan: list[int], threshold: float) -> float:
    """What the plan changes of a task's unfiltered results (TaskModel.result per chunk), by the task's kind."""
    if kind == "detection":
        return detection_loss(results, plan, threshold)
    if kind == "persons":
        return person_loss([r["persons"] for r in results], plan, threshold)
    return action_loss([r["label"] for r in results], plan)


class TaskModel:
    """One task's adapter folded into the backbone (merged LoRA, as the daemon's merged mode serves it).
    `result(frames)` is a chunk's unfiltered result: detection, per frame every box scoring >= 0.05 (the head's
    threshold is applied when scoring); an action head, the clip's result as a row holds it (label, scores, and
    with a persons branch its persons). `kind` says which loss applies and `threshold` is the head's."""

    def __init__(self, config: PipelineConfig, stream_id: str, task_name: str):
        task = next(t for t in config.stream(stream_id).tasks if t.name == task_name)
        if task.track:
            raise ValueError(f"task {task_name!r} is tracked: tracked tasks are never filtered")
        hidden = load_backbone(config.daemon.backbone).config.hidden_size
        self.adapter = load_adapter_dir(task.adapter, config.adapters[task.adapter], hidden)
        self.model = merged_backbone(config.daemon.backbone, self.adapter)
        head = self.adapter.head
        if self.adapter.head_config.get("task", "detection") != "action":
            self.kind = "detection"
        else:
            self.kind = "persons" if head.persons else "action"
        self.threshold = float(head.score_threshold)

    @torch.no_grad()
    def result(self, frames: list[TrainingFrame]):
        head = self.adapter.head
        if self.kind == "detection":
            by_key = detection_predictions(self.adapter, self.model, frames)
            return [by_key[f.key] for f in frames]
        side = int(self.adapter.head_config.get("image_size", 224))
        feats, lbs = features(self.model, frames, side, keep_pixels=bool(head.detail))
        return head.decode(head(feats, len(frames)), [lbs[0]], [frames[0].size], [[f.t for f in frames]])[0].to_json()


def tune_report(stream_id: str, task_name: str, kind: str, threshold: float, results: list,
                plans: dict[float, list[int]], max_loss: float, refresh_chunks: int) -> TuneReport:
    """Every candidate threshold's loss and reused share over these chunks, and the knee of those within max_loss:
    the smallest that filters within KNEE of the most any of them filters (the losses are measured, not assumed to
    grow with the threshold)."""
    candidates = tuple(Candidate(th, round(loss(kind, results, plan, threshold), 4), round(reused_share(plan), 3))
                       for th, plan in sorted(plans.items()))
    return TuneReport(stream_id, task_name, kind, len(results), max_loss, refresh_chunks, candidates,
                      knee(candidates, max_loss))


def knee(candidates: tuple[Candidate, ...], max_loss: float) -> Candidate | None:
    """Of the candidates within max_loss, the smallest threshold that filters within KNEE of the most; None: none."""
    passing = [c for c in candidates if c.loss <= max_loss]
    if not passing:
        return None
    most = max(c.reused_share for c in passing)
    return min((c for c in passing if c.reused_share >= most - KNEE), key=lambda c: c.threshold)


def tune(config: PipelineConfig, stream_id: str, task_name: str, start: float = 0.0, end: float | None = None,
         max_loss: float = 0.02, refresh_chunks: int = 10, thresholds: tuple[float, ...] = THRESHOLDS,
         also: tuple[tuple[str, float, float | None], ...] = ()) -> TuneReport:
    """Measure every candidate threshold on the stream's video over [start, end), and on each (video, start, end)
    of `also` (other footage of the same camera, cut and filtered as the stream's own), and pick the knee."""
    stream = config.stream(stream_id)
    task = TaskModel(config, stream_id, task_name)
    footage = ((stream.source, start, end), *also)
    parts = []
    for source, a, b in footage:
        one = dataclasses.replace(config, streams=tuple(dataclasses.replace(s, source=source) if s.id == stream_id
                                                        else s for s in config.streams))
        plans = Plans(thresholds, refresh_chunks)  # a fresh filter per video: a camera restarted on other footage
        results = []
        for chunk in task_chunks(one, stream_id, task_name, a, b):
            plans.add([letterbox(f.rgb, config.daemon.image_size)[0] for f in chunk])  # what ingest's filter sees
            results.append(task.result(chunk))
        if not results:
            raise ValueError(f"stream {stream_id}: no whole chunk in [{a}, {b}) of {source}")
        parts.append((results, plans.plans))
    results, plans = joined(parts)
    return tune_report(stream_id, task_name, task.kind, task.threshold, results, plans, max_loss, refresh_chunks)


def joined(parts: list[tuple[list, dict[float, list[int]]]]) -> tuple[list, dict[float, list[int]]]:
    """Several videos' (results, plans per threshold) as one, each video filtered on its own: a chunk's source
    index is shifted by the chunks of the videos before it."""
    results: list = []
    plans: dict[float, list[int]] = {}
    for part_results, part_plans in parts:
        offset = len(results)
        results += part_results
        for th, plan in part_plans.items():
            plans.setdefault(th, []).extend(offset + src for src in plan)
    return results, plans
