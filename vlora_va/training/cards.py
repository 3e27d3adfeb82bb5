"""Adapter cards (README.md beside each adapter) and the comparison report (JSON + Markdown table)."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

from .. import jsonfmt
from .metrics import fmt_ratio
from .spec import Spec


def _ranges(ranges) -> str:
    return "; ".join(f"`{r.video.name}` {r.start:g}–{'end' if r.end is None else f'{r.end:g}'} s"
                     f"{'' if r.step is None else f', every {r.step:g} s'}" for r in ranges) or "none"


def lora_summary(spec: Spec) -> dict:
    """The spec's LoRA settings for reports, with init_from relative to the adapters' folder (no machine paths)."""
    out = dict(spec.lora.__dict__)
    if out.get("init_from"):
        out["init_from"] = os.path.relpath(out["init_from"], spec.output.parent)
    return out


def _started_from(spec: Spec) -> str:
    return f", starting from the `{lora_summary(spec)['init_from']}` adapter's LoRA" if spec.lora.init_from else ""


def _reproduce(spec: Spec) -> str:
    return f"vlora-va train adapters/specs/{spec.name}.yaml"


def _source_line(s) -> str:
    if s.kind == "centernet":
        return (f"- **{s.name}**: CenterNet COCO-80 ONNX teacher filtered to {s.classes}; boxes scoring ≥ {s.score_threshold} "
                f"are labels, {s.ignore_below}–{s.score_threshold} are don't-care"
                f"{f', as are boxes under {s.min_height:g} px tall' if s.min_height else ''}.")
    if s.kind == "activity":
        return (f"- **{s.name}**: activity derived from tracking CenterNet person boxes (score ≥ {s.score_threshold}) over each "
                "1-s clip — see `vlora_va/training/actions.py` for the exact rule.")
    return f"- **{s.name}**: {s.kind} {s.classes} {s.options}"


def _det_table(row: dict) -> str:
    lines = ["| held-out data | class | refs | precision | recall | F1@0.5 | AP50 |", "|---|---|---|---|---|---|---|"]
    for where, rep in row["test"].items():
        for c, m in rep.items():
            lines.append(f"| {where} | {c} | {m['refs']} | {m['precision']:.3f} | {m['recall']:.3f} | {m['f1']:.3f} | {m['ap50']:.3f} |")
    return "\n".join(lines)


def detection_card(spec: Spec, name: str, sources, row: dict) -> str:
    classes = [c for s in sources for c in s.classes]
    return f"""# Adapter `{name}` — object detection ({', '.join(classes)})

LoRA (rank {spec.lora.rank}, alpha {spec.lora.alpha:g}) on backbone layers {spec.lora.layers} ({', '.join(spec.lora.modules)})
of `{spec.backbone}`{_started_from(spec)}, plus a dense anchor-free detection head on the patch grid. Input: {spec.image_size}×{spec.image_size}
letterbox (pad 114), ImageNet normalisation — exactly what the daemon feeds it.

## Knowledge sources (pseudo-labels; no human labels exist offline)
{chr(10).join(_source_line(s) for s in sources)}

## Data
- training: {_ranges(spec.train)} (+ horizontal flips: {spec.opts.flip})
- validation (score threshold {row['threshold']}): {_ranges(spec.val)}
- held out, never trained on: {_ranges(spec.test)}

## Accuracy against the teacher's labels on held-out data
{_det_table(row)}

F1 at the adapter's score threshold; a detection matches a label at IoU ≥ 0.5; don't-care boxes count neither way.
Full comparison (head-only, per-source, fused, classical teacher): `adapters/REPORT-{spec.name}.md`.

## Training
{row['steps']} steps, {row['train_seconds']:.0f} s on {platform.machine()} CPU ({_threads(spec)}, shared machine, frozen layers < {spec.split} cached once;
feature caching and teacher labelling not included){'' if row['complete'] else ' — stopped by the time budget'}.

