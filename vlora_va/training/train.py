"""LoRA (peft) + task-head training on cached lower-layer features, with checkpoints, resume and a budget.

One run trains one adapter: LoRA on `spec.lora.layers` (rank/alpha/modules configurable) and a fresh or
warm-started head. Layers below the first LoRA layer are frozen, so their output comes from the
`FeatureCache`; each step runs only the upper layers. A checkpoint (LoRA + head + optimiser + step) is
written every `ckpt_every` steps and at the end; a run started again with the same settings resumes from
it. When the time budget runs out the run stops early, saves, and returns what it has (`complete=False`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import pickle
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from vlora_va.engine.adapters import canonical_module_names, fit_target_modules
from vlora_va.engine.backbones import canonical_name, linear_names, load_backbone, patch_size, renamed_for
from vlora_va.engine.backends.torch_eager import normalise
from vlora_va.engine.heads import HEAD_FORMAT, HEAD_FORMAT_VERSION, ActionHead, DetectionHead, Features, build_head
from vlora_va.training.features import upper_hidden
from vlora_va.training.spec import LoraSpec, TrainSpec, target_names


def installed_module(model: nn.Module, name: str) -> nn.Module:
    """The (possibly peft-wrapped) backbone's layer called `name` under either naming."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    here = renamed_for(name, dict(base.named_modules()))
    if here is None:
        raise KeyError(f"{name!r} is not a layer of this backbone")
    return base.get_submodule(here)


def build_model(backbone: str | nn.Module, lora: LoraSpec, seed: int = 0) -> nn.Module:
    """The frozen backbone, wrapped by peft when LoRA layers are chosen (a fresh copy each call)."""
    model = load_backbone(backbone) if isinstance(backbone, str) else backbone
    for p in model.parameters():
        p.requires_grad_(False)
    torch.manual_seed(seed)  # LoRA init and the head built next: a run is reproducible from its seed
    if not lora.layers:
        return model
    from peft import LoraConfig, get_peft_model

    # The one place the spec's (canonical) names meet the installed transformers' naming.
    targets = fit_target_modules(target_names(lora), linear_names(model))
    cfg = LoraConfig(r=lora.rank, lora_alpha=lora.alpha, target_modules=targets, lora_dropout=0.0, bias="none")
    model = get_peft_model(model, cfg)
    if lora.init_from:
        _start_from(model, lora)
    return model


def _start_from(model: nn.Module, lora: LoraSpec) -> None:
    """Load lora.init_from's A and B into the fresh LoRA (load_spec checked that the shapes match)."""
    from vlora_va.engine.adapters import read_lora

    _, _, _, weights = read_lora(Path(lora.init_from))
    weights = canonical_module_names(weights)  # a file under legacy names starts a run too
    with torch.no_grad():
        for name in target_names(lora):
            m = installed_module(model, name)
            m.lora_A["default"].weight.copy_(weights[name][0])
            m.lora_B["default"].weight.copy_(weights[name][1])


