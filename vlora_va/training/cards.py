"""Adapter cards (README.md beside each adapter) and the comparison report (JSON + Markdown table)."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

from vlora_va.common import jsonfmt
from vlora_va.engine.motion import TRACK_SHARE
from vlora_va.training.corrections import load_corrections
from vlora_va.training.metrics import fmt_ratio
from vlora_va.training.spec import Spec


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


REPO = Path(__file__).resolve().parents[2]


def _shown(path: Path) -> str:
    """A path as a card shows it: from the repository's root where it lies inside (a study writes under
    adapters/studies/, not adapters/), else as it is."""
    path = Path(path).resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def _report_path(spec: Spec) -> str:
    return _shown(spec.output.parent / f"REPORT-{spec.name}.md")


TEACHER_WORDS = {"centernet": "CenterNet COCO-80 teacher",
                 "nanodet": "NanoDet COCO-80 teacher",
                 "fused": "CenterNet and NanoDet COCO-80 teachers, box-fused (`training/label_fusion.py`),"}


def _source_line(s) -> str:
    if s.kind in TEACHER_WORDS:
        tiles = int(s.options.get("tiles", 1))
        on = (f" on the whole frame and on {tiles}×{tiles} overlapping tiles (merged: `teachers.merge_tiled`)"
              if tiles > 1 else "")
        return (f"- **{s.name}**: {TEACHER_WORDS[s.kind]}{on} filtered to {s.classes}; boxes scoring ≥ {s.score_threshold} "
                f"are labels, {s.ignore_below}–{s.score_threshold} are don't-care"
                f"{f', as are boxes under {s.min_height:g} px tall' if s.min_height else ''}.{_corrections_words(s)}")
    if s.kind == "activity":
        return (f"- **{s.name}**: activity derived from tracking CenterNet person boxes (score ≥ {s.score_threshold}) over each "
                "1-s clip — see `vlora_va/training/actions.py` for the exact rule.")
    return f"- **{s.name}**: {s.kind} {s.classes} {s.options}"


def _corrections_words(s) -> str:
    if not s.options.get("corrections"):
        return ""
    path = Path(s.options["corrections"])
    fixes = load_corrections(path)
    changed = sum(1 for f in fixes.frames.values() if f.remove or f.add or f.add_ignore)
    return (f" On {len(fixes.frames)} {fixes.video} frames checked by hand (`{path.parent.name}/{path.name}`, sha256 "
            f"{s.options['corrections_sha256'][:12]}…), {changed} of them corrected, the hand boxes replace the "
            "teacher's there and in those frames' crops (`training/corrections.py`).")


def _detail_words(spec: Spec) -> str:
    detail = spec.head.get("detail")
    return (f", joined there by a {detail}-channel convolution branch on the input image at a quarter of its size "
            "(it separates people a patch token holds together)" if detail else "")


def _box_head_start(spec: Spec) -> str:
    if spec.box_head_from is None:
        return ""
    where = os.path.relpath(spec.box_head_from, spec.output.parent)
    return f"; that person head started from the `{where}` adapter's detection head (its person class)"


def _det_table(row: dict) -> str:
    lines = ["| held-out data | class | refs | precision | recall | F1@0.5 | AP50 |", "|---|---|---|---|---|---|---|"]
    for where, rep in row["test"].items():
        for c, m in rep.items():
            lines.append(f"| {where} | {c} | {m['refs']} | {fmt_ratio(m['precision'])} | {fmt_ratio(m['recall'])} | {fmt_ratio(m['f1'])} | "
                         f"{fmt_ratio(m['ap50'])} |")
    return "\n".join(lines)


def _human_det_table(rows: list[dict]) -> str:
    """Every row's human-set figures per range and class (rows without them are skipped)."""
    lines = ["| model | held-out frames | class | refs | precision | recall | F1@0.5 | AP50 | recall < 40 px | 40–100 px "
             "| > 100 px | side-by-side pairs as two boxes |", "|---" * 12 + "|"]
    for row in rows:
        for where, h in (row.get("human") or {}).items():
            for c, m in h["per_class"].items():
                if not m["refs"]:
                    continue
                by_h = [f"{fmt_ratio(v['recall'])} ({v['found']}/{v['refs']})" if v["refs"] else "—"
                        for v in m["recall_by_height"].values()]
                pairs = m.get("side_by_side")
                side = f"{fmt_ratio(pairs['rate'])} ({pairs['separate']}/{pairs['cases']})" if pairs and pairs["cases"] else "—"
                lines.append(f"| {row['model']} | {where} ({h['frames']}) | {c} | {m['refs']} | {fmt_ratio(m['precision'])} | "
                             f"{fmt_ratio(m['recall'])} | {fmt_ratio(m['f1'])} | {fmt_ratio(m['ap50'])} | {' | '.join(by_h)} | {side} |")
    return "\n".join(lines)


