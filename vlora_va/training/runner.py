"""`vlora-va train SPEC.yaml`: run a whole spec and write adapters, cards and the comparison report.

Detection: one adapter with LoRA + head on all sources (or, with `fusion: true`, the fewest adapters that
keep every source's task at its requirement), plus the comparison rows on the same held-out data: the
head-only model (frozen backbone), LoRA + head per source, and a classical teacher where one exists.
Action: LoRA + head and the head-only baseline, each trained `train_options.repeats` times (seeds seed,
seed+1, ...) and reported per run and as a mean; the first seed's adapter is saved. With the head's persons
branch, each run's person-score threshold is chosen on `val`, and every person's activity is scored too.
Everything is measured on `test` ranges only after `val` chose the score threshold; test frames are never
trained on.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from pathlib import Path

import torch

from .. import jsonfmt
from . import pipeline as P
from .actions import MIRRORED
from .cards import action_card, detection_card, lora_summary, write_report
from .fusion import fuse
from .metrics import best_person_threshold, detection_report
from .spec import LoraSpec, Spec, target_names
from .teachers import HogPeopleTeacher


def _range_name(r) -> str:
    return f"{r.video.name}[{r.start:g}-{'end' if r.end is None else f'{r.end:g}'}]"


def _test_splits(spec: Spec, layer: int) -> dict[str, P.Split]:
    out = {}
    for r in spec.test:
        s = P.detection_split(spec, [r], "test")
        P.cache_features(spec, s, layer, flip=False)
        out[_range_name(r)] = s
    return out


def _det_row(spec, name, result, lora, sources, val, tests, seconds) -> dict:
    rep, thr, _ = P.evaluate_detection(spec, result.model, result.head, val, sources, lora)
    row = {"model": name, "threshold": thr, "val": rep, "train_seconds": round(seconds, 1), "steps": result.steps,
           "complete": result.complete, "test": {}}
    for where, split in tests.items():
        row["test"][where] = P.evaluate_detection(spec, result.model, result.head, split, sources, lora, thr)[0]
    return row


def _hog_row(spec: Spec, tests: dict[str, P.Split], sources) -> dict | None:
    """The classical HOG teacher scored against the CenterNet person labels (a reference, not a target)."""
    person = [s for s in sources if "person" in s.classes]
    if not person:
        return None
    hog = HogPeopleTeacher(score_threshold=0.0)
    row = {"model": "teacher: OpenCV HOG people (vs CenterNet labels)", "test": {}}
    for where, split in tests.items():
        preds = hog.label(split.frames, P.cache_root(spec) / "labels")
        row["test"][where] = detection_report(preds, split.refs(person), ["person"], 0.5)
    return row


def _prepare(spec: Spec, layer: int):
    train = P.detection_split(spec, spec.train, "train")
    val = P.detection_split(spec, spec.val, "val")
    P.cache_features(spec, train, layer, spec.opts.flip)
    P.cache_features(spec, val, layer, False)
    return train, val, _test_splits(spec, layer)


def train_detection_spec(spec: Spec) -> dict:
    deadline = P.deadline_after(spec.budget_minutes)
    t0 = time.monotonic()
    layer = spec.split
    train, val, tests = _prepare(spec, layer)
    rows, adapters = [], []
    if spec.fusion:
        by_name = {s.name: s for s in spec.sources}

        def train_fn(state, members):
            srcs = [by_name[m] for m in members]
            t = time.monotonic()
            res = P.train_detection(spec, train, srcs, spec.lora, deadline, warm=state and (state.model, state.head),
                                    tag="fuse-" + "+".join(members))
            res.seconds = time.monotonic() - t
            return res

        def eval_fn(state, members):
            rep = P.evaluate_detection(spec, state.model, state.head, val, [by_name[m] for m in members], spec.lora)[0]
            return {m: rep[c]["f1"] for m in members for c in by_name[m].classes[:1]}

        fused = fuse([s.name for s in spec.sources], spec.requirements, train_fn, eval_fn)
        for i, a in enumerate(fused.adapters):
            srcs = [by_name[m] for m in a.sources]
            name = f"{spec.name}-{i}" if len(fused.adapters) > 1 else spec.name
            row = _det_row(spec, f"fused adapter {name} ({'+'.join(a.sources)})", a.state, spec.lora, srcs, val, tests,
                           a.state.seconds)
            rows.append(row)
            adapters.append((name, a.state, srcs, row))
        fusion_log = fused.log
    else:
        res = P.train_detection(spec, train, spec.sources, spec.lora, deadline, tag="joint")
        row = _det_row(spec, f"LoRA+head, all sources ({'+'.join(s.name for s in spec.sources)})", res, spec.lora,
                       spec.sources, val, tests, res.seconds)
        rows.append(row)
        adapters.append((spec.name, res, spec.sources, row))
        fusion_log = None
    saved = []
    for name, res, srcs, row in adapters:
        out = spec.output if len(adapters) == 1 else spec.output.parent / name
        card = detection_card(spec, name, srcs, row)
        P.save_detection(spec, out, res, spec.lora, srcs, row["threshold"], {"val": row["val"], "test": row["test"]}, card)
        _record_sources(out, srcs)
        saved.append(str(out))
    if spec.baselines:
        rows += _baselines(spec, train, val, tests, deadline)
    report = {"spec": spec.name, "task": "detection", "image_size": spec.image_size, "lora": lora_summary(spec),
              "rows": rows, "fusion": fusion_log, "adapters": saved, "seconds": round(time.monotonic() - t0, 1)}
    write_report(spec.output.parent / f"REPORT-{spec.name}", report)
    return report


def _record_sources(out: Path, sources) -> None:
    """Write the label protocol into head_config.json so `vlora-va eval` scores against the same labels."""
    p = out / "head_config.json"
    cfg = json.loads(p.read_text())
    cfg["label_sources"] = [{k: v for k, v in s.__dict__.items()} for s in sources]
    p.write_text(jsonfmt.dumps(cfg, indent=2) + "\n")


def _baselines(spec: Spec, train, val, tests, deadline) -> list[dict]:
    rows = []
    head_only = LoraSpec(layers=[])
    tr, va = P.Split(train.frames, train.labels, side=spec.image_size), P.Split(val.frames, val.labels, side=spec.image_size)
    P.cache_features(spec, tr, 12, spec.opts.flip)
    P.cache_features(spec, va, 12, False)
    te = {}
    for where, s in tests.items():
        te[where] = P.Split(s.frames, s.labels, side=spec.image_size)
        P.cache_features(spec, te[where], 12, False)
    res = P.train_detection(spec, tr, spec.sources, head_only, deadline, tag="head-only")
    rows.append(_det_row(spec, "head only (frozen backbone), all sources", res, head_only, spec.sources, va, te, res.seconds))
    if len(spec.sources) > 1:
        for s in spec.sources:
            res = P.train_detection(spec, train, [s], spec.lora, deadline, tag=f"single-{s.name}")
            rows.append(_det_row(spec, f"LoRA+head, source {s.name} only", res, spec.lora, [s], val, tests, res.seconds))
    hog = _hog_row(spec, tests, spec.sources)
    if hog:
        rows.append(hog)
    return rows


def _action_labels(train: P.ClipSet, persons: bool) -> list[str]:
    """The head's labels: the clip labels (and, with the persons branch, every person's activity), mirrored."""
    seen = set(train.activities() if persons else train.labels)
    return sorted(seen | {MIRRORED.get(x, x) for x in seen}, key=lambda x: (x not in ("no_person", "standing"), x))


def _action_run(spec: Spec, res, lora: LoraSpec, val: P.ClipSet | None, tests: dict[str, P.ClipSet]) -> dict:
    """Pick the person threshold on val (persons branch only), then score every test range."""
    head = res.head
    if head.persons and val is not None:
        persons = [p["persons"] for p in P.predict_action(spec, res.model, head, val, lora)]
        head.score_threshold = best_person_threshold(persons, val.persons, head.person_labels)
    return {w: P.evaluate_action(spec, head, cs, P.predict_action(spec, res.model, head, cs, lora))
            for w, cs in tests.items()}


def _scores(test: dict[str, dict]) -> dict:
    out = {"top1": {w: t["top1"] for w, t in test.items()}}
    if any("persons" in t for t in test.values()):
        out["person_top1"] = {w: t["persons"]["top1"] for w, t in test.items()
                              if "persons" in t and t["persons"]["top1"] is not None}
    return out


def train_action_spec(spec: Spec) -> dict:
    deadline = P.deadline_after(spec.budget_minutes)
    t0 = time.monotonic()
    train = P.action_clipset(spec, spec.train)
    val = P.action_clipset(spec, spec.val) if spec.val else None
    tests = {_range_name(r): P.action_clipset(spec, [r]) for r in spec.test}
    labels = _action_labels(train, bool(spec.head.get("persons")))
    rows = []
    variants = [("LoRA+head", spec.lora)] + ([("head only (frozen backbone)", LoraSpec(layers=[]))] if spec.baselines else [])
    saved = None
    for name, lora in variants:
        lay = min(lora.layers) if lora.layers else 12
        P.cache_clip_features(spec, train, lay, spec.opts.flip)
        for cs in [*tests.values(), *([val] if val else [])]:
            P.cache_clip_features(spec, cs, lay, False)
        runs = []
        for k in range(spec.opts.repeats):  # seeds seed, seed+1, ...: the first run is the one saved
            run_spec = dataclasses.replace(spec, opts=dataclasses.replace(spec.opts, seed=spec.opts.seed + k))
            res = P.train_action(run_spec, train, labels, lora, deadline, tag=name.split()[0].lower())
            test = _action_run(spec, res, lora, val, tests)
            runs.append({"seed": run_spec.opts.seed, "train_seconds": round(res.seconds, 1), "complete": res.complete,
                         **_scores(test)})
            if k == 0:
                row = {"model": name, "train_seconds": round(res.seconds, 1), "steps": res.steps,
                       "complete": res.complete, "test": test}
                if saved is None:
                    saved = _save_action(spec, res, labels, row)
        if len(runs) > 1:
            row["runs"] = runs
            row["mean_top1"] = {w: round(statistics.mean(r["top1"][w] for r in runs), 4) for w in tests}
            if "person_top1" in runs[0]:
                row["mean_person_top1"] = {w: round(statistics.mean(r["person_top1"][w] for r in runs), 4)
                                           for w in runs[0]["person_top1"]}
        rows.append(row)
    counts = {"train": {lab: train.labels.count(lab) for lab in labels},
              **{w: {lab: cs.labels.count(lab) for lab in sorted(set(cs.labels))} for w, cs in tests.items()}}
    person_counts = ({w: _person_counts(cs) for w, cs in {"train": train, **tests}.items()}
                     if spec.head.get("persons") else None)
    report = {"spec": spec.name, "task": "action", "image_size": spec.image_size, "lora": lora_summary(spec),
              "rows": rows, "clip_counts": counts, "person_counts": person_counts, "adapters": [saved],
              "seconds": round(time.monotonic() - t0, 1)}
    write_report(spec.output.parent / f"REPORT-{spec.name}", report)
    (spec.output / "README.md").write_text(action_card(spec, rows[0], counts, person_counts))
    return report


def _person_counts(cs: P.ClipSet) -> dict[str, int]:
    labels = [p["label"] for ps in cs.persons for p in ps]
    return {lab: labels.count(lab) for lab in sorted(set(labels))}


def _save_action(spec: Spec, res, labels: list[str], row: dict) -> str:
    from ..adapters import save_adapter_dir
    from . import train as T

    params = dict(spec.head)
    if res.head.persons:
        params["score_threshold"] = res.head.score_threshold  # chosen on the validation range
    cfg = T.head_config("action", labels, spec.image_size, params, spec.clip_len)
    cfg["metrics"] = {"test": row["test"]}
    cfg["label_sources"] = [dict(s.__dict__) for s in spec.sources]
    save_adapter_dir(spec.output, lora=T.lora_weights(res.model, spec.lora), rank=spec.lora.rank, alpha=spec.lora.alpha,
                     target_modules=target_names(spec.lora) or ["encoder.layer.11.attention.q_proj"],
                     base_model=spec.backbone, head=res.head, head_config=cfg)
    return str(spec.output)


def train_spec(spec: Spec) -> dict:
    torch.set_num_threads(spec.opts.threads)
    return train_detection_spec(spec) if spec.task == "detection" else train_action_spec(spec)