def lora_weights(model: nn.Module, lora: LoraSpec) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{module name: (A [r, in], B [out, r])} as adapters.save_adapter_dir wants."""
    if not lora.layers:
        return {}
    out = {}
    for name in target_names(lora):  # canonical names, whichever naming the backbone has
        m = installed_module(model, name)
        out[name] = (m.lora_A["default"].weight.detach().clone(), m.lora_B["default"].weight.detach().clone())
    return out


def head_config(task: str, names: list[str], image_size: int, params: dict, clip_len: int = 8) -> dict:
    cfg = {"task": task, ("classes" if task == "detection" else "labels"): list(names), "params": dict(params),
           "trained": True, "image_size": image_size}
    if task == "action":
        cfg["clip_len"] = clip_len
    return cfg


def new_head(task: str, names: list[str], hidden: int, image_size: int, params: dict | None = None,
             clip_len: int = 8, warm: nn.Module | None = None) -> tuple[nn.Module, dict]:
    """A head for `names`; with `warm`, every weight is copied and old classes keep their output rows."""
    params = dict(params or {})
    if task == "detection":
        params["image_size"] = image_size
    cfg = head_config(task, names, image_size, params, clip_len)
    head = build_head({"format": HEAD_FORMAT, "version": HEAD_FORMAT_VERSION, **cfg}, hidden)
    if warm is not None:
        old_names = warm.classes if isinstance(warm, DetectionHead) else warm.labels
        state = head.state_dict()
        for k, v in warm.state_dict().items():
            if k in state and state[k].shape == v.shape:
                state[k] = v.clone()
            elif k in state:  # the class output layer grew: copy the rows of classes it already knew
                for i, n in enumerate(old_names):
                    if n in names:
                        state[k][names.index(n)] = v[i]
        head.load_state_dict(state)
    return head, cfg


@dataclass
class RunResult:
    model: nn.Module
    head: nn.Module
    steps: int
    seconds: float
    complete: bool
    losses: list[float]


def _fingerprint(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def file_digest(path: Path) -> str:
    """A file's identity in a run's fingerprint: the start of its SHA-256."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def lora_identity(lora: LoraSpec) -> dict:
    """The LoRA settings as part of a run's identity. A run started from a saved adapter (init_from) is named by
    that adapter's weights, not its path: after the adapter is retrained, its path starts a new run."""
    out = dict(lora.__dict__)
    if lora.init_from:
        out["init_from"] = file_digest(Path(lora.init_from) / "adapter_model.safetensors")
    return out


def run_settings(opts: TrainSpec) -> dict:
    """The training options that change what one run computes (its checkpoint's identity). How many seeds
    a spec repeats, how often it checkpoints and how many threads it uses do not: a run trained by another
    spec or process with the same settings is resumed, not redone."""
    return {k: v for k, v in opts.__dict__.items() if k not in ("repeats", "ckpt_every", "threads")}


def _save_ckpt(path: Path, model, head, opt, sched, step: int, fingerprint: str, seconds: float) -> None:
    # canonical names: a checkpoint resumes under either transformers naming
    trainable = {canonical_name(k): v for k, v in model.named_parameters() if v.requires_grad}
    state = {"step": step, "fingerprint": fingerprint, "seconds": seconds, "lora": trainable,
             "head": head.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
             "rng": torch.get_rng_state()}
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path.with_suffix(".tmp"))
    path.with_suffix(".tmp").replace(path)  # atomic: a run killed mid-save keeps the previous checkpoint


def _load_ckpt(path: Path, model, head, opt, sched, fingerprint: str) -> tuple[int, float]:
    if not path.is_file():
        return 0, 0.0
    try:  # tensors and plain values only: a checkpoint on disk is never unpickled into arbitrary objects
        state = torch.load(path, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError) as e:
        tqdm.write(f"checkpoint {path} is unreadable ({type(e).__name__}): starting afresh")
        return 0, 0.0
    if state.get("fingerprint") != fingerprint:
        tqdm.write(f"checkpoint {path} is from other settings: starting afresh")
        return 0, 0.0
    params = {canonical_name(k): v for k, v in model.named_parameters()}
    with torch.no_grad():
        for k, v in state["lora"].items():
            params[k].copy_(v)
    head.load_state_dict(state["head"])
    opt.load_state_dict(state["opt"])
    sched.load_state_dict(state["sched"])
    torch.set_rng_state(state["rng"])
    tqdm.write(f"resumed from {path} at step {state['step']}")
    return int(state["step"]), float(state.get("seconds", 0.0))


