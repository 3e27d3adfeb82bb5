"""The training spec (`vlora-va train SPEC.yaml`): one YAML file → one typed, validated `Spec`.

Relative paths are resolved against the spec file's folder. Example: adapters/specs/detect.yaml.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

SOURCE_KINDS = ("centernet", "nanodet", "fused", "hog", "haar", "coco", "activity", "manifest")
LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "fc1", "fc2")


class SpecError(ValueError):
    """A spec that cannot be used; the message names the key."""


@dataclass
class Range:
    video: Path
    start: float = 0.0
    end: float | None = None
    step: float | None = None  # seconds between frames (None: every frame)

    def holds(self, t: float) -> bool:
        """Whether media time t (seconds) lies in the range: start <= t < end."""
        return t >= self.start - 1e-6 and (self.end is None or t < self.end - 1e-6)


@dataclass
class SourceSpec:
    name: str
    kind: str  # one of SOURCE_KINDS
    classes: list[str] = field(default_factory=list)  # detection: the classes this source teaches
    score_threshold: float = 0.4  # teacher boxes below this are not labels ...
    ignore_below: float = 0.2  # ... and those in [ignore_below, score_threshold) are "don't care" regions
    min_height: float = 0.0  # boxes shorter than this (original px) are "don't care" too
    options: dict = field(default_factory=dict)  # kind-specific (path, cascade, upscale, ...)


BASELINES = ("head-only", "per-source")


def _parse_baselines(raw) -> tuple[str, ...]:
    if raw is True or raw is None:
        return BASELINES
    if raw is False:
        return ()
    if isinstance(raw, list) and all(b in BASELINES for b in raw):
        return tuple(raw)
    raise SpecError(f"baselines: expected true, false or a list of {', '.join(BASELINES)}; got {raw!r}")


@dataclass
class LoraSpec:
    rank: int = 8
    alpha: float = 16
    layers: list[int] = field(default_factory=lambda: [8, 9, 10, 11])  # [] = head only
    modules: list[str] = field(default_factory=lambda: list(LORA_MODULES))
    # A PEFT adapter directory whose LoRA weights training starts from (same rank, alpha and targets), e.g. the
    # detect adapter for actions: it already learnt where people are, which the frozen backbone lacks.
    init_from: str | None = None


@dataclass
class TrainSpec:
    epochs: int = 8
    batch: int = 8
    lr: float = 1e-3
    lora_lr: float = 5e-4
    weight_decay: float = 1e-4
    flip: bool = True  # horizontal-flip augmentation (doubles the cached features)
    # detection: zoomed-in crops per training frame (augment.zoom_views), each `zoom_scale` x the frame's sides
    zoom_in: int = 0
    zoom_scale: list[float] = field(default_factory=lambda: [0.4, 0.7])
    # detection: views of each training frame through random other cameras (augment.camera_views: framing, mirror,
    # perspective, light, noise, blur, compression), with the frame's labels carried through the geometry
    camera_views: int = 0
    # action: also train on the clips with a walking_toward / walking_away person played backwards (their
    # labels reverse: toward <-> away, left <-> right), the rare classes of the footage
    reverse: bool = False
    ckpt_every: int = 25  # steps
    seed: int = 0
    # train every model with seeds seed .. seed+repeats-1 and report each run and the mean (one run's held-out
    # top-1 swings by ±0.1 with the seed alone); detection saves the seed best on validation, action the first
    repeats: int = 1
    threads: int = 1  # 1: a second thread on a shared 2-core machine ran 4x slower (measured)
    # action specs: parts of the LoRA + head model kept exactly as loaded, not trained: "lora" (from
    # lora.init_from) and "box_head" (from box_head_from). The head-only baseline trains its whole head: its box
    # head reads the frozen backbone, not the features the loaded one was learnt on.
    freeze: list[str] = field(default_factory=list)


@dataclass
class Spec:
    name: str
    task: str  # detection | action
    output: Path
    backbone: str = "dinov2-small"
    image_size: int = 224
    clip_len: int = 8  # action: frames per 1-s clip
    train: list[Range] = field(default_factory=list)
    val: list[Range] = field(default_factory=list)  # for the score threshold and fusion decisions
    test: list[Range] = field(default_factory=list)  # held out: only ever evaluated
    sources: list[SourceSpec] = field(default_factory=list)
    requirements: dict[str, float] = field(default_factory=dict)  # task (class or "action") -> min val accuracy
    fusion: bool = False
    lora: LoraSpec = field(default_factory=LoraSpec)
    opts: TrainSpec = field(default_factory=TrainSpec)
    budget_minutes: float = 60.0
    cache_dir: Path | None = None
    teachers_dir: Path | None = None
    # comparison runs beside the adapter: "head-only" (frozen backbone; with the teacher scored for detection)
    # and "per-source" (detection: LoRA + head on each source alone). YAML: true (all), false (none) or a list.
    baselines: tuple[str, ...] = BASELINES
    head: dict = field(default_factory=dict)  # head constructor params, e.g. {width: 128, norm: false} (heads.py)
    # action heads with `boxes`: a detection adapter whose head the person box head starts from (every weight, the
    # person row of its class output), e.g. the detect adapter, which already finds people far better than a
    # box head trained from scratch on a clip's two middle frames does
    box_head_from: Path | None = None
    # `vlora-va train --repeat K`: train only the K-th of `repeats` (runner._repeats); set by the command, not YAML
    only_repeat: int | None = None

    @property
    def split(self) -> int:
        """First LoRA layer: layers below it are frozen and cached."""
        return min(self.lora.layers) if self.lora.layers else 12


def _ranges(raw, key: str, root: Path) -> list[Range]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise SpecError(f"{key}: expected a list of {{video, start, end, step}}")
    out = []
    for i, r in enumerate(raw):
        if not isinstance(r, dict) or "video" not in r:
            raise SpecError(f"{key}[{i}]: expected a mapping with 'video'")
        video = (root / r["video"]).resolve()
        if not video.is_file():
            raise SpecError(f"{key}[{i}].video: {video} does not exist")
        unknown = set(r) - {"video", "start", "end", "step"}
        if unknown:
            raise SpecError(f"{key}[{i}]: unknown keys {sorted(unknown)}")
        out.append(Range(video, float(r.get("start", 0.0)), None if r.get("end") is None else float(r["end"]),
                         None if r.get("step") is None else float(r["step"])))
    return out


def _dataclass(cls, raw, key: str):
    raw = raw or {}
    if not isinstance(raw, dict):
        raise SpecError(f"{key}: expected a mapping")
    known = set(cls.__dataclass_fields__)
    unknown = set(raw) - known
    if unknown:
        raise SpecError(f"{key}: unknown keys {sorted(unknown)} (known: {', '.join(sorted(known))})")
    return cls(**raw)


def load_spec(path: str | Path) -> Spec:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise SpecError(f"{path}: {e}") from None
    if not isinstance(raw, dict):
        raise SpecError(f"{path}: expected a mapping at the top level")
    root = path.parent
    for k in ("name", "task", "output"):
        if k not in raw:
            raise SpecError(f"{k}: required")
    if raw["task"] not in ("detection", "action"):
        raise SpecError(f"task: expected detection or action, got {raw['task']!r}")
    sources = []
    for i, s in enumerate(raw.get("sources") or []):
        if not isinstance(s, dict) or s.get("kind") not in SOURCE_KINDS:
            raise SpecError(f"sources[{i}].kind: expected one of {', '.join(SOURCE_KINDS)}")
        opts = {k: v for k, v in s.items() if k not in SourceSpec.__dataclass_fields__}
        src = SourceSpec(**{k: v for k, v in s.items() if k in SourceSpec.__dataclass_fields__ and k != "options"},
                     options={**s.get("options", {}), **opts})
        if src.options.get("corrections"):
            src.options["corrections"] = str((root / src.options["corrections"]).resolve())
        sources.append(src)
    if not sources:
        raise SpecError("sources: at least one knowledge source is needed")
    spec = Spec(
        name=str(raw["name"]), task=raw["task"], output=(root / raw["output"]).resolve(),
        backbone=str(raw.get("backbone", "dinov2-small")), image_size=int(raw.get("image_size", 224)),
        clip_len=int(raw.get("clip_len", 8)),
        train=_ranges(raw.get("train"), "train", root), val=_ranges(raw.get("val"), "val", root),
        test=_ranges(raw.get("test"), "test", root), sources=sources,
        requirements={str(k): float(v) for k, v in (raw.get("requirements") or {}).items()},
        fusion=bool(raw.get("fusion", False)),
        lora=_dataclass(LoraSpec, raw.get("lora"), "lora"), opts=_dataclass(TrainSpec, raw.get("train_options"), "train_options"),
        budget_minutes=float(raw.get("budget_minutes", 60)),
        cache_dir=(root / raw["cache_dir"]).expanduser().resolve() if raw.get("cache_dir") else None,
        teachers_dir=(root / raw["teachers_dir"]).resolve() if raw.get("teachers_dir") else None,
        baselines=_parse_baselines(raw.get("baselines", True)),
        head=dict(raw.get("head") or {}),
        box_head_from=(root / raw["box_head_from"]).resolve() if raw.get("box_head_from") else None,
    )
    if not spec.train:
        raise SpecError("train: at least one video range is needed")
    if spec.image_size % 14:
        raise SpecError(f"image_size: {spec.image_size} is not a multiple of the patch size 14")
    bad = [m for m in spec.lora.modules if m not in LORA_MODULES]
    if bad:
        raise SpecError(f"lora.modules: unknown {bad} (known: {', '.join(LORA_MODULES)})")
    if any(not 0 <= layer < 12 for layer in spec.lora.layers):
        raise SpecError("lora.layers: layer indices must be in 0..11")
    if spec.lora.init_from is not None:
        spec.lora.init_from = str((root / spec.lora.init_from).resolve())
        _check_init_from(spec.lora)
    if spec.box_head_from is not None:
        _check_box_head_from(spec)
    for i, src in enumerate(sources):
        if src.options.get("corrections"):
            _check_corrections(spec, src, i)
    if not isinstance(spec.opts.repeats, int) or spec.opts.repeats < 1:
        raise SpecError(f"train_options.repeats: expected an integer >= 1, got {spec.opts.repeats!r}")
    if spec.opts.repeats > 1 and spec.fusion:
        raise SpecError("train_options.repeats: a fusion spec trains one run per fusion step (repeats must be 1)")
    if not isinstance(spec.opts.zoom_in, int) or spec.opts.zoom_in < 0:
        raise SpecError(f"train_options.zoom_in: expected an integer >= 0, got {spec.opts.zoom_in!r}")
    lo_hi = spec.opts.zoom_scale
    if not (isinstance(lo_hi, list) and len(lo_hi) == 2 and all(isinstance(v, (int, float)) for v in lo_hi)
            and 0 < lo_hi[0] <= lo_hi[1] <= 1):
        raise SpecError(f"train_options.zoom_scale: expected [low, high] with 0 < low <= high <= 1, got {lo_hi!r}")
    if spec.opts.reverse and spec.task != "action":
        raise SpecError("train_options.reverse: only action specs train on time-reversed clips")
    if not isinstance(spec.opts.camera_views, int) or spec.opts.camera_views < 0:
        raise SpecError(f"train_options.camera_views: expected an integer >= 0, got {spec.opts.camera_views!r}")
    if spec.opts.camera_views and spec.task != "detection":
        raise SpecError("train_options.camera_views: only detection specs train on other cameras' views")
    if spec.opts.zoom_in and spec.task != "detection":
        raise SpecError("train_options.zoom_in: only detection specs train on zoomed-in crops")
    _check_freeze(spec)
    manifests = [s.name for s in sources if s.kind != "activity"]
    if spec.head.get("boxes") and (spec.task != "action" or manifests):
        raise SpecError("head.boxes: the person boxes are learnt from the teacher's boxes in each clip's frames: an "
                        "action spec whose sources are all of kind activity" +
                        (f" (source {manifests[0]!r} is not)" if spec.task == "action" else ""))
    fixed = [s.name for s in sources if s.kind == "coco"]
    if spec.opts.zoom_in and fixed:
        raise SpecError(f"train_options.zoom_in: source {fixed[0]!r} is a fixed label file, which has no labels for "
                        "the crops (a teacher labels each crop itself)")
    return spec


def _check_corrections(spec: Spec, source: SourceSpec, i: int) -> None:
    """A source's hand corrections (training/corrections.py) fix a teacher's boxes of one of its classes, on
    frames the spec trains or validates on: a corrected test frame would be tuning on held-out data. The file's
    digest joins the source's options, so a run on other corrections is another run (checkpoints, cards)."""
    from vlora_va.training.corrections import CorrectionsError, load_corrections

    where = f"sources[{i}].corrections"
    if spec.task != "detection" or source.kind != "centernet":
        raise SpecError(f"{where}: only a detection spec's centernet source has teacher boxes to correct")
    path = Path(source.options["corrections"])
    try:
        fixes = load_corrections(path)
    except CorrectionsError as e:
        raise SpecError(f"{where}: {e}") from None
    if fixes.cls not in source.classes:
        raise SpecError(f"{where}: corrects {fixes.cls!r} boxes, which source {source.name!r} does not teach")
    inside = [r for r in spec.train + spec.val if r.video.stem == fixes.video]
    for t in fixes.frames:
        if not any(r.holds(t) for r in inside):
            raise SpecError(f"{where}: frame {fixes.video}@{t:g} is not in the spec's train or val ranges")
    source.options["corrections_sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()


FREEZABLE = {"lora": "lora.init_from", "box_head": "box_head_from"}


def _check_freeze(spec: Spec) -> None:
    """Each frozen part must be loaded from somewhere: a fresh part kept untrained would be noise (or, for a LoRA,
    nothing at all)."""
    freeze = spec.opts.freeze
    if not isinstance(freeze, list) or any(p not in FREEZABLE for p in freeze):
        raise SpecError(f"train_options.freeze: expected a list of {', '.join(FREEZABLE)}; got {freeze!r}")
    if freeze and spec.task != "action":
        raise SpecError("train_options.freeze: only action specs keep loaded parts frozen")
    loaded = {"lora": spec.lora.init_from, "box_head": spec.box_head_from}
    for part in freeze:
        if loaded[part] is None:
            raise SpecError(f"train_options.freeze: {part!r} is frozen but not loaded: set {FREEZABLE[part]}")


def _check_box_head_from(spec: Spec) -> None:
    """box_head_from must be a detection adapter with a person class whose head has the box head's shape."""
    if spec.task != "action" or not spec.head.get("boxes"):
        raise SpecError("box_head_from: only an action head with `boxes` has a person box head to start")
    cfg_file = spec.box_head_from / "head_config.json"
    if not cfg_file.is_file():
        raise SpecError(f"box_head_from: {cfg_file} does not exist")
    cfg = json.loads(cfg_file.read_text())
    if cfg.get("task") != "detection" or "person" not in cfg.get("classes", []):
        raise SpecError(f"box_head_from: {spec.box_head_from} is not a detection adapter with a person class")
    params = cfg.get("params", {})
    theirs = (params.get("upsample", 2), params.get("detail", 0), params.get("width", 128), cfg.get("image_size"))
    ours = (spec.head["boxes"], spec.head.get("detail", 0), spec.head.get("box_width", 128), spec.image_size)
    if theirs != ours:
        raise SpecError(f"box_head_from: {spec.box_head_from} has (upsample, detail, width, image_size) {theirs}; this "
                        f"spec's box head has {ours}")


def _check_init_from(lora: LoraSpec) -> None:
    """The starting adapter must have exactly this spec's LoRA shape: otherwise its weights mean something else."""
    from vlora_va.engine.adapters import AdapterError, canonical_module_names, read_lora

    if not lora.layers:
        raise SpecError("lora.init_from: needs lora.layers (a head-only model has no LoRA to start from)")
    try:
        rank, scale, _, weights = read_lora(Path(lora.init_from))
        weights = canonical_module_names(weights)  # target_names are canonical; the file may be either
    except AdapterError as e:
        raise SpecError(f"lora.init_from: {e}") from None
    if rank != lora.rank or abs(scale - lora.alpha / lora.rank) > 1e-9:
        raise SpecError(f"lora.init_from: {lora.init_from} has r={rank}, scale {scale:g}; this spec has r={lora.rank}, "
                        f"scale {lora.alpha / lora.rank:g}")
    missing = [n for n in target_names(lora) if n not in weights or weights[n][0].shape[0] != rank]
    if missing:
        raise SpecError(f"lora.init_from: {lora.init_from} has no rank-{rank} LoRA on {', '.join(missing[:3])}"
                        f"{' …' if len(missing) > 3 else ''}")


def target_names(lora: LoraSpec) -> list[str]:
    """Full module names, e.g. encoder.layer.8.attention.q_proj: the canonical DINOv2 naming (transformers >=
    5.18), which saved adapters use. `installed_module` finds each in a backbone named either way."""
    out = []
    for layer in sorted(lora.layers):
        for m in lora.modules:
            out.append(f"encoder.layer.{layer}.{'mlp' if m.startswith('fc') else 'attention'}.{m}")
    return out
