"""`vlora-va train SPEC.yaml`: run a whole spec and write adapters, cards and the comparison report.

Detection: one adapter with LoRA + head on all sources (or, with `fusion: true`, the fewest adapters that
keep every source's task at its requirement), plus the comparison rows on the same held-out data: the
head-only model (frozen backbone), LoRA + head per source, and a classical teacher where one exists.
Detection models and action ones (LoRA + head and the head-only baseline) are each trained
`train_options.repeats` times (seeds seed, seed+1, ...) and reported per run and as a mean. A detection spec
saves the seed best on validation; an action spec saves the first seed. An action head with the persons
branch has each run's person-score threshold chosen on `val`, and every person's activity is scored too.
Everything is measured on `test` ranges only after `val` chose the score threshold; test frames are never
trained on.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import time
from pathlib import Path

import torch

from vlora_va.common import jsonfmt
from vlora_va.training import pipeline as P
from vlora_va.training.actions import MIRRORED, REVERSED
from vlora_va.training.cards import action_card, detection_card, lora_summary, write_report
from vlora_va.training.fusion import fuse
from vlora_va.training.metrics import best_person_threshold, detection_report, human_detection_report, mean_f1
from vlora_va.training.spec import LoraSpec, Spec, target_names
from vlora_va.training.teachers import HogPeopleTeacher


def _range_name(r) -> str:
    return f"{r.video.name}[{r.start:g}-{'end' if r.end is None else f'{r.end:g}'}]"


def _test_splits(spec: Spec, layer: int) -> dict[str, P.Split]:
    out = {}
    for r in spec.test:
        s = P.detection_split(spec, [r], "test")
        P.cache_features(spec, s, layer, flip=False)
        out[_range_name(r)] = s
    return out


def _det_row(spec, name, result, lora, sources, val, tests, seconds, human=None) -> dict:
    """One trained model's row: threshold and NMS calibrated on val, then every test range (teacher labels and,
    where the human-checked set has frames in the range, the human boxes) at those settings."""
    rep, threshold, _ = P.evaluate_detection(spec, result.model, result.head, val, sources, lora)  # calibrates
    row = {"model": name, "threshold": threshold, "nms_iou": result.head.nms_iou, "val": rep, "train_seconds": round(seconds, 1),
           "steps": result.steps, "complete": result.complete, "seed": spec.opts.seed, "test": {}}
    for where, split in tests.items():
        row["test"][where], _, preds = P.evaluate_detection(spec, result.model, result.head, split, sources, lora,
                                                            threshold)
        on_human = _human_report(human, split, preds, P.classes_of(sources), threshold)
        if on_human:
            row.setdefault("human", {})[where] = on_human
    return row


def _human_report(human, split: P.Split, preds: list[list[dict]], classes: list[str], threshold: float) -> dict | None:
    """The predictions on the split's frames that the human-checked set labels, scored against its boxes."""
    from vlora_va.training.evaluate import HUMAN_CLASSES

    if human is None:
        return None
    keys = [f.key for f in split.frames if f.key in human.boxes]
    if not keys:
        return None
    pred_map = {f.key: p for f, p in zip(split.frames, preds) if f.key in human.boxes}
    refs = {k: human.boxes[k] for k in keys}
    named = [c for c in classes if c in HUMAN_CLASSES]
    return {"frames": len(keys), "per_class": human_detection_report(pred_map, refs, named, threshold)}


# The report's names of the two kinds of model (cards and tables tell them apart by these words)
LORA_HEAD, HEAD_ONLY = "LoRA+head", "head only (frozen backbone)"


def _seeded(spec: Spec, k: int) -> Spec:
    return dataclasses.replace(spec, opts=dataclasses.replace(spec.opts, seed=spec.opts.seed + k))