def _main_range(row: dict) -> str | None:
    """The held-out range with the most human-checked persons (the targets are read there)."""
    refs = {w: (h["per_class"].get("person") or {}).get("refs", 0) for w, h in (row.get("human") or {}).items()}
    return max(refs, key=refs.get) if refs and max(refs.values()) else None


def _person_target_lines(row: dict) -> str:
    """The issue's detection targets, met or not, for this row on the range with the most human-checked persons."""
    out = []
    for where, h in (row.get("human") or {}).items():
        m = h["per_class"].get("person")
        if where != _main_range(row) or not m:
            continue
        big = m["recall_by_height"][">100"]
        pairs = m.get("side_by_side") or {}
        curve = m.get("recall_at_precision_0.9") or {}
        checks = [("recall ≥ 0.85 at precision ≥ 0.9, at its validation-picked threshold", m["recall"] >= 0.85 and m["precision"] >= 0.9,
                   f"recall {m['recall']:.3f}, precision {m['precision']:.3f}; the curve's best recall at precision ≥ 0.9 "
                   f"is {fmt_ratio(curve.get('recall'))} (at score ≥ {curve.get('threshold')}: a reading of this set, not an "
                   "operating point chosen on it)"),
                  ("recall ≥ 0.9 for people taller than 100 px", (big["recall"] or 0) >= 0.9,
                   f"{fmt_ratio(big['recall'])} ({big['found']}/{big['refs']})"),
                  ("side-by-side people as separate boxes in ≥ 80% of the cases", (pairs.get("rate") or 0) >= 0.8,
                   f"{fmt_ratio(pairs.get('rate'))} ({pairs.get('separate', 0)} of {pairs.get('cases', 0)} pairs)")]
        out += [f"- {where}, {what}: **{'met' if ok else 'not met'}** ({figure})" for what, ok, figure in checks]
    return "\n".join(out)


