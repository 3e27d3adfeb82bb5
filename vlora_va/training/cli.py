"""Entry points for `vlora-va train SPEC.yaml` and `vlora-va eval ADAPTER --on VIDEO...`.

Wire them into vlora_va/cli.py as subcommands that pass the remaining argv: `main_train(argv)`,
`main_eval(argv)`; both return a process exit code.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from vlora_va.common import jsonfmt
from vlora_va.training.metrics import fmt_ratio
from vlora_va.training.spec import Range, SpecError, load_spec

_RANGE = re.compile(r"^(?P<video>.+?)(?::(?P<start>[\d.]+)?-(?P<end>[\d.]+)?)?(?:@(?P<step>[\d.]+))?$")
# `vlora-va eval` where a teacher file is missing: what an adapter's teacher-relative report would have held, and
# where the teacher files are looked for.
TEACHER_FIGURES = {"detection": "F1@0.5, AP50, P and R per class against the teacher's labels",
                   "action": "top-1 and confusion against the teacher's tracking-rule labels"}
TEACHERS_HINT = ("(the teacher files are read from --teachers-dir, else $VLORA_VA_TEACHERS, "
                 "else ~/.cache/vlora-va/teachers, where `vlora-va teachers fetch` puts them)")
TEACHER_NAMES = ("centernet", "nanodet", "fused")


def parse_range(text: str, default_step: float | None) -> Range:
    """VIDEO[:START-END][@STEP], e.g. sample_videos/pedestrians.mp4:55-79.5@0.5 (seconds)."""
    m = _RANGE.match(text)
    if not m or not Path(m["video"]).is_file():
        raise argparse.ArgumentTypeError(f"{text!r}: expected an existing VIDEO[:START-END][@STEP]")
    return Range(Path(m["video"]), float(m["start"] or 0), float(m["end"]) if m["end"] else None,
                 float(m["step"]) if m["step"] else default_step)


def _cards_only(spec) -> int:
    import json

    from vlora_va.training.cards import write_report
    from vlora_va.training.runner import write_cards

    stem = spec.output.parent / f"REPORT-{spec.name}"
    if not stem.with_suffix(".json").is_file():
        print(f"vlora-va train --cards-only: {stem.with_suffix('.json')}: no report (train the spec first)", file=sys.stderr)
        return 2
    report = json.loads(stem.with_suffix(".json").read_text())
    write_report(stem, report)
    write_cards(spec, report)
    print(f"wrote the cards of {', '.join(report['adapters'])} and {stem.with_suffix('.md')}")
    return 0


def main_train(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="vlora-va train", description="Train adapters from a training spec (YAML).")
    ap.add_argument("spec", help="training spec, e.g. adapters/specs/detect.yaml")
    ap.add_argument("--budget-minutes", type=float, help="override the spec's time budget")
    ap.add_argument("--no-baselines", action="store_true", help="skip the head-only / per-source comparison runs")
    ap.add_argument("--threads", type=int, help="torch threads (default: the spec's, else 1)")
    ap.add_argument("--repeat", type=int, metavar="K",
                    help="train only repeat K (seed seed+K) of the spec's train_options.repeats, exactly as the whole "
                         "spec trains it; run repeats side by side, then the whole spec resumes their checkpoints "
                         "(needs --out)")
    ap.add_argument("--out", type=Path, metavar="DIR",
                    help="write the adapter and its report under DIR instead of the spec's output")
    ap.add_argument("--cards-only", action="store_true",
                    help="train nothing: rewrite the adapters' README cards and REPORT-*.md from the spec's REPORT-*.json")
    args = ap.parse_args(argv)
    if not Path(args.spec).is_file():  # said here: load_spec's own message would repeat the path
        print(f"vlora-va train: {args.spec}: no such file", file=sys.stderr)
        return 2
    try:
        spec = load_spec(args.spec)
    except SpecError as e:
        print(f"vlora-va train: {args.spec}: {e}", file=sys.stderr)
        return 2
    if args.budget_minutes is not None:
        spec.budget_minutes = args.budget_minutes
    if args.no_baselines:
        spec.baselines = ()
    if args.threads:
        spec.opts.threads = args.threads
    if args.repeat is not None:
        if not 0 <= args.repeat < spec.opts.repeats:
            print(f"vlora-va train: --repeat {args.repeat}: the spec has repeats 0..{spec.opts.repeats - 1}",
                  file=sys.stderr)
            return 2
        if args.out is None:  # one repeat alone must not replace the adapter the whole spec saves
            print("vlora-va train: --repeat needs --out DIR", file=sys.stderr)
            return 2
        spec.only_repeat = args.repeat
    if args.out is not None:
        spec.output = args.out.resolve() / spec.output.name
    if args.cards_only:
        return _cards_only(spec)
    from vlora_va.training.runner import train_spec

    report = train_spec(spec)
    print(f"wrote {', '.join(report['adapters'])} and {spec.output.parent / ('REPORT-' + spec.name)}.md "
          f"in {report['seconds']:.0f} s")
    return 0


def main_eval(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="vlora-va eval", description="Score an adapter against teacher labels on video, "
                                 "and against the human-checked set where it has frames or clips in the ranges.")
    ap.add_argument("adapter", help="adapter directory, or teacher:centernet, teacher:nanodet or teacher:fused (a "
                                    "teacher itself, scored on the human-checked set only)")
    ap.add_argument("--on", nargs="+", required=True, metavar="VIDEO[:START-END][@STEP]",
                    help="held-out footage, e.g. sample_videos/pedestrians.mp4:55-79.5")
    ap.add_argument("--step", type=float, default=0.5, help="seconds between evaluated frames / clips (default 0.5)")
    ap.add_argument("--backbone", default="dinov2-small")
    ap.add_argument("--teachers-dir", type=Path, help="folder with the teacher files (default: where `vlora-va "
                                                      "teachers fetch` puts them)")
    ap.add_argument("--tiles", type=int, default=1, help="teachers: also run on N x N overlapping tiles (default 1)")
    ap.add_argument("--human", type=Path, metavar="FILE",
                    help="human-checked set (COCO JSON + activity clips; default adapters/eval/human-v1.json)")
    ap.add_argument("--no-human", action="store_true", help="teacher-relative figures only")
    ap.add_argument("--json", type=Path, help="also write the report here")
    ap.add_argument("--draw", type=Path, metavar="DIR", help="detection: save one annotated frame per video here")
    args = ap.parse_args(argv)
    try:
        ranges = [parse_range(t, args.step) for t in args.on]
    except argparse.ArgumentTypeError as e:
        ap.error(str(e))
    from vlora_va.engine.adapters import AdapterError
    from vlora_va.engine.backbones import ModelError
    from vlora_va.training.evaluate import HUMAN_SET, evaluate_adapter, evaluate_teacher_on_human, load_human_set

    human = None if args.no_human else args.human or (HUMAN_SET if HUMAN_SET.is_file() else None)
    if human is not None and not Path(human).is_file():
        ap.error(f"--human {human}: no such file")
    if args.json and not args.json.parent.is_dir():  # found now, not after the whole evaluation
        ap.error(f"--json {args.json}: no such directory {args.json.parent}")
    if args.adapter.startswith("teacher:"):
        name = args.adapter.partition(":")[2]
        if name not in TEACHER_NAMES:
            ap.error(f"{args.adapter}: the teachers that can be scored are "
                     f"{', '.join('teacher:' + n for n in TEACHER_NAMES)}")
        if human is None:
            ap.error(f"{args.adapter} is scored on the human-checked set only (drop --no-human or give --human)")
        try:
            report = evaluate_teacher_on_human(load_human_set(human), ranges, args.teachers_dir, tiles=args.tiles,
                                               teacher_name=name)
        except FileNotFoundError as e:  # the teacher file itself
            print(f"vlora-va eval: {e} {TEACHERS_HINT}", file=sys.stderr)
            return 1
    else:
        if not Path(args.adapter).is_dir():
            ap.error(f"{args.adapter}: no such adapter directory")
        if args.draw:
            try:
                args.draw.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                ap.error(f"--draw {args.draw}: {e.strerror}")
        try:
            report = evaluate_adapter(args.adapter, ranges, args.backbone, args.teachers_dir, draw_dir=args.draw,
                                      human=human)
        except (AdapterError, ModelError) as e:  # not an adapter directory; a backbone that is not there
            print(f"vlora-va eval: {e}", file=sys.stderr)
            return 1
    text = jsonfmt.dumps(report, indent=2)
    if args.json:
        args.json.write_text(text + "\n")
    if "human_set" in report:
        hs = report["human_set"]
        print(f"human-checked set {hs['path']} sha256 {hs['sha256'][:12]}"
              + ("" if hs["frozen"] else " (NOT the frozen file: figures are not comparable)"))
    for where, rep in report["reports"].items():
        if "top1" in rep:
            print(f"{where}: top-1 {rep['top1']:.3f} over {rep['clips']} clips; confusion (rows = reference) "
                  f"{rep['labels']}: {rep['confusion']}")
            p = rep.get("persons")
            if p and p["top1"] is None:
                print(f"{where}: per person: no labelled person; {p['predicted']} reported (false alarms)")
            elif p:
                print(f"{where}: per person: top-1 {p['top1']:.3f} over {p['persons']} persons (a missed person counts "
                      f"wrong), {fmt_ratio(p['top1_found'])} of those found; found {p['recall']:.3f}, precision "
                      f"{fmt_ratio(p['precision'])}; confusion (rows = reference, last column = missed) "
                      f"{p['activities']}: {p['confusion']}")
        elif "per_class" in rep:
            for c, m in rep["per_class"].items():
                print(f"{where} {c}: F1@0.5 {m['f1']:.3f} AP50 {m['ap50']:.3f} P {m['precision']:.3f} R {m['recall']:.3f} "
                      f"({m['refs']} refs, threshold {rep['threshold']})")
        elif "teacher_missing" in rep:
            print(f"{where}: skipped the teacher-relative figures ({TEACHER_FIGURES[report['task']]}"
                  f"{' and the --draw frame' if args.draw and report['task'] == 'detection' else ''}): "
                  f"{rep['teacher_missing']}")
        _print_human(where, rep.get("human"))
        _print_human(where, rep.get("human_persons"), "the teacher's tracking-rule labels, per person")
    if any("teacher_missing" in rep for rep in report["reports"].values()):
        print(TEACHERS_HINT)
    return 0


def _print_human(where: str, h: dict | None, what: str = "per person") -> None:
    """One human-set report line (detection per class, or per-person activity)."""
    if h and "per_class" in h:
        for c, m in h["per_class"].items():
            sizes = ", ".join(f"{b} {fmt_ratio(v['recall'])} ({v['found']}/{v['refs']})"
                              for b, v in m["recall_by_height"].items())
            pairs = m.get("side_by_side")
            side = (f"; side-by-side pairs as two boxes {fmt_ratio(pairs['rate'])} ({pairs['separate']}/{pairs['cases']})"
                    if pairs else "")
            print(f"{where} [human] {c}: F1@0.5 {m['f1']:.3f} AP50 {m['ap50']:.3f} P {m['precision']:.3f} "
                  f"R {m['recall']:.3f} ({m['refs']} refs, threshold {h['threshold']}); recall by height {sizes}{side}")
    elif h:
        print(f"{where} [human] {what} (IoU >= {h['iou']}): top-1 {fmt_ratio(h['top1'])} over {h['persons']} "
              f"persons in {h['clips']} clips (a missed person counts wrong), {fmt_ratio(h['top1_found'])} of "
              f"those found; found {fmt_ratio(h['recall'])}, precision {fmt_ratio(h['precision'])}; "
              f"top-1 over left/right/standing {fmt_ratio(h['top1_left_right_standing'])}; recall per activity "
              + ", ".join(f"{a} {fmt_ratio(v['recall'])} ({v['right']}/{v['persons']})"
                          for a, v in h["per_activity"].items())
              + f"; confusion (rows = reference, last column = missed) {h['activities']}: {h['confusion']}"
              + (f"; at IoU >= 0.3: top-1 {fmt_ratio(h['at_iou_0.3']['top1'])}, found "
                 f"{fmt_ratio(h['at_iou_0.3']['recall'])}" if "at_iou_0.3" in h else ""))


def _footage(text: str) -> tuple[str, float, float | None]:
    """VIDEO[@START-END] -> (video, start, end); ValueError naming the problem."""
    video, _, span = text.partition("@")
    if not Path(video).is_file():
        raise ValueError(f"--also {text}: no such video file {video!r}")
    if not span:
        return video, 0.0, None
    try:
        a, b = (float(x) for x in span.split("-", 1))
    except ValueError:
        raise ValueError(f"--also {text}: the range must be START-END in seconds, e.g. {video}@0-60") from None
    return video, a, b


def main_filter(argv: list[str] | None = None) -> int:
    """`vlora-va filter tune CONFIG --stream S --task T`: the frame-filter threshold for a task (filter_tune.py)."""
    ap = argparse.ArgumentParser(prog="vlora-va filter", description="Frame filtering for quiet cameras.")
    sub = ap.add_subparsers(dest="what", required=True)
    p = sub.add_parser("tune", help="measure filter thresholds on the stream's video (and the camera's quiet footage, "
                                    "--also) against the unfiltered results and print the one to use: the smallest "
                                    "that filters about as much as any within max_loss (paste it under the task)")
    p.add_argument("config", help="pipelines.yaml")
    p.add_argument("--stream", required=True)
    p.add_argument("--task", required=True)
    p.add_argument("--range", default="0-55", metavar="START-END",
                   help="seconds of the stream's video to tune on (default 0-55: the shipped adapters' training range)")
    p.add_argument("--also", action="append", default=[], metavar="VIDEO[@START-END]",
                   help="more footage of the same camera, e.g. its quiet hours (repeatable): without quiet footage "
                        "no threshold filters anything to tune by")
    p.add_argument("--max-loss", type=float, default=0.02, help="accuracy loss allowed (default 0.02)")
    p.add_argument("--refresh-chunks", type=int, default=10)
    p.add_argument("--json", type=Path, help="also write the report here")
    args = ap.parse_args(argv)
    from vlora_va.contracts.config import ConfigError, load_config
    from vlora_va.training.filter_tune import tune

    try:
        cfg = load_config(args.config)
        start, end = (float(x) for x in args.range.split("-", 1))
        also = tuple(_footage(v) for v in args.also)
        stream = cfg.stream(args.stream)
        if args.task not in {t.name for t in stream.tasks}:
            raise ValueError(f"stream {args.stream} has no task {args.task!r} (tasks: "
                             f"{', '.join(t.name for t in stream.tasks)})")
    except ConfigError as e:
        for problem in e.errors:
            print(f"invalid: {problem}", file=sys.stderr)
        return 2
    except KeyError:
        print(f"no stream {args.stream!r} in {args.config}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"{e}", file=sys.stderr)
        return 2
    report = tune(cfg, args.stream, args.task, start, end, args.max_loss, args.refresh_chunks, also=also)
    print(f"{report.stream}/{report.task} ({report.kind}, {report.chunks} chunks, refresh every "
          f"{report.refresh_chunks}): loss against the unfiltered results, share of chunks filtered")
    for c in report.candidates:
        mark = " <- chosen" if c is report.chosen else ""
        print(f"  threshold {c.threshold:5g}: loss {c.loss:.4f}, filtered {c.reused_share:.0%}{mark}")
    print(report.yaml())
    if args.json:
        import dataclasses
        import json

        args.json.write_text(json.dumps(dataclasses.asdict(report), indent=2) + "\n")
    return 0