@contextlib.contextmanager
def _one_trainer(ckpt: Path | None):
    """Hold the run's lock while training it: a second process asking for the same run (the whole spec while
    `vlora-va train --repeat K` still trains that seed) waits, then resumes from the checkpoint the first left,
    instead of both writing one checkpoint."""
    if ckpt is None:
        yield
        return
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    with open(ckpt.with_suffix(".lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            tqdm.write(f"{ckpt.name}: another process is training this run; waiting for it to finish")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def run(model: nn.Module, head: nn.Module, n_samples: int, loss_fn, opts: TrainSpec, deadline: float,
        ckpt: Path | None, fingerprint: str, desc: str) -> RunResult:
    """The generic loop: epochs over shuffled sample indices, AdamW + warm-up/cosine, checkpoints, budget.

    loss_fn(model, head, indices) -> scalar loss."""
    with _one_trainer(ckpt):
        return _run(model, head, n_samples, loss_fn, opts, deadline, ckpt, fingerprint, desc)


def _run(model: nn.Module, head: nn.Module, n_samples: int, loss_fn, opts: TrainSpec, deadline: float,
         ckpt: Path | None, fingerprint: str, desc: str) -> RunResult:
    torch.manual_seed(opts.seed)
    lora_params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": list(head.parameters()), "lr": opts.lr}]
    if lora_params:
        groups.append({"params": lora_params, "lr": opts.lora_lr})
    opt = torch.optim.AdamW(groups, weight_decay=opts.weight_decay)
    per_epoch = math.ceil(n_samples / opts.batch)
    total = max(1, per_epoch * opts.epochs)
    warmup = max(1, total // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, total) / total)))
    step, spent = _load_ckpt(ckpt, model, head, opt, sched, fingerprint) if ckpt else (0, 0.0)
    start = time.monotonic() - spent
    losses: list[float] = []
    head.train()
    g = torch.Generator().manual_seed(opts.seed)
    orders = [torch.randperm(n_samples, generator=g) for _ in range(opts.epochs)]  # fixed: resume continues them
    bar = tqdm(total=total, initial=step, desc=desc, unit="step")
    complete = True
    while step < total:
        if time.monotonic() > deadline:
            complete = False
            tqdm.write(f"{desc}: time budget reached at step {step}/{total}")
            break
        e, b = divmod(step, per_epoch)
        idx = orders[e][b * opts.batch:(b + 1) * opts.batch]
        loss = loss_fn(model, head, idx)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for grp in groups for p in grp["params"]], 1.0)
        opt.step()
        sched.step()
        step += 1
        losses.append(float(loss.detach()))
        bar.update(1)
        bar.set_postfix(loss=f"{sum(losses[-20:]) / len(losses[-20:]):.3f}")
        if ckpt and step % opts.ckpt_every == 0:
            _save_ckpt(ckpt, model, head, opt, sched, step, fingerprint, time.monotonic() - start)
    bar.close()
    if ckpt:
        _save_ckpt(ckpt, model, head, opt, sched, step, fingerprint, time.monotonic() - start)
    head.eval()
    return RunResult(model, head, step, time.monotonic() - start, complete, losses)


# --- task-specific pieces: what one step computes -------------------------------------------------------------

def features_from(model: nn.Module, lower: torch.Tensor, split: int, image_size: int, patch: int,
                  images: torch.Tensor | None = None, index: torch.Tensor | slice = slice(None)) -> Features:
    """Features of the cached lower-layer states lower[index]; images[index] (`images`: uint8 [N, S, S, 3], the
    letterboxed frames, indexed like `lower`) ride along for heads that also read the image (a detail branch)."""
    feats = Features.from_hidden(upper_hidden(model, lower[index].float(), split), image_size, patch)
    feats.pixels = None if images is None else normalise(images[index])
    return feats


def detection_loss_fn(lower: torch.Tensor, targets: list[tuple], split: int, image_size: int, patch: int,
                      images: torch.Tensor | None = None):
    """lower: [N, tokens, D] cached features; targets[i] = (heat, box, weight, count) for sample i; images: the
    samples' letterboxed frames when the head reads them."""
    from vlora_va.training.targets import detection_loss

    def loss_fn(model, head, idx):
        feats = features_from(model, lower, split, image_size, patch, images, idx)
        heat, box, weight, count = (torch.stack([targets[i][k] if k < 3 else torch.tensor(targets[i][3])
                                                 for i in idx.tolist()]) for k in range(4))
        return detection_loss(head(feats), heat, box, weight, count, image_size)

    return loss_fn