def _det_seed_table(rows: list[dict], where: str | None) -> str:
    """Per trained model with seed runs: every run's and the mean's human-set person figures on range `where`."""
    lines = ["| model | seed | held-out frames | precision | recall | F1@0.5 | AP50 | recall at precision ≥ 0.9 | "
             "recall > 100 px | side-by-side | train s |", "|---" * 11 + "|"]
    for row in rows:
        if not row.get("runs"):
            continue
        for run in [*row["runs"], {"seed": "mean", **row["mean"]}]:
            for w, m in (run.get("human_person") or {}).items():
                if w != where:
                    continue
                seed = f"**{run['seed']}**" if run["seed"] == "mean" else run["seed"]
                lines.append(f"| {row['model']} | {seed} | {w} | {fmt_ratio(m['precision'])} | {fmt_ratio(m['recall'])} "
                             f"| {fmt_ratio(m['f1'])} | {fmt_ratio(m['ap50'])} | {fmt_ratio(m.get('recall_at_p90'))} | "
                             f"{fmt_ratio(m['recall_over_100px'])} | {fmt_ratio(m['side_by_side'])} | "
                             f"{run.get('train_seconds', 0):.0f} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def _lora_vs_head_only(rows: list[dict], means, what: str) -> str:
    """One plain sentence: does LoRA + head beat head-only on the seeds' mean (human-checked set), per range."""
    lora = [r for r in rows if r.get("runs") and r["model"].startswith("LoRA")]
    head = [r for r in rows if r.get("runs") and r["model"].startswith("head only")]
    if not lora or not head:
        return ""
    a, b = means(lora[0]), means(head[0])
    out = []
    for w in a:
        if a[w] is None or b.get(w) is None:
            continue
        verdict = "beats" if a[w] > b[w] else "does **not** beat"
        out.append(f"On {w}, LoRA + head {verdict} head-only on the mean over {len(lora[0]['runs'])} seeds: {what} "
                   f"{a[w]:.3f} vs {b[w]:.3f}.")
    return "\n" + "\n".join(out) + "\n" if out else ""


def _chosen_why(row: dict) -> str:
    """Why this seed was saved: reports that record each run's validation score chose the best one; older
    reports saved the first seed."""
    return ", the best there," if "val_mean_f1" in row["runs"][0] else ", the first,"


def _det_human_section(row: dict, rows: list[dict]) -> str:
    if not any(r.get("human") for r in rows):
        return ""
    from vlora_va.training.evaluate import HUMAN_SET_SHA256

    seeds = _det_seed_table(rows, _main_range(row))
    seeded = sum(bool(r.get("runs")) for r in rows)
    what = "LoRA + head vs head-only" if seeded > 1 else row["model"].split(",")[0]
    seed_part = (f"""
### {what}, {len(row['runs'])} seeds{' each' if seeded > 1 else ''} (human-checked persons)
Every model's threshold and NMS were picked on the validation range; seed {row['seed']}{_chosen_why(row)} is the
adapter saved here.

{seeds}
{_lora_vs_head_only(rows, lambda r: {w: m["f1"] for w, m in r["mean"].get("human_person", {}).items()
                                     if w == _main_range(row)}, "person F1@0.5")}""" if seeds and row.get("runs") else "")
    return f"""
## Accuracy on the human-checked set
`adapters/eval/human-v1.json` (sha256 `{HUMAN_SET_SHA256}`, frozen; how it was made: `adapters/eval/README.md`):
boxes drawn and checked by hand on held-out frames. Models at their own score threshold and NMS IoU (picked on
the validation range, never on this set); the CenterNet teacher at the score above which its boxes are labels.
Recall by height counts reference boxes by height in original-frame pixels; a side-by-side pair is two labelled
persons whose boxes touch or overlap or whose centres are closer than the wider box's width, counted as two boxes
when both are matched.

{_human_det_table(rows)}

Targets (issue 15), this adapter:
{_person_target_lines(row)}
{seed_part}"""


def _lora_words(spec: Spec) -> str:
    if not spec.lora.layers:  # head only: nothing of the backbone is trained
        return "No LoRA (head only): the frozen backbone"
    return (f"LoRA (rank {spec.lora.rank}, alpha {spec.lora.alpha:g}) on backbone layers {spec.lora.layers} "
            f"({', '.join(spec.lora.modules)})")


def detection_card(spec: Spec, name: str, sources, row: dict, rows: list[dict] | None = None, *,
                   adapter: Path) -> str:
    """The adapter's README: `row` is its own report row, `rows` every row of the report (baselines, teacher),
    `adapter` the directory it is saved in."""
    rows = rows or [row]
    classes = [c for s in sources for c in s.classes]
    return f"""# Adapter `{name}` — object detection ({', '.join(classes)})

{_lora_words(spec)}
of `{spec.backbone}`{_started_from(spec)}, plus a dense anchor-free detection head on the patch grid upsampled
×{spec.head.get('upsample', 2)}{_detail_words(spec)}. Input: {spec.image_size}×{spec.image_size} letterbox (pad 114), ImageNet normalisation — exactly what the daemon feeds it.

## Knowledge sources (pseudo-labels; no human labels exist offline)
{chr(10).join(_source_line(s) for s in sources)}

## Data
- training: {_ranges(spec.train)} (+ horizontal flips: {spec.opts.flip}{_zoom_words(spec)})
- validation (score threshold {row['threshold']}, NMS IoU {row.get('nms_iou', 0.5)}): {_ranges(spec.val)}
- held out, never trained on: {_ranges(spec.test)}

## Accuracy against the teacher's labels on held-out data
{_det_table(row)}

F1 at the adapter's score threshold; a detection matches a label at IoU ≥ 0.5; don't-care boxes count neither way.
Full comparison (head-only, per-source, fused, classical teacher): `{_report_path(spec)}`.
{_det_human_section(row, rows)}
## Training
{row['steps']} steps, {row['train_seconds']:.0f} s on {platform.machine()} CPU ({_threads(spec)}, shared machine, frozen layers < {spec.split} cached once;
feature caching and teacher labelling not included){'' if row['complete'] else ' — stopped by the time budget'}.

Reproduce: `{_reproduce(spec)}` (needs the `train` extra and the teachers from `vlora-va teachers fetch`).
Evaluate: `vlora-va eval {_shown(adapter)} --on sample_videos/pedestrians.mp4:55-79.5 sample_videos/bikes.mp4`
"""


def _zoom_words(spec: Spec) -> str:
    if not spec.opts.zoom_in:
        return ""
    lo, hi = spec.opts.zoom_scale
    return (f"; + {spec.opts.zoom_in} zoomed-in crop{'s' if spec.opts.zoom_in > 1 else ''} per frame, {lo:g}–{hi:g} of "
            "each side, labelled by the teacher on the crop")


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


def _human_person_rows(rows: list[dict]) -> list[tuple[str, str, dict]]:
    """(model, range, human-set person report) of every row: trained models keep it per test range, the label
    rule's row has only that (`human_persons`)."""
    out = []
    for row in rows:
        out += [(row["model"], w, rep["human_persons"]) for w, rep in row.get("test", {}).items() if rep.get("human_persons")]
        out += [(row["model"], w, h) for w, h in row.get("human_persons", {}).items()]
    return out


def _recall_cell(h: dict, activity: str) -> str:
    v = h["per_activity"].get(activity)
    return f"{fmt_ratio(v['recall'])} ({v['right']}/{v['persons']})" if v else "—"


def _action_human_section(rows: list[dict]) -> str:
    found = _human_person_rows(rows)
    if not found:
        return ""
    from vlora_va.training.evaluate import HUMAN_SET_SHA256

    lines = ["| model | held-out clips | top-1 | top-1 over left / right / standing | right of those found | found | "
             "precision | walking_toward | walking_away | standing |", "|---" * 10 + "|"]
    for model, where, h in found:
        lines.append(f"| {model} | {where} ({h['clips']}) | **{fmt_ratio(h['top1'])}** | "
                     f"{fmt_ratio(h['top1_left_right_standing'])} | {fmt_ratio(h['top1_found'])} | {fmt_ratio(h['recall'])} | "
                     f"{fmt_ratio(h['precision'])} | {_recall_cell(h, 'walking_toward')} | "
                     f"{_recall_cell(h, 'walking_away')} | {_recall_cell(h, 'standing')} |")
    model, where, first = found[0]
    seeds = ["| model | seed | top-1 | left / right / standing | found | walking_toward | walking_away | standing |",
             "|---" * 8 + "|"]
    for row in rows:
        runs = [r for r in row.get("runs", []) if r.get("human")]
        for run in [*runs, *([{"seed": "**mean**", "human": row["mean_human"]}] if runs and row.get("mean_human") else [])]:
            for w, m in run["human"].items():
                seeds.append(f"| {row['model']} | {run['seed']} | {fmt_ratio(m['top1'])} | "
                             f"{fmt_ratio(m['top1_left_right_standing'])} | {fmt_ratio(m['recall'])} | "
                             f"{fmt_ratio(m['recall_walking_toward'])} | {fmt_ratio(m['recall_walking_away'])} | "
                             f"{fmt_ratio(m['recall_standing'])} |")
    seed_part = ("\nPer seed (human-checked persons; the first seed is the shipped adapter):\n\n" + "\n".join(seeds) + "\n"
                 + _lora_vs_head_only(rows, lambda r: {w: m["top1"] for w, m in r.get("mean_human", {}).items()},
                                      "per-person top-1")
                 if len(seeds) > 2 else "")
    lrs = first["top1_left_right_standing"] or 0.0
    return f"""
## Accuracy on the human-checked set
`adapters/eval/human-v1.json` (sha256 `{HUMAN_SET_SHA256}`, frozen; how it was made and its activity rule:
`adapters/eval/README.md`): one-second clips of the held-out range, every person boxed by hand and their activity
judged by eye. A predicted person (at the score threshold picked on the validation range) matches a labelled one
when their mean boxes overlap with IoU ≥ 0.5; a prediction on an "ignore" person counts neither way; a missed
person counts as wrong. Per-activity cells: recall (right / labelled persons). The majority-class baseline
(always the most frequent activity) has recall 0 on every other activity.

{chr(10).join(lines)}

Target (issue 15): top-1 ≥ 0.8 over walking left / right / standing: **{'met' if lrs >= 0.8 else 'not met'}**
({fmt_ratio(first['top1_left_right_standing'])} for `{model}`, seed 0).

Confusion of `{model}` on {where} (rows = human label, last column = missed):

{chr(10).join(_confusion(first["activities"], [*first["activities"], "missed"], first["confusion"]))}
{seed_part}"""


def action_card(spec: Spec, row: dict, counts: dict, person_counts: dict | None = None,
                rows: list[dict] | None = None) -> str:
    """The adapter's README: `row` is its own report row, `rows` every row of the report (head-only, label rule)."""
    rows = rows or [row]
    persons = bool(spec.head.get("persons"))
    tables = [_action_tables(rep, where) for where, rep in row["test"].items()]
    person_words = (" and a per-person branch (where each person is over the clip, and that person's activity)"
                    if persons else "")
    if persons and spec.head.get("boxes"):
        person_words += (f"; each person's box from a person detection head (patch grid ×{spec.head['boxes']}"
                         f"{_detail_words(spec)}) on the clip's two middle frames, linked and averaged, its activity "
                         f"read at the box's centre{_box_head_start(spec)}")
    if persons and spec.head.get("activity_from") == "track":
        person_words += ("; the person head also runs on the clip's other frames, each person's box is followed "
                         f"through them, and where it is seen on ≥ {TRACK_SHARE:.0%} of the frames the label rule's "
                         "motion test (below) names the activity, not the activity maps (which still name cycling)")
    person_line = f"\n\nPerson counts: {json.dumps(person_counts)}" if person_counts else ""
    return f"""# Adapter `{spec.name}` — activity recognition on 1-s clips ({spec.clip_len} frames)

LoRA (rank {spec.lora.rank}, alpha {spec.lora.alpha:g}) on backbone layers {spec.lora.layers} of `{spec.backbone}`{_started_from(spec)}, and a clip
classifier head ({_action_head_words(spec.head)}; head params {json.dumps(spec.head)}){person_words}.
Input {spec.image_size}×{spec.image_size} letterbox, as served.

## Labels (how they are made — read this before trusting the numbers)
{chr(10).join(_source_line(s) for s in spec.sources)}
Every person tracked through ≥ 60% of the clip gets an activity from how their feet (the box's bottom centre)
move and how their box height changes: `standing` (feet move < 0.12 body heights/s), `walking_left/right`
(mostly sideways), `walking_toward/away` (mostly along the image's vertical, named by the box growing or
shrinking, not by up/down), `cycling` (a bicycle box rides with the person). A person is *not sure* (still a
person target, but no activity target and not scored) in the 0.12–0.25 heights/s band between standing and
walking, when walking diagonally, when the scale and the feet disagree about towards/away, or when a standing
person's height changes. The clip's label is its *main subject's* (the largest such person), or `no_person`.
Labels are as good as the teacher and the IoU tracker; the figures against them are agreement with this rule on
held-out clips; the human-checked figures are below them.

Clip counts: {json.dumps(counts)}{person_line}

## Data
- training: {_ranges(spec.train)} (a clip starts every `step` s{'; mirrored clips swap left/right' if spec.opts.flip else ''}{'; the clips with a sure walking_toward/away person also played backwards (toward and away, left and right swap)' if spec.opts.reverse else ''})
- validation (person score threshold): {_ranges(spec.val)}
- held out, never trained on: {_ranges(spec.test)}

## Accuracy on held-out clips
{(chr(10) * 2).join(tables)}

Chance level: always answering the most frequent training label would score
{_majority(counts)} per clip on the first held-out range. The head-only baseline and its numbers are in
`{_report_path(spec)}`.
{_action_human_section(rows)}
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
                cells.append((where, c, f"{fmt_ratio(m['f1'])} / {fmt_ratio(m['ap50'])}"))
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