Reproduce: `{_reproduce(spec)}` (needs the `train` extra and the CenterNet teacher in `../shared/assets/teachers`).
Evaluate: `vlora-va eval adapters/{name} --on sample_videos/pedestrians.mp4:55-79.5 sample_videos/bikes.mp4`
"""


def _confusion(rows: list[str], cols: list[str], cm: list[list[int]]) -> list[str]:
    lines = ["| reference \\ predicted | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    return lines + [f"| {lab} | " + " | ".join(str(v) for v in r) + " |" for lab, r in zip(rows, cm)]


def _action_tables(rep: dict, where: str) -> str:
    t = [f"**{where}**, per clip (main subject): top-1 {rep['top1']:.3f} over {rep['clips']} clips", "",
         *_confusion(rep["labels"], rep["labels"], rep["confusion"])]
    p = rep.get("persons")
    if p and not p["persons"]:
        t += ["", f"**{where}**, per person: no labelled person in these clips; the head reported {p['predicted']} "
                  f"(false alarms, at person score ≥ {p['threshold']:g})"]
    elif p:
        t += ["", f"**{where}**, per person: top-1 **{p['top1']:.3f}** over {p['persons']} persons (a missed person "
                  f"counts as wrong); {fmt_ratio(p['top1_found'])} of the persons found; found {p['recall']:.3f} of them, "
                  f"precision {fmt_ratio(p['precision'])} (person score ≥ {p['threshold']:g})", "",
              *_confusion(p["activities"], [*p["activities"], "missed"], p["confusion"])]
    return "\n".join(t)


def action_card(spec: Spec, row: dict, counts: dict, person_counts: dict | None = None) -> str:
    persons = bool(spec.head.get("persons"))
    tables = [_action_tables(rep, where) for where, rep in row["test"].items()]
    person_words = (" and a per-person branch (where each person is over the clip, and that person's activity)"
                    if persons else "")
    person_line = f"\n\nPerson counts: {json.dumps(person_counts)}" if person_counts else ""
    return f"""# Adapter `{spec.name}` — activity recognition on 1-s clips ({spec.clip_len} frames)

LoRA (rank {spec.lora.rank}, alpha {spec.lora.alpha:g}) on backbone layers {spec.lora.layers} of `{spec.backbone}`{_started_from(spec)}, and a clip
classifier head ({_action_head_words(spec.head)}; head params {json.dumps(spec.head)}){person_words}.
Input {spec.image_size}×{spec.image_size} letterbox, as served.

## Labels (how they are made — read this before trusting the numbers)
{chr(10).join(_source_line(s) for s in spec.sources)}
Every person tracked through ≥ 60% of the clip gets an activity: `standing` (moves < 0.12 body heights/s),
`walking_left/right` (mostly horizontal motion), `walking_toward/away` (mostly vertical: down/up the image),
`cycling` (a bicycle box rides with the person). The clip's label is its *main subject's* (the largest such
person), or `no_person`. Labels are as good as the teacher and the IoU tracker; the accuracy below is agreement
with this rule on held-out clips.

Clip counts: {json.dumps(counts)}{person_line}

## Data
- training: {_ranges(spec.train)} (a clip starts every `step` s{'; mirrored clips swap left/right' if spec.opts.flip else ''})
- validation (person score threshold): {_ranges(spec.val)}
- held out, never trained on: {_ranges(spec.test)}

## Accuracy on held-out clips
{(chr(10) * 2).join(tables)}

Chance level: always answering the most frequent training label would score
{_majority(counts)} per clip on the first held-out range. The head-only baseline and its numbers are in
`adapters/REPORT-{spec.name}.md`.

## Training
{row['steps']} steps, {row['train_seconds']:.0f} s on CPU ({_threads(spec)}, frozen layers < {spec.split} cached){'' if row['complete'] else ' — stopped by the time budget'}.
{_seed_runs(row)}

