"""Orchestration of one training spec: data → cached features → train → validate → test → save.

`DetectionData` / `ActionData` hold everything that depends only on the data and the split layer (frames,
labels, cached lower features, targets), so fusion and the baselines reuse them across many runs.
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from vlora_va.contracts.geometry import Letterbox
from vlora_va.engine.adapters import save_adapter_dir
from vlora_va.engine.backbones import resolve
from vlora_va.engine.heads import DECODE_ONLY
from vlora_va.engine.vit import num_blocks
from vlora_va.training import train as T
from vlora_va.training.actions import MIRRORED, REVERSED
from vlora_va.training.augment import camera_views, zoom_views
from vlora_va.training.data import (
    LabelledClip,
    activity_clips,
    detection_labels,
    frame_lookup,
    frames_of,
    manifest_clips,
    merge_labels,
    people_there,
)
from vlora_va.training.features import FeatureCache, frozen_layers
from vlora_va.training.frames import TrainingFrame, letterbox_params, letterboxed
from vlora_va.training.metrics import (
    action_report,
    best_f1_threshold,
    detection_report,
    mean_f1,
    person_activity_report,
)
from vlora_va.training.spec import LoraSpec, SourceSpec, Spec, target_names
from vlora_va.training.targets import build_targets, middle_frame_targets, person_targets


def cache_root(spec: Spec) -> Path:
    return spec.cache_dir or Path.home() / ".cache" / "vlora-va"


@dataclass
class Split:
    """One data split (train / val / test) of a detection spec."""

    frames: list[TrainingFrame]
    labels: dict[str, dict[str, list[dict]]]  # source name -> frame key -> labels
    lower: torch.Tensor | None = None
    lower_flip: torch.Tensor | None = None
    images: torch.Tensor | None = None  # uint8 [N, S, S, 3] letterboxed frames, for heads that read the image

    @property
    def letterboxes(self) -> list[Letterbox]:
        return [letterbox_params(*f.size, self.side) for f in self.frames]

    side: int = 224

    def refs(self, sources: list[SourceSpec]) -> dict[str, list[dict]]:
        return merge_labels(*(self.labels[s.name] for s in sources))


def detection_split(spec: Spec, ranges, name: str, progress: bool = True) -> Split:
    """The frames of `ranges` and every source's labels for them; the "train" split also gets the spec's
    zoomed-in crops (augment.zoom_views), labelled by the teachers like any frame."""
    frames = frames_of(ranges)
    if name == "train":  # never train within 1 s of a human-checked frame: those frames measure the adapter
        frames = away_from_human(frames)
    clean = list(frames)
    if name == "train" and spec.opts.zoom_in:
        frames += zoom_views(frames, spec.opts.zoom_in, tuple(spec.opts.zoom_scale), spec.opts.seed)
    labels = {s.name: detection_labels(s, frames, spec, progress) for s in spec.sources}
    if name == "train" and spec.opts.camera_views:
        views, carried = camera_views(clean, labels, spec.opts.camera_views, spec.opts.seed)
        frames += views
        for s in spec.sources:
            labels[s.name].update(carried[s.name])
    return Split(frames, labels, side=spec.image_size)


def away_from_human(frames: list[TrainingFrame]) -> list[TrainingFrame]:
    """The frames more than 1 s from every human-checked frame of their video (adapters/eval/human-v1.json)."""
    from vlora_va.training.frame_picking import away_from, shipped_human_times

    times = {video: shipped_human_times(video) for video in {f.video for f in frames}}
    return [f for f in frames if away_from([f], times[f.video])]  # the frames' order is the run's identity


def clips_away_from_human(clips: list[LabelledClip]) -> list[LabelledClip]:
    """The clips whose whole window lies more than 1 s from every human-checked frame of their video. The window is
    [start, start + 1 s) (every frame of it made the label, not only the frames the model sees), or up to the clip's
    last frame if that is later (a manifest clip)."""
    from vlora_va.training.frame_picking import LEAK_MARGIN_S, shipped_human_times

    def away(c: LabelledClip) -> bool:
        end = max(c.start + 1.0, c.frames[-1].t if c.frames else c.start)
        return all(c.start - h > LEAK_MARGIN_S + 1e-6 or h - end >= LEAK_MARGIN_S - 1e-6
                   for h in shipped_human_times(c.video))

    return [c for c in clips if away(c)]


def cache_features(spec: Spec, split: Split, layer: int, flip: bool, progress: bool = True) -> None:
    model = T.build_model(spec.backbone, LoraSpec(layers=[]))
    cache = FeatureCache(cache_root(spec), resolve(spec.backbone), spec.image_size, layer)
    split.lower = cache.get(model, split.frames, progress=progress)
    split.lower_flip = cache.get(model, split.frames, flip=True, progress=progress) if flip else None
    if spec.head.get("detail"):
        split.images = letterboxed(split.frames, spec.image_size)[0]


def classes_of(sources: list[SourceSpec]) -> list[str]:
    out: list[str] = []
    for s in sources:
        out += [c for c in s.classes if c not in out]
    return out


def train_detection(spec: Spec, train: Split, sources: list[SourceSpec], lora: LoraSpec, deadline: float,
                    warm: tuple | None = None, tag: str = "", progress: bool = True) -> T.RunResult:
    """Train (or continue training `warm` = (model, head)) one detection adapter on `sources`."""
    classes = classes_of(sources)
    # A warm start trains a copy: fusion must be able to roll back to the untouched previous state.
    model = T.build_model(spec.backbone, lora, spec.opts.seed) if warm is None else copy.deepcopy(warm[0])
    hidden = (model.get_base_model() if hasattr(model, "get_base_model") else model).config.hidden_size
    head, _ = T.new_head("detection", classes, hidden, spec.image_size, spec.head,
                         warm=None if warm is None else warm[1])
    patch = T.backbone_patch(model)
    grid = head.upsample * spec.image_size // patch
    refs = train.refs(sources)
    lbs = train.letterboxes
    lower, targets = [train.lower], []
    for flip in ([False, True] if train.lower_flip is not None else [False]):
        for f, lb in zip(train.frames, lbs):
            targets.append(build_targets([r for r in refs[f.key] if not r["ignore"]], lb, spec.image_size, grid,
                                         classes, flip))
    if train.lower_flip is not None:
        lower.append(train.lower_flip)
    lower = torch.cat(lower)
    images = None
    if train.images is not None:  # mirrored like the flipped features (flip=True letterboxes, then mirrors)
        images = torch.cat([train.images, train.images.flip(2)]) if train.lower_flip is not None else train.images
    split = min(lora.layers) if lora.layers else 12
    loss_fn = T.detection_loss_fn(lower, targets, split, spec.image_size, patch, images)
    # the sources in full: a run on other labels (another threshold, the teacher on tiles, other hand fixes) is
    # another run; hand fixes count by their content's digest, not where the file lies
    fp = T._fingerprint(tag, spec.backbone, classes, T.lora_identity(lora), T.run_settings(spec.opts), spec.image_size,
                        [f.key for f in train.frames], len(lower), spec.head, [_label_identity(s) for s in sources])
    return T.run(model, head, len(lower), loss_fn, spec.opts, deadline, checkpoint_path(spec, tag, fp), fp,
                 f"train {tag or spec.name}")


def checkpoint_path(spec: Spec, tag: str, fingerprint: str) -> Path:
    """Where a run's checkpoint lies: named by what the run computes (its fingerprint: the backbone, the training
    frames, labels, head, LoRA and recipe), not by the spec that asked for it, so a study spec repeating another
    spec's run resumes it instead of training it again."""
    return cache_root(spec) / "checkpoints" / spec.task / f"{tag or 'run'}-{fingerprint}.pt"