def _repeats(spec: Spec) -> list[int]:
    """Which of the spec's repeats to train: all, or the one `vlora-va train --repeat K` names. A repeat run alone
    has the data (zoomed crops drawn with the spec's seed) and the seed of that repeat in the whole spec, so its
    checkpoint is the one the whole spec resumes: repeats can train side by side in separate processes."""
    return list(range(spec.opts.repeats)) if spec.only_repeat is None else [spec.only_repeat]


def _repeated_detection(spec: Spec, name: str, train, sources, lora, val, tests, deadline, human, tag: str):
    """`repeats` runs (seeds seed, seed+1, ...): (the chosen run's result, its row with every run and their mean).
    The chosen run (`best_on_validation`) is the one a spec ships."""
    results, rows = [], []
    for k in _repeats(spec):
        run_spec = _seeded(spec, k)
        res = P.train_detection(run_spec, train, sources, lora, deadline, tag=tag)
        results.append(res)
        rows.append(_det_row(run_spec, name, res, lora, sources, val, tests, res.seconds, human))
    chosen = best_on_validation(rows)
    row = dict(rows[chosen])
    if len(rows) > 1:
        row["runs"] = [_det_summary(r) for r in rows]
        row["mean"] = _mean_tree([r for r in row["runs"]], skip=("seed",))
    return results[chosen], row


def best_on_validation(rows: list[dict]) -> int:
    """The index of the run with the best validation score: mean F1 over classes (`mean_f1`, what picked each
    run's threshold) on the validation range; the earliest seed on a tie. Seeds of one recipe differ by several
    points of held-out F1, and the validation range may choose among them: the held-out ranges may not. (On
    `detect`'s 35 validation frames three seeds lay within 0.002 there: a weak signal; adapters/STUDIES.md.)"""
    scores = [mean_f1(r["val"]) for r in rows]
    scores = [-1.0 if math.isnan(x) else x for x in scores]
    return scores.index(max(scores))


def _det_summary(row: dict) -> dict:
    """The figures of one run that the seed comparison averages: F1 per class on every test range (teacher
    labels) and the human-set person figures."""
    out = {"seed": row["seed"], "threshold": row["threshold"], "nms_iou": row["nms_iou"],
           "val_mean_f1": round(mean_f1(row["val"]), 4),
           "train_seconds": row["train_seconds"],
           "test_f1": {w: {c: r["f1"] for c, r in rep.items()} for w, rep in row["test"].items()}}
    for where, h in row.get("human", {}).items():
        person = h["per_class"].get("person")
        if person and person["refs"]:
            out.setdefault("human_person", {})[where] = _person_figures(person)
    return out


def _person_figures(person: dict) -> dict:
    by_height = person["recall_by_height"]
    pairs = person.get("side_by_side", {})
    return {"precision": person["precision"], "recall": person["recall"], "f1": person["f1"], "ap50": person["ap50"],
            "recall_at_p90": (person.get("recall_at_precision_0.9") or {}).get("recall"),
            "recall_over_100px": by_height[">100"]["recall"], "side_by_side": pairs.get("rate")}


def _mean_tree(items: list[dict], skip=()) -> dict:
    """Element-wise mean of dicts of the same shape (numbers averaged, None where any run has None)."""
    out = {}
    for k, v in items[0].items():
        if k in skip:
            continue
        if isinstance(v, dict):
            out[k] = _mean_tree([i[k] for i in items])
        elif isinstance(v, (int, float)):
            vals = [i[k] for i in items]
            out[k] = None if any(x is None for x in vals) else round(statistics.mean(vals), 4)
        elif v is None:
            out[k] = None
    return out


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


def _human_set():
    """The human-checked evaluation set, or None where it is not there (a spec outside this repository)."""
    from vlora_va.training.evaluate import HUMAN_SET, load_human_set

    return load_human_set() if Path(HUMAN_SET).is_file() else None