def action_loss_fn(lower: torch.Tensor, clips: list[list[int]], labels: torch.Tensor, class_weight: torch.Tensor,
                   split: int, image_size: int, patch: int, clip_len: int, persons: list[tuple] | None = None,
                   person_weight: torch.Tensor | None = None, frame_boxes: list[tuple] | None = None,
                   images: torch.Tensor | None = None):
    """clips[i] = indices into `lower` of sample i's frames; labels[i] its class index; persons[i] its
    person-branch targets (targets.person_targets) when the head has that branch; frame_boxes[i] the person
    DetectionHead's targets on its two middle frames (targets.middle_frame_targets) when the head has `boxes`
    that anything upstream of their loss trains (None: no box loss); images: the letterboxed frames, indexed like
    `lower`, for a person head with a detail branch."""
    from vlora_va.training.targets import detection_loss, person_loss

    def loss_fn(model, head, idx):
        frames = torch.tensor([j for i in idx.tolist() for j in clips[i]])
        feats = features_from(model, lower, split, image_size, patch, images, frames)
        logits, maps, boxes = head(feats, clip_len, every_frame=False)  # the box loss is on the middle frames
        loss = F.cross_entropy(logits, labels[idx], weight=class_weight, label_smoothing=0.05)
        if maps is not None:
            targets = (torch.stack([persons[i][k] for i in idx.tolist()]) for k in range(5))
            loss = loss + person_loss(maps, *targets, activity_weight=person_weight)
        if boxes is not None and frame_boxes is not None:  # None: box head and LoRA both frozen
            heat, box, weight, count = (torch.cat([frame_boxes[i][k] for i in idx.tolist()]) for k in range(4))
            loss = loss + detection_loss(boxes, heat, box, weight, count, image_size)
        return loss

    return loss_fn


@torch.no_grad()
def detection_outputs(model, head: DetectionHead, lower: torch.Tensor, split: int, image_size: int, patch: int,
                      batch: int = 16, images: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The head's raw output (class logits, box distances) for every frame of cached features: decode it as
    often as needed (e.g. once per NMS setting) without running the upper layers again."""
    outs = [head(features_from(model, lower, split, image_size, patch, images, slice(i, i + batch)))
            for i in range(0, len(lower), batch)]
    return torch.cat([o[0] for o in outs]), torch.cat([o[1] for o in outs])


def decode_detections(head: DetectionHead, raw: tuple[torch.Tensor, torch.Tensor], letterboxes, sizes,
                      threshold: float = 0.05) -> list[list[dict]]:
    """Decoded boxes (original pixels) at a low threshold (AP needs the full ranking), with the head's NMS."""
    old, head.score_threshold = head.score_threshold, threshold
    try:
        return [[d.to_json() for d in image] for image in head.decode(raw, letterboxes, sizes)]  # rows like labels
    finally:
        head.score_threshold = old


@torch.no_grad()
def predict_action(model, head: ActionHead, lower: torch.Tensor, clips: list[list[int]], split: int, image_size: int,
                   patch: int, clip_len: int, letterboxes, sizes, threshold: float = 0.05, batch: int = 4,
                   images: torch.Tensor | None = None, frame_times: list[list[float]] | None = None) -> list[dict]:
    """Decoded clips; persons at a low threshold (the report reads them at the chosen one). images: the
    letterboxed frames, indexed like `lower` (a person head with a detail branch reads them); frame_times: per
    clip, its frames' times (a head naming activities by the persons' tracks needs them)."""
    old, head.score_threshold = head.score_threshold, threshold
    out = []
    for i in range(0, len(clips), batch):
        frames = torch.tensor([j for c in clips[i:i + batch] for j in c])
        feats = features_from(model, lower, split, image_size, patch, images, frames)
        times = None if frame_times is None else frame_times[i:i + batch]
        out += [r.to_json() for r in head.decode(head(feats, clip_len), letterboxes[i:i + batch], sizes[i:i + batch],
                                                 times)]
    head.score_threshold = old
    return out


def backbone_patch(model: nn.Module) -> int:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return patch_size(base)