def _label_identity(source: SourceSpec) -> dict:
    out = asdict(source)
    out["options"] = {k: v for k, v in out["options"].items() if k != "corrections"}  # its digest stays
    return out


NMS_CHOICES = (0.4, 0.5, 0.6, 0.7)  # IoU above which a weaker box of the same class is dropped


def _split_outputs(spec: Spec, model, head, split: Split, lora: LoraSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """The head's raw output on every frame of a split: the upper layers run once, decoded as often as needed."""
    layer = min(lora.layers) if lora.layers else 12
    return T.detection_outputs(model, head, split.lower, layer, spec.image_size, T.backbone_patch(model),
                               images=split.images)


def calibrate_detection(head, raw: tuple[torch.Tensor, torch.Tensor], val: Split,
                        sources: list[SourceSpec]) -> tuple[float, float]:
    """(score threshold, NMS IoU) with the best mean F1 on the validation split (`raw`: the head's output on it,
    `_split_outputs`); both are set on `head`. Side-by-side people overlap: NMS at 0.5 can drop the second of
    two correct boxes, so its IoU is chosen too, never on test data."""
    refs, classes = val.refs(sources), classes_of(sources)
    best = (-1.0, 0.3, head.nms_iou)
    for nms in NMS_CHOICES:
        head.nms_iou = nms
        preds = T.decode_detections(head, raw, val.letterboxes, [f.size for f in val.frames])
        pred_map = {f.key: p for f, p in zip(val.frames, preds)}
        threshold = best_f1_threshold(pred_map, refs, classes)
        f1 = mean_f1(detection_report(pred_map, refs, classes, threshold))
        if f1 > best[0] + 1e-9:  # ties keep the stricter (earlier) NMS
            best = (f1, threshold, nms)
    _, head.score_threshold, head.nms_iou = best
    return best[1], best[2]


def evaluate_detection(spec: Spec, result_model, head, split: Split, sources: list[SourceSpec], lora: LoraSpec,
                       threshold: float | None = None) -> tuple[dict, float, list[list[dict]]]:
    """(per-class report, threshold used, predictions) with the head's NMS. threshold None: calibrate the
    threshold and NMS on this split first (`calibrate_detection`; validation data only)."""
    raw = _split_outputs(spec, result_model, head, split, lora)
    if threshold is None:
        threshold, _ = calibrate_detection(head, raw, split, sources)
    preds = T.decode_detections(head, raw, split.letterboxes, [f.size for f in split.frames])
    pred_map = {f.key: p for f, p in zip(split.frames, preds)}
    return detection_report(pred_map, split.refs(sources), classes_of(sources), threshold), threshold, preds


def save_detection(spec: Spec, out: Path, result: T.RunResult, lora: LoraSpec, sources: list[SourceSpec],
                   threshold: float, metrics: dict, card: str) -> Path:
    head = result.head
    head.score_threshold = threshold
    params = {**spec.head, "image_size": spec.image_size, "score_threshold": threshold, "nms_iou": head.nms_iou}
    cfg = T.head_config("detection", head.classes, spec.image_size, params)
    cfg["metrics"] = metrics
    cfg["sources"] = [s.name for s in sources]
    p = save_adapter_dir(out, lora=T.lora_weights(result.model, lora), rank=lora.rank, alpha=lora.alpha,
                         target_modules=target_names(lora) or ["encoder.layer.11.attention.q_proj"],
                         base_model=spec.backbone, head=head, head_config=cfg)
    (p / "README.md").write_text(card)
    return p


# --- action ------------------------------------------------------------------------------------------------

@dataclass
class ClipSet:
    frames: list[TrainingFrame]
    clips: list[list[int]]
    labels: list[str]
    starts: list[tuple[str, float]] = field(default_factory=list)
    persons: list[list[dict]] = field(default_factory=list)  # per clip: labelled persons (actions.person_activities)
    seen: list[list[list[float]]] = field(default_factory=list)  # per clip: every teacher person box (don't care)
    frame_boxes: list[list[list[list[float]]]] = field(default_factory=list)  # per clip and frame: teacher person boxes
    lower: torch.Tensor | None = None
    lower_flip: torch.Tensor | None = None
    side: int = 224
    images: torch.Tensor | None = None  # uint8 [N, S, S, 3] letterboxed frames, for a person head's detail branch

    @property
    def letterboxes(self) -> list[Letterbox]:
        """One per clip (its frames share a video, hence a letterbox)."""
        return [letterbox_params(*self.frames[c[0]].size, self.side) for c in self.clips]

    @property
    def sizes(self) -> list[tuple[int, int]]:
        return [self.frames[c[0]].size for c in self.clips]

    @property
    def frame_times(self) -> list[list[float]]:
        """Per clip, its frames' media times (s)."""
        return [[self.frames[j].t for j in c] for c in self.clips]

    def people_there(self) -> list[list[list[float]]] | None:
        """Per clip, data.people_there; None for a set without teacher boxes (hand-built in tests)."""
        return [people_there(fb) for fb in self.frame_boxes] if self.frame_boxes else None

    def activities(self) -> list[str]:
        """Every label a clip or a person of this set has."""
        return sorted(set(self.labels) | {p["label"] for ps in self.persons for p in ps})


def action_clipset(spec: Spec, ranges, progress: bool = True, train: bool = False) -> ClipSet:
    clips = []
    for s in spec.sources:
        clips += activity_clips(s, ranges, spec, progress) if s.kind == "activity" else manifest_clips(s, ranges, spec)
    if train:  # never train within 1 s of a human-checked frame, as detection_split
        clips = clips_away_from_human(clips)
    frames, idx = frame_lookup(clips)
    return ClipSet(frames, idx, [c.label for c in clips], [(c.video, c.start) for c in clips],
                   [c.persons for c in clips], [c.seen for c in clips], [c.frame_boxes for c in clips],
                   side=spec.image_size)


def cache_clip_features(spec: Spec, cs: ClipSet, layer: int, flip: bool, progress: bool = True) -> None:
    model = T.build_model(spec.backbone, LoraSpec(layers=[]))
    cache = FeatureCache(cache_root(spec), resolve(spec.backbone), spec.image_size, layer)
    cs.lower = cache.get(model, cs.frames, progress=progress)
    cs.lower_flip = cache.get(model, cs.frames, flip=True, progress=progress) if flip else None
    if spec.head.get("detail") and cs.images is None:
        cs.images = letterboxed(cs.frames, spec.image_size)[0]


def reversed_persons(persons: list[dict]) -> list[dict]:
    """The persons of a clip played backwards: every motion reverses (actions.REVERSED), boxes stay."""
    return [{**p, "label": REVERSED.get(p["label"], p["label"])} for p in persons]


def rare_clips(cs: ClipSet) -> list[int]:
    """Clips with a sure walking_toward / walking_away person: the classes time reversal makes more of."""
    return [k for k, ps in enumerate(cs.persons)
            if any(p["label"] in ("walking_toward", "walking_away") and p.get("sure", True) for p in ps)]


def train_action(spec: Spec, cs: ClipSet, labels: list[str], lora: LoraSpec, deadline: float, tag: str = "") -> T.RunResult:
    model = T.build_model(spec.backbone, lora, spec.opts.seed)
    hidden = (model.get_base_model() if hasattr(model, "get_base_model") else model).config.hidden_size
    head, _ = T.new_head("action", labels, hidden, spec.image_size, spec.head, clip_len=spec.clip_len)
    if spec.box_head_from is not None:
        start_box_head(head.box_head, spec.box_head_from, hidden)
    # freeze applies to the LoRA + head model only (spec.TrainSpec.freeze)
    frozen = set(spec.opts.freeze) if lora.layers else set()
    if "lora" in frozen:
        model.requires_grad_(False)
    if "box_head" in frozen:
        head.box_head.requires_grad_(False)
    lbs = cs.letterboxes
    # one sample per (clip, view): (frame indices into `lower`, clip label, persons, clip index, mirrored,
    # the teacher's person boxes per frame in the order the model sees them)
    frame_boxes = cs.frame_boxes or [[] for _ in cs.clips]  # hand-built sets in tests may have none
    samples = [(c, cs.labels[k], cs.persons[k], k, False, frame_boxes[k]) for k, c in enumerate(cs.clips)]
    lower, images = cs.lower, cs.images
    if cs.lower_flip is not None:  # mirrored clips: left and right swap
        n = len(cs.frames)
        lower = torch.cat([cs.lower, cs.lower_flip])
        images = None if images is None else torch.cat([images, images.flip(2)])  # as flip=True letterboxes
        samples += [([j + n for j in c], MIRRORED.get(cs.labels[k], cs.labels[k]), cs.persons[k], k, True,
                     frame_boxes[k]) for k, c in enumerate(cs.clips)]
    if spec.opts.reverse:  # the rare clips played backwards: toward <-> away, left <-> right (REVERSED)
        samples += [(cs.clips[k][::-1], REVERSED.get(cs.labels[k], cs.labels[k]), reversed_persons(cs.persons[k]), k,
                     False, frame_boxes[k][::-1]) for k in rare_clips(cs)]
    clips = [sm[0] for sm in samples]
    y = torch.tensor([labels.index(sm[1]) for sm in samples])
    persons = frame_targets = None
    if head.persons:
        grid = spec.image_size // T.backbone_patch(model)
        persons = [person_targets(ps, cs.seen[k], lbs[k], spec.image_size, grid, head.person_labels, flip)
                   for _, _, ps, k, flip, _ in samples]
    # the box loss trains the box head, or keeps a trained LoRA's features what a frozen box head needs; with both
    # frozen it teaches nothing
    if head.box_head is not None and not {"box_head", "lora"} <= frozen:
        grid = spec.image_size // T.backbone_patch(model) * head.box_head.upsample
        frame_targets = [middle_frame_targets(fb, lbs[k], spec.image_size, grid, flip)
                         for _, _, _, k, flip, fb in samples]
    split = min(lora.layers) if lora.layers else 12
    if "lora" in frozen:  # the LoRA layers' output never changes: run them once, not every step
        lower, split = frozen_layers(model, lower, split), num_blocks(model)
    loss_fn = T.action_loss_fn(lower, clips, y, _balanced(y, len(labels)), split, spec.image_size,
                               T.backbone_patch(model), spec.clip_len, persons,
                               None if persons is None else _balanced(torch.cat([t[3][t[3] >= 0] for t in persons]),
                                                                      len(head.person_labels)), frame_targets,
                               images)
    fp = T._fingerprint(tag, spec.backbone, labels, T.lora_identity(lora), T.run_settings(spec.opts), spec.image_size,
                        [f.key for f in cs.frames], len(clips), learnt_head_params(spec.head), spec.clip_len,
                        [asdict(s) for s in spec.sources],
                        T.file_digest(spec.box_head_from / "head.safetensors") if spec.box_head_from else None)
    return T.run(model, head, len(clips), loss_fn, spec.opts, deadline, checkpoint_path(spec, tag, fp), fp,
                 f"train {tag or spec.name}")


def learnt_head_params(params: dict) -> dict:
    """The head params that change what a run learns: a run's identity leaves out those that only change how
    its outputs are read (heads.DECODE_ONLY), so a decoding change rescores a finished run instead of redoing it."""
    return {k: v for k, v in params.items() if k not in DECODE_ONLY}


def start_box_head(box_head, path: Path, hidden: int) -> None:
    """Start a person box head from the detection adapter at `path`: every weight, and of its class output the
    person row (load_spec checked the shapes)."""
    from vlora_va.engine.adapters import load_adapter_dir

    source = load_adapter_dir(path.name, path, hidden).head
    person = source.classes.index("person")
    state = box_head.state_dict()
    for k, v in source.state_dict().items():
        state[k] = v[person:person + 1].clone() if k.startswith("cls_out.") else v.clone()
    box_head.load_state_dict(state)


def _balanced(y: torch.Tensor, n: int) -> torch.Tensor:
    """Class weights ∝ 1/sqrt(frequency), mean 1: rare activities still count."""
    counts = torch.bincount(y, minlength=n).float().clamp(min=1)
    weight = (counts.sum() / counts).sqrt()
    return weight / weight.mean()


def predict_action(spec: Spec, model, head, cs: ClipSet, lora: LoraSpec) -> list[dict]:
    """The head's decoded output per clip (label, scores and, with the persons branch, persons)."""
    layer = min(lora.layers) if lora.layers else 12
    return T.predict_action(model, head, cs.lower, cs.clips, layer, spec.image_size, T.backbone_patch(model),
                            spec.clip_len, cs.letterboxes, cs.sizes, images=cs.images, frame_times=cs.frame_times)


def evaluate_action(spec: Spec, head, cs: ClipSet, pred: list[dict]) -> dict:
    """Clip top-1 and confusion; with persons, the per-person activity report at the head's threshold."""
    report = action_report([p["label"] for p in pred], cs.labels, head.labels)
    if head.persons:
        report["persons"] = person_activity_report([p["persons"] for p in pred], cs.persons, head.person_labels,
                                                   head.score_threshold, cs.people_there())
    return report


def deadline_after(minutes: float) -> float:
    return time.monotonic() + minutes * 60