def train_detection_spec(spec: Spec) -> dict:
    deadline = P.deadline_after(spec.budget_minutes)
    t0 = time.monotonic()
    layer = spec.split
    train, val, tests = _prepare(spec, layer)
    human = _human_set()
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
                           a.state.seconds, human)
            rows.append(row)
            adapters.append((name, a.state, srcs, row))
        fusion_log = fused.log
    else:
        kind = LORA_HEAD if spec.lora.layers else HEAD_ONLY
        res, row = _repeated_detection(spec, f"{kind}, all sources ({'+'.join(s.name for s in spec.sources)})",
                                       train, spec.sources, spec.lora, val, tests, deadline, human, tag="joint")
        rows.append(row)
        adapters.append((spec.name, res, spec.sources, row))
        fusion_log = None
    saved, cards = [], []
    for name, res, srcs, row in adapters:
        out = spec.output if len(adapters) == 1 else spec.output.parent / name
        P.save_detection(spec, out, res, spec.lora, srcs, row["threshold"], {"val": row["val"], "test": row["test"]},
                         detection_card(spec, name, srcs, row, adapter=out))
        _record_sources(out, srcs)
        saved.append(str(out))
        cards.append({"adapter": str(out), "row": rows.index(row), "sources": [s.name for s in srcs]})
    if spec.baselines:
        rows += _baselines(spec, train, val, tests, deadline, human)
    rows += _teacher_rows(spec, human)
    report = {"spec": spec.name, "task": "detection", "image_size": spec.image_size, "lora": lora_summary(spec),
              "rows": rows, "fusion": fusion_log, "adapters": saved, "cards": cards,
              "seconds": round(time.monotonic() - t0, 1)}
    write_report(spec.output.parent / f"REPORT-{spec.name}", report)
    write_cards(spec, report)
    return report


def write_cards(spec: Spec, report: dict) -> None:
    """Each adapter's README.md from the spec and its report (rows of every model, the baselines and the teacher):
    run at the end of training, and by `vlora-va train --cards-only` to redo the cards without training."""
    rows = report["rows"]
    here = spec.output.parent  # the report's paths are where it was trained; the cards go beside this spec's output
    if report["task"] == "action":
        adapter = here / Path(report["adapters"][0]).name
        adapter.joinpath("README.md").write_text(
            action_card(spec, rows[0], report["clip_counts"], report.get("person_counts"), rows))
        return
    by_name = {s.name: s for s in spec.sources}
    cards = report.get("cards") or [{"adapter": report["adapters"][0], "row": 0, "sources": list(by_name)}]
    for c in cards:
        adapter = here / Path(c["adapter"]).name
        card = detection_card(spec, adapter.name, [by_name[n] for n in c["sources"]], rows[c["row"]], rows,
                              adapter=adapter)
        adapter.joinpath("README.md").write_text(card)


def _teacher_rows(spec: Spec, human) -> list[dict]:
    """The CenterNet teacher on the human-checked set (its boxes for detection; for actions, the activities its
    tracking rule gives, which are the training labels): what the student's teacher gets right."""
    from vlora_va.training.teacher_models import TeacherMissing, find_model

    try:
        find_model("centernet", spec.teachers_dir)
    except TeacherMissing:
        return []
    if human is None:
        return []
    from vlora_va.training.evaluate import evaluate_teacher_on_human

    if spec.task == "action":
        ranges = [r for r in spec.test if human.clips_in(r)]
        reports = evaluate_teacher_on_human(human, ranges, spec.teachers_dir, spec.cache_dir)["reports"]
        found = {w: r["human_persons"] for w, r in reports.items() if r.get("human_persons")}
        return [{"model": "label rule on CenterNet tracks (the training labels)", "human_persons": found}] if found else []
    tiles = max((int(s.options.get("tiles", 1)) for s in spec.sources if s.kind in ("centernet", "fused")), default=1)
    rows = []
    for n in sorted({1, tiles}):  # the plain teacher, and the tiled one where the spec's labels come from it
        reports = evaluate_teacher_on_human(human, spec.test, spec.teachers_dir, spec.cache_dir, tiles=n,
                                            persons=False)["reports"]
        found = {w: r["human"] for w, r in reports.items() if r.get("human")}
        name = "teacher: CenterNet, boxes scoring ≥ 0.4" + (f", whole frame + {n}×{n} tiles (the labels)" if n > 1 else "")
        rows += [{"model": name, "human": found}] if found else []
    return rows


