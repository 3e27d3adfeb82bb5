"""Adapter cards (README.md beside each adapter) and the comparison report (JSON + Markdown table)."""

from __future__ import annotations

import json
import platform
from pathlib import Path

from .. import jsonfmt
from .spec import Spec


def _ranges(ranges) -> str:
    return "; ".join(f"`{r.video.name}` {r.start:g}–{'end' if r.end is None else f'{r.end:g}'} s"
                     f"{'' if r.step is None else f', every {r.step:g} s'}" for r in ranges) or "none"


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
of `{spec.backbone}`, plus a dense anchor-free detection head on the patch grid. Input: {spec.image_size}×{spec.image_size}
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
{row['steps']} steps, {row['train_seconds']:.0f} s on {platform.machine()} CPU (1 thread, shared machine, frozen layers < {spec.split} cached once;
feature caching and teacher labelling not included){'' if row['complete'] else ' — stopped by the time budget'}.

Reproduce: `{_reproduce(spec)}` (needs the `train` extra and the CenterNet teacher in `../shared/assets/teachers`).
Evaluate: `vlora-va eval adapters/{name} --on sample_videos/pedestrians.mp4:55-79.5 sample_videos/bikes.mp4`
"""


def action_card(spec: Spec, row: dict, counts: dict) -> str:
    tables = []
    for where, rep in row["test"].items():
        labs = rep["labels"]
        t = [f"**{where}**: top-1 {rep['top1']:.3f} over {rep['clips']} clips", "",
             "| reference \\ predicted | " + " | ".join(labs) + " |", "|---" * (len(labs) + 1) + "|"]
        t += [f"| {lab} | " + " | ".join(str(v) for v in r) + " |" for lab, r in zip(labs, rep["confusion"])]
        tables.append("\n".join(t))
    return f"""# Adapter `{spec.name}` — activity recognition on 1-s clips ({spec.clip_len} frames)

LoRA (rank {spec.lora.rank}, alpha {spec.lora.alpha:g}) on backbone layers {spec.lora.layers} of `{spec.backbone}` and a clip
classifier head ({_action_head_words(spec.head)}; head params {json.dumps(spec.head)}).
Input {spec.image_size}×{spec.image_size} letterbox, as served.

## Labels (how they are made — read this before trusting the numbers)
{chr(10).join(_source_line(s) for s in spec.sources)}
The label describes the clip's *main subject* (the largest person tracked through ≥ 60% of the clip): `standing`
(moves < 0.12 body heights/s), `walking_left/right` (mostly horizontal motion), `walking_toward/away` (mostly
vertical: down/up the image), `cycling` (a bicycle box rides with the person), `no_person`. Labels are as good as
the teacher and the IoU tracker; the accuracy below is agreement with this rule on held-out clips.

Clip counts: {json.dumps(counts)}

## Data
- training: {_ranges(spec.train)} (a clip starts every `step` s{'; mirrored clips swap left/right' if spec.opts.flip else ''})
- held out, never trained on: {_ranges(spec.test)}

## Accuracy on held-out clips
{(chr(10) * 2).join(tables)}

Chance level: always answering the most frequent training label would score
{_majority(counts)} on the first held-out range. The head-only baseline and its numbers are in `adapters/REPORT-{spec.name}.md`.

## Training
{row['steps']} steps, {row['train_seconds']:.0f} s on CPU (1 thread, frozen layers < {spec.split} cached).
{_seed_runs(row)}

Reproduce: `{_reproduce(spec)}`
"""


def _seed_runs(row: dict) -> str:
    if not row.get("runs"):
        return ""
    lines = [f"This adapter is seed {row['runs'][0]['seed']} (saved before any held-out score was seen). "
             f"The same spec trained with {len(row['runs'])} seeds, held-out top-1:"]
    lines += [f"- seed {r['seed']}: " + ", ".join(f"{w} {v:.3f}" for w, v in r["top1"].items()) for r in row["runs"]]
    lines.append("- mean: " + ", ".join(f"{w} {v:.3f}" for w, v in row["mean_top1"].items()))
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


def _row_cells(row: dict) -> list[tuple[str, str, str]]:
    cells = []
    for where, rep in row.get("test", {}).items():
        if "top1" in rep and row.get("runs"):
            scores = [r["top1"][where] for r in row["runs"]]
            seeds = ", ".join(str(r["seed"]) for r in row["runs"])
            cells.append((where, "top-1", f"{rep['top1']:.3f}; seeds {seeds}: mean {row['mean_top1'][where]:.3f}, "
                                          f"range {min(scores):.3f}–{max(scores):.3f}"))
        elif "top1" in rep:
            cells.append((where, "top-1", f"{rep['top1']:.3f}"))
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