Reproduce: `{_reproduce(spec)}`
"""


def _threads(spec: Spec) -> str:
    return f"{spec.opts.threads} thread{'s' if spec.opts.threads > 1 else ''}"


def _seed_runs(row: dict) -> str:
    if not row.get("runs"):
        return ""
    persons = "person_top1" in row["runs"][0]
    lines = [f"This adapter is seed {row['runs'][0]['seed']} (saved before any held-out score was seen). "
             f"The same spec trained with {len(row['runs'])} seeds, held-out top-1 per clip"
             f"{' / per person' if persons else ''}:"]

    def scores(r: dict, clip: str, person: str) -> str:
        def person_score(w: str) -> str:
            return f" / {r[person][w]:.3f}" if w in r[person] else " / n/a (no labelled person)"

        return ", ".join(f"{w} {v:.3f}" + (person_score(w) if persons else "") for w, v in r[clip].items())

    lines += [f"- seed {r['seed']}: " + scores(r, "top1", "person_top1") for r in row["runs"]]
    lines.append("- mean: " + scores(row, "mean_top1", "mean_person_top1"))
    return "\n".join(lines)


def _action_head_words(head: dict) -> str:
    motion = " and their frame-to-frame differences" if head.get("motion") else ""
    if head.get("spatial") == "local":
        return (f"the full patch grid of every frame{motion}, a 3-D convolution over time, rows and columns, "
                "mean+max over the clip")
    return f"per-frame pooled patch features{motion}, temporal convolution, mean+max over time"


def _majority(counts: dict) -> str:
    train = counts["train"]
    top = max(train, key=train.get)
    held = [v for k, v in counts.items() if k != "train"]
    if not held:
        return "n/a"
    return f"{held[0].get(top, 0) / max(sum(held[0].values()), 1):.3f} (`{top}`)"


def _seed_cell(row: dict, where: str, run_key: str, mean_key: str, shipped: float) -> str:
    if not row.get("runs"):
        return f"{shipped:.3f}"
    scores = [r[run_key][where] for r in row["runs"]]
    seeds = ", ".join(str(r["seed"]) for r in row["runs"])
    return f"{shipped:.3f}; seeds {seeds}: mean {row[mean_key][where]:.3f}, range {min(scores):.3f}–{max(scores):.3f}"


def _row_cells(row: dict) -> list[tuple[str, str, str]]:
    cells = []
    for where, rep in row.get("test", {}).items():
        if "top1" in rep:
            cells.append((where, "top-1 per clip", _seed_cell(row, where, "top1", "mean_top1", rep["top1"])))
            p = rep.get("persons")
            if p and p["top1"] is None:
                cells.append((where, "top-1 per person", f"n/a: no labelled person, {p['predicted']} false alarms"))
            elif p:
                cells.append((where, "top-1 per person", _seed_cell(row, where, "person_top1", "mean_person_top1",
                                                                     p["top1"])))
        else:
            for c, m in rep.items():
                cells.append((where, c, f"{m['f1']:.3f} / {m['ap50']:.3f}"))
    return cells


def write_report(stem: Path, report: dict) -> None:
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(jsonfmt.dumps(report, indent=2) + "\n")
    metric = "top-1" if report["task"] == "action" else "F1@0.5 / AP50 vs teacher labels"
    lines = [f"# {report['spec']}: comparison on held-out data ({metric})", "",
             f"image size {report['image_size']}, LoRA {report['lora']}", "",
             "| model | held-out data | class | score | train s |", "|---|---|---|---|---|"]
    for row in report["rows"]:
        for where, c, v in _row_cells(row):
            lines.append(f"| {row['model']} | {where} | {c} | {v} | {row.get('train_seconds', '')} |")
    if report.get("fusion"):
        lines += ["", "## Fusion decisions (validation F1)", ""]
        lines += [f"- {e['source']} → adapter {e['adapter']}: {e['decision']} {e['accuracy']}"
                  f"{' failing ' + str(e['failing']) if e['failing'] else ''}" for e in report["fusion"]]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