def _record_sources(out: Path, sources) -> None:
    """Write the label protocol into head_config.json so `vlora-va eval` scores against the same labels (a hand
    corrections file by its path from the adapter's folder: no machine paths in an adapter)."""
    p = out / "head_config.json"
    cfg = json.loads(p.read_text())
    cfg["label_sources"] = [dict(s.__dict__) for s in sources]
    for s in cfg["label_sources"]:
        if s["options"].get("corrections"):
            s["options"] = {**s["options"], "corrections": os.path.relpath(s["options"]["corrections"], out)}
    p.write_text(jsonfmt.dumps(cfg, indent=2) + "\n")


def _baselines(spec: Spec, train, val, tests, deadline, human=None) -> list[dict]:
    rows = []
    if "head-only" in spec.baselines:
        head_only = LoraSpec(layers=[])
        tr = P.Split(train.frames, train.labels, side=spec.image_size)
        va = P.Split(val.frames, val.labels, side=spec.image_size)
        P.cache_features(spec, tr, 12, spec.opts.flip)
        P.cache_features(spec, va, 12, False)
        te = {}
        for where, s in tests.items():
            te[where] = P.Split(s.frames, s.labels, side=spec.image_size)
            P.cache_features(spec, te[where], 12, False)
        rows.append(_repeated_detection(spec, f"{HEAD_ONLY}, all sources", tr, spec.sources, head_only,
                                        va, te, deadline, human, tag="head-only")[1])
    if "per-source" in spec.baselines and len(spec.sources) > 1:
        for s in spec.sources:
            res = P.train_detection(spec, train, [s], spec.lora, deadline, tag=f"single-{s.name}")
            rows.append(_det_row(spec, f"{LORA_HEAD}, source {s.name} only", res, spec.lora, [s], val, tests, res.seconds,
                                 human))
    hog = _hog_row(spec, tests, spec.sources) if "head-only" in spec.baselines else None
    if hog:
        rows.append(hog)
    return rows


def _action_labels(train: P.ClipSet, persons: bool, reverse: bool = False) -> list[str]:
    """The head's labels: the clip labels (and, with the persons branch, every person's activity), mirrored
    (and, when training on reversed clips, reversed)."""
    seen = set(train.activities() if persons else train.labels)
    seen |= {MIRRORED.get(x, x) for x in seen} | ({REVERSED.get(x, x) for x in seen} if reverse else set())
    return sorted(seen, key=lambda x: (x not in ("no_person", "standing"), x))


def _action_run(spec: Spec, res, lora: LoraSpec, val: P.ClipSet | None, tests: dict[str, P.ClipSet],
                human=None) -> dict:
    """Pick the person threshold on val (persons branch only), then score every test range (against the label
    rule and, for the clips the human-checked set has, against its persons as `human_persons`)."""
    head = res.head
    if head.persons and val is not None:
        persons = [p["persons"] for p in P.predict_action(spec, res.model, head, val, lora)]
        head.score_threshold = best_person_threshold(persons, val.persons, head.person_labels, val.people_there())
    out = {}
    for where, cs in tests.items():
        preds = P.predict_action(spec, res.model, head, cs, lora)
        out[where] = P.evaluate_action(spec, head, cs, preds)
        on_human = _human_persons(human, cs, preds, head) if head.persons else None
        if on_human:
            out[where]["human_persons"] = on_human
    return out


def _human_persons(human, cs: P.ClipSet, preds: list[dict], head) -> dict | None:
    """Predicted persons of the clips the human-checked set labels, scored against its persons (IoU >= 0.5)."""
    from vlora_va.training.evaluate import human_persons_report

    if human is None:
        return None
    by_start = {(c["video"], round(c["start"], 3)): c for c in human.clips}
    pairs = [(k, by_start[(v, round(t, 3))]) for k, (v, t) in enumerate(cs.starts) if (v, round(t, 3)) in by_start]
    if not pairs:
        return None
    return human_persons_report([preds[k]["persons"] for k, _ in pairs], [c["persons"] for _, c in pairs], head)


def _scores(test: dict[str, dict]) -> dict:
    out = {"top1": {w: t["top1"] for w, t in test.items()}}
    if any("persons" in t for t in test.values()):
        out["person_top1"] = {w: t["persons"]["top1"] for w, t in test.items()
                              if "persons" in t and t["persons"]["top1"] is not None}
    human = {w: t["human_persons"] for w, t in test.items() if "human_persons" in t}
    if human:
        out["human"] = {w: {"top1": h["top1"], "top1_left_right_standing": h["top1_left_right_standing"],
                            "recall": h["recall"],
                            **{f"recall_{a}": h["per_activity"].get(a, {}).get("recall")
                               for a in ("walking_toward", "walking_away", "standing")}}
                        for w, h in human.items()}
    return out


def train_action_spec(spec: Spec) -> dict:
    deadline = P.deadline_after(spec.budget_minutes)
    t0 = time.monotonic()
    train = P.action_clipset(spec, spec.train, train=True)
    val = P.action_clipset(spec, spec.val) if spec.val else None
    tests = {_range_name(r): P.action_clipset(spec, [r]) for r in spec.test}
    labels = _action_labels(train, bool(spec.head.get("persons")), spec.opts.reverse)
    human = _human_set()
    rows = []
    variants = [(LORA_HEAD, spec.lora)] + ([(HEAD_ONLY, LoraSpec(layers=[]))]
                                             if "head-only" in spec.baselines else [])
    saved = None
    for name, lora in variants:
        lay = min(lora.layers) if lora.layers else 12
        P.cache_clip_features(spec, train, lay, spec.opts.flip)
        for cs in [*tests.values(), *([val] if val else [])]:
            P.cache_clip_features(spec, cs, lay, False)
        runs = []
        for k in _repeats(spec):  # seeds seed, seed+1, ...: the first run is the one saved
            run_spec = _seeded(spec, k)
            res = P.train_action(run_spec, train, labels, lora, deadline, tag=name.split()[0].lower())
            test = _action_run(spec, res, lora, val, tests, human)
            runs.append({"seed": run_spec.opts.seed, "train_seconds": round(res.seconds, 1), "complete": res.complete,
                         **_scores(test)})
            if len(runs) == 1:
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
            if "human" in runs[0]:
                row["mean_human"] = _mean_tree([r["human"] for r in runs])
        rows.append(row)
    counts = {"train": {lab: train.labels.count(lab) for lab in labels},
              **{w: {lab: cs.labels.count(lab) for lab in sorted(set(cs.labels))} for w, cs in tests.items()}}
    person_counts = ({w: _person_counts(cs) for w, cs in {"train": train, **tests}.items()}
                     if spec.head.get("persons") else None)
    rows += _teacher_rows(spec, human)
    report = {"spec": spec.name, "task": "action", "image_size": spec.image_size, "lora": lora_summary(spec),
              "rows": rows, "clip_counts": counts, "person_counts": person_counts, "adapters": [saved],
              "seconds": round(time.monotonic() - t0, 1)}
    write_report(spec.output.parent / f"REPORT-{spec.name}", report)
    write_cards(spec, report)
    return report


def _person_counts(cs: P.ClipSet) -> dict[str, int]:
    """Persons per sure activity, and how many the label rule was not sure of (`not sure`)."""
    labels = [p["label"] if p.get("sure", True) else "not sure" for ps in cs.persons for p in ps]
    return {lab: labels.count(lab) for lab in sorted(set(labels))}


def _save_action(spec: Spec, res, labels: list[str], row: dict) -> str:
    from vlora_va.engine.adapters import save_adapter_dir
    from vlora_va.training import train as T

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
